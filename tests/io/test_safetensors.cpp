// .safetensors: bit-exact round trips, the byte layout other tools read, and malformed files each
// failing with a message naming the file, the tensor and the field.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "minidl/core/error.hpp"
#include "minidl/io/safetensors.hpp"
#include "support/error_of.hpp"
#include "support/temp_dir.hpp"

namespace minidl {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Bytes = std::vector<std::uint8_t>;

using minidl::testing::error_of;

Bytes read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const fs::path& p, const Bytes& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

/// A file as the format defines it: little-endian header length, header text, data bytes.
Bytes make_file(const std::string& header, const Bytes& data) {
  Bytes b;
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<std::uint8_t>(header.size() >> (8 * i)));
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

Bytes f32_bytes(const std::vector<float>& v) {
  Bytes b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

/// Whether dir (and below) holds no temporary file of write_file_atomically ("<name>.tmp.XXXXXX").
bool no_temporary_file(const fs::path& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename().string().find(".tmp") != std::string::npos) return false;
  return true;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

class SafetensorsTest : public minidl::testing::TempDirTest {};

NamedTensors sample_tensors() {
  const float nan_payload = std::bit_cast<float>(0x7fc12345u);
  const float denormal = std::numeric_limits<float>::denorm_min();
  const float inf = std::numeric_limits<float>::infinity();
  NamedTensors t;
  t.emplace_back("encoder.w",
                 Tensor::from<float>({2, 3}, {1.5f, -0.0f, nan_payload, inf, -inf, denormal}));
  t.emplace_back("encoder.b", Tensor::from<float>({3}, {0.1f, 0.2f, 0.3f}));
  // An odd i32 count puts the next (i64) tensor at an offset that is not a multiple of 8.
  t.emplace_back("step",
                 Tensor::from<std::int32_t>({3}, {std::numeric_limits<std::int32_t>::min(), -1,
                                                  std::numeric_limits<std::int32_t>::max()}));
  t.emplace_back("counts",
                 Tensor::from<std::int64_t>(
                     {2, 2}, {std::numeric_limits<std::int64_t>::min(), -1, std::int64_t{1} << 40,
                              std::numeric_limits<std::int64_t>::max()}));
  t.emplace_back("scalar", Tensor::from<float>(Shape{}, {42.0f}));
  t.emplace_back("empty", Tensor::empty({0, 3}, DType::F32));
  t.emplace_back("a_last", Tensor::from<std::int32_t>({1}, {7}));
  return t;
}

TEST_F(SafetensorsTest, RoundTripIsBitExactAndKeepsOrder) {
  const NamedTensors in = sample_tensors();
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"note", "quotes \" and \\ and \xc3\xbcnicode"}, {"empty", ""}};
  save_safetensors(path("m.safetensors"), in, meta);
  const SafetensorsFile out = load_safetensors(path("m.safetensors"));
  EXPECT_EQ(out.metadata, meta);
  ASSERT_EQ(out.tensors.size(), in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out.tensors[i].first, in[i].first);
    EXPECT_TRUE(same_bits(out.tensors[i].second, in[i].second)) << in[i].first;
  }
  EXPECT_TRUE(no_temporary_file(dir_));
}

TEST_F(SafetensorsTest, NoMetadataAndNoTensors) {
  save_safetensors(path("none.safetensors"), {});
  const SafetensorsFile out = load_safetensors(path("none.safetensors"));
  EXPECT_TRUE(out.tensors.empty());
  EXPECT_TRUE(out.metadata.empty());
  const Bytes b = read_bytes(path("none.safetensors"));
  EXPECT_EQ(b, make_file("{}      ", {}));
}

