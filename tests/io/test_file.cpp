#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "minidl/core/error.hpp"
#include "minidl/io/file.hpp"

using namespace minidl;
using ::testing::HasSubstr;

namespace {
std::string read_all(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}
}  // namespace

// A whole new content replaces the old one, and nothing else is left in the directory.
TEST(File, WriteAtomicallyReplacesTheWholeFile) {
  const auto dir = std::filesystem::temp_directory_path() / "minidl_test_file";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "out.txt").string();
  write_file_atomically(path, "first version, long", "test");
  write_file_atomically(path, std::string("second\0binary", 13), "test");
  EXPECT_EQ(read_all(path), std::string("second\0binary", 13));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 1);
  std::filesystem::remove_all(dir);
}

// An unwritable path fails with the caller's label and the path, and leaves no file behind.
TEST(File, WriteAtomicallyNamesWhatFailed) {
  const auto dir = std::filesystem::temp_directory_path() / "minidl_test_file_missing";
  std::filesystem::remove_all(dir);
  const std::string path = (dir / "out.txt").string();
  try {
    write_file_atomically(path, "x", "--metrics");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("--metrics: cannot write '" + path + "'"));
  }
  EXPECT_FALSE(std::filesystem::exists(dir));
}
