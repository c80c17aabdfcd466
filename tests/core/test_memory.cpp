// The memory check's view of container limits: cgroup v2 and v1 files under a fake root, the
// cgroup and its ancestors, "max" and v1's "unlimited", and the ranks sharing one host.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "minidl/core/error.hpp"
#include "minidl/core/resident.hpp"
#include "minidl/core/tensor.hpp"

using namespace minidl;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

/// A fresh directory under the system's temporary directory, removed with the object.
struct FakeRoot {
  fs::path dir;
  FakeRoot() {
    dir = fs::temp_directory_path() /
          ("minidl-cgroup-" + std::to_string(::getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~FakeRoot() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  void write(const std::string& rel, const std::string& text) const {
    fs::create_directories((dir / rel).parent_path());
    std::ofstream(dir / rel) << text << "\n";
  }
  std::string root() const { return dir.string(); }
};

constexpr std::size_t kMiB = std::size_t{1} << 20;

}  // namespace

TEST(CgroupMemory, V2LimitLessUsage) {
  FakeRoot f;
  f.write("job/memory.max", std::to_string(512 * kMiB));
  f.write("job/memory.current", std::to_string(100 * kMiB));
  EXPECT_EQ(cgroup_available_memory(f.root(), "0::/job\n"), 412 * kMiB);
}

TEST(CgroupMemory, V2MaxMeansNoLimitAndAncestorsCount) {
  FakeRoot f;
  f.write("a/b/memory.max", "max");
  f.write("a/b/memory.current", "0");
  EXPECT_EQ(cgroup_available_memory(f.root(), "0::/a/b\n"), std::nullopt);
  // The parent's limit binds the child.
  f.write("a/memory.max", std::to_string(300 * kMiB));
  f.write("a/memory.current", std::to_string(50 * kMiB));
  EXPECT_EQ(cgroup_available_memory(f.root(), "0::/a/b\n"), 250 * kMiB);
  // The tightest of several.
  f.write("a/b/memory.max", std::to_string(200 * kMiB));
  f.write("a/b/memory.current", std::to_string(20 * kMiB));
  EXPECT_EQ(cgroup_available_memory(f.root(), "0::/a/b\n"), 180 * kMiB);
}

TEST(CgroupMemory, V1MemoryController) {
  FakeRoot f;
  const std::string self =
      "12:pids:/x\n"
      "4:memory:/docker/abc\n"
      "0::/\n";
  f.write("memory/docker/abc/memory.limit_in_bytes", std::to_string(1024 * kMiB));
  f.write("memory/docker/abc/memory.usage_in_bytes", std::to_string(24 * kMiB));
  EXPECT_EQ(cgroup_available_memory(f.root(), self), 1000 * kMiB);
  // "unlimited" is written as a page-rounded 2^63.
  f.write("memory/docker/abc/memory.limit_in_bytes", "9223372036854771712");
  EXPECT_EQ(cgroup_available_memory(f.root(), self), std::nullopt);
}

TEST(CgroupMemory, ContainerMountsItsOwnCgroupAtTheRoot) {
  // The path names the cgroup from the host; the container sees its own at the mount's root.
  FakeRoot f;
  f.write("memory/memory.limit_in_bytes", std::to_string(64 * kMiB));
  f.write("memory/memory.usage_in_bytes", std::to_string(80 * kMiB));
  EXPECT_EQ(cgroup_available_memory(f.root(), "4:memory,cpu:/process_api/123\n"), 0u);
}

TEST(CgroupMemory, NothingReadableIsNoLimit) {
  FakeRoot f;
  EXPECT_EQ(cgroup_available_memory(f.root(), "0::/job\n4:memory:/job\n"), std::nullopt);
  f.write("job/memory.max", "garbage");
  EXPECT_EQ(cgroup_available_memory(f.root(), "0::/job\n"), std::nullopt);
  EXPECT_EQ(cgroup_available_memory(f.root(), "not a cgroup line\n"), std::nullopt);
}

// MINIDL_CGROUP_ROOT: the check refuses what the fake limit cannot hold, naming the size, and
// counts the ranks on the host.
TEST(CgroupMemory, CheckHonoursTheLimitAndTheRanksOnTheHost) {
  FakeRoot f;
  f.write("memory.max", std::to_string(200 * kMiB));
  f.write("memory.current", "0");
  f.write("memory/memory.limit_in_bytes", std::to_string(200 * kMiB));
  f.write("memory/memory.usage_in_bytes", "0");
  ::setenv("MINIDL_CGROUP_ROOT", f.root().c_str(), 1);
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  ::unsetenv("MPI_LOCALNRANKS");
  EXPECT_LE(available_memory(), 200 * kMiB);
  EXPECT_NO_THROW(check_fits_in_memory(150 * kMiB, "the graph"));
  try {
    check_fits_in_memory(300 * kMiB, "the graph");
    ADD_FAILURE() << "300 MiB passed a 200 MiB limit";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("the graph needs 300.0 MiB, more than the "));
    EXPECT_THAT(e.what(), HasSubstr("(the memory cgroup's limit less its usage)"));
  }
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  try {
    check_fits_in_memory(150 * kMiB, "the graph");
    ADD_FAILURE() << "2 x 150 MiB passed a 200 MiB limit";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("the graph needs 150.0 MiB per rank, 300.0 MiB for the 2 "
                                    "ranks on this host, more than the "));
  }
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  ::unsetenv("MINIDL_CGROUP_ROOT");
}

// VmHWM of /proc/self/status, in bytes; 0 when the line is missing or not in kB.
TEST(PeakResident, ReadsVmHwmInBytes) {
  EXPECT_EQ(minidl::peak_resident_bytes("Name:\tx\nVmPeak:\t  900 kB\nVmHWM:\t    1234 kB\n"),
            1234 * 1024);
  EXPECT_EQ(minidl::peak_resident_bytes("Name:\tx\nVmRSS:\t 5 kB\n"), 0);
  EXPECT_EQ(minidl::peak_resident_bytes("VmHWM:\t 12 MB\n"), 0);
#ifdef __linux__
  EXPECT_GT(minidl::peak_resident_bytes(), 0);  // this process's own
#endif
}