TEST_F(SafetensorsTest, LayoutIsWhatOtherToolsRead) {
  const NamedTensors in = sample_tensors();
  save_safetensors(path("m.safetensors"), in, {{"format", "pt"}});
  const Bytes b = read_bytes(path("m.safetensors"));
  ASSERT_GE(b.size(), 8u);
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t{b[i]} << (8 * i);
  EXPECT_EQ((8 + n) % 8, 0u) << "data must start 8-byte aligned";
  const std::string text(b.begin() + 8, b.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  EXPECT_EQ(text.front(), '{');
  const auto header = nlohmann::json::parse(text);  // the trailing padding is JSON whitespace
  EXPECT_EQ(header["__metadata__"], nlohmann::json({{"format", "pt"}}));
  std::uint64_t pos = 0;
  for (const auto& [name, t] : in) {
    SCOPED_TRACE(name);
    const auto& e = header.at(name);
    EXPECT_EQ(e.at("dtype"), std::string(dtype_safetensors_name(t.dtype())));
    EXPECT_EQ(e.at("shape").get<std::vector<std::int64_t>>(), t.shape().dims());
    const auto offsets = e.at("data_offsets").get<std::vector<std::uint64_t>>();
    ASSERT_EQ(offsets.size(), 2u);
    EXPECT_EQ(offsets[0], pos) << "data in the given order, packed";
    EXPECT_EQ(offsets[1] - offsets[0], t.nbytes());
    ASSERT_LE(8 + n + offsets[1], b.size());
    if (t.nbytes() > 0) {
      EXPECT_EQ(std::memcmp(b.data() + 8 + n + offsets[0], t.raw(), t.nbytes()), 0);
    }
    pos = offsets[1];
  }
  EXPECT_EQ(8 + n + pos, b.size());
  EXPECT_EQ(header.size(), in.size() + 1);
}

TEST_F(SafetensorsTest, MatchesTheReferenceWriterByteForByte) {
  // What the reference writer produces for {"a": [1, 2] f32} with metadata {"format": "pt"}:
  // compact JSON, metadata first, fields dtype/shape/data_offsets, spaces up to 8-byte alignment.
  const std::string json =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string padded = json + std::string((8 - json.size() % 8) % 8, ' ');
  save_safetensors(path("a.safetensors"), {{"a", Tensor::from<float>({2}, {1.0f, 2.0f})}},
                   {{"format", "pt"}});
  EXPECT_EQ(read_bytes(path("a.safetensors")), make_file(padded, f32_bytes({1.0f, 2.0f})));
}

TEST_F(SafetensorsTest, ReadsFilesWrittenInAnotherOrder) {
  // Another writer may list tensors in any header order, with extra spaces and no padding; the
  // result follows the order of the data.
  const std::string header = R"({ "b": {"dtype": "I64", "shape": [1], "data_offsets": [8, 16]},)"
                             R"( "a": {"shape": [2], "data_offsets": [0, 8], "dtype": "F32"}, )"
                             R"("__metadata__": {"k": "v"}})";
  Bytes data = f32_bytes({3.0f, 4.0f});
  const std::int64_t big = -5;
  data.resize(16);
  std::memcpy(data.data() + 8, &big, 8);
  write_bytes(path("x.safetensors"), make_file(header, data));
  const SafetensorsFile f = load_safetensors(path("x.safetensors"));
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].first, "a");
  EXPECT_EQ(f.tensors[0].second.at(1), 4.0f);
  EXPECT_EQ(f.tensors[1].first, "b");
  EXPECT_EQ(f.tensors[1].second.data<std::int64_t>()[0], -5);
  EXPECT_EQ(f.metadata.at("k"), "v");
}

TEST_F(SafetensorsTest, OverwritesAnExistingFile) {
  save_safetensors(path("m.safetensors"), {{"x", Tensor::from<float>({1}, {1.0f})}});
  save_safetensors(path("m.safetensors"), {{"y", Tensor::from<float>({2}, {2.0f, 3.0f})}});
  const SafetensorsFile f = load_safetensors(path("m.safetensors"));
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.tensors[0].first, "y");
  EXPECT_TRUE(no_temporary_file(dir_));
}

