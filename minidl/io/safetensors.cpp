#include "minidl/io/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>
#include <system_error>
#include <vector>

#include "minidl/core/error.hpp"
#include "minidl/core/text.hpp"
#include "minidl/io/file.hpp"

namespace minidl {

namespace {

namespace fs = std::filesystem;
using detail::concat;
using Json = nlohmann::ordered_json;  // keeps the tensors in the order they were written

// Tensor bytes go to disk as they sit in memory; the format is little-endian.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes little-endian");

constexpr std::string_view kMetadataKey = "__metadata__";
// The reference implementation rejects larger headers; so do we, before allocating one.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

using File = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

std::optional<DType> parse_dtype(std::string_view s) {
  for (DType t : {DType::F32, DType::I32, DType::I64}) {
    if (dtype_safetensors_name(t) == s) return t;
  }
  return std::nullopt;
}

std::string_view json_kind(const Json& j) {
  if (j.is_number_integer() && !j.is_number_unsigned()) return "negative integer";
  if (j.is_number_float()) return "non-integer number";
  return j.type_name();
}

// Deeper than any header needs (a tensor's entry is two levels down): the JSON value and its
// dump are recursive, so a deeper one could overflow the stack.
constexpr int kMaxNesting = 32;

/// Fails unless the JSON text nests its arrays and objects at most kMaxNesting deep (strings,
/// escapes included, are skipped; the parser judges the rest).
void check_nesting(std::string_view text, const std::string& file) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      MINIDL_CHECK(++depth <= kMaxNesting, file, ": the JSON header nests arrays and objects more ",
                   "than ", kMaxNesting, " deep (at header byte ", i, ", file offset ", 8 + i,
                   "); a safetensors header needs 3");
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
}

/// A JSON value for a message: at most about 80 characters of it, never the whole of a large
/// one, strings escaped to one printable line.
std::string brief(const Json& j, std::size_t budget = 80) {
  if (j.is_string()) return concat('"', printable(j.get_ref<const std::string&>(), budget), '"');
  if (!j.is_structured()) return j.dump();
  std::string out = j.is_array() ? "[" : "{";
  std::size_t shown = 0;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (out.size() >= budget) {
      out += concat(shown > 0 ? "," : "", "... (", j.size(), " elements)");
      break;
    }
    if (shown++ > 0) out += ",";
    if (j.is_object()) out += concat('"', printable(it.key(), budget), "\":");
    out += brief(*it, budget > out.size() ? budget - out.size() : 1);
  }
  return out + (j.is_array() ? "]" : "}");
}

/// What the header says about one tensor.
struct Entry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

}  // namespace

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string file = concat("safetensors file '", path, "'");
  Json header = Json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::set<std::string_view> names;
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    MINIDL_CHECK(name != kMetadataKey, "cannot write ", file, ": '", kMetadataKey,
                 "' is reserved for the metadata, not a tensor name");
    MINIDL_CHECK(names.insert(name).second, "cannot write ", file, ": tensor name '",
                 printable(name), "' appears twice");
    MINIDL_CHECK(t.raw() != nullptr || t.numel() == 0, "cannot write ", file, ": tensor '",
                 printable(name), "' has no data");
    header[name] = Json{{"dtype", dtype_safetensors_name(t.dtype())},
                        {"shape", t.shape().dims()},
                        {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    MINIDL_FAIL("cannot write ", file, ": a tensor name or metadata string is not valid UTF-8 (",
                e.what(), ")");
  }
  // Pad with spaces so the data starts 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(text.size() >> (8 * i));

  std::vector<std::string_view> pieces{std::string_view(reinterpret_cast<const char*>(len), 8),
                                       text};
  for (const auto& [name, t] : tensors)
    pieces.emplace_back(static_cast<const char*>(t.raw()), t.nbytes());
  write_file_atomically(path, pieces, "safetensors file");
}

