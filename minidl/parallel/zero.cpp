#include "minidl/parallel/zero.hpp"

#include <algorithm>
#include <cstring>
#include <memory>

#include "minidl/ops/common.hpp"
#include "minidl/ops/registry.hpp"
#include "minidl/parallel/collectives.hpp"
#include "minidl/parallel/op_table.hpp"
#include "minidl/parallel/reduction_tree.hpp"

namespace minidl::parallel {

ZeroPlan ZeroPlan::make(const std::vector<std::pair<std::string, Shape>>& params, int ranks) {
  MINIDL_CHECK(ranks >= 1, "zero: ", ranks, " ranks");
  ZeroPlan p;
  p.offsets = {0};
  std::vector<std::int64_t> cuts;  // the chunk boundaries a shard may end at
  for (const auto& [name, shape] : params) {
    const std::int64_t n = shape.numel(), start = p.offsets.back();
    const std::int64_t chunk = ops::fixed_order_chunk(n);
    for (std::int64_t c = chunk; c < n; c += chunk) cuts.push_back(start + c);
    p.names.push_back(name);
    p.shapes.push_back(shape);
    p.offsets.push_back(start + n);
    cuts.push_back(start + n);
  }
  const std::int64_t total = p.offsets.back();
  MINIDL_CHECK(static_cast<std::int64_t>(cuts.size()) >= ranks, "--zero: the ", total,
               " parameter elements form ", cuts.size(), " norm chunk(s), too few to give each of ",
               ranks, " ranks a shard");
  // Rank r's shard ends at the first cut at or past r + 1 shares of the total, leaving every
  // later rank a cut of its own.
  p.bounds = {0};
  std::size_t next = 0;
  for (int r = 1; r < ranks; ++r) {
    const std::int64_t target = total * r / ranks;
    const std::size_t last = cuts.size() - 1 - static_cast<std::size_t>(ranks - r);
    while (next < last && (cuts[next] < target || cuts[next] <= p.bounds.back())) ++next;
    p.bounds.push_back(cuts[next++]);
  }
  p.bounds.push_back(total);
  return p;
}

Slice ZeroPlan::piece(std::size_t i, int rank) const {
  const std::int64_t lo = std::max(offsets[i], bounds[rank]);
  const std::int64_t hi = std::min(offsets[i + 1], bounds[rank + 1]);
  if (hi <= lo) return {0, 0};
  return {lo - offsets[i], hi - offsets[i]};
}

int ZeroPlan::index(const std::string& name) const {
  const auto it = std::find(names.begin(), names.end(), name);
  return it == names.end() ? -1 : static_cast<int>(it - names.begin());
}

namespace {

constexpr const char* kNoGrad = "communication is inserted after differentiation";

Communicator* comm_of(const ir::Node& node) {
  const auto id = node.attrs().get<std::int64_t>("group");
  Communicator* comm = nullptr;
  try {
    comm = &group(static_cast<int>(id));
  } catch (const Error& e) {
    MINIDL_FAIL(node.describe(), ": ", e.what());
  }
  const auto bounds = node.attrs().get<ir::Ints>("bounds");
  MINIDL_CHECK(static_cast<int>(bounds.size()) == comm->size() + 1, node.describe(), ": ",
               bounds.size() - 1, " shards for the ", comm->size(), " ranks of group ", id);
  return comm;
}

ir::KernelFactory naming(ir::Kernel (*make)(const ir::Node&)) {
  return [make](const ir::Node& node) -> ir::Kernel {
    return [kernel = make(node)](const ir::KernelArgs& k) {
      try {
        kernel(k);
      } catch (const Error& e) {
        MINIDL_FAIL(k.node->describe(), ": ", e.what());
      }
    };
  };
}

// bounds: ranks + 1 increasing offsets from 0; rank one of the ranks. Returns the rank's shard.
std::int64_t check_shards(ir::InferCtx& c) {
  const auto bounds = c.attr<ir::Ints>("bounds");
  const auto rank = c.attr<std::int64_t>("rank");
  MINIDL_CHECK_NODE(c, bounds.size() >= 2 && bounds.front() == 0,
                    "bounds must start at 0 and hold one more entry than ranks, got ",
                    Shape(bounds));
  for (std::size_t r = 1; r < bounds.size(); ++r)
    MINIDL_CHECK_NODE(c, bounds[r] > bounds[r - 1], "shard ", r - 1, " of bounds ", Shape(bounds),
                      " is empty");
  MINIDL_CHECK_NODE(c, rank >= 0 && rank + 1 < static_cast<std::int64_t>(bounds.size()), "rank ",
                    rank, " outside the ", bounds.size() - 1, " shards");
  return bounds[static_cast<std::size_t>(rank) + 1] - bounds[static_cast<std::size_t>(rank)];
}

std::vector<std::int64_t> counts(const ir::Ints& bounds, std::int64_t scale) {
  std::vector<std::int64_t> c;
  for (std::size_t r = 0; r + 1 < bounds.size(); ++r)
    c.push_back((bounds[r + 1] - bounds[r]) * scale);
  return c;
}

// ---- reduce_scatter ---------------------------------------------------------------------------

// x [N] -> y [bounds[rank + 1] - bounds[rank]].
void infer_reduce_scatter(ir::InferCtx& c) {
  const std::int64_t shard = check_shards(c);
  const auto bounds = c.attr<ir::Ints>("bounds");
  MINIDL_CHECK_NODE(c, c.input(0).rank() == 1 && c.dtype(0) == DType::F32,
                    "expected a flat f32 bucket, got ", c.dtype(0), " ", c.input(0));
  MINIDL_CHECK_NODE(c, c.input(0).numel() == bounds.back(), "the bucket has ", c.input(0).numel(),
                    " elements, the shards ", bounds.back());
  MINIDL_CHECK_NODE(c, c.attr<std::int64_t>("leaves") >= 0, "leaves must be >= 0");
  c.set_output(0, Shape{shard});
}

// Deterministic: every rank's part is gathered and the tree's joins are applied to this rank's
// shard only: the same additions, in the same order, as tree_allreduce makes there.
ir::Kernel make_reduce_scatter(const ir::Node& node) {
  Communicator* comm = comm_of(node);
  const auto bounds = node.attrs().get<ir::Ints>("bounds");
  const auto rank = node.attrs().get<std::int64_t>("rank");
  const auto leaves = node.attrs().get<std::int64_t>("leaves");
  const std::int64_t n = bounds.back();
  const std::int64_t lo = bounds[static_cast<std::size_t>(rank)];
  const std::int64_t len = bounds[static_cast<std::size_t>(rank) + 1] - lo;
  if (leaves == 0) {
    const std::vector<std::int64_t> c = counts(bounds, 1);
    return [comm, c](const ir::KernelArgs& k) {
      comm->reduce_scatter_sum(k.in[0].data<float>(), k.out[0].data<float>(), c);
    };
  }
  MINIDL_CHECK(leaves >= comm->size(), node.describe(), ": a tree over ", leaves,
               " micro-shard(s) cannot give each of the ", comm->size(), " ranks one");
  auto joins = std::make_shared<std::vector<std::pair<int, int>>>();
  tree_combine_order(leaves, comm->size(), [&](int a, int b) { joins->emplace_back(a, b); });
  auto parts = std::make_shared<std::vector<float>>();
  return [comm, joins, parts, n, lo, len](const ir::KernelArgs& k) {
    const float* x = k.in[0].data<float>();
    float* y = k.out[0].data<float>();
    if (joins->empty()) {
      std::memcpy(y, x + lo, static_cast<std::size_t>(len) * sizeof(float));
      return;
    }
    parts->resize(static_cast<std::size_t>(n * comm->size()));
    float* all = parts->data();
    comm->allgather(x, all, n * static_cast<std::int64_t>(sizeof(float)));
    for (const auto& [a, b] : *joins) {
      float* dst = all + a * n + lo;
      const float* src = all + b * n + lo;
      ops::elementwise(len, [&](std::int64_t i0, std::int64_t i1) {
#pragma omp simd
        for (std::int64_t i = i0; i < i1; ++i) dst[i] += src[i];
      });
    }
    std::memcpy(y, all + lo, static_cast<std::size_t>(len) * sizeof(float));
  };
}

// ---- allgatherv -------------------------------------------------------------------------------

// x [bounds[rank + 1] - bounds[rank]] -> y [N].
void infer_allgatherv(ir::InferCtx& c) {
  const std::int64_t shard = check_shards(c);
  MINIDL_CHECK_NODE(c, c.input(0) == Shape{shard} && c.dtype(0) == DType::F32,
                    "expected this rank's f32 shard [", shard, "], got ", c.dtype(0), " ",
                    c.input(0));
  c.set_output(0, Shape{c.attr<ir::Ints>("bounds").back()});
}

ir::Kernel make_allgatherv(const ir::Node& node) {
  Communicator* comm = comm_of(node);
  const std::vector<std::int64_t> bytes =
      counts(node.attrs().get<ir::Ints>("bounds"), sizeof(float));
  return [comm, bytes](const ir::KernelArgs& k) {
    comm->allgatherv(k.in[0].raw(), k.out[0].raw(), bytes);
  };
}

// ---- shard_sum_squares ------------------------------------------------------------------------

// The norm chunks of the parameters at `offsets`, as flat [begin, end) ranges, in order.
std::vector<std::pair<std::int64_t, std::int64_t>> norm_chunks(const ir::Ints& offsets) {
  std::vector<std::pair<std::int64_t, std::int64_t>> chunks;
  for (std::size_t i = 0; i + 1 < offsets.size(); ++i) {
    const std::int64_t n = offsets[i + 1] - offsets[i], chunk = ops::fixed_order_chunk(n);
    for (std::int64_t c = 0; c < n; c += chunk)
      chunks.emplace_back(offsets[i] + c, offsets[i] + std::min(n, c + chunk));
  }
  return chunks;
}

void infer_shard_sum_squares(ir::InferCtx& c) {
  const std::int64_t shard = check_shards(c);
  const auto bounds = c.attr<ir::Ints>("bounds");
  const auto offsets = c.attr<ir::Ints>("offsets");
  const auto order = c.attr<ir::Ints>("order");
  MINIDL_CHECK_NODE(c, c.input(0) == Shape{shard} && c.dtype(0) == DType::F32,
                    "expected this rank's f32 shard [", shard, "], got ", c.dtype(0), " ",
                    c.input(0));
  MINIDL_CHECK_NODE(c,
                    offsets.size() >= 2 && offsets.front() == 0 && offsets.back() == bounds.back(),
                    "the parameters' offsets ", Shape(offsets), " do not cover the ", bounds.back(),
                    " elements of the shards");
  std::vector<bool> seen(offsets.size() - 1, false);
  for (const std::int64_t i : order) {
    MINIDL_CHECK_NODE(c, i >= 0 && i + 1 < static_cast<std::int64_t>(offsets.size()) && !seen[i],
                      "order ", Shape(order), " is not an order of the ", offsets.size() - 1,
                      " parameters");
    seen[static_cast<std::size_t>(i)] = true;
  }
  MINIDL_CHECK_NODE(c, order.size() + 1 == offsets.size(), "order ", Shape(order), " names ",
                    order.size(), " of the ", offsets.size() - 1, " parameters");
  std::size_t b = 1;
  for (const auto& [lo, hi] : norm_chunks(offsets)) {
    while (b < bounds.size() && bounds[b] <= lo) ++b;
    MINIDL_CHECK_NODE(c, hi <= bounds[b], "norm chunk [", lo, ", ", hi,
                      ") crosses the end of shard ", b - 1, " at ", bounds[b]);
  }
  c.set_output(0, Shape{});
}

// Each rank sums the chunks of its shard (in double, each in order, as fixed_order_sum does);
// the partial sums are gathered, every parameter's chunks are added in order and rounded to f32
// (sum_squares), and the parameters' sums are added in f32 in update order (clip-grad-norm).
ir::Kernel make_shard_sum_squares(const ir::Node& node) {
  Communicator* comm = comm_of(node);
  const auto bounds = node.attrs().get<ir::Ints>("bounds");
  const auto rank = node.attrs().get<std::int64_t>("rank");
  const auto offsets = node.attrs().get<ir::Ints>("offsets");
  const auto order = node.attrs().get<ir::Ints>("order");
  const auto chunks = norm_chunks(offsets);
  std::vector<std::int64_t> bytes(bounds.size() - 1, 0);
  std::vector<std::pair<std::int64_t, std::int64_t>> mine;  // relative to the shard
  for (const auto& [lo, hi] : chunks) {
    const auto r = static_cast<std::size_t>(std::upper_bound(bounds.begin(), bounds.end(), lo) -
                                            bounds.begin() - 1);
    bytes[r] += sizeof(double);
    if (static_cast<std::int64_t>(r) == rank) mine.emplace_back(lo - bounds[r], hi - bounds[r]);
  }
  // Each parameter's number of chunks, in the flat order.
  std::vector<std::int64_t> per_param;
  for (std::size_t i = 0; i + 1 < offsets.size(); ++i) {
    const std::int64_t n = offsets[i + 1] - offsets[i];
    per_param.push_back((n + ops::fixed_order_chunk(n) - 1) / ops::fixed_order_chunk(n));
  }
  return [comm, bytes, mine, per_param, order, n_chunks = chunks.size()](const ir::KernelArgs& k) {
    const float* x = k.in[0].data<float>();
    std::vector<double> partial(mine.size()), all(n_chunks);
    parallel_for(static_cast<std::int64_t>(mine.size()), 4096,
                 [&](std::int64_t c0, std::int64_t c1) {
                   for (std::int64_t c = c0; c < c1; ++c) {
                     double s = 0.0;
                     for (std::int64_t i = mine[c].first; i < mine[c].second; ++i)
                       s += static_cast<double>(x[i]) * x[i];
                     partial[c] = s;
                   }
                 });
    comm->allgatherv(partial.data(), all.data(), bytes);
    std::vector<float> sums;
    std::size_t c = 0;
    for (const std::int64_t chunks : per_param) {
      double total = 0.0;
      for (std::int64_t j = 0; j < chunks; ++j) total += all[c++];
      sums.push_back(static_cast<float>(total));
    }
    float total = sums[static_cast<std::size_t>(order[0])];
    for (std::size_t j = 1; j < order.size(); ++j)
      total += sums[static_cast<std::size_t>(order[j])];
    *k.out[0].data<float>() = total;
  };
}

// ---- zero_scatter_into, zero_gather_into ------------------------------------------------------

// The elements of the flat range [offset, offset + n) of a parameter that shard r holds, as
// [begin, end) relative to the parameter (begin == end: none).
std::pair<std::int64_t, std::int64_t> overlap(const ir::Ints& bounds, std::size_t r,
                                              std::int64_t offset, std::int64_t n) {
  const std::int64_t lo = std::max(bounds[r], offset), hi = std::min(bounds[r + 1], offset + n);
  return hi > lo ? std::pair{lo - offset, hi - offset}
                 : std::pair{std::int64_t{0}, std::int64_t{0}};
}

// shard [S], x [...] at flat `offset` -> shard, in place: x's elements within this rank's shard.
void infer_into(ir::InferCtx& c) {
  const std::int64_t shard = check_shards(c);
  const auto bounds = c.attr<ir::Ints>("bounds");
  const auto offset = c.attr<std::int64_t>("offset");
  MINIDL_CHECK_NODE(
      c, c.input(0) == Shape{shard} && c.dtype(0) == DType::F32 && c.dtype(1) == DType::F32,
      "expected this rank's f32 shard [", shard, "] and an f32 tensor, got ", c.dtype(0), " ",
      c.input(0), " and ", c.dtype(1), " ", c.input(1));
  MINIDL_CHECK_NODE(c, offset >= 0 && offset + c.input(1).numel() <= bounds.back(), "offset ",
                    offset, " + ", c.input(1).numel(), " elements exceeds the shards' ",
                    bounds.back());
  MINIDL_CHECK_NODE(c, c.attr<std::int64_t>("leaves") >= 0, "leaves must be >= 0");
  c.set_output(0, c.input(0));
}

// This rank's part of the sum over the ranks of a parameter's gradient x, written into the
// shard: MPI's reduce-scatter with each rank's count its part of x (none for most ranks). With
// `whole` (zero_allreduce_into) x itself becomes the whole sum (an allreduce in place) and the
// part is copied from it. In deterministic mode every rank's x is gathered and the tree's joins
// are applied to this rank's part only (to all of x with `whole`): the same additions, in the
// same order, as tree_allreduce makes there.
ir::Kernel make_reduce_into(const ir::Node& node, bool whole) {
  Communicator* comm = comm_of(node);
  const auto bounds = node.attrs().get<ir::Ints>("bounds");
  const auto rank = static_cast<std::size_t>(node.attrs().get<std::int64_t>("rank"));
  const auto leaves = node.attrs().get<std::int64_t>("leaves");
  const auto offset = node.attrs().get<std::int64_t>("offset");
  const std::int64_t n = node.input(1)->shape().numel();
  const auto [lo, hi] = overlap(bounds, rank, offset, n);
  const std::int64_t at =
      hi > lo ? offset + lo - bounds[rank] : 0;  // the part's place in the shard
  // OpenMPI's collectives take temporary buffers of up to their input's size: x goes in chunks
  // of at most kChunk elements, so those stay small beside the shard.
  static constexpr std::int64_t kChunk = std::int64_t{1} << 20;
  if (leaves == 0) {
    if (whole) {
      return [comm, n, lo, hi, at](const ir::KernelArgs& k) {
        float* x = k.out[1].data<float>();
        for (std::int64_t c = 0; c < n; c += kChunk)
          comm->allreduce_sum(x + c, std::min(kChunk, n - c));
        std::memcpy(k.out[0].data<float>() + at, x + lo,
                    static_cast<std::size_t>(hi - lo) * sizeof(float));
      };
    }
    // MPI's reduce-scatter hands out consecutive parts from the start of its input (the ranks
    // holding no part of a chunk get none).
    struct Call {
      std::int64_t begin = 0, at = 0;  // x's first element, where this rank's part goes
      std::vector<std::int64_t> counts;
    };
    std::vector<Call> calls;
    for (std::int64_t c = 0; c < n; c += kChunk) {
      const std::int64_t len = std::min(kChunk, n - c);
      Call call{.begin = c};
      for (std::size_t r = 0; r + 1 < bounds.size(); ++r) {
        const auto [a, b] = overlap(bounds, r, offset + c, len);
        call.counts.push_back(b - a);
        if (r == rank && b > a) call.at = offset + c + a - bounds[rank];
      }
      calls.push_back(std::move(call));
    }
    return [comm, calls](const ir::KernelArgs& k) {
      for (const Call& c : calls)
        comm->reduce_scatter_sum(k.in[1].data<float>() + c.begin, k.out[0].data<float>() + c.at,
                                 c.counts);
    };
  }
  MINIDL_CHECK(leaves >= comm->size(), node.describe(), ": a tree over ", leaves,
               " micro-shard(s) cannot give each of the ", comm->size(), " ranks one");
  auto joins = std::make_shared<std::vector<std::pair<int, int>>>();
  tree_combine_order(leaves, comm->size(), [&](int a, int b) { joins->emplace_back(a, b); });
  return [comm, joins, n, lo, hi, at, whole](const ir::KernelArgs& k) {
    const float* x = k.in[1].data<float>();
    float* y = k.out[0].data<float>() + at;
    // The range the joins apply to.
    const std::int64_t from = whole ? 0 : lo, len = whole ? n : hi - lo;
    // Every rank's x, for this call only: at any time one gradient times the ranks, not the
    // whole model's (and nothing shared between the ranks a simulation runs in one process).
    std::vector<float> parts;
    if (!joins->empty()) {
      parts.resize(static_cast<std::size_t>(n * comm->size()));
      float* all = parts.data();
      comm->allgather(x, all, n * static_cast<std::int64_t>(sizeof(float)));
      for (const auto& [a, b] : *joins) {
        float* dst = all + a * n + from;
        const float* src = all + b * n + from;
        ops::elementwise(len, [&](std::int64_t i0, std::int64_t i1) {
#pragma omp simd
          for (std::int64_t i = i0; i < i1; ++i) dst[i] += src[i];
        });
      }
      if (whole)
        std::memcpy(k.out[1].data<float>(), all, static_cast<std::size_t>(n) * sizeof(float));
      x = all;
    }
    std::memcpy(y, x + lo, static_cast<std::size_t>(hi - lo) * sizeof(float));
  };
}

ir::Kernel make_scatter_into(const ir::Node& node) { return make_reduce_into(node, false); }
ir::Kernel make_allreduce_into(const ir::Node& node) { return make_reduce_into(node, true); }

// shard [S], x [...] -> shard, x: zero_scatter_into's shard, and x summed over the ranks.
void infer_allreduce_into(ir::InferCtx& c) {
  infer_into(c);
  c.set_output(1, c.input(1));
}

// param [...], shard [S] -> param, in place: every rank's part of the parameter, from its
// shard, gathered into the parameter (MPI's allgatherv, each rank's count its part).
void infer_gather_into(ir::InferCtx& c) {
  const std::int64_t shard = check_shards(c);
  const auto bounds = c.attr<ir::Ints>("bounds");
  const auto offset = c.attr<std::int64_t>("offset");
  MINIDL_CHECK_NODE(
      c, c.input(1) == Shape{shard} && c.dtype(0) == DType::F32 && c.dtype(1) == DType::F32,
      "expected an f32 parameter and this rank's f32 shard [", shard, "], got ", c.dtype(0), " ",
      c.input(0), " and ", c.dtype(1), " ", c.input(1));
  MINIDL_CHECK_NODE(c, offset >= 0 && offset + c.input(0).numel() <= bounds.back(), "offset ",
                    offset, " + ", c.input(0).numel(), " elements exceeds the shards' ",
                    bounds.back());
  c.set_output(0, c.input(0));
}

ir::Kernel make_gather_into(const ir::Node& node) {
  Communicator* comm = comm_of(node);
  const auto bounds = node.attrs().get<ir::Ints>("bounds");
  const auto rank = static_cast<std::size_t>(node.attrs().get<std::int64_t>("rank"));
  const auto offset = node.attrs().get<std::int64_t>("offset");
  const std::int64_t n = node.input(0)->shape().numel();
  std::vector<std::int64_t> bytes;
  for (std::size_t r = 0; r + 1 < bounds.size(); ++r) {
    const auto [a, b] = overlap(bounds, r, offset, n);
    bytes.push_back((b - a) * static_cast<std::int64_t>(sizeof(float)));
  }
  const auto [lo, hi] = overlap(bounds, rank, offset, n);
  const std::int64_t at = hi > lo ? offset + lo - bounds[rank] : 0;
  return [comm, bytes, at](const ir::KernelArgs& k) {
    comm->allgatherv(k.in[1].data<float>() + at, k.out[0].raw(), bytes);
  };
}

// ---- assign_slice -----------------------------------------------------------------------------

// dst [...], src [n] -> dst, in place: dst's elements (flat) = src[offset, offset + dst.numel()).
void infer_assign_slice(ir::InferCtx& c) {
  const auto offset = c.attr<std::int64_t>("offset");
  MINIDL_CHECK_NODE(c,
                    c.dtype(0) == DType::F32 && c.dtype(1) == DType::F32 && c.input(1).rank() == 1,
                    "expected an f32 destination and a flat f32 source");
  MINIDL_CHECK_NODE(c, offset >= 0 && offset + c.input(0).numel() <= c.input(1).numel(), "offset ",
                    offset, " + ", c.input(0).numel(), " elements exceeds the source's ",
                    c.input(1).numel());
  c.set_output(0, c.input(0));
}

void assign_slice_native(const ir::KernelArgs& k) {
  const auto offset = k.attrs().get<std::int64_t>("offset");
  std::memcpy(k.out[0].raw(), k.in[1].data<float>() + offset, k.out[0].nbytes());
}

}  // namespace

MINIDL_OP(reduce_scatter)
    .inputs({"x"})
    .attr<ir::Ints>("bounds")
    .attr<int>("rank")
    .attr<int>("leaves", 0)
    .attr<int>("group", 0)
    .infer(infer_reduce_scatter)
    .kernel_factory(ir::Backend::Native, "mpi", naming(make_reduce_scatter))
    .side_effect()
    .communication(ir::CommRole::Collective)
    .no_grad(kNoGrad);

MINIDL_OP(allgatherv)
    .inputs({"x"})
    .attr<ir::Ints>("bounds")
    .attr<int>("rank")
    .attr<int>("group", 0)
    .infer(infer_allgatherv)
    .kernel_factory(ir::Backend::Native, "mpi", naming(make_allgatherv))
    .side_effect()
    .communication(ir::CommRole::Collective)
    .no_grad(kNoGrad);

MINIDL_OP(shard_sum_squares)
    .inputs({"x"})
    .attr<ir::Ints>("bounds")
    .attr<int>("rank")
    .attr<ir::Ints>("offsets")
    .attr<ir::Ints>("order")
    .attr<int>("group", 0)
    .infer(infer_shard_sum_squares)
    .kernel_factory(ir::Backend::Native, "mpi", naming(make_shard_sum_squares))
    .side_effect()
    .communication(ir::CommRole::Collective)
    .no_grad("a clipping norm: gradients are not differentiated again");

MINIDL_OP(zero_scatter_into)
    .inputs({"shard", "x"})
    .attr<ir::Ints>("bounds")
    .attr<int>("rank")
    .attr<int>("offset")
    .attr<int>("leaves", 0)
    .attr<int>("group", 0)
    .infer(infer_into)
    .kernel_factory(ir::Backend::Native, "mpi", naming(make_scatter_into))
    .inplace(0, 0)
    .side_effect()
    .communication(ir::CommRole::Collective)
    .no_grad(kNoGrad);

MINIDL_OP(zero_allreduce_into)
    .inputs({"shard", "x"})
    .outputs({"shard", "sum"})
    .attr<ir::Ints>("bounds")
    .attr<int>("rank")
    .attr<int>("offset")
    .attr<int>("leaves", 0)
    .attr<int>("group", 0)
    .infer(infer_allreduce_into)
    .kernel_factory(ir::Backend::Native, "mpi", naming(make_allreduce_into))
    .inplace(0, 0)
    .inplace(1, 1)
    .side_effect()
    .communication(ir::CommRole::Collective)
    .no_grad(kNoGrad);

MINIDL_OP(zero_gather_into)
    .inputs({"param", "shard"})
    .attr<ir::Ints>("bounds")
    .attr<int>("rank")
    .attr<int>("offset")
    .attr<int>("group", 0)
    .infer(infer_gather_into)
    .kernel_factory(ir::Backend::Native, "mpi", naming(make_gather_into))
    .inplace(0, 0)
    .side_effect()
    .communication(ir::CommRole::Collective)
    .no_grad(kNoGrad);

MINIDL_OP(assign_slice)
    .inputs({"dst", "src"})
    .attr<int>("offset")
    .infer(infer_assign_slice)
    .kernel(ir::Backend::Native, assign_slice_native)
    .inplace(0, 0)
    .side_effect()
    .no_grad("writes a parameter after its update");

// ---- building the step ------------------------------------------------------------------------

namespace {

ir::Node* add(ir::Graph& g, const ir::OpDef& def, std::vector<ir::Value*> inputs, ir::Attrs attrs,
              const std::string& name, ir::Phase phase) {
  register_ops();
  ir::Node* n = g.add_node(def, std::move(inputs), std::move(attrs), name);
  n->set_phase(phase);
  return n;
}

ir::Ints shard_attr(const ZeroPlan& plan) { return plan.bounds; }

}  // namespace

ZeroPieces zero_reduce_gradients(ir::Graph& g, const ZeroPlan& plan, const ZeroOptions& o,
                                 const std::vector<ir::Value*>& params,
                                 const std::vector<ir::Value*>& grads) {
  MINIDL_CHECK(params.size() == grads.size(), "zero: ", params.size(), " parameters, ",
               grads.size(), " gradients");
  MINIDL_CHECK(o.stage == 1 || o.stage == 2, "--zero: stage ", o.stage,
               " (expected 1: optimizer state sharded, or 2: gradients too)");
  // The gradient of each parameter of the plan, in the flat order.
  std::vector<ir::Value*> by_index(plan.names.size(), nullptr);
  for (std::size_t k = 0; k < params.size(); ++k) {
    const std::string& name = params[k]->producer()->name();
    const int i = plan.index(name);
    MINIDL_CHECK(i >= 0, "--zero: the training graph's parameter '", name,
                 "' is not among the model's parameters");
    MINIDL_CHECK(params[k]->shape() == plan.shapes[static_cast<std::size_t>(i)],
                 "--zero: parameter '", name, "' is ", params[k]->shape(), " in the graph, ",
                 plan.shapes[static_cast<std::size_t>(i)], " in the model");
    MINIDL_CHECK(grads[k]->dtype() == DType::F32, "--zero: the gradient of '", name, "' is ",
                 grads[k]->dtype(), ", only f32 is reduced");
    by_index[static_cast<std::size_t>(i)] = grads[k];
  }
  for (std::size_t i = 0; i < by_index.size(); ++i)
    MINIDL_CHECK(by_index[i] != nullptr, "--zero: the model's parameter '", plan.names[i],
                 "' is not used by the training graph, so it has no gradient to shard");

  // No flat bucket of the whole gradient: each gradient is reduced where the backward left it
  // (stage 1: allreduced in place, this rank's part copied into its shard; stage 2:
  // reduce-scattered from there into the shard), so the reduction adds no whole-size buffer.
  const ir::Phase comm = ir::Phase::Communication;
  const std::int64_t lo = plan.bounds[static_cast<std::size_t>(o.rank)];
  ir::Value* shard = add(g, ops::op("fill"), {}, {{"shape", ir::Ints{plan.shard_size(o.rank)}}},
                         "zero.shard", comm)
                         ->output();
  // Stage 1: the whole sums (the gradients, reduced in place); accumulated sums already reduced.
  std::vector<ir::Value*> whole_sum(by_index.size(), nullptr);
  for (std::size_t i = 0; i < by_index.size(); ++i) {
    const std::string& name = plan.names[i];
    if (o.reduced) {
      whole_sum[i] = by_index[i];
    } else {
      // One chain through the shard: every rank runs the collectives in the flat order, whatever
      // order the rest of its graph (its own pieces) would allow.
      ir::Node* n =
          add(g, o.stage == 1 ? op_zero_allreduce_into : op_zero_scatter_into, {shard, by_index[i]},
              {{"bounds", shard_attr(plan)},
               {"rank", std::int64_t{o.rank}},
               {"offset", plan.offsets[i]},
               {"leaves", o.tree_leaves},
               {"group", std::int64_t{o.group}}},
              (o.stage == 1 ? "zero.allreduce." : "zero.reduce_scatter.") + name, comm);
      shard = n->output(0);
      if (o.stage == 1) whole_sum[i] = n->output(1);
    }
  }

  ZeroPieces out;
  for (std::size_t i = 0; i < plan.names.size(); ++i) {
    const Slice p = plan.piece(i, o.rank);
    if (p.size() == 0) continue;
    const std::string& name = plan.names[i];
    ir::Value* param = nullptr;
    for (ir::Value* v : params)
      if (v->producer()->name() == name) param = v;
    ir::Value* piece = bucket_unpack(param, p.begin, Shape{p.size()}, "zero.piece." + name);
    piece->producer()->set_phase(ir::Phase::Update);
    ir::Value* grad = nullptr;  // stage 2: below, from the finished shard
    if (whole_sum[i] != nullptr) {
      // The piece of the whole sum; already taken gradients are placed in the shard too (read
      // by the clipping norm only).
      grad = bucket_unpack(whole_sum[i], p.begin, Shape{p.size()}, "zero.grad." + name);
      grad->producer()->set_phase(comm);
      if (o.reduced) {
        shard = bucket_pack(shard, grad, plan.offsets[i] + p.begin - lo, "zero.shard." + name);
        shard->producer()->set_phase(comm);
      }
    }
    out.names.push_back(name);
    out.index.push_back(i);
    out.params.push_back(piece);
    out.grads.push_back(grad);
  }
  for (std::size_t k = 0; k < out.grads.size(); ++k) {
    if (out.grads[k] != nullptr) continue;
    const std::size_t i = out.index[k];
    const Slice p = plan.piece(i, o.rank);
    out.grads[k] = bucket_unpack(shard, plan.offsets[i] + p.begin - lo, Shape{p.size()},
                                 "zero.grad." + out.names[k]);
    out.grads[k]->producer()->set_phase(comm);
  }
  out.shard = shard;
  return out;
}

ir::Value* zero_sum_squares(ir::Graph& g, const ZeroPlan& plan, const ZeroOptions& o,
                            const ZeroPieces& pieces, const std::vector<std::size_t>& order) {
  ir::Ints ord(order.begin(), order.end());
  return add(g, op_shard_sum_squares, {pieces.shard},
             {{"bounds", shard_attr(plan)},
              {"rank", std::int64_t{o.rank}},
              {"offsets", plan.offsets},
              {"order", ord},
              {"group", std::int64_t{o.group}}},
             "zero.grad_sum_squares", ir::Phase::Communication)
      ->output();
}

void zero_gather_parameters(ir::Graph& g, const ZeroPlan& plan, const ZeroOptions& o,
                            const ZeroPieces& pieces, const std::vector<ir::Value*>& updated,
                            const std::vector<ir::Value*>& params) {
  MINIDL_CHECK(updated.size() == pieces.params.size(), "zero: ", updated.size(),
               " updated pieces of ", pieces.params.size());
  const std::int64_t lo = plan.bounds[static_cast<std::size_t>(o.rank)];
  ir::Value* shard = add(g, ops::op("fill"), {}, {{"shape", ir::Ints{plan.shard_size(o.rank)}}},
                         "zero.updated", ir::Phase::Update)
                         ->output();
  for (std::size_t k = 0; k < updated.size(); ++k) {
    const std::size_t i = pieces.index[k];
    shard = bucket_pack(shard, updated[k], plan.offsets[i] + plan.piece(i, o.rank).begin - lo,
                        "zero.pack_updated." + pieces.names[k]);
    shard->producer()->set_phase(ir::Phase::Update);
  }
  // Each parameter gathers its parts straight into its own storage: no whole-size buffer.
  for (ir::Value* p : params) {
    const std::string& name = p->producer()->name();
    const auto i = static_cast<std::size_t>(plan.index(name));
    add(g, op_zero_gather_into, {p, shard},
        {{"bounds", shard_attr(plan)},
         {"rank", std::int64_t{o.rank}},
         {"offset", plan.offsets[i]},
         {"group", std::int64_t{o.group}}},
        "zero.allgatherv." + name, ir::Phase::Communication);
  }
}

}  // namespace minidl::parallel
