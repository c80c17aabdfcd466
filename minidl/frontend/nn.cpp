#include "minidl/frontend/nn.hpp"

#include <cxxabi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <typeinfo>

#include "minidl/core/rng.hpp"
#include "minidl/io/safetensors.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/parallel/tensor_parallel.hpp"

namespace minidl::nn {

namespace {
std::uint64_t name_hash(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

/// "Linear" for minidl::nn::Linear, "custom::Gelu" for a user's custom::Gelu: the type as a
/// user wrote it.
std::string type_name(const std::type_info& t) {
  std::string name = t.name();
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(
      abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status), std::free);
  if (status == 0 && demangled != nullptr) name = demangled.get();
  for (std::string_view noise : {"minidl::nn::", "minidl::", "(anonymous namespace)::"}) {
    for (std::size_t at; (at = name.find(noise)) != std::string::npos;)
      name.erase(at, noise.size());
  }
  return name;
}
}  // namespace

void initialize(Tensor& t, Init init, std::int64_t fan_in, std::int64_t fan_out, std::uint64_t seed,
                std::string_view stream_name) {
  const CounterRng rng(seed);
  const std::uint64_t stream = name_hash(stream_name);
  switch (init) {
    case Init::He:
      rng.fill_normal(t, stream, 0.0f, static_cast<float>(std::sqrt(2.0 / fan_in)));
      break;
    case Init::Xavier: {
      const auto a = static_cast<float>(std::sqrt(6.0 / static_cast<double>(fan_in + fan_out)));
      rng.fill_uniform(t, stream, -a, a);
      break;
    }
    case Init::Zeros:
      std::fill_n(t.data<float>(), t.numel(), 0.0f);
      break;
  }
}

ir::Value* Module::operator()(ir::Value* x) {
  ir::NameScope scope(x->graph(), local_name_);
  return forward(x);
}

std::string Module::who() const {
  std::string type = type_name(typeid(*this));
  return path_.empty() ? type : fmt::format("{} '{}'", type, path_);
}

void Module::check_new_name(std::string_view kind, const std::string& name) const {
  std::string problem = train::name_segment_problem(name);
  if (problem.empty()) {
    auto taken = [&](const NamedTensors& list) {
      return std::any_of(list.begin(), list.end(), [&](const auto& p) { return p.first == name; });
    };
    if (taken(parameters_)) problem = "this module has a parameter of that name already";
    if (taken(buffers_)) problem = "this module has a buffer of that name already";
    if (std::any_of(children_.begin(), children_.end(),
                    [&](const Child& c) { return c.name == name; })) {
      problem = "this module has a child of that name already";
    }
  } else if (name.find('.') != std::string::npos) {
    problem += " (the module tree makes the dotted names: register a child module instead)";
  }
  MINIDL_CHECK(problem.empty(), who(), ": cannot register ", kind, " '", name, "': ", problem);
}

Tensor Module::register_parameter(std::string name, Tensor t) {
  check_new_name("parameter", name);
  MINIDL_CHECK(t.raw() != nullptr, who(), ": cannot register parameter '", name,
               "': the tensor has no storage");
  parameters_.emplace_back(std::move(name), t);
  return t;
}

Tensor Module::register_buffer(std::string name, Tensor t) {
  check_new_name("buffer", name);
  MINIDL_CHECK(t.raw() != nullptr, who(), ": cannot register buffer '", name,
               "': the tensor has no storage");
  buffers_.emplace_back(std::move(name), t);
  return t;
}

void Module::adopt(std::string name, std::unique_ptr<Module> m) {
  check_new_name("module", name);
  MINIDL_CHECK(m != nullptr, who(), ": cannot register module '", name, "': it is null");
  m->local_name_ = name;
  m->set_path(full_name(name));
  m->train(training_);
  children_.push_back({std::move(name), std::move(m)});
}

void Module::set_path(const std::string& path) {
  path_ = path;
  for (Child& c : children_) c.module->set_path(full_name(c.name));
}

std::string Module::full_name(std::string_view local) const {
  return path_.empty() ? std::string(local) : fmt::format("{}.{}", path_, local);
}

void Module::collect(bool buffers, NamedTensors& out) const {
  for (const auto& [name, t] : buffers ? buffers_ : parameters_)
    out.emplace_back(full_name(name), t);
  for (const Child& c : children_) c.module->collect(buffers, out);
}

NamedTensors Module::parameters() {
  NamedTensors out;
  collect(false, out);
  return out;
}

NamedTensors Module::buffers() {
  NamedTensors out;
  collect(true, out);
  return out;
}

NamedTensors Module::state_dict() {
  NamedTensors out;
  collect(false, out);
  collect(true, out);
  return out;
}

void Module::reset(std::uint64_t seed) {
  reset_parameters(seed);
  for (Child& c : children_) c.module->reset(seed);
}

void Module::train(bool on) {
  training_ = on;
  for (Child& c : children_) c.module->train(on);
}

ir::Value* Module::source_value(ir::Graph& g, bool buffer, std::string_view name) {
  const NamedTensors& list = buffer ? buffers_ : parameters_;
  const char* kind = buffer ? "buffer" : "parameter";
  auto it = std::find_if(list.begin(), list.end(), [&](const auto& p) { return p.first == name; });
  if (it == list.end()) {
    std::string known;
    for (const auto& [n, t] : list) known += fmt::format("{}'{}'", known.empty() ? "" : ", ", n);
    MINIDL_FAIL(who(), " has no ", kind, " '", name,
                "' (registered: ", known.empty() ? "none" : known, ")");
  }
  const std::string full = full_name(name);
  const std::string_view op = buffer ? "state" : "parameter";
  if (ir::Node* n = g.find(full)) {
    MINIDL_CHECK(n->op() == op && n->bound().raw() == it->second.raw(), who(), ": ", kind, " '",
                 full, "' cannot be a node of the graph, which has a node of that name already (",
                 n->op(), " ", n->output()->ref(), ")");
    if (buffer) return n->output();
  }
  if (buffer) return ops::state(g, full, it->second);
  return train::read_parameter(g, full, it->second, train::find_shard(shards_, name));
}

const Tensor& Module::registered_parameter(std::string_view name) const {
  auto it = std::find_if(parameters_.begin(), parameters_.end(),
                         [&](const auto& p) { return p.first == name; });
  MINIDL_CHECK(it != parameters_.end(), who(), " has no parameter '", name, "'");
  return it->second;
}

std::vector<std::pair<std::string, train::ParameterShard>> Module::parameter_shards() {
  std::vector<std::pair<std::string, train::ParameterShard>> out;
  for (const auto& [name, s] : shards_) out.emplace_back(full_name(name), s);
  for (Child& c : children_) {
    auto theirs = c.module->parameter_shards();
    out.insert(out.end(), theirs.begin(), theirs.end());
  }
  return out;
}

Module* Module::owner_of(const std::string& name) {
  // A child whose full name prefixes `name` holds it (or one of its children does).
  for (Child& c : children_) {
    const std::string& p = c.module->name();
    if (name.size() > p.size() && name.compare(0, p.size(), p) == 0 && name[p.size()] == '.')
      return c.module->owner_of(name);
  }
  return this;
}

void Module::unshard_parameter(const std::string& name, const Tensor& whole) {
  Module* m = owner_of(name);
  if (m != this) return m->unshard_parameter(name, whole);
  auto s = std::find_if(shards_.begin(), shards_.end(),
                        [&](const auto& p) { return full_name(p.first) == name; });
  MINIDL_CHECK(s != shards_.end() && whole.shape() == s->second.whole, who(), ": parameter '", name,
               "' is not stored as a shard of ", whole.shape());
  auto it = std::find_if(parameters_.begin(), parameters_.end(),
                         [&](const auto& p) { return p.first == s->first; });
  it->second = whole.clone();
  shards_.erase(s);
}

void Module::shard_parameter(const std::string& name, const train::ParameterShard& shard) {
  Module* m = owner_of(name);
  if (m != this) return m->shard_parameter(name, shard);
  auto it = std::find_if(parameters_.begin(), parameters_.end(),
                         [&](const auto& p) { return full_name(p.first) == name; });
  MINIDL_CHECK(it != parameters_.end(), who(), " has no parameter '", name, "' to shard");
  MINIDL_CHECK(train::find_shard(shards_, it->first) == nullptr, who(), ": parameter '", name,
               "' is stored as a shard already");
  MINIDL_CHECK(it->second.shape() == shard.whole && shard.count >= 1 && shard.index >= 0 &&
                   shard.index < shard.count && shard.axis >= 0 &&
                   shard.axis < static_cast<int>(shard.whole.rank()) &&
                   shard.whole[static_cast<std::size_t>(shard.axis)] % shard.count == 0,
               who(), ": parameter '", name, "' ", it->second.shape(), " cannot be stored as part ",
               shard.index, " of ", shard.count, " of ", shard.whole, " along axis ", shard.axis);
  std::vector<std::int64_t> dims = shard.whole.dims();
  dims[static_cast<std::size_t>(shard.axis)] /= shard.count;
  // The handle in the list is the module's only one: replacing it releases the whole tensor.
  it->second = parallel::take_piece(it->second, Shape(dims), shard.index, shard.count);
  shards_.emplace_back(it->first, shard);
}

ir::Value* Module::parameter_value(ir::Graph& g, std::string_view name) {
  return source_value(g, false, name);
}

ir::Value* Module::buffer_value(ir::Graph& g, std::string_view name) {
  return source_value(g, true, name);
}

void Module::initialize_parameter(std::string_view name, Init init, std::int64_t fan_in,
                                  std::int64_t fan_out, std::uint64_t seed) {
  auto it = std::find_if(parameters_.begin(), parameters_.end(),
                         [&](const auto& p) { return p.first == name; });
  MINIDL_CHECK(it != parameters_.end(), who(), " has no parameter '", name, "'");
  MINIDL_CHECK(train::find_shard(shards_, name) == nullptr, who(), ": parameter '", full_name(name),
               "' is stored as a shard: initialise the model before it is sharded");
  initialize(it->second, init, fan_in, fan_out, seed, full_name(name));
}

Linear::Linear(std::int64_t in, std::int64_t out, Init init, bool bias)
    : in_(in), out_(out), init_(init) {
  MINIDL_CHECK(in > 0 && out > 0, "Linear(", in, " -> ", out, "): sizes must be positive");
  register_parameter("weight", Tensor::zeros({out, in}));
  has_bias_ = bias;
  if (bias) register_parameter("bias", Tensor::zeros({out}));
}

ir::Value* Linear::forward(ir::Value* x) {
  ir::Graph& g = x->graph();
  MINIDL_CHECK(x->shape().rank() == 2 && x->shape()[1] == in_, describe(), " '", name(),
               "': expected input [N,", in_, "], got ", x->shape());
  ir::Value* y = ops::matmul(x, parameter_value(g, "weight"), false, true);
  if (has_bias_) y = ops::bias_add(y, parameter_value(g, "bias"));
  return y;
}

void Linear::reset_parameters(std::uint64_t seed) {
  initialize_parameter("weight", init_, in_, out_, seed);
  if (has_bias_) initialize_parameter("bias", Init::Zeros, in_, out_, seed);
}

std::string Linear::describe() const {
  return fmt::format("Linear({} -> {}, {})", in_, out_, init_ == Init::He ? "he" : "xavier");
}

Conv2d::Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel,
               std::int64_t stride, std::int64_t pad, Init init, bool bias)
    : in_(in_channels),
      out_(out_channels),
      kernel_(kernel),
      stride_(stride),
      pad_(pad),
      init_(init) {
  MINIDL_CHECK(in_ > 0 && out_ > 0 && kernel_ > 0 && stride_ > 0 && pad_ >= 0, "Conv2d(", in_,
               " -> ", out_, ", kernel ", kernel_, ", stride ", stride_, ", pad ", pad_,
               "): sizes, kernel and stride must be positive and pad non-negative");
  register_parameter("weight", Tensor::zeros({out_, in_, kernel_, kernel_}));
  has_bias_ = bias;
  if (bias) register_parameter("bias", Tensor::zeros({out_}));
}

