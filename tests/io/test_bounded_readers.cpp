// The readers are bounded before they allocate: a header's promise is checked against the
// file's size (or, for gzip, what that size can inflate to) before the body is read; a gzip
// stream is inflated no further than the expected size + 1 byte; devices, FIFOs and sparse
// files end in an error naming the file, at once. safetensors headers: nesting bounded, no
// message that serialises a large structure from the file, control characters escaped.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "minidl/core/error.hpp"
#include "minidl/io/datasets.hpp"
#include "minidl/io/safetensors.hpp"
#include "support/error_of.hpp"
#include "support/gzip.hpp"
#include "support/temp_dir.hpp"

namespace minidl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Bytes = std::vector<std::uint8_t>;
using minidl::testing::error_of;

void put_be32(Bytes& b, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<std::uint8_t>(v >> s));
}

Bytes idx(std::uint32_t magic, const std::vector<std::uint32_t>& dims, std::size_t body) {
  Bytes b;
  put_be32(b, magic);
  for (auto d : dims) put_be32(b, d);
  b.resize(b.size() + body, 0);
  return b;
}

/// gzip of the bytes `head` followed by `zeros` zero bytes, deflated in pieces (a "gzip
/// bomb" when zeros is large: about 1 KiB per MiB).
Bytes gzip_with_zeros(const Bytes& head, std::size_t zeros) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 9, Z_DEFLATED, 16 + MAX_WBITS, 9, Z_DEFAULT_STRATEGY), Z_OK);
  Bytes out, chunk(1 << 20);
  const Bytes block(1 << 20, 0);
  auto push = [&](const std::uint8_t* p, std::size_t n, int flush) {
    zs.next_in = const_cast<Bytef*>(p);
    zs.avail_in = static_cast<uInt>(n);
    do {
      zs.next_out = chunk.data();
      zs.avail_out = static_cast<uInt>(chunk.size());
      deflate(&zs, flush);
      out.insert(out.end(), chunk.data(), chunk.data() + (chunk.size() - zs.avail_out));
    } while (zs.avail_out == 0);
  };
  push(head.data(), head.size(), Z_NO_FLUSH);
  for (std::size_t left = zeros; left > 0;) {
    const std::size_t n = std::min(left, block.size());
    push(block.data(), n, Z_NO_FLUSH);
    left -= n;
  }
  push(nullptr, 0, Z_FINISH);
  deflateEnd(&zs);
  return out;
}

class BoundedReaders : public minidl::testing::TempDirTest {
 protected:
  /// A file of `size` bytes that starts with head and is a hole after it (takes no disk).
  std::string sparse(const std::string& name, const Bytes& head, off_t size) {
    const std::string p = file(name, head);
    EXPECT_EQ(::truncate(p.c_str(), size), 0);
    return p;
  }
  std::string fifo(const std::string& name) {
    const std::string p = path(name);
    EXPECT_EQ(::mkfifo(p.c_str(), 0600), 0);
    return p;
  }
};

constexpr off_t kHuge = off_t{1} << 40;  // 1 TiB, as a sparse file

