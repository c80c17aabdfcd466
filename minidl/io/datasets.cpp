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
#include "minidl/io/file.hpp"

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

/// deflate's best ratio is about 1032:1: a gzip file of n bytes cannot inflate to more.
constexpr std::uint64_t kMaxInflateRatio = 1032;

/// A data file read front to back as a stream of its content, decompressed on the way when it
/// is gzip (one or more concatenated members; detected by the magic bytes, not the name). Only
/// what is asked for is read or inflated, so a reader that knows the expected size from a header
/// stops at that size + 1 byte however much the file holds or would inflate to.
class DataSource {
 public:
  DataSource(const std::string& path, std::string_view what)
      : path_(path), what_(what), file_(open_input(path, what)), in_(std::size_t{1} << 16) {
    refill();
    gz_ = in_end_ >= 2 && in_[0] == 0x1f && in_[1] == 0x8b;
    if (gz_) {
      MINIDL_CHECK(inflateInit2(&zs_, 16 + MAX_WBITS) == Z_OK, "cannot start zlib to decompress '",
                   path, "'");
      zlib_ = true;
    }
  }
  DataSource(const DataSource&) = delete;
  DataSource& operator=(const DataSource&) = delete;
  ~DataSource() {
    if (zlib_) inflateEnd(&zs_);
  }

  bool gz() const { return gz_; }
  /// The file's size on disk (compressed, for a gzip file).
  std::uint64_t file_size() const { return file_.size; }
  /// The most content the file can hold: its size, or what its size can inflate to.
  std::uint64_t max_content() const {
    return gz_ ? (file_.size > UINT64_MAX / kMaxInflateRatio ? UINT64_MAX
                                                             : file_.size * kMaxInflateRatio)
               : file_.size;
  }

  /// Up to n bytes of the content, fewer only at its end.
  std::size_t read(std::uint8_t* dst, std::size_t n) {
    return gz_ ? inflate_into(dst, n) : copy_into(dst, n);
  }

 private:
  /// Moves what is left of the input buffer to its front and fills the rest from the file.
  void refill() {
    if (in_pos_ > 0) {
      std::memmove(in_.data(), in_.data() + in_pos_, in_end_ - in_pos_);
      in_end_ -= in_pos_;
      in_pos_ = 0;
    }
    const std::size_t want = in_.size() - in_end_;
    const std::size_t got = read_input(file_, in_.data() + in_end_, want, path_, what_);
    in_end_ += got;
    in_eof_ = got < want;
  }

  std::size_t copy_into(std::uint8_t* dst, std::size_t n) {
    const std::size_t buffered = std::min(n, in_end_ - in_pos_);
    std::memcpy(dst, in_.data() + in_pos_, buffered);
    in_pos_ += buffered;
    consumed_ += buffered;
    return buffered + read_input(file_, dst + buffered, n - buffered, path_, what_);
  }

  std::size_t inflate_into(std::uint8_t* dst, std::size_t n) {
    std::size_t done = 0;
    while (done < n && !finished_) {
      if (in_pos_ == in_end_ && !in_eof_) refill();
      zs_.next_in = in_.data() + in_pos_;
      zs_.avail_in = static_cast<uInt>(in_end_ - in_pos_);
      zs_.next_out = dst + done;
      zs_.avail_out = static_cast<uInt>(std::min<std::size_t>(n - done, std::size_t{1} << 30));
      const uInt avail_in = zs_.avail_in, avail_out = zs_.avail_out;
      const int rc = inflate(&zs_, Z_NO_FLUSH);
      in_pos_ += avail_in - zs_.avail_in;
      consumed_ += avail_in - zs_.avail_in;
      done += avail_out - zs_.avail_out;
      if (rc == Z_STREAM_END) {
        if (in_end_ - in_pos_ < 2 && !in_eof_) refill();
        if (in_pos_ == in_end_) {
          finished_ = true;
          break;
        }
        if (in_end_ - in_pos_ >= 2 && in_[in_pos_] == 0x1f && in_[in_pos_ + 1] == 0x8b) {
          inflateReset(&zs_);  // another gzip member follows
          continue;
        }
        MINIDL_FAIL("corrupt gzip stream in '", path_, "': ", file_.size - consumed_,
                    " bytes of trailing data at compressed byte offset ", consumed_,
                    ", expected the end of the file or another gzip member");
      }
      if (rc == Z_MEM_ERROR) throw std::bad_alloc();
      if (rc != Z_OK && rc != Z_BUF_ERROR) {
        MINIDL_FAIL("corrupt gzip stream in '", path_, "' near compressed byte offset ", consumed_,
                    ": ", zs_.msg != nullptr ? zs_.msg : "invalid data");
      }
      if (in_pos_ == in_end_ && in_eof_ && zs_.avail_out > 0) {
        MINIDL_FAIL("corrupt gzip stream in '", path_, "': the compressed data ends at byte ",
                    consumed_, " before the end of the stream (truncated file?)");
      }
    }
    return done;
  }

