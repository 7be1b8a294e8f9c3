#include "kernels/cpu/cpu_budget.h"

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "tests/kernels/cpu/fake_cgroup.h"
#include "kernels/cpu/thread_pool.h"
#include <sched.h>

namespace kimi::cpu {
namespace {

TEST(CpuBudget, ParsesCgroupV2CpuMax) {
  EXPECT_EQ(ParseCpuMax("max 100000\n"), std::nullopt);
  EXPECT_EQ(ParseCpuMax("400000 100000\n"), 4.0);
  EXPECT_EQ(ParseCpuMax("150000 100000"), 1.5);
  EXPECT_EQ(ParseCpuMax("50000"), 0.5);  // the period defaults to 100 ms
  EXPECT_EQ(ParseCpuMax(""), std::nullopt);
  EXPECT_EQ(ParseCpuMax("lots 100000"), std::nullopt);
  EXPECT_EQ(ParseCpuMax("100000 0"), std::nullopt);
}

TEST(CpuBudget, ParsesCgroupV1CfsQuota) {
  EXPECT_EQ(ParseCfsQuota("-1\n", "100000\n"), std::nullopt);
  EXPECT_EQ(ParseCfsQuota("200000\n", "100000\n"), 2.0);
  EXPECT_EQ(ParseCfsQuota("25000", "100000"), 0.25);
  EXPECT_EQ(ParseCfsQuota("x", "100000"), std::nullopt);
}

using testing::Files;
using testing::kV2Mount;

TEST(CpuBudget, CgroupV2TakesTheSmallestLimitUpTheHierarchy) {
  // A Kubernetes-style nesting: the pod limits 2.5 CPUs, the container itself nothing, a parent
  // slice 8.
  const std::string cgroup = "0::/kubepods.slice/pod1/ctr\n";
  EXPECT_EQ(
      CgroupCpuLimit(cgroup, kV2Mount,
                     Files({{"/sys/fs/cgroup/kubepods.slice/pod1/ctr/cpu.max", "max 100000\n"},
                            {"/sys/fs/cgroup/kubepods.slice/pod1/cpu.max", "250000 100000\n"},
                            {"/sys/fs/cgroup/kubepods.slice/cpu.max", "800000 100000\n"}})),
      2.5);
  // No limit anywhere (the root group has no cpu.max at all).
  EXPECT_EQ(
      CgroupCpuLimit(cgroup, kV2Mount,
                     Files({{"/sys/fs/cgroup/kubepods.slice/pod1/ctr/cpu.max", "max 100000\n"},
                            {"/sys/fs/cgroup/kubepods.slice/cpu.max", "max 100000\n"}})),
      std::nullopt);
  // Inside a container's cgroup namespace (docker --cpus=3): the group is "/", the mount point.
  EXPECT_EQ(
      CgroupCpuLimit("0::/\n", kV2Mount, Files({{"/sys/fs/cgroup/cpu.max", "300000 100000"}})),
      3.0);
  // Nothing mounted, or no v2 line: no limit.
  EXPECT_EQ(CgroupCpuLimit(cgroup, "22 1 0:21 / / rw - ext4 /dev/vda1 rw\n",
                           Files({{"/sys/fs/cgroup/cpu.max", "100000 100000"}})),
            std::nullopt);
}

TEST(CpuBudget, CgroupMountOfASubtreeAndEscapedPaths) {
  // A mount whose root is the process's own group (a container without a cgroup namespace): the
  // group's directory is the mount point; its parents are not visible there.
  const std::string mount =
      "40 22 0:26 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
      "41 22 0:27 / /mnt/with\\040space rw - ext4 /dev/vdb rw\n";
  EXPECT_EQ(CgroupCpuLimit("0::/docker/abc\n", mount,
                           Files({{"/sys/fs/cgroup/cpu.max", "200000 100000"},
                                  {"/sys/fs/cgroup/docker/abc/cpu.max", "100000 100000"}})),
            2.0);
  const std::string escaped = "40 22 0:26 / /run/my\\040cgroups rw - cgroup2 cgroup2 rw\n";
  EXPECT_EQ(
      CgroupCpuLimit("0::/a\n", escaped, Files({{"/run/my cgroups/a/cpu.max", "100000 100000"}})),
      1.0);
}

TEST(CpuBudget, CgroupV1CpuControllerAndHybridLayouts) {
  const std::string mount =
      "30 22 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
      "31 22 0:27 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
      "32 22 0:28 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
  const std::string cgroup =
      "5:memory:/user.slice\n"
      "4:cpu,cpuacct:/user.slice/job\n"
      "0::/user.slice/job\n";
  std::map<std::string, std::string> files = {
      {"/sys/fs/cgroup/cpu,cpuacct/user.slice/job/cpu.cfs_quota_us", "-1\n"},
      {"/sys/fs/cgroup/cpu,cpuacct/user.slice/job/cpu.cfs_period_us", "100000\n"},
      {"/sys/fs/cgroup/cpu,cpuacct/user.slice/cpu.cfs_quota_us", "150000\n"},
      {"/sys/fs/cgroup/cpu,cpuacct/user.slice/cpu.cfs_period_us", "100000\n"},
      {"/sys/fs/cgroup/memory/user.slice/cpu.cfs_quota_us", "10000\n"},  // not the cpu hierarchy
  };
  EXPECT_EQ(CgroupCpuLimit(cgroup, mount, Files(files)), 1.5);
  files["/sys/fs/cgroup/unified/user.slice/job/cpu.max"] = "100000 100000\n";  // both: smaller
  EXPECT_EQ(CgroupCpuLimit(cgroup, mount, Files(files)), 1.0);
}

TEST(CpuBudget, ParsesCpuLists) {
  EXPECT_EQ(ParseCpuList("0-3\n"), 4);
  EXPECT_EQ(ParseCpuList("0-3,8,10-11"), 7);
  EXPECT_EQ(ParseCpuList("5"), 1);
  EXPECT_EQ(ParseCpuList("\n"), std::nullopt);  // an empty cpuset
  EXPECT_EQ(ParseCpuList("3-1"), std::nullopt);
  EXPECT_EQ(ParseCpuList("0-x"), std::nullopt);
}

TEST(CpuBudget, CgroupCpusetFromTheInnermostGroupThatHasOne) {
  // v2: the container's group has no cpuset controller; its parent's effective CPUs apply.
  const std::string cgroup = "0::/kubepods.slice/pod1/ctr\n";
  EXPECT_EQ(CgroupCpusetCpus(
                cgroup, kV2Mount,
                Files({{"/sys/fs/cgroup/kubepods.slice/pod1/cpuset.cpus.effective", "4-11\n"},
                       {"/sys/fs/cgroup/cpuset.cpus.effective", "0-63\n"}})),
            8);
  // v1: the cpuset hierarchy's own mount.
  const std::string mount =
      "31 22 0:27 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n"
      "32 22 0:28 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
  EXPECT_EQ(
      CgroupCpusetCpus("3:cpuset:/docker/abc\n4:cpu,cpuacct:/docker/abc\n", mount,
                       Files({{"/sys/fs/cgroup/cpuset/docker/abc/cpuset.effective_cpus", "0-1\n"},
                              {"/sys/fs/cgroup/cpuset/cpuset.effective_cpus", "0-15\n"}})),
      2);
  EXPECT_EQ(CgroupCpusetCpus("0::/\n", kV2Mount, Files({})), std::nullopt);
}

// mpirun's ranks of one node: unbound, bound to a socket each (two per socket), bound to a core
// each, and in a container (cpuset, or quota) that all of them share.
TEST(CpuBudget, RanksShareTheirGroupWithinTheirOwnMask) {
  CpuBudget unbound{.online = 32, .group = 32, .affinity = 32, .quota = std::nullopt};
  EXPECT_EQ(RankThreads(unbound, 4), 8);
  EXPECT_EQ(RankThreads(unbound, 1), 32);
  CpuBudget socket{.online = 32, .group = 32, .affinity = 16, .quota = std::nullopt};
  EXPECT_EQ(RankThreads(socket, 4), 8);
  CpuBudget core{.online = 16, .group = 16, .affinity = 1, .quota = std::nullopt};
  EXPECT_EQ(RankThreads(core, 2), 1);
  CpuBudget cpuset{.online = 64, .group = 8, .affinity = 8, .quota = std::nullopt};
  EXPECT_EQ(RankThreads(cpuset, 2), 4);
  CpuBudget quota{.online = 64, .group = 64, .affinity = 64, .quota = 4.0};
  EXPECT_EQ(RankThreads(quota, 8), 1);  // never below one
}

TEST(CpuBudget, ThisProcessIsWithinTheMachine) {
  const CpuBudget b = ProcessCpuBudget();
  EXPECT_GE(b.online, 1);
  EXPECT_GE(b.affinity, 1);
  EXPECT_LE(b.affinity, b.online);
  EXPECT_GE(b.usable(), 1);
  EXPECT_LE(b.usable(), b.affinity);
  EXPECT_GE(b.group, b.affinity);
  EXPECT_LE(b.group, b.online);
  EXPECT_GE(b.shared(), b.usable());
  EXPECT_LE(b.shared(), b.group);
  if (b.quota) {
    EXPECT_LE(b.usable(), std::max(1.0, *b.quota + 1.0));
  }
  EXPECT_NE(DescribeCpuBudget(b).find("online"), std::string::npos);
}

// Restricted to one CPU (as `taskset -c N` or a launcher's binding leaves it), the process may use
// one, and a pool sized by default gets one thread: no spinning workers on a CPU it does not have.
TEST(CpuBudget, OneCpuInTheAffinityMaskSizesThePoolToOne) {
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof saved, &saved), 0);
  int first = 0;
  while (first < CPU_SETSIZE && !CPU_ISSET(first, &saved)) ++first;
  ASSERT_LT(first, CPU_SETSIZE);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  if (sched_setaffinity(0, sizeof one, &one) != 0) GTEST_SKIP() << "cannot set the affinity here";
  const char* env = std::getenv("KIMI_NUM_THREADS");
  const std::string saved_env = env != nullptr ? env : "";
  unsetenv("KIMI_NUM_THREADS");

  const CpuBudget b = ProcessCpuBudget();
  EXPECT_EQ(b.affinity, 1);
  EXPECT_EQ(b.usable(), 1);
  {
    ThreadPool pool(0);
    EXPECT_EQ(pool.num_threads(), 1);
  }

  if (env != nullptr) setenv("KIMI_NUM_THREADS", saved_env.c_str(), 1);
  ASSERT_EQ(sched_setaffinity(0, sizeof saved, &saved), 0);
}

}  // namespace
}  // namespace kimi::cpu
