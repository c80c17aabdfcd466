#include "minidl/io/datasets.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "minidl/core/error.hpp"
#include "minidl/core/threading.hpp"

namespace minidl {

namespace {

namespace fs = std::filesystem;
using detail::concat;

using Bytes = std::vector<std::uint8_t>;

/// What one kind of IDX file holds; the magic's low byte is the rank, 0x08 before it means u8.
struct IdxKind {
  std::string_view name;  // "image" or "label"
  std::uint32_t magic;
  std::string_view dims;      // names of the dimensions, for messages
  std::string_view elements;  // what the elements are, for messages
};
constexpr IdxKind kImages{"image", 0x00000803, "N, H, W", "pixel data"};
constexpr IdxKind kLabels{"label", 0x00000801, "N", "labels"};

std::uint32_t read_be32(const std::uint8_t* p) {
  return std::uint32_t{p[0]} << 24 | std::uint32_t{p[1]} << 16 | std::uint32_t{p[2]} << 8 | p[3];
}

std::uint32_t read_le32(const std::uint8_t* p) {
  return std::uint32_t{p[3]} << 24 | std::uint32_t{p[2]} << 16 | std::uint32_t{p[1]} << 8 | p[0];
}

/// Fails with a message naming path unless it is an existing regular (or special) file.
void check_is_file(const std::string& path, std::string_view what) {
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    MINIDL_FAIL("cannot access ", what, " '", path, "': ", ec.message());
  }
  MINIDL_CHECK(fs::exists(st), "cannot open ", what, " '", path, "': it does not exist");
  MINIDL_CHECK(!fs::is_directory(st), "cannot open ", what, " '", path,
               "': it is a directory, expected a file");
}

/// The whole content of path.
Bytes read_file(const std::string& path, std::string_view what) {
  check_is_file(path, what);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (f == nullptr) MINIDL_FAIL("cannot read ", what, " '", path, "': ", std::strerror(errno));
  std::error_code ec;
  const std::uintmax_t expected = fs::file_size(path, ec);
  Bytes bytes(ec ? std::size_t{1} << 16 : static_cast<std::size_t>(expected) + 1);
  std::size_t n = 0;
  // Read until EOF rather than trusting the size, which may change under us or be 0 (a pipe).
  for (;;) {
    if (n == bytes.size()) bytes.resize(bytes.size() * 2);
    const std::size_t got = std::fread(bytes.data() + n, 1, bytes.size() - n, f.get());
    n += got;
    if (got == 0) break;
  }
  if (std::ferror(f.get())) {
    MINIDL_FAIL("cannot read ", what, " '", path, "': ", std::strerror(errno), " after ", n,
                " bytes");
  }
  bytes.resize(n);
  return bytes;
}

bool is_gzip(const Bytes& b) { return b.size() >= 2 && b[0] == 0x1f && b[1] == 0x8b; }

/// Decompresses a gzip file (one or more concatenated members) read from path.
Bytes gunzip(const Bytes& in, const std::string& path) {
  // The trailer's ISIZE is the size mod 2^32 of the last member: a good first guess, capped by
  // deflate's best ratio (about 1032:1) so a corrupt trailer cannot ask for a huge buffer.
  std::size_t guess = in.size() >= 18 ? read_le32(in.data() + in.size() - 4) : 0;
  guess = std::min(guess, in.size() * 1032);
  Bytes out(std::max<std::size_t>(guess + 64, std::size_t{1} << 16));

  z_stream zs{};
  MINIDL_CHECK(inflateInit2(&zs, 16 + MAX_WBITS) == Z_OK, "cannot start zlib to decompress '", path,
               "'");
  std::unique_ptr<z_stream, int (*)(z_stream*)> guard(&zs, &inflateEnd);

  constexpr std::size_t kChunk = std::size_t{1} << 30;  // avail_in/avail_out are 32-bit
  std::size_t in_pos = 0;
  std::size_t out_pos = 0;
  for (;;) {
    if (out_pos == out.size()) out.resize(out.size() * 2);
    zs.next_in = const_cast<Bytef*>(in.data() + in_pos);
    zs.avail_in = static_cast<uInt>(std::min(in.size() - in_pos, kChunk));
    zs.next_out = out.data() + out_pos;
    zs.avail_out = static_cast<uInt>(std::min(out.size() - out_pos, kChunk));
    const uInt avail_in = zs.avail_in;
    const uInt avail_out = zs.avail_out;
    const int rc = inflate(&zs, Z_NO_FLUSH);
    in_pos += avail_in - zs.avail_in;
    out_pos += avail_out - zs.avail_out;
    if (rc == Z_STREAM_END) {
      if (in_pos == in.size()) break;
      if (in.size() - in_pos >= 2 && in[in_pos] == 0x1f && in[in_pos + 1] == 0x8b) {
        inflateReset(&zs);  // another gzip member follows
        continue;
      }
      MINIDL_FAIL("corrupt gzip stream in '", path, "': ", in.size() - in_pos,
                  " bytes of trailing data at compressed byte offset ", in_pos,
                  ", expected the end of the file or another gzip member");
    }
    if (rc == Z_MEM_ERROR) throw std::bad_alloc();
    if (rc != Z_OK && rc != Z_BUF_ERROR) {
      MINIDL_FAIL("corrupt gzip stream in '", path, "' near compressed byte offset ", in_pos, ": ",
                  zs.msg != nullptr ? zs.msg : "invalid data");
    }
    if (in_pos == in.size() && zs.avail_out > 0) {
      MINIDL_FAIL("corrupt gzip stream in '", path, "': the compressed data ends at byte ",
                  in.size(), " before the end of the stream (truncated file?)");
    }
  }
  out.resize(out_pos);
  return out;
}

/// A data file's content, decompressed when it is gzip (detected by its magic bytes, not its
/// name).
struct DataFile {
  Bytes bytes;
  bool gz = false;
};

DataFile read_data_file(const std::string& path, std::string_view what) {
  DataFile f;
  f.bytes = read_file(path, what);
  if (is_gzip(f.bytes)) {
    f.gz = true;
    f.bytes = gunzip(f.bytes, path);
  }
  return f;
}

/// One IDX file's content, its dimensions and where its elements start.
struct IdxFile {
  std::string path;
  std::string_view kind;  // "image" or "label"
  bool gz = false;
  Bytes bytes;
  std::vector<std::int64_t> dims;
  std::size_t data_offset = 0;

