#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

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

namespace {

/// A fresh directory for one test, removed afterwards.
struct Dir {
  std::filesystem::path path;
  explicit Dir(const std::string& name)
      : path(std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~Dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path))
      out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

}  // namespace

// A symlink planted where the old writer put its temporary file ("<path>.tmp"), and the target
// itself a symlink: the writer follows neither, so the file they point to stays as it was.
TEST(File, WriteAtomicallyNeverFollowsAPlantedSymlink) {
  Dir dir("minidl_test_file_symlink");
  const auto victim = dir.path / "victim";
  { std::ofstream(victim) << "precious"; }
  const std::string path = (dir.path / "out.safetensors").string();
  std::filesystem::create_symlink(victim, path + ".tmp");
  write_file_atomically(path, "new content", "test");
  EXPECT_EQ(read_all(victim), "precious");
  EXPECT_EQ(read_all(path), "new content");
  EXPECT_FALSE(std::filesystem::is_symlink(path));
  // The target a symlink: replaced by the file, not written through.
  const std::string linked = (dir.path / "linked.txt").string();
  std::filesystem::create_symlink(victim, linked);
  write_file_atomically(linked, "other", "test");
  EXPECT_EQ(read_all(victim), "precious");
  EXPECT_FALSE(std::filesystem::is_symlink(linked));
  EXPECT_EQ(read_all(linked), "other");
  EXPECT_EQ(dir.names(), (std::vector<std::string>{"linked.txt", "out.safetensors",
                                                   "out.safetensors.tmp", "victim"}));
}

// The temporary files are unique per write (two writers of one path do not share one), made
// with the usual permissions (0666 less the umask), and none is left.
TEST(File, WriteAtomicallyUsesUniqueTemporaryFiles) {
  Dir dir("minidl_test_file_unique");
  const std::string path = (dir.path / "metrics.jsonl").string();
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t) {
    writers.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i)
        write_file_atomically(path, std::string(1000, static_cast<char>('a' + t)), "test");
    });
  }
  for (auto& w : writers) w.join();
  const std::string content = read_all(path);
  ASSERT_EQ(content.size(), 1000u);
  EXPECT_EQ(content, std::string(1000, content[0]));  // one writer's whole content
  EXPECT_EQ(dir.names(), std::vector<std::string>{"metrics.jsonl"});
  const mode_t mask = ::umask(0);
  ::umask(mask);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666 & ~mask);
}

// check_writable and check_writable_directory say why an output could not be written, before
// anything is written, and leave nothing behind either way.
TEST(File, CheckWritableNamesTheProblemAndCreatesNothing) {
  Dir dir("minidl_test_file_check");
  const std::string d = dir.path.string();
  { std::ofstream(dir.path / "a_file") << "x"; }
  std::filesystem::create_directory(dir.path / "a_dir");
  EXPECT_NO_THROW(check_writable(d + "/new.safetensors", "--save"));
  EXPECT_NO_THROW(check_writable(d + "/a_file", "--save"));  // replaced when written
  const struct {
    std::string path, words;
  } bad[] = {
      {d + "/missing/out.json", "--trace: cannot write '" + d +
                                    "/missing/out.json': the directory '" + d +
                                    "/missing' does not exist"},
      {d + "/a_dir", "--trace: cannot write '" + d + "/a_dir': it is a directory"},
      {d + "/a_file/out.json", "'" + d + "/a_file' is not a directory"},
      {"/proc/minidl-out.json",
       "--trace: cannot write '/proc/minidl-out.json': cannot create a "
       "file in '/proc'"},  // refused even to root
      {"", "the path is empty"},
  };
  for (const auto& c : bad) {
    try {
      check_writable(c.path, "--trace");
      ADD_FAILURE() << c.path << ": no error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(c.words));
    }
  }
  // A directory that does not exist yet is fine when it could be made; nothing is made.
  EXPECT_NO_THROW(check_writable_directory(d + "/ckpt/deeper", "--checkpoint-dir"));
  EXPECT_NO_THROW(check_writable_directory(d + "/a_dir", "--checkpoint-dir"));
  try {
    check_writable_directory(d + "/a_file/ckpt", "--checkpoint-dir");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("--checkpoint-dir: cannot write in '" + d + "/a_file/ckpt': '" +
                                    d + "/a_file' is not a directory"));
  }
  try {
    check_writable_directory("/proc/minidl-ckpt", "--checkpoint-dir");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot create a file in '/proc'"));
  }
  EXPECT_EQ(dir.names(), (std::vector<std::string>{"a_dir", "a_file"}));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path / "a_dir"));
}

// Inputs that are not regular files are refused at once, naming the file and what it is; a FIFO
// without a writer does not block the open.
TEST(File, OpenInputRefusesDevicesAndFifos) {
  Dir dir("minidl_test_file_input");
  const std::string fifo = (dir.path / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const struct {
    std::string path, words;
  } bad[] = {
      {"/dev/zero",
       "cannot open IDX image file '/dev/zero': it is a character device, expected a "
       "regular file"},
      {fifo, "cannot open IDX image file '" + fifo +
                 "': it is a FIFO (named pipe), expected a "
                 "regular file"},
      {dir.path.string(), "it is a directory, expected a file"},
      {(dir.path / "none").string(), "it does not exist"},
  };
  for (const auto& c : bad) {
    try {
      (void)open_input(c.path, "IDX image file");
      ADD_FAILURE() << c.path << ": no error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(c.words));
    }
  }
}
