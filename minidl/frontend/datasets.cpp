#include "minidl/frontend/datasets.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
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
  f.bytes = read_file(path, concat("IDX ", k.name, " file"));
  if (is_gzip(f.bytes)) {
    f.gz = true;
    f.bytes = gunzip(f.bytes, path);
  }
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
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  MINIDL_CHECK(fs::exists(st), "data directory '", dir, "' does not exist; run scripts/fetch-data ",
               dataset, " (it fills data/", dataset, " at the repository root, or --dest DIR)");
  MINIDL_CHECK(fs::is_directory(st), "data directory '", dir, "' is not a directory");

  const std::string prefix = split == "train" ? "train" : "t10k";
  auto pick = [&](const std::string& base) {
    const fs::path raw = fs::path(dir) / base;
    if (fs::exists(raw, ec)) return raw.string();
    const fs::path gz = fs::path(dir) / (base + ".gz");
    if (fs::exists(gz, ec)) return gz.string();
    MINIDL_FAIL("data directory '", dir, "' has neither '", base, "' nor '", base,
                ".gz'; run scripts/fetch-data ", dataset, " to fetch the missing files");
  };
  return read_idx(pick(prefix + "-images-idx3-ubyte"), pick(prefix + "-labels-idx1-ubyte"),
                  dataset + "/" + split);
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

}  // namespace minidl