  /// "IDX image file 'p'", with a note that offsets count decompressed bytes for a gzip file.
  std::string desc() const {
    return concat("IDX ", kind, " file '", path, "'",
                  gz ? " (gzip; offsets count decompressed bytes)" : "");
  }
};

std::string_view idx_type_name(std::uint8_t code) {
  switch (code) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "i16";
    case 0x0C:
      return "i32";
    case 0x0D:
      return "f32";
    case 0x0E:
      return "f64";
    default:
      return {};
  }
}

/// Reads and validates an IDX file of the given kind.
IdxFile read_idx_file(const std::string& path, const IdxKind& k) {
  IdxFile f;
  f.path = path;
  f.kind = k.name;
  DataFile content = read_data_file(path, concat("IDX ", k.name, " file"));
  f.bytes = std::move(content.bytes);
  f.gz = content.gz;
  const Bytes& b = f.bytes;
  const int rank = static_cast<int>(k.magic & 0xff);

  MINIDL_CHECK(b.size() >= 4, "truncated ", f.desc(),
               ": expected a 4-byte magic number at offset 0, file has only ", b.size(), " bytes");
  const std::uint32_t found = read_be32(b.data());
  if (found != k.magic) {
    const std::uint32_t other = k.magic == kImages.magic ? kLabels.magic : kImages.magic;
    const bool idx_like = b[0] == 0 && b[1] == 0 && !idx_type_name(b[2]).empty();
    if (idx_like && b[2] == 0x08) {
      MINIDL_FAIL(
          "wrong number of dimensions in ", f.desc(), ": ", int{b[3]}, " (magic ",
          fmt::format("{:#010x}", found), " at offset 0), expected ", rank, " (", k.dims, ")",
          found == other ? concat("; it looks like an IDX ", k.name == "image" ? "label" : "image",
                                  " file: are the image and label paths swapped?")
                         : std::string());
    }
    if (idx_like) {
      MINIDL_FAIL("wrong element type in ", f.desc(), ": ", idx_type_name(b[2]), " (magic ",
                  fmt::format("{:#010x}", found), " at offset 0), expected unsigned bytes (",
                  fmt::format("{:#010x}", k.magic), ")");
    }
    MINIDL_FAIL("wrong magic number in ", f.desc(), ": found ", fmt::format("{:#010x}", found),
                " at offset 0, expected ", fmt::format("{:#010x}", k.magic), " for an IDX ", k.name,
                " file");
  }

  const std::size_t header = 4 + 4 * static_cast<std::size_t>(rank);
  MINIDL_CHECK(b.size() >= header, "truncated ", f.desc(), ": expected the ", header,
               "-byte header (magic and ", rank,
               rank == 1 ? " dimension: " : " dimensions: ", k.dims,
               ") at offset 0, file has only ", b.size(), " bytes");
  std::uint64_t count = 1;
  bool overflow = false;
  for (std::size_t i = 0; i < static_cast<std::size_t>(rank); ++i) {
    const std::uint32_t d = read_be32(b.data() + 4 + 4 * i);
    f.dims.push_back(d);
    overflow = overflow || __builtin_mul_overflow(count, std::uint64_t{d}, &count);
  }
  const std::string dims_str = Shape(f.dims).str();
  MINIDL_CHECK(std::find(f.dims.begin(), f.dims.end(), 0) == f.dims.end(),
               "zero dimension in the header of ", f.desc(), ": ", dims_str, " (", k.dims,
               ") at offset 4, expected every dimension > 0");
  const std::size_t available = b.size() - header;
  MINIDL_CHECK(!overflow && count <= available, "truncated ", f.desc(), ": expected ",
               overflow ? std::string("more than 2^64") : concat(count), " bytes of ", k.elements,
               " at offset ", header, " (dimensions ", dims_str, "), file has only ", b.size(),
               " bytes (", available, " after the header)");
  MINIDL_CHECK(count == available, "trailing bytes in ", f.desc(), ": ", available - count,
               " unexpected bytes at offset ", header + count, ": expected ", header + count,
               " bytes in all (", header, "-byte header and ", count, " bytes of ", k.elements,
               " for dimensions ", dims_str, "), found ", b.size());
  f.data_offset = header;
  return f;
}