ir::Value* Conv2d::forward(ir::Value* x) {
  ir::Graph& g = x->graph();
  MINIDL_CHECK(x->shape().rank() == 4 && x->shape()[1] == in_, describe(), " '", name(),
               "': expected input [N,", in_, ",H,W], got ", x->shape());
  ir::Value* y =
      ops::apply("conv2d", {x, parameter_value(g, "weight")},
                 {{"stride", ir::Ints{stride_, stride_}}, {"pad", ir::Ints{pad_, pad_}}});
  if (has_bias_) y = ops::bias_add(y, parameter_value(g, "bias"));
  return y;
}

void Conv2d::reset_parameters(std::uint64_t seed) {
  const std::int64_t taps = kernel_ * kernel_;
  initialize_parameter("weight", init_, in_ * taps, out_ * taps, seed);
  if (has_bias_) initialize_parameter("bias", Init::Zeros, 0, 0, seed);
}

std::string Conv2d::describe() const {
  return fmt::format("Conv2d({} -> {}, {}x{}, stride {}, pad {}, {})", in_, out_, kernel_, kernel_,
                     stride_, pad_, init_ == Init::He ? "he" : "xavier");
}

namespace {
/// The attributes of a pooling node with a square window.
ir::Attrs pool_attrs(std::int64_t kernel, std::int64_t stride, std::int64_t pad) {
  return {{"kernel", ir::Ints{kernel, kernel}},
          {"stride", ir::Ints{stride, stride}},
          {"pad", ir::Ints{pad, pad}}};
}
}  // namespace

