// Text from outside made safe: bytes that are not UTF-8 escaped for JSON, control characters
// escaped and long text cut for messages.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "minidl/core/text.hpp"

namespace minidl {
namespace {

TEST(Text, Utf8EscapedKeepsValidTextAndEscapesTheRest) {
  const struct {
    std::string in, out;
  } cases[] = {
      {"plain/path.jsonl", "plain/path.jsonl"},
      {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"},
      {"bad\xff"
       "byte",
       "bad\\xFFbyte"},                               // not a UTF-8 byte at all
      {"latin1 caf\xe9.txt", "latin1 caf\\xE9.txt"},  // a lead byte without its continuation
      {"overlong \xc0\xaf", "overlong \\xC0\\xAF"},   // "/" spelled in two bytes
      {"surrogate \xed\xa0\x80", "surrogate \\xED\\xA0\\x80"},
      {"cut \xe2\x82", "cut \\xE2\\x82"},          // a sequence the end cuts short
      {"tab\tand\nnewline", "tab\tand\nnewline"},  // valid UTF-8: JSON escapes them itself
  };
  for (const auto& c : cases) {
    EXPECT_EQ(utf8_escaped(c.in), c.out) << c.in;
    // What JSON writers refuse, they now take.
    EXPECT_NO_THROW((void)nlohmann::json(utf8_escaped(c.in)).dump()) << c.in;
  }
  EXPECT_THROW((void)nlohmann::json(std::string("bad\xff")).dump(), nlohmann::json::exception);
}

TEST(Text, PrintableIsOneLineAndBounded) {
  EXPECT_EQ(printable("name"), "name");
  EXPECT_EQ(printable("a\nb\x1b[31m\x7f"), "a\\x0Ab\\x1B[31m\\x7F");
  EXPECT_EQ(printable("\xff\xc3\xa9"), "\\xFF\xc3\xa9");
  const std::string long_name(100000, 'x');
  const std::string p = printable(long_name, 50);
  EXPECT_EQ(p, std::string(50, 'x') + "... (100000 bytes)");
  // Never cut inside a character: 30 two-byte characters cut at byte 21 keep 10 of them.
  std::string accents;
  for (int i = 0; i < 30; ++i) accents += "\xc3\xa9";
  EXPECT_EQ(printable(accents, 21), accents.substr(0, 20) + "... (60 bytes)");
}

}  // namespace
}  // namespace minidl