/// Checks that dir is an existing directory; the message says how to fetch dataset.
void check_data_dir(const std::string& dir, const std::string& dataset) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  MINIDL_CHECK(fs::exists(st), "data directory '", dir, "' does not exist; run scripts/fetch-data ",
               dataset, " (it fills data/", dataset, " at the repository root, or --dest DIR)");
  MINIDL_CHECK(fs::is_directory(st), "data directory '", dir, "' is not a directory");
}

/// dir/base if it exists, else dir/base.gz.
std::string pick_file(const std::string& dir, const std::string& base, const std::string& dataset) {
  std::error_code ec;
  const fs::path raw = fs::path(dir) / base;
  if (fs::exists(raw, ec)) return raw.string();
  const fs::path gz = fs::path(dir) / (base + ".gz");
  if (fs::exists(gz, ec)) return gz.string();
  MINIDL_FAIL("data directory '", dir, "' has neither '", base, "' nor '", base,
              ".gz'; run scripts/fetch-data ", dataset, " to fetch the missing files");
}

constexpr std::int64_t kCifarChannels = 3, kCifarSide = 32;
constexpr std::int64_t kCifarPixels = kCifarChannels * kCifarSide * kCifarSide;  // 3072
constexpr std::int64_t kCifarRecord = 1 + kCifarPixels;                          // 3073