MaxPool2d::MaxPool2d(std::int64_t kernel, std::int64_t stride, std::int64_t pad)
    : kernel_(kernel), stride_(stride == 0 ? kernel : stride), pad_(pad) {
  MINIDL_CHECK(kernel_ > 0 && stride_ > 0 && pad_ >= 0 && 2 * pad_ <= kernel_, "MaxPool2d(", kernel,
               ", stride ", stride, ", pad ", pad,
               "): kernel and stride must be positive, pad in [0, kernel / 2]");
}

ir::Value* MaxPool2d::forward(ir::Value* x) {
  return ops::apply("max_pool2d", {x}, pool_attrs(kernel_, stride_, pad_));
}

std::string MaxPool2d::describe() const {
  return fmt::format("MaxPool2d({}x{}, stride {}, pad {})", kernel_, kernel_, stride_, pad_);
}

AvgPool2d::AvgPool2d(std::int64_t kernel, std::int64_t stride, std::int64_t pad,
                     bool count_include_pad)
    : kernel_(kernel),
      stride_(stride == 0 ? kernel : stride),
      pad_(pad),
      count_include_pad_(count_include_pad) {
  MINIDL_CHECK(kernel_ > 0 && stride_ > 0 && pad_ >= 0 && 2 * pad_ <= kernel_, "AvgPool2d(", kernel,
               ", stride ", stride, ", pad ", pad,
               "): kernel and stride must be positive, pad in [0, kernel / 2]");
}