TEST_F(BoundedReaders, IdxReaderChecksTheHeaderAgainstTheFileBeforeReading) {
  const std::string labels = file("labels", idx(0x801, {2}, 2));
  const Bytes header = idx(0x803, {2, 2, 2}, 0);
  const struct {
    std::string what, images, words;
  } cases[] = {
      {"/dev/zero", "/dev/zero",
       "cannot open IDX image file '/dev/zero': it is a character device, expected a regular "
       "file"},
      {"a FIFO with no writer", fifo("fifo"), "it is a FIFO (named pipe), expected a regular file"},
      {"a 1 TiB sparse file behind a header for 8 pixels", sparse("sparse", header, kHuge),
       "trailing bytes in IDX image file"},
      {"a header for 2^32 x 2^16 pixels in a 24-byte file",
       file("promise", idx(0x803, {0xffffffffu, 0xffffu, 0xffffu}, 8)), "truncated IDX image file"},
      {"a gzip header for 4 GiB x 4 GiB pixels in a few bytes",
       file("promise.gz", minidl::testing::gzip(idx(0x803, {0xffffffffu, 0xffffffffu, 1}, 8))),
       "inflates to at most"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string msg = error_of([&] { read_idx(c.images, labels, "bounded"); });
    EXPECT_THAT(msg, HasSubstr("'" + c.images + "'"));
    EXPECT_THAT(msg, HasSubstr(c.words));
  }
  // The same for the labels: a sparse label file.
  const std::string images = file("images", idx(0x803, {2, 2, 2}, 8));
  const std::string msg =
      error_of([&] { read_idx(images, sparse("sparse-labels", idx(0x801, {2}, 0), kHuge), "b"); });
  EXPECT_THAT(msg, HasSubstr("trailing bytes in IDX label file"));
  EXPECT_THAT(msg, HasSubstr(std::to_string(kHuge)));
}

// A gzip bomb: a header for 8 pixels, then 256 MiB of zeros in about 256 KiB. The reader stops
// after the 8 pixels and one byte more, and says it read no further.
TEST_F(BoundedReaders, GzipIsInflatedToTheExpectedSizePlusOneByteOnly) {
  const Bytes bomb = gzip_with_zeros(idx(0x803, {2, 2, 2}, 8), std::size_t{256} << 20);
  ASSERT_LT(bomb.size(), std::size_t{1} << 20);
  const std::string images = file("bomb.gz", bomb);
  const std::string labels = file("labels", idx(0x801, {2}, 2));
  const std::string msg = error_of([&] { read_idx(images, labels, "bomb"); });
  EXPECT_THAT(msg, HasSubstr("trailing bytes in IDX image file '" + images +
                             "' (gzip; offsets count decompressed bytes): unexpected bytes from "
                             "offset 24"));
  EXPECT_THAT(msg, HasSubstr("found more (read no further)"));
  // The same for a CIFAR-10 batch: 10 records expected, a bomb of zeros (labels 0, valid).
  const std::string batch = file("batch.gz", gzip_with_zeros({}, std::size_t{256} << 20));
  const std::string cmsg = error_of([&] { read_cifar10({batch}, "bomb", 10); });
  EXPECT_THAT(cmsg, HasSubstr("trailing bytes in CIFAR-10 batch file '" + batch + "' (gzip"));
  EXPECT_THAT(cmsg, HasSubstr("unexpected bytes from offset 30730"));
  // And a good gzip file of the size expected still reads.
  const Bytes ok = gzip_with_zeros(idx(0x803, {2, 2, 2}, 0), 8);
  EXPECT_EQ(read_idx(file("ok.gz", ok), labels, "ok").size(), 2);
}

TEST_F(BoundedReaders, CifarReaderRefusesDevicesFifosAndSparseFiles) {
  const struct {
    std::string what, path, words;
  } cases[] = {
      {"/dev/zero", "/dev/zero", "it is a character device, expected a regular file"},
      {"a FIFO", fifo("fifo"), "it is a FIFO (named pipe)"},
      {"a 1 TiB sparse file", sparse("sparse", {}, kHuge), "trailing bytes in CIFAR-10 batch"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string msg = error_of([&] { read_cifar10({c.path}, "bounded", 10000); });
    EXPECT_THAT(msg, HasSubstr("'" + c.path + "'"));
    EXPECT_THAT(msg, HasSubstr(c.words));
  }
}

/// A safetensors file with the given JSON header and data bytes.
Bytes safetensors(const std::string& header, std::size_t data = 0) {
  Bytes b(8);
  for (int i = 0; i < 8; ++i) b[i] = static_cast<std::uint8_t>(header.size() >> (8 * i));
  b.insert(b.end(), header.begin(), header.end());
  b.resize(b.size() + data, 0);
  return b;
}

TEST_F(BoundedReaders, SafetensorsHeadersAreBoundedInDepthAndInMessages) {
  const std::string deep_array = std::string(100000, '[') + std::string(100000, ']');
  const std::string many(200000, '0');
  std::string offsets = "[0";
  for (int i = 0; i < 100000; ++i) offsets += ",1";
  offsets += "]";
  const struct {
    std::string what, header, words;
    std::size_t max_length;
  } cases[] = {
      {"an array nested 100000 deep", "{\"w\":" + deep_array + "}",
       "nests arrays and objects more than 32 deep (at header byte 36", 300},
      {"objects nested 100000 deep in the metadata",
       "{\"__metadata__\":" +
           [] {
             std::string s;
             for (int i = 0; i < 100000; ++i) s += "{\"a\":";
             s += "1";
             for (int i = 0; i < 100000; ++i) s += "}";
             return s;
           }() +
           "}",
       "nests arrays and objects more than 32 deep", 300},
      {"brackets inside a string are not nesting",
       "{\"" + std::string(100, '[') + "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}",
       "must hold 2 integers [begin, end], found [0]", 600},
      {"100001 data offsets",
       "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":" + offsets + "}}",
       "(100001 elements)]", 400},
      {"a negative number among 100000 in a shape",
       "{\"w\":{\"dtype\":\"F32\",\"shape\":[" +
           [] {
             std::string s = "-1";
             for (int i = 0; i < 100000; ++i) s += ",7";
             return s;
           }() +
           "],\"data_offsets\":[0,4]}}",
       "found negative integer in [-1,7,7,", 400},
      {"a name with a newline, an escape sequence and a long tail",
       "{\"evil\\nname\\u001b[2J" + std::string(5000, 'x') +
           "\":{\"dtype\":\"F99\",\"shape\":[1],\"data_offsets\":[0,4]}}",
       "tensor 'evil\\x0Aname\\x1B[2Jxxx", 700},
      {"a dtype of 200000 characters",
       "{\"w\":{\"dtype\":\"" + many + "\",\"shape\":[1],\"data_offsets\":[0,4]}}",
       "field 'dtype' is '000", 600},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string p = file("t.safetensors", safetensors(c.header, 4));
    const std::string msg = error_of([&] { load_safetensors(p); });
    EXPECT_THAT(msg, HasSubstr(c.words));
    EXPECT_LE(msg.size(), c.max_length) << msg.substr(0, 1000);
    EXPECT_EQ(msg.find('\n'), std::string::npos);
    EXPECT_EQ(msg.find('\x1b'), std::string::npos);
  }
  // A header that nests exactly as deep as allowed is judged by its content, not refused.
  const std::string ok_depth =
      "{\"__metadata__\":{\"k\":" + std::string(30, '[') + std::string(30, ']') + "}}";
  EXPECT_THAT(error_of([&] { load_safetensors(file("d.safetensors", safetensors(ok_depth))); }),
              HasSubstr("field '__metadata__' entry 'k' must be a string, found array"));
}

TEST_F(BoundedReaders, SafetensorsReaderRefusesDevicesFifosAndSparseFiles) {
  const struct {
    std::string what, path, words;
  } cases[] = {
      {"/dev/zero", "/dev/zero", "it is a character device, expected a regular file"},
      {"a FIFO", fifo("fifo"), "it is a FIFO (named pipe)"},
      // A header that claims a huge length: refused from the size, nothing allocated.
      {"a 1 TiB sparse file", sparse("sparse", safetensors("{}"), kHuge), "the data section holds"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string msg = error_of([&] { load_safetensors(c.path); });
    EXPECT_THAT(msg, HasSubstr("'" + c.path + "'"));
    EXPECT_THAT(msg, HasSubstr(c.words));
  }
}

}  // namespace
}  // namespace minidl
