#include "kernels/cpu/cgroup.h"

#include <map>
#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "tests/kernels/cpu/fake_cgroup.h"

namespace kimi::cpu::cgroup {
namespace {

using testing::Files;
using testing::kV2Mount;

constexpr int64_t kGiB = int64_t{1} << 30;

TEST(Cgroup, MemoryLeftIsTheSmallestLimitLessUsageUpTheHierarchy) {
  const std::string group = "0::/kubepods.slice/pod1/ctr\n";
  const std::string ctr = "/sys/fs/cgroup/kubepods.slice/pod1/ctr",
                    pod = "/sys/fs/cgroup/kubepods.slice/pod1";
  // The container has no limit of its own; the pod allows 16 GiB and uses 10 (other containers
  // count), the slice 64 of which 20 are used.
  auto files = std::map<std::string, std::string>{
      {ctr + "/memory.max", "max\n"},
      {ctr + "/memory.current", std::to_string(2 * kGiB) + "\n"},
      {pod + "/memory.max", std::to_string(16 * kGiB) + "\n"},
      {pod + "/memory.current", std::to_string(10 * kGiB) + "\n"},
      {"/sys/fs/cgroup/kubepods.slice/memory.max", std::to_string(64 * kGiB) + "\n"},
      {"/sys/fs/cgroup/kubepods.slice/memory.current", std::to_string(20 * kGiB) + "\n"}};
  EXPECT_EQ(MemoryLeft(group, kV2Mount, Files(files)), 6 * kGiB);
  // Over its limit (the kernel reclaims down to it): nothing left, not a negative amount.
  files[pod + "/memory.current"] = std::to_string(17 * kGiB) + "\n";
  EXPECT_EQ(MemoryLeft(group, kV2Mount, Files(files)), 0);
  // No limit anywhere.
  EXPECT_EQ(MemoryLeft(group, kV2Mount, Files({{ctr + "/memory.max", "max\n"}})), std::nullopt);
  EXPECT_EQ(MemoryLeft("", "", Files({})), std::nullopt);
}

TEST(Cgroup, MemoryLeftInCgroupV1) {
  // v1 writes "no limit" as a page-rounded 2^63 - 1; a limit without a usage file counts as unused.
  const std::string group = "4:memory:/docker/abc\n";
  const std::string mount =
      "22 1 0:21 / / rw - ext4 /dev/vda1 rw\n"
      "40 22 0:35 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n";
  EXPECT_EQ(
      MemoryLeft(
          group, mount,
          Files({{"/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "314572800\n"},
                 {"/sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes", "14572800\n"},
                 {"/sys/fs/cgroup/memory/docker/memory.limit_in_bytes", "9223372036854771712\n"}})),
      300000000);
  EXPECT_EQ(
      MemoryLeft(group, mount,
                 Files({{"/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n"}})),
      std::nullopt);
}

TEST(Cgroup, ParsesMemAvailable) {
  EXPECT_EQ(ParseMemAvailable("MemTotal:       24554712 kB\nMemFree:         1234 kB\n"
                              "MemAvailable:   20971520 kB\n"),
            20 * kGiB);
  EXPECT_EQ(ParseMemAvailable("MemTotal:       24554712 kB\n"), std::nullopt);
  EXPECT_EQ(ParseMemAvailable(""), std::nullopt);
}

TEST(Cgroup, ThisProcessHasSomeMemory) {
  const std::optional<int64_t> available = ProcessMemoryAvailable();
  ASSERT_TRUE(available.has_value());  // Linux has /proc/meminfo
  EXPECT_GT(*available, 0);
}

}  // namespace
}  // namespace kimi::cpu::cgroup
