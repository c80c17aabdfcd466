// A fresh directory per test (named after the process and the test, removed afterwards): as a
// fixture with a helper that writes a file into it, or as a plain object (TempDir).
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

namespace minidl::testing {

class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           fmt::format("minidl_{}_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  /// The full path of name in the directory.
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  /// Writes bytes to name in the directory and returns its full path.
  std::string file(const std::string& name, const std::vector<std::uint8_t>& bytes) {
    std::ofstream f(dir_ / name, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
    EXPECT_TRUE(f.good()) << name;
    return path(name);
  }

  std::filesystem::path dir_;
};

/// A fresh directory, removed when the object goes.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static int count = 0;
    path = std::filesystem::temp_directory_path() /
           fmt::format("minidl-ckpt-{}-{}-{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name(), ++count);
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path.string(); }
};

}  // namespace minidl::testing