/// The record count of a CIFAR-10 batch file of `size` bytes, or an error naming the file and
/// where its size goes wrong.
std::int64_t cifar_records(const std::string& desc, std::size_t size,
                           std::int64_t records_per_file) {
  const auto found = static_cast<std::int64_t>(size);
  const std::string layout =
      concat(kCifarRecord, "-byte records: 1 label byte and ", kCifarPixels, " pixel bytes");
  if (records_per_file <= 0) {
    MINIDL_CHECK(found > 0, "empty ", desc, ": expected one or more ", layout);
    MINIDL_CHECK(found % kCifarRecord == 0, "truncated ", desc, ": it ends at byte offset ", found,
                 ", inside record ", found / kCifarRecord, " (which starts at offset ",
                 found / kCifarRecord * kCifarRecord, " and needs ", kCifarRecord,
                 " bytes); expected a whole number of ", layout);
    return found / kCifarRecord;
  }
  const std::int64_t expected = records_per_file * kCifarRecord;
  const std::string want =
      concat("expected ", expected, " bytes (", records_per_file, " ", layout, ")");
  if (found < expected) {
    const std::int64_t r = found / kCifarRecord;
    MINIDL_FAIL("truncated ", desc, ": found ", found, " bytes, ", want, "; ",
                found == 0 ? std::string("the file is empty")
                : found % kCifarRecord == 0
                    ? concat("the file ends at byte offset ", found, ", after record ", r - 1)
                    : concat("the file ends at byte offset ", found, ", inside record ", r,
                             " (which starts at offset ", r * kCifarRecord, ")"));
  }
  MINIDL_CHECK(found == expected, "trailing bytes in ", desc, ": ", found - expected,
               " unexpected bytes at offset ", expected, "; ", want, ", found ", found);
  return records_per_file;
}

}  // namespace

std::int64_t Dataset::size() const { return labels.shape().rank() == 1 ? labels.shape()[0] : 0; }

Dataset read_idx(const std::string& images_path, const std::string& labels_path, std::string name,
                 int num_classes) {
  MINIDL_CHECK(num_classes >= 1, "num_classes must be at least 1, got ", num_classes, " (reading '",
               labels_path, "')");
  const IdxFile img = read_idx_file(images_path, kImages);
  const IdxFile lab = read_idx_file(labels_path, kLabels);
  const std::int64_t n = img.dims[0];
  const std::int64_t h = img.dims[1];
  const std::int64_t w = img.dims[2];
  MINIDL_CHECK(lab.dims[0] == n, "image file '", images_path, "' holds ", n,
               " images but label file '", labels_path, "' holds ", lab.dims[0],
               " labels; expected one label per image");

  Dataset d;
  d.name = std::move(name);
  d.num_classes = num_classes;

  d.labels = Tensor::empty(Shape{n}, DType::I32);
  const std::uint8_t* lsrc = lab.bytes.data() + lab.data_offset;
  std::int32_t* ldst = d.labels.data<std::int32_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    if (lsrc[i] >= num_classes) {
      MINIDL_FAIL("label out of range in ", lab.desc(), ": sample ", i, " at byte offset ",
                  lab.data_offset + i, " has label ", int{lsrc[i]}, ", expected 0..",
                  num_classes - 1, " (num_classes ", num_classes, ")");
    }
    ldst[i] = lsrc[i];
  }

  d.images = Tensor::empty(Shape{n, 1, h, w}, DType::F32);
  const std::uint8_t* src = img.bytes.data() + img.data_offset;
  float* dst = d.images.data<float>();
  // Division, not a multiply by 1/255: it rounds exactly as torchvision's ToTensor (x / 255).
  parallel_for(d.images.numel(), 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) dst[i] = static_cast<float>(src[i]) / 255.0f;
  });
  return d;
}

Dataset load_mnist(const std::string& dir, const std::string& split, const std::string& dataset) {
  MINIDL_CHECK(split == "train" || split == "test", "unknown ", dataset, " split '", split,
               "', expected 'train' or 'test'");
  check_data_dir(dir, dataset);
  const std::string prefix = split == "train" ? "train" : "t10k";
  return read_idx(pick_file(dir, prefix + "-images-idx3-ubyte", dataset),
                  pick_file(dir, prefix + "-labels-idx1-ubyte", dataset), dataset + "/" + split);
}