TEST_F(SafetensorsTest, SaveIntoAMissingDirectoryFailsAndLeavesNoFile) {
  const std::string p = path("no/such/dir/m.safetensors");
  const std::string msg = error_of([&] {
    save_safetensors(p, {{"x", Tensor::from<float>({1}, {1.0f})}});
  });
  EXPECT_THAT(msg, HasSubstr("safetensors file: cannot write '" + p + "'"));
  EXPECT_THAT(msg, HasSubstr("the directory '" + path("no/such/dir") + "' does not exist"));
  EXPECT_FALSE(fs::exists(p));
  EXPECT_TRUE(no_temporary_file(dir_));
}

TEST_F(SafetensorsTest, FailedRenameRemovesTheTempFile) {
  const std::string p = path("taken");
  fs::create_directories(fs::path(p) / "child");  // a non-empty directory cannot be replaced
  const std::string msg = error_of([&] {
    save_safetensors(p, {{"x", Tensor::from<float>({1}, {1.0f})}});
  });
  EXPECT_THAT(msg, HasSubstr("safetensors file: cannot write '" + p + "'"));
  EXPECT_THAT(msg, HasSubstr("renaming"));
  EXPECT_TRUE(fs::is_directory(p));
  EXPECT_TRUE(no_temporary_file(dir_));
}

TEST_F(SafetensorsTest, SaveRejectsBadNames) {
  const Tensor t = Tensor::from<float>({1}, {1.0f});
  EXPECT_THAT(error_of([&] {
                save_safetensors(path("d"), {{"w", t}, {"w", t}});
              }),
              HasSubstr("tensor name 'w' appears twice"));
  EXPECT_THAT(error_of([&] {
                save_safetensors(path("d"), {{"__metadata__", t}});
              }),
              HasSubstr("'__metadata__' is reserved"));
  EXPECT_FALSE(fs::exists(path("d")));
  EXPECT_TRUE(no_temporary_file(dir_));
}

struct Corrupt {
  std::string what;
  Bytes bytes;
  std::vector<std::string> words;
};