  std::string path_;
  std::string what_;
  InputFile file_;
  Bytes in_;  // compressed (or raw) bytes read ahead: [in_pos_, in_end_)
  std::size_t in_pos_ = 0, in_end_ = 0;
  bool in_eof_ = false;
  std::uint64_t consumed_ = 0;  // bytes of the file used so far
  bool gz_ = false, zlib_ = false, finished_ = false;
  z_stream zs_{};
};

/// "the file holds S bytes" or, for gzip, what its compressed size allows.
std::string content_limit(const DataSource& src) {
  return src.gz() ? concat("a gzip file of ", src.file_size(), " bytes inflates to at most ",
                           src.max_content())
                  : concat("the file holds ", src.file_size());
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

/// Reads and validates an IDX file of the given kind: the header first, then exactly the
/// elements it announces (checked against what the file can hold before they are allocated) and
/// one byte more to find trailing bytes.
IdxFile read_idx_file(const std::string& path, const IdxKind& k) {
  IdxFile f;
  f.path = path;
  f.kind = k.name;
  DataSource src(path, concat("IDX ", k.name, " file"));
  f.gz = src.gz();
  const int rank = static_cast<int>(k.magic & 0xff);
  const std::size_t header = 4 + 4 * static_cast<std::size_t>(rank);
  Bytes& b = f.bytes;
  b.resize(header);

  std::size_t got = src.read(b.data(), 4);
  MINIDL_CHECK(got >= 4, "truncated ", f.desc(),
               ": expected a 4-byte magic number at offset 0, file has only ", got, " bytes");
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

  got += src.read(b.data() + 4, header - 4);
  MINIDL_CHECK(got >= header, "truncated ", f.desc(), ": expected the ", header,
               "-byte header (magic and ", rank,
               rank == 1 ? " dimension: " : " dimensions: ", k.dims,
               ") at offset 0, file has only ", got, " bytes");
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
  // Before allocating the elements: the size the header announces against the file's.
  if (!src.gz()) {
    const std::uint64_t size = src.file_size();
    const std::uint64_t available = size - header;
    MINIDL_CHECK(!overflow && count <= available, "truncated ", f.desc(), ": expected ",
                 overflow ? std::string("more than 2^64") : concat(count), " bytes of ", k.elements,
                 " at offset ", header, " (dimensions ", dims_str, "), file has only ", size,
                 " bytes (", available, " after the header)");
    MINIDL_CHECK(count == available, "trailing bytes in ", f.desc(), ": ", available - count,
                 " unexpected bytes at offset ", header + count, ": expected ", header + count,
                 " bytes in all (", header, "-byte header and ", count, " bytes of ", k.elements,
                 " for dimensions ", dims_str, "), found ", size);
  } else {
    MINIDL_CHECK(!overflow && count <= src.max_content() - header, "truncated ", f.desc(),
                 ": expected ", overflow ? std::string("more than 2^64") : concat(count),
                 " bytes of ", k.elements, " at offset ", header, " (dimensions ", dims_str,
                 "), but ", content_limit(src));
  }
  // Grown as the bytes arrive: a gzip file's promise is only an upper bound until inflated.
  const std::size_t total = header + static_cast<std::size_t>(count);
  for (bool more = true; more && got < total;) {
    b.resize(std::min(total, std::max(2 * got, std::size_t{1} << 20)));
    const std::size_t r = src.read(b.data() + got, b.size() - got);
    more = r == b.size() - got;
    got += r;
  }
  MINIDL_CHECK(got == header + count, "truncated ", f.desc(), ": expected ", count, " bytes of ",
               k.elements, " at offset ", header, " (dimensions ", dims_str, "), file has only ",
               got, " bytes (", got - header, " after the header)");
  // One byte more: a gzip stream is inflated no further than that.
  std::uint8_t extra = 0;
  MINIDL_CHECK(src.read(&extra, 1) == 0, "trailing bytes in ", f.desc(),
               ": unexpected bytes from offset ", header + count, ": expected ", header + count,
               " bytes in all (", header, "-byte header and ", count, " bytes of ", k.elements,
               " for dimensions ", dims_str, "), found more (read no further)");
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
  std::vector<Bytes> files;
  std::vector<std::int64_t> counts;
  std::int64_t n = 0;
  for (const std::string& path : paths) {
    DataSource src(path, "CIFAR-10 batch file");
    const std::string desc = concat("CIFAR-10 batch file '", path, "'",
                                    src.gz() ? " (gzip; offsets count decompressed bytes)" : "");
    Bytes& b = files.emplace_back();
    if (!src.gz()) {
      // The size says everything before anything is allocated.
      counts.push_back(cifar_records(desc, src.file_size(), records_per_file));
      b.resize(static_cast<std::size_t>(counts.back() * kCifarRecord));
      const std::size_t got = src.read(b.data(), b.size());
      MINIDL_CHECK(got == b.size(), "truncated ", desc, ": it ended at byte offset ", got,
                   " while being read, expected ", b.size(), " bytes (did it change?)");
    } else {
      // Inflated up to the expected size + 1 byte (or what the compressed size allows).
      const std::uint64_t limit = records_per_file > 0
                                      ? static_cast<std::uint64_t>(records_per_file * kCifarRecord)
                                      : src.max_content();
      std::size_t got = 0;
      for (bool more = true; more;) {
        if (got == b.size()) {
          b.resize(static_cast<std::size_t>(
              std::min<std::uint64_t>(limit + 1, std::max<std::size_t>(2 * b.size(), 1 << 16))));
        }
        const std::size_t want = b.size() - got;
        const std::size_t r = want == 0 ? 0 : src.read(b.data() + got, want);
        got += r;
        more = r == want && want > 0 && got <= limit;
      }
      MINIDL_CHECK(got <= limit, "trailing bytes in ", desc, ": unexpected bytes from offset ",
                   limit, "; expected ", limit, " bytes (", records_per_file, " ", kCifarRecord,
                   "-byte records), found more (read no further)");
      b.resize(got);
      counts.push_back(cifar_records(desc, got, records_per_file));
    }
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
    const std::uint8_t* b = files[f].data();
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
      // In double, rounded once: the standardised pixel is the float nearest (x - mean) / sd.
      // In float, the subtraction and the product would each round, the same way for every
      // pixel of the same value (a picture has 256 levels), so their error would not average
      // out: it moved a BatchNorm's running means 8.8e-6 of their size from PyTorch's in ten
      // steps (docs/results.md, cifar_bn_cnn).
      const double mean = stats.mean[p % channels];
      const double sd = stats.stddev[p % channels];
      const double inv = sd > 0.0 ? 1.0 / sd : 1.0;
      float* xp = x + p * plane;
#pragma omp simd
      for (std::int64_t i = 0; i < plane; ++i) {
        xp[i] = static_cast<float>((static_cast<double>(xp[i]) - mean) * inv);
      }
    }
  });
}

namespace {

DatasetSplits load_mnist_like(const std::string& dir, const std::string& name) {
  DatasetSplits s{load_mnist(dir, "train", name), load_mnist(dir, "test", name)};
  // A model built for the training images could not take test images of another size: say so
  // now, naming the files, not after the first epoch.
  const auto sample = [](const Dataset& d) {
    const auto& dims = d.images.shape().dims();
    return Shape(std::vector<std::int64_t>(dims.begin() + 1, dims.end()));
  };
  MINIDL_CHECK(sample(s.train) == sample(s.test), "test images ", sample(s.test), " in '",
               pick_file(dir, "t10k-images-idx3-ubyte", name), "' differ from the training images ",
               sample(s.train), " in '", pick_file(dir, "train-images-idx3-ubyte", name),
               "'; expected one sample shape");
  return s;
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