Dataset read_cifar10(const std::vector<std::string>& paths, std::string name,
                     std::int64_t records_per_file) {
  MINIDL_CHECK(!paths.empty(), "read_cifar10: no batch files given for '", name, "'");
  std::vector<DataFile> files;
  std::vector<std::int64_t> counts;
  std::int64_t n = 0;
  for (const std::string& path : paths) {
    files.push_back(read_data_file(path, "CIFAR-10 batch file"));
    const std::string desc =
        concat("CIFAR-10 batch file '", path, "'",
               files.back().gz ? " (gzip; offsets count decompressed bytes)" : "");
    counts.push_back(cifar_records(desc, files.back().bytes.size(), records_per_file));
    const std::uint8_t* b = files.back().bytes.data();
    for (std::int64_t r = 0; r < counts.back(); ++r) {
      const std::uint8_t label = b[r * kCifarRecord];
      if (label > 9) {
        MINIDL_FAIL("label out of range in ", desc, ": record ", r, " at byte offset ",
                    r * kCifarRecord, " has label ", int{label}, ", expected 0..9");
      }
    }
    n += counts.back();
  }

  Dataset d;
  d.name = std::move(name);
  d.num_classes = 10;
  d.images = Tensor::empty(Shape{n, kCifarChannels, kCifarSide, kCifarSide}, DType::F32);
  d.labels = Tensor::empty(Shape{n}, DType::I32);
  float* dst = d.images.data<float>();
  std::int32_t* labels = d.labels.data<std::int32_t>();
  std::int64_t first = 0;
  for (std::size_t f = 0; f < files.size(); ++f) {
    const std::uint8_t* b = files[f].bytes.data();
    // A record is its label and the R, G and B planes, row-major: exactly [3, 32, 32].
    parallel_for(counts[f], kCifarPixels, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const std::uint8_t* rec = b + r * kCifarRecord;
        labels[first + r] = rec[0];
        float* img = dst + (first + r) * kCifarPixels;
        for (std::int64_t i = 0; i < kCifarPixels; ++i) {
          img[i] = static_cast<float>(rec[1 + i]) / 255.0f;  // as torchvision's ToTensor
        }
      }
    });
    first += counts[f];
  }
  return d;
}

DatasetSplits load_cifar10(const std::string& dir, std::int64_t records_per_file) {
  check_data_dir(dir, "cifar10");
  std::vector<std::string> train;
  for (int i = 1; i <= 5; ++i) {
    train.push_back(pick_file(dir, fmt::format("data_batch_{}.bin", i), "cifar10"));
  }
  const std::string test = pick_file(dir, "test_batch.bin", "cifar10");
  return {read_cifar10(train, "cifar10/train", records_per_file),
          read_cifar10({test}, "cifar10/test", records_per_file)};
}

ChannelStats channel_stats(const Dataset& d) {
  const Shape& s = d.images.shape();
  MINIDL_CHECK(s.rank() >= 2 && s.numel() > 0, "channel statistics of '", d.name,
               "': expected non-empty images [N, C, ...], got ", s);
  const std::int64_t n = s[0], channels = s[1], plane = s.numel() / (n * channels);
  const float* x = d.images.data<float>();
  // One partial sum per (sample, channel) plane, added in a fixed order afterwards: the same
  // result for any thread count. Two passes (mean, then squared deviations from it) avoid the
  // cancellation of E[x^2] - E[x]^2.
  std::vector<double> part(static_cast<std::size_t>(n * channels));
  // The mean of each channel's values, or of their squared deviations from center when given.
  auto channel_means = [&](const std::vector<double>* center) {
    parallel_for(n * channels, plane, [&](std::int64_t p0, std::int64_t p1) {
      for (std::int64_t p = p0; p < p1; ++p) {
        const float* xp = x + p * plane;
        double acc = 0.0;
        if (center == nullptr) {
          for (std::int64_t i = 0; i < plane; ++i) acc += xp[i];
        } else {
          const double c = (*center)[p % channels];
          for (std::int64_t i = 0; i < plane; ++i) acc += (xp[i] - c) * (xp[i] - c);
        }
        part[p] = acc;
      }
    });
    std::vector<double> out(static_cast<std::size_t>(channels), 0.0);
    for (std::int64_t p = 0; p < n * channels; ++p) out[p % channels] += part[p];
    for (double& v : out) v /= static_cast<double>(n * plane);
    return out;
  };
  ChannelStats st;
  st.mean = channel_means(nullptr);
  st.stddev = channel_means(&st.mean);
  for (double& v : st.stddev) v = std::sqrt(v);
  return st;
}