std::vector<Corrupt> corrupt_cases() {
  const std::string a8 = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const Bytes d8 = f32_bytes({1.0f, 2.0f});
  const Bytes good = make_file("{" + a8 + "}", d8);
  auto one = [&](const std::string& entry, const Bytes& data = {}) {
    return make_file(R"({"a":)" + entry + "}", data.empty() ? Bytes(8, 0) : data);
  };
  Bytes long_header = good;
  long_header[0] = 0xE8;  // 1000
  long_header[1] = 0x03;
  Bytes huge_header = good;
  huge_header[7] = 0x7F;
  Bytes cut_data(good.begin(), good.end() - 4);
  Bytes extra = good;
  extra.insert(extra.end(), {0, 0, 0, 0});

  std::vector<Corrupt> c;
  c.push_back({"shorter than 8 bytes", Bytes(5, 0), {"is too small: 5 bytes", "header length"}});
  c.push_back({"header length > file",
               long_header,
               {"header length 1000 (at offset 0) exceeds the file size of " +
                std::to_string(good.size())}});
  c.push_back({"absurd header length", huge_header, {"header length", "exceeds the file size"}});
  c.push_back({"truncated data",
               cut_data,
               {"tensor 'a' field 'data_offsets' [0,8] runs past the end of the data section",
                "holds 4 bytes", "truncated file?"}});
  c.push_back({"trailing data", extra, {"data section holds 12 bytes", "cover only 8"}});
  c.push_back({"bad JSON", make_file(R"({"a":{"dtype":"F32",)", d8), {"bad JSON header"}});
  c.push_back(
      {"not UTF-8", make_file("{\"\xff\":1}", {}), {"bad JSON header", "ill-formed UTF-8"}});
  c.push_back({"header is an array",
               make_file("[1,2]", {}),
               {"the JSON header must be an object, found array"}});
  c.push_back({"bad dtype",
               one(R"({"dtype":"F16","shape":[2],"data_offsets":[0,8]})"),
               {"tensor 'a' field 'dtype' is 'F16', expected one of F32, I32, I64"}});
  c.push_back({"dtype not a string",
               one(R"({"dtype":3,"shape":[2],"data_offsets":[0,8]})"),
               {"tensor 'a' field 'dtype' must be a string, found number"}});
  c.push_back({"missing dtype",
               one(R"({"shape":[2],"data_offsets":[0,8]})"),
               {"tensor 'a' has no 'dtype' field"}});
  c.push_back({"missing shape",
               one(R"({"dtype":"F32","data_offsets":[0,8]})"),
               {"tensor 'a' has no 'shape' field"}});
  c.push_back({"missing data_offsets",
               one(R"({"dtype":"F32","shape":[2]})"),
               {"tensor 'a' has no 'data_offsets' field"}});
  c.push_back({"tensor not an object", one("[1]"), {"tensor 'a' must be an object"}});
  c.push_back({"negative dim",
               one(R"({"dtype":"F32","shape":[2,-1],"data_offsets":[0,8]})"),
               {"tensor 'a' field 'shape' must be an array of non-negative integers",
                "found negative integer in [2,-1]"}});
  c.push_back({"float offsets",
               one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8.5]})"),
               {"tensor 'a' field 'data_offsets' must be an array of non-negative integers",
                "found non-integer number in [0,8.5]"}});
  c.push_back({"three offsets",
               one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,4,8]})"),
               {"tensor 'a' field 'data_offsets' must hold 2 integers [begin, end], found "
                "[0,4,8]"}});
  c.push_back({"begin > end",
               one(R"({"dtype":"F32","shape":[2],"data_offsets":[8,0]})"),
               {"tensor 'a' field 'data_offsets' [8,0] has begin > end"}});
  c.push_back({"offsets do not match the shape",
               one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})"),
               {"tensor 'a' field 'data_offsets' [0,8] spans 8 bytes, but field 'shape' [3] of "
                "F32 needs 12"}});
  c.push_back({"shape overflows",
               one(R"({"dtype":"I64","shape":[4294967296,4294967296],"data_offsets":[0,8]})"),
               {"tensor 'a' field 'data_offsets'", "needs more than 2^64"}});
  c.push_back({"overlap",
               make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                         Bytes(12, 0)),
               {"tensor 'b' field 'data_offsets' [4,12] overlaps tensor 'a' [0,8]"}});
  c.push_back({"gap",
               make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                         Bytes(20, 0)),
               {"data bytes [8,12) belong to no tensor (before tensor 'b' field 'data_offsets' "
                "[12,20])"}});
  c.push_back({"metadata value not a string",
               make_file(R"({"__metadata__":{"epoch":3}})", {}),
               {"field '__metadata__' entry 'epoch' must be a string, found number"}});
  c.push_back({"metadata not an object",
               make_file(R"({"__metadata__":"x"})", {}),
               {"field '__metadata__' must be an object of strings, found string"}});
  return c;
}

TEST_F(SafetensorsTest, CorruptFilesNameTheFileTensorAndField) {
  int i = 0;
  for (const Corrupt& c : corrupt_cases()) {
    SCOPED_TRACE(c.what);
    const std::string p = path(fmt::format("case{}.safetensors", i++));
    write_bytes(p, c.bytes);
    const std::string msg = error_of([&] { load_safetensors(p); });
    EXPECT_THAT(msg, HasSubstr("safetensors file '" + p + "'"));
    for (const std::string& w : c.words) EXPECT_THAT(msg, HasSubstr(w));
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST_F(SafetensorsTest, MissingFileAndDirectory) {
  EXPECT_THAT(error_of([&] { load_safetensors(path("nope.safetensors")); }),
              HasSubstr("cannot open safetensors file '" + path("nope.safetensors") +
                        "': it does not exist"));
  EXPECT_THAT(error_of([&] { load_safetensors(dir_.string()); }),
              HasSubstr("is a directory, expected a file"));
}

}  // namespace
}  // namespace minidl