SafetensorsFile load_safetensors(const std::string& path) {
  const std::string file = concat("safetensors file '", path, "'");
  InputFile f = open_input(path, "safetensors file");
  const std::uint64_t size = f.size;

  auto read_exact = [&](void* dst, std::uint64_t n, std::uint64_t at, std::string_view what) {
    if (n == 0) return;
    if (read_input(f, dst, n, path, "safetensors file") != n) {
      MINIDL_FAIL("cannot read ", file, ": ", what, " at offset ", at,
                  " ends early (unexpected end of file)");
    }
  };

  MINIDL_CHECK(size >= 8, file, " is too small: ", size,
               " bytes, expected at least the 8-byte header length at offset 0");
  std::uint8_t len[8];
  read_exact(len, 8, 0, "the header length");
  std::uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= std::uint64_t{len[i]} << (8 * i);
  MINIDL_CHECK(header_len <= size - 8, file, ": header length ", header_len,
               " (at offset 0) exceeds the file size of ", size, " bytes (at most ", size - 8,
               " bytes of header fit); truncated or not a safetensors file?");
  MINIDL_CHECK(header_len <= kMaxHeaderBytes, file, ": header length ", header_len,
               " (at offset 0) exceeds the limit of ", kMaxHeaderBytes, " bytes");
  std::string text(header_len, '\0');
  read_exact(text.data(), header_len, 8, "the JSON header");

  check_nesting(text, file);
  Json header;
  try {
    header = Json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // Keep the message one printable line: the parser quotes the bytes it choked on.
    std::string why = e.what();
    for (char& ch : why) {
      if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) >= 0x7f) ch = '?';
    }
    MINIDL_FAIL(file, ": bad JSON header (", header_len, " bytes at offset 8): ", why);
  }
  MINIDL_CHECK(header.is_object(), file, ": the JSON header must be an object, found ",
               header.type_name());

  SafetensorsFile out;
  std::vector<Entry> entries;
  for (const auto& item : header.items()) {
    // Named references, not a structured binding: the lambdas below capture them.
    const std::string& key = item.key();
    const Json& value = item.value();
    if (key == kMetadataKey) {
      MINIDL_CHECK(value.is_object(), file, ": field '", kMetadataKey,
                   "' must be an object of strings, found ", value.type_name());
      for (const auto& [k, v] : value.items()) {
        MINIDL_CHECK(v.is_string(), file, ": field '", kMetadataKey, "' entry '", printable(k),
                     "' must be a string, found ", v.type_name());
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string tensor = concat(file, ": tensor '", printable(key), "'");
    MINIDL_CHECK(value.is_object(), tensor, " must be an object with fields dtype, shape and ",
                 "data_offsets, found ", value.type_name());
    auto field = [&](const char* name) -> const Json& {
      auto it = value.find(name);
      MINIDL_CHECK(it != value.end(), tensor, " has no '", name, "' field");
      return *it;
    };
    auto uint_array = [&](const char* name, const Json& j) {
      MINIDL_CHECK(j.is_array(), tensor, " field '", name,
                   "' must be an array of non-negative integers, found ", j.type_name());
      std::vector<std::uint64_t> v;
      for (const Json& x : j) {
        MINIDL_CHECK(x.is_number_unsigned(), tensor, " field '", name,
                     "' must be an array of non-negative integers, found ", json_kind(x), " in ",
                     brief(j));
        v.push_back(x.get<std::uint64_t>());
      }
      return v;
    };

    Entry e;
    e.name = key;
    const Json& dtype = field("dtype");
    MINIDL_CHECK(dtype.is_string(), tensor, " field 'dtype' must be a string, found ",
                 dtype.type_name());
    const std::optional<DType> dt = parse_dtype(dtype.get<std::string>());
    MINIDL_CHECK(dt.has_value(), tensor, " field 'dtype' is '", printable(dtype.get<std::string>()),
                 "', expected one of F32, I32, I64");
    e.dtype = *dt;

    std::uint64_t nbytes = dtype_size(e.dtype);
    bool overflow = false;
    std::vector<std::int64_t> dims;
    for (std::uint64_t d : uint_array("shape", field("shape"))) {
      overflow = overflow || d > static_cast<std::uint64_t>(INT64_MAX) ||
                 __builtin_mul_overflow(nbytes, d, &nbytes);
      dims.push_back(static_cast<std::int64_t>(d));
    }
    e.shape = Shape(std::move(dims));

    const Json& offsets_json = field("data_offsets");
    const std::vector<std::uint64_t> offsets = uint_array("data_offsets", offsets_json);
    MINIDL_CHECK(offsets.size() == 2, tensor,
                 " field 'data_offsets' must hold 2 integers [begin, end], found ",
                 brief(offsets_json));
    e.begin = offsets[0];
    e.end = offsets[1];
    const std::uint64_t data_size = size - 8 - header_len;
    MINIDL_CHECK(e.begin <= e.end, tensor, " field 'data_offsets' ", brief(offsets_json),
                 " has begin > end");
    MINIDL_CHECK(e.end <= data_size, tensor, " field 'data_offsets' ", brief(offsets_json),
                 " runs past the end of the data section, which holds ", data_size,
                 " bytes (file of ", size, " bytes, data from offset ", 8 + header_len,
                 "); truncated file?");
    MINIDL_CHECK(!overflow && e.end - e.begin == nbytes, tensor, " field 'data_offsets' ",
                 brief(offsets_json), " spans ", e.end - e.begin, " bytes, but field 'shape' ",
                 e.shape, " of ", dtype_safetensors_name(e.dtype), " needs ",
                 overflow ? std::string("more than 2^64") : concat(nbytes));
    entries.push_back(std::move(e));
  }

  // The data must be packed: each tensor starts where the previous one ends, and the last one
  // ends at the end of the file.
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
  });
  const std::uint64_t data_size = size - 8 - header_len;
  std::uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    MINIDL_CHECK(e.begin >= pos, file, ": tensor '", printable(e.name), "' field 'data_offsets' [",
                 e.begin, ",", e.end, "] overlaps tensor '",
                 prev != nullptr ? printable(prev->name) : "", "' [",
                 prev != nullptr ? prev->begin : 0, ",", pos, "]");
    MINIDL_CHECK(e.begin == pos, file, ": data bytes [", pos, ",", e.begin,
                 ") belong to no tensor (before tensor '", printable(e.name),
                 "' field 'data_offsets' [", e.begin, ",", e.end,
                 "]); expected the tensors packed without gaps");
    pos = e.end;
    prev = &e;
  }
  MINIDL_CHECK(pos == data_size, file, ": the data section holds ", data_size,
               " bytes (from offset ", 8 + header_len, ") but the tensors cover only ", pos,
               "; expected no bytes after the last tensor");

  out.tensors.reserve(entries.size());
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    read_exact(t.raw(), e.end - e.begin, 8 + header_len + e.begin,
               concat("the data of tensor '", printable(e.name), "'"));
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

}  // namespace minidl