void normalize_channels(Dataset& d, const ChannelStats& stats) {
  const Shape& s = d.images.shape();
  MINIDL_CHECK(s.rank() >= 2 && static_cast<std::size_t>(s[1]) == stats.mean.size() &&
                   stats.stddev.size() == stats.mean.size(),
               "normalising '", d.name, "': images ", s, " do not have the ", stats.mean.size(),
               " channels of the statistics");
  if (s.numel() == 0) return;
  const std::int64_t channels = s[1], plane = s.numel() / (s[0] * channels);
  float* x = d.images.data<float>();
  parallel_for(s[0] * channels, plane, [&](std::int64_t p0, std::int64_t p1) {
    for (std::int64_t p = p0; p < p1; ++p) {
      const auto mean = static_cast<float>(stats.mean[p % channels]);
      const double sd = stats.stddev[p % channels];
      const auto inv = static_cast<float>(sd > 0.0 ? 1.0 / sd : 1.0);
      float* xp = x + p * plane;
#pragma omp simd
      for (std::int64_t i = 0; i < plane; ++i) xp[i] = (xp[i] - mean) * inv;
    }
  });
}

namespace {

DatasetSplits load_mnist_like(const std::string& dir, const std::string& name) {
  return {load_mnist(dir, "train", name), load_mnist(dir, "test", name)};
}

/// The datasets load_dataset knows: a name and how to load a directory of its files.
struct DatasetEntry {
  std::string_view name;
  DatasetSplits (*load)(const std::string& dir, const std::string& name);
};
constexpr DatasetEntry kDatasets[] = {
    {"mnist", load_mnist_like},
    {"fashion-mnist", load_mnist_like},
    {"cifar10", [](const std::string& dir, const std::string&) { return load_cifar10(dir); }},
};

}  // namespace

std::vector<std::string> dataset_names() {
  std::vector<std::string> names;
  for (const DatasetEntry& e : kDatasets) names.emplace_back(e.name);
  return names;
}

DatasetSplits load_dataset(const std::string& name, const std::string& dir) {
  for (const DatasetEntry& e : kDatasets) {
    if (e.name == name) return e.load(dir, name);
  }
  std::string known;
  for (const DatasetEntry& e : kDatasets) known += concat(known.empty() ? "" : ", ", e.name);
  MINIDL_FAIL("unknown dataset '", name, "' (known: ", known, ")");
}

Dataset take(const Dataset& d, std::int64_t n) {
  if (n <= 0 || n >= d.size()) return d;
  Dataset out;
  out.name = d.name;
  out.num_classes = d.num_classes;
  Shape ishape = d.images.shape();
  ishape[0] = n;
  out.images = Tensor::empty(ishape, d.images.dtype());
  std::memcpy(out.images.raw(), d.images.raw(), out.images.nbytes());
  Shape lshape = d.labels.shape();
  lshape[0] = n;
  out.labels = Tensor::empty(lshape, d.labels.dtype());
  std::memcpy(out.labels.raw(), d.labels.raw(), out.labels.nbytes());
  return out;
}

Dataset upscale(const Dataset& d, std::int64_t k) {
  MINIDL_CHECK(k >= 1 && k <= 64, "upscale factor must be in [1, 64], got ", k);
  if (k == 1) return d;
  const Shape& s = d.images.shape();
  MINIDL_CHECK(s.rank() == 4, "upscale expects images [N,C,H,W], got ", s);
  const std::int64_t n = s[0], c = s[1], h = s[2], w = s[3];
  Dataset out = d;
  out.images = Tensor::empty({n, c, h * k, w * k});
  const float* src = d.images.data<float>();
  float* dst = out.images.data<float>();
  parallel_for(n * c, h * w * k * k, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t plane = b; plane < e; ++plane) {
      const float* in = src + plane * h * w;
      float* o = dst + plane * h * w * k * k;
      for (std::int64_t y = 0; y < h * k; ++y)
        for (std::int64_t x = 0; x < w * k; ++x) o[y * w * k + x] = in[(y / k) * w + x / k];
    }
  });
  return out;
}

}  // namespace minidl