ir::Value* AvgPool2d::forward(ir::Value* x) {
  ir::Attrs a = pool_attrs(kernel_, stride_, pad_);
  a.set("count_include_pad", count_include_pad_);
  return ops::apply("avg_pool2d", {x}, a);
}

std::string AvgPool2d::describe() const {
  return fmt::format("AvgPool2d({}x{}, stride {}, pad {}{})", kernel_, kernel_, stride_, pad_,
                     count_include_pad_ ? "" : ", count_include_pad false");
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(std::int64_t output_h, std::int64_t output_w)
    : oh_(output_h), ow_(output_w) {
  MINIDL_CHECK(oh_ > 0 && ow_ > 0, "AdaptiveAvgPool2d(", oh_, "x", ow_,
               "): the output size must be positive");
}

ir::Value* AdaptiveAvgPool2d::forward(ir::Value* x) {
  const Shape& s = x->shape();
  MINIDL_CHECK(s.rank() == 4, describe(), " '", name(), "': expected input [N,C,H,W], got ", s);
  const std::int64_t h = s[2], w = s[3];
  // PyTorch's window i covers [floor(i H / OH), ceil((i + 1) H / OH)): when OH divides H these
  // are the equal, disjoint windows of one avg_pool2d; otherwise they differ in size or overlap.
  MINIDL_CHECK(h % oh_ == 0 && w % ow_ == 0, describe(), " '", name(), "': input ", h, "x", w,
               " is not a multiple of the output size ", oh_, "x", ow_,
               " (windows of different sizes are not supported); x=", s);
  const ir::Ints window{h / oh_, w / ow_};
  return ops::apply("avg_pool2d", {x}, {{"kernel", window}, {"stride", window}});
}

std::string AdaptiveAvgPool2d::describe() const {
  return fmt::format("AdaptiveAvgPool2d({}x{})", oh_, ow_);
}

ir::Value* ReLU::forward(ir::Value* x) { return ops::relu(x); }
ir::Value* Sigmoid::forward(ir::Value* x) { return ops::sigmoid(x); }
ir::Value* Tanh::forward(ir::Value* x) { return ops::tanh(x); }
ir::Value* Flatten::forward(ir::Value* x) { return ops::flatten(x); }

BatchNorm::BatchNorm(std::string kind, std::vector<int> ranks, std::int64_t num_features,
                     double eps, double momentum, bool affine, bool track_running_stats)
    : kind_(std::move(kind)),
      ranks_(std::move(ranks)),
      features_(num_features),
      eps_(eps),
      momentum_(momentum),
      affine_(affine),
      track_(track_running_stats) {
  MINIDL_CHECK(features_ > 0 && eps_ >= 0.0 && momentum_ >= 0.0 && momentum_ <= 1.0, kind_, "(",
               features_, ", eps ", eps_, ", momentum ", momentum_,
               "): num_features must be positive, eps >= 0 and momentum in [0, 1]");
  if (affine_) {
    weight_ = register_parameter("weight", Tensor::full({features_}, 1.0f));
    bias_ = register_parameter("bias", Tensor::zeros({features_}));
  }
  if (track_) {
    running_mean_ = register_buffer("running_mean", Tensor::zeros({features_}));
    running_var_ = register_buffer("running_var", Tensor::full({features_}, 1.0f));
    num_batches_tracked_ = register_buffer("num_batches_tracked", Tensor::zeros({}, DType::I64));
  }
}

// PyTorch's reset_parameters: the affine transform and the running statistics start afresh.
void BatchNorm::reset_parameters(std::uint64_t) {
  if (affine_) {
    std::fill_n(weight_.data<float>(), features_, 1.0f);
    std::fill_n(bias_.data<float>(), features_, 0.0f);
  }
  if (track_) {
    std::fill_n(running_mean_.data<float>(), features_, 0.0f);
    std::fill_n(running_var_.data<float>(), features_, 1.0f);
    *num_batches_tracked_.data<std::int64_t>() = 0;
  }
}

ir::Value* BatchNorm::forward(ir::Value* x) {
  const Shape& s = x->shape();
  const bool rank_ok = std::count(ranks_.begin(), ranks_.end(), s.rank()) > 0;
  MINIDL_CHECK(rank_ok && s[1] == features_, describe(), " '", name(), "': expected input ",
               ranks_.size() == 1 ? fmt::format("[N,{},H,W]", features_)
                                  : fmt::format("[N,{}] or [N,{},L]", features_, features_),
               ", got ", s);
  if (s.rank() != 3) return normalize(x);
  // [N,C,L] as [N,C,L,1]: the ops take [N,C] and [N,C,H,W].
  ir::Value* y = normalize(ops::reshape(x, {s[0], s[1], s[2], 1}));
  return ops::reshape(y, s.dims());
}

ir::Value* BatchNorm::normalize(ir::Value* x) {
  ir::Graph& g = x->graph();
  ir::Value* w = affine_ ? parameter_value(g, "weight") : nullptr;
  ir::Value* b = affine_ ? parameter_value(g, "bias") : nullptr;
  if (!training() && track_) {
    return ops::batch_norm(x, buffer_value(g, "running_mean"), buffer_value(g, "running_var"), w, b,
                           eps_);
  }
  ir::Value* stats = ops::bn_stats(x);
  // The global batch's statistics: for the running ones, and under --sync-bn
  // (parallel::use_global_statistics) for the normalisation too. Every replica's forward sums
  // its own (a cross_replica_sum is a collective: each replica must reach it).
  ir::Value* global =
      training() ? ops::cross_replica_sum(stats, name().empty() ? "stats" : name() + ".stats")
                 : nullptr;
  auto [mean, var] = ops::bn_moments(stats);
  ir::Value* y = ops::batch_norm(x, mean, var, w, b, eps_);
  if (global == nullptr || !track_) return y;
  // The sums are the same in every replica, so only the first forward in this graph updates
  // the buffers.
  ir::Value* running_mean = buffer_value(g, "running_mean");
  const auto& users = running_mean->users();
  const bool updated = std::any_of(users.begin(), users.end(), [&](const ir::Node* u) {
    for (std::size_t o = 0; o < u->outputs().size(); ++o) {
      const int in = u->def().shares_input(static_cast<int>(o));
      if (in >= 0 && !u->def().is_alias() && u->input(in) == running_mean) return true;
    }
    return false;
  });
  if (!updated) {
    ops::bn_update_running(running_mean, buffer_value(g, "running_var"),
                           buffer_value(g, "num_batches_tracked"), global, momentum_);
  }
  return y;
}

std::string BatchNorm::describe() const {
  std::string extra;
  if (eps_ != 1e-5) extra += fmt::format(", eps={}", eps_);
  if (momentum_ != 0.1) extra += fmt::format(", momentum={}", momentum_);
  if (!affine_) extra += ", affine=False";
  if (!track_) extra += ", track_running_stats=False";
  return fmt::format("{}({}{})", kind_, features_, extra);
}

Sequential& Sequential::add(std::unique_ptr<Module> m, std::string name) {
  if (name.empty()) name = std::to_string(children().size());
  register_module(std::move(name), std::move(m));
  return *this;
}

ir::Value* Sequential::forward(ir::Value* x) {
  for (const Child& c : children()) x = (*c.module)(x);
  return x;
}

std::string Sequential::describe() const {
  std::string s;
  for (const Child& c : children())
    s += fmt::format("{}{}: {}", s.empty() ? "" : ", ", c.name, c.module->describe());
  return "Sequential(" + s + ")";
}

Module& Residual::adopt_child(std::unique_ptr<Module> m, std::string name) {
  if (name.empty()) name = std::to_string(children().size());
  return register_module(std::move(name), std::move(m));
}

Residual& Residual::add(std::unique_ptr<Module> m, std::string name) {
  body_.push_back(&adopt_child(std::move(m), std::move(name)));
  return *this;
}

Residual& Residual::set_shortcut(std::unique_ptr<Module> m, std::string name) {
  MINIDL_CHECK(shortcut_ == nullptr, describe(), ": cannot set the shortcut '", name,
               "': the block has one already");
  shortcut_ = &adopt_child(std::move(m), std::move(name));
  return *this;
}

Residual& Residual::add_post(std::unique_ptr<Module> m, std::string name) {
  post_.push_back(&adopt_child(std::move(m), std::move(name)));
  return *this;
}

ir::Value* Residual::forward(ir::Value* x) {
  ir::Value* y = x;
  for (Module* m : body_) y = (*m)(y);
  ir::Value* s = shortcut_ != nullptr ? (*shortcut_)(x) : x;
  MINIDL_CHECK(y->shape() == s->shape(), "Residual '", name(), "': the body gives ", y->shape(),
               " but the ", shortcut_ != nullptr ? "shortcut" : "identity shortcut", " gives ",
               s->shape(), " for x=", x->shape(),
               shortcut_ != nullptr ? "" : " (a body that changes the shape needs a shortcut)");
  y = ops::add(y, s);
  for (Module* m : post_) y = (*m)(y);
  return y;
}

std::string Residual::describe() const {
  auto list = [&](const std::vector<Module*>& modules) {
    std::string s;
    for (const Module* m : modules)
      for (const Child& c : children())
        if (c.module.get() == m)
          s += fmt::format("{}{}: {}", s.empty() ? "" : ", ", c.name, m->describe());
    return s;
  };
  std::string shortcut = "identity";
  for (const Child& c : children())
    if (c.module.get() == shortcut_) {
      shortcut = c.name == "shortcut" ? c.module->describe()
                                      : fmt::format("{}: {}", c.name, c.module->describe());
    }
  std::string s = fmt::format("Residual(body: [{}], shortcut: {}", list(body_), shortcut);
  if (!post_.empty()) s += fmt::format(", post: [{}]", list(post_));
  return s + ")";
}

namespace {
// The activations by name: make_activation and the app's --activation values both read it.
const std::vector<std::pair<std::string, std::unique_ptr<Module> (*)()>>& activations() {
  static const std::vector<std::pair<std::string, std::unique_ptr<Module> (*)()>> table{
      {"relu", []() -> std::unique_ptr<Module> { return std::make_unique<ReLU>(); }},
      {"sigmoid", []() -> std::unique_ptr<Module> { return std::make_unique<Sigmoid>(); }},
      {"tanh", []() -> std::unique_ptr<Module> { return std::make_unique<Tanh>(); }},
  };
  return table;
}
}  // namespace

std::vector<std::string> activation_names() {
  std::vector<std::string> names;
  for (const auto& [name, make] : activations()) names.push_back(name);
  return names;
}

std::unique_ptr<Module> make_activation(const std::string& name) {
  for (const auto& [known, make] : activations())
    if (known == name) return make();
  MINIDL_FAIL("unknown activation '", name, "' (expected ",
              fmt::format("{}", fmt::join(activation_names(), ", ")), ")");
}

Dropout::Dropout(double p) : p_(p) {
  MINIDL_CHECK(p >= 0.0 && p < 1.0, "Dropout(", p, "): p must be in [0, 1)");
}

ir::Value* Dropout::forward(ir::Value* x) {
  if (!training() || p_ == 0.0) return x;
  ir::Value* key = ops::rng_key(x->graph());
  // The same seed and name give the same node seed in every graph built for the model.
  const std::uint64_t seed = mix64(seed_ ^ name_hash(name()));
  return ops::dropout(x, key, p_, static_cast<std::int64_t>(seed)).first;
}

void Dropout::reset_parameters(std::uint64_t seed) { seed_ = seed; }

std::string Dropout::describe() const { return fmt::format("Dropout(p={})", p_); }

void load_state_dict(Module& m, const NamedTensors& values, const std::string& source) {
  NamedTensors state = m.state_dict();
  const auto shards = m.parameter_shards();  // a part takes its part of the whole value
  std::string problems;
  for (auto& [name, t] : state) {
    auto it =
        std::find_if(values.begin(), values.end(), [&](const auto& v) { return v.first == name; });
    const train::ParameterShard* s = train::find_shard(shards, name);
    const Shape& shape = s != nullptr ? s->whole : t.shape();
    if (it == values.end()) {
      problems += fmt::format("; missing '{}' {}", name, shape);
    } else if (it->second.shape() != shape || it->second.dtype() != t.dtype()) {
      problems += fmt::format("; '{}' is {} {} in the file, the model has {} {}", name,
                              it->second.shape(), it->second.dtype(), shape, t.dtype());
    }
  }
  for (const auto& [name, t] : values) {
    auto it =
        std::find_if(state.begin(), state.end(), [&](const auto& p) { return p.first == name; });
    if (it == state.end()) problems += fmt::format("; unexpected '{}' {}", name, t.shape());
  }
  MINIDL_CHECK(problems.empty(), "'", source, "' does not match the model", problems);
  for (auto& [name, t] : state) {
    const train::ParameterShard* s = train::find_shard(shards, name);
    for (const auto& [vn, v] : values) {
      if (vn != name) continue;
      t.copy_from(s != nullptr ? parallel::take_piece(v, t.shape(), s->index, s->count) : v);
    }
  }
}

void load_state_dict(Module& m, const std::string& path) {
  load_state_dict(m, load_safetensors(path).tensors, path);
}

void save_state_dict(Module& m, const std::string& path) {
  const auto shards = m.parameter_shards();
  MINIDL_CHECK(shards.empty(), "cannot save '", path, "': parameter '", shards.front().first,
               "' is stored as a part of ", shards.front().second.whole,
               " (train::unshard_parameters stores it whole)");
  save_safetensors(path, m.state_dict(), {{"format", "pt"}, {"framework", "minidl"}});
}

}  // namespace minidl::nn
