// Container limits read from fake cgroup trees laid out as the kernel mounts them.
#include "server/config/cgroup_limits.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace gpucompute {
namespace {

namespace fs = std::filesystem;

class CgroupLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("cgroup_limits_test." + std::to_string(getpid()) + "." +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(root());
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path root() const { return dir_ / "sys/fs/cgroup"; }
  std::string self() const { return (dir_ / "self_cgroup").string(); }

  void Write(const fs::path& path, const std::string& text) {
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text << "\n";
  }
  CgroupLimits Read() { return ReadCgroupLimits(root().string(), self()); }

  fs::path dir_;
};

TEST_F(CgroupLimitsTest, V2ContainerWithItsOwnNamespace) {
  // A cgroup namespace: the container's group is the mount's root.
  Write(self(), "0::/");
  Write(root() / "cgroup.controllers", "cpuset cpu io memory pids");
  Write(root() / "memory.max", "2147483648");
  Write(root() / "cpu.max", "150000 100000");
  const CgroupLimits limits = Read();
  ASSERT_TRUE(limits.memory_bytes.has_value());
  EXPECT_EQ(*limits.memory_bytes, 2147483648u);
  ASSERT_TRUE(limits.cpus.has_value());
  EXPECT_DOUBLE_EQ(*limits.cpus, 1.5);
  EXPECT_EQ(LimitedThreadCount(16, limits), 2);
  EXPECT_EQ(LimitedThreadCount(1, limits), 1);
  EXPECT_EQ(LimitedMemoryBytes(uint64_t{64} << 30, limits), 2147483648u);
  EXPECT_EQ(LimitedMemoryBytes(uint64_t{1} << 30, limits), uint64_t{1} << 30);
}

TEST_F(CgroupLimitsTest, V2UnlimitedIsNoLimit) {
  Write(self(), "0::/");
  Write(root() / "cgroup.controllers", "cpu memory");
  Write(root() / "memory.max", "max");
  Write(root() / "cpu.max", "max 100000");
  const CgroupLimits limits = Read();
  EXPECT_FALSE(limits.memory_bytes.has_value());
  EXPECT_FALSE(limits.cpus.has_value());
  EXPECT_EQ(LimitedThreadCount(12, limits), 12);
  EXPECT_EQ(LimitedMemoryBytes(12345, limits), 12345u);
}

TEST_F(CgroupLimitsTest, V2TightestAncestorWins) {
  // A pod-level limit above a looser container-level one (Kubernetes' layout).
  Write(self(), "0::/kubepods/pod1/ctr");
  Write(root() / "cgroup.controllers", "cpu memory");
  Write(root() / "kubepods/pod1/memory.max", "1073741824");
  Write(root() / "kubepods/pod1/cpu.max", "50000 100000");
  Write(root() / "kubepods/pod1/ctr/memory.max", "4294967296");
  Write(root() / "kubepods/pod1/ctr/cpu.max", "400000 100000");
  Write(root() / "kubepods/memory.max", "max");
  const CgroupLimits limits = Read();
  ASSERT_TRUE(limits.memory_bytes.has_value());
  EXPECT_EQ(*limits.memory_bytes, 1073741824u);
  ASSERT_TRUE(limits.cpus.has_value());
  EXPECT_DOUBLE_EQ(*limits.cpus, 0.5);
  EXPECT_EQ(LimitedThreadCount(8, limits), 1);
}

TEST_F(CgroupLimitsTest, V2PathFromTheHostReadsTheMountItself) {
  // No cgroup namespace: /proc/self/cgroup names the host's path, which does not exist
  // inside the container's mount.
  Write(self(), "0::/machine.slice/libpod-abc.scope/container");
  Write(root() / "cgroup.controllers", "cpu memory");
  Write(root() / "memory.max", "536870912");
  const CgroupLimits limits = Read();
  ASSERT_TRUE(limits.memory_bytes.has_value());
  EXPECT_EQ(*limits.memory_bytes, 536870912u);
  EXPECT_FALSE(limits.cpus.has_value());
}

TEST_F(CgroupLimitsTest, V1ContainerLimits) {
  Write(self(),
        "12:pids:/docker/abc\n"
        "4:memory:/docker/abc\n"
        "3:cpu,cpuacct:/docker/abc\n"
        "0::/\n");
  // The container's own groups are bind-mounted at each controller's mount point.
  Write(root() / "memory/memory.limit_in_bytes", "2147483648");
  Write(root() / "cpu,cpuacct/cpu.cfs_quota_us", "100000");
  Write(root() / "cpu,cpuacct/cpu.cfs_period_us", "100000");
  const CgroupLimits limits = Read();
  ASSERT_TRUE(limits.memory_bytes.has_value());
  EXPECT_EQ(*limits.memory_bytes, 2147483648u);
  ASSERT_TRUE(limits.cpus.has_value());
  EXPECT_DOUBLE_EQ(*limits.cpus, 1.0);
  EXPECT_EQ(LimitedThreadCount(2, limits), 1);
}

TEST_F(CgroupLimitsTest, V1HostPathAndUnlimitedValues) {
  // A hybrid host: v1 controllers with the group's real path, v2 without controllers.
  Write(self(),
        "4:memory:/jobs/j1\n"
        "1:cpu:/\n"
        "0::/\n");
  Write(root() / "unified/cgroup.controllers", "");
  Write(root() / "memory/memory.limit_in_bytes", "9223372036854771712");
  Write(root() / "memory/jobs/memory.limit_in_bytes", "9223372036854771712");
  Write(root() / "memory/jobs/j1/memory.limit_in_bytes", "3221225472");
  Write(root() / "cpu/cpu.cfs_quota_us", "-1");
  Write(root() / "cpu/cpu.cfs_period_us", "100000");
  const CgroupLimits limits = Read();
  ASSERT_TRUE(limits.memory_bytes.has_value());
  EXPECT_EQ(*limits.memory_bytes, 3221225472u);
  EXPECT_FALSE(limits.cpus.has_value());
}

TEST_F(CgroupLimitsTest, NothingMountedIsNoLimit) {
  Write(self(), "0::/");
  const CgroupLimits limits = Read();
  EXPECT_FALSE(limits.memory_bytes.has_value());
  EXPECT_FALSE(limits.cpus.has_value());
  // And no membership file at all.
  const CgroupLimits none = ReadCgroupLimits(root().string(), (dir_ / "missing").string());
  EXPECT_FALSE(none.memory_bytes.has_value());
  EXPECT_FALSE(none.cpus.has_value());
}

TEST_F(CgroupLimitsTest, MalformedFilesAreIgnored) {
  Write(self(), "0::/");
  Write(root() / "cgroup.controllers", "cpu memory");
  Write(root() / "memory.max", "lots");
  Write(root() / "cpu.max", "150000");
  const CgroupLimits limits = Read();
  EXPECT_FALSE(limits.memory_bytes.has_value());
  EXPECT_FALSE(limits.cpus.has_value());
}

TEST(AvailableProcessorsTest, AtLeastOneAndAtMostTheMachine) {
  const int n = AvailableProcessors();
  EXPECT_GE(n, 1);
  EXPECT_LE(n, static_cast<int>(sysconf(_SC_NPROCESSORS_CONF)));
}

}  // namespace
}  // namespace gpucompute
