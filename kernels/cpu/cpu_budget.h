// How many CPUs this process may use, for sizing its thread pool: the CPUs of its affinity mask
// (taskset, a container's cpuset, mpirun's binding), capped by its cgroup CPU quota (docker --cpus,
// a Kubernetes CPU limit) rounded up. std::thread::hardware_concurrency() counts every online CPU
// of the machine: a server limited to 4 CPUs of a 64-core host would start 64 threads, whose spins
// and futex waits then take turns on 4 (each parallel section waiting on descheduled parts).
//
// The quota is the smallest along the process's cgroup and its ancestors (a limit on a parent,
// such as a Kubernetes pod or a systemd slice, binds every group under it): cgroup v2 `cpu.max`,
// cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`, found through /proc/self/cgroup and
// /proc/self/mountinfo. The group's cpuset (v2 `cpuset.cpus.effective`, v1
// `cpuset.effective_cpus`) says what the processes of the group share: ranks that a launcher bound
// to a part of it each have a narrower affinity mask.
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>

#include "kernels/cpu/cgroup.h"

namespace kimi::cpu {

struct CpuBudget {
  int online = 1;               // CPUs of the machine (std::thread::hardware_concurrency)
  int group = 1;                // CPUs of the cgroup's cpuset (the online ones without one)
  int affinity = 1;             // CPUs in the process's affinity mask
  std::optional<double> quota;  // the cgroup CPU limit, in CPUs, when there is one

  // min(affinity, ceil(quota)), at least 1: the CPUs this process may use.
  int usable() const { return std::min(affinity, QuotaCpus()); }
  // min(group, ceil(quota)), at least 1: those its group's processes may use together.
  int shared() const { return std::min(group, QuotaCpus()); }

 private:
  int QuotaCpus() const;  // ceil(quota), at least 1; no limit without one
};

// This process's budget, read now (the calling thread's affinity mask).
CpuBudget ProcessCpuBudget();

// One line for logs: "4 CPUs (8 in the affinity mask, 16 in the cgroup's cpuset, 64 online;
// cgroup CPU quota 3.50)".
std::string DescribeCpuBudget(const CpuBudget& b);

// Threads for each of `ranks` processes started together on this machine (mpirun's ranks of one
// node): a share of what their group may use, and no more than this one may:
// min(usable, shared / ranks), at least 1. Unbound ranks split the group's CPUs; ranks bound to a
// socket each take their share of the whole, which fits in their socket; ranks bound to a core
// each get that core.
int RankThreads(const CpuBudget& b, int ranks);

// The pieces, on given file contents (for tests).
// cgroup v2 cpu.max: "max PERIOD" (no limit) or "QUOTA PERIOD", in microseconds.
std::optional<double> ParseCpuMax(std::string_view cpu_max);
// cgroup v1: cpu.cfs_quota_us (-1: no limit) over cpu.cfs_period_us.
std::optional<double> ParseCfsQuota(std::string_view quota_us, std::string_view period_us);
// A CPU list ("0-3,8,10-11\n"): how many CPUs it names; nullopt when empty or malformed.
std::optional<int> ParseCpuList(std::string_view list);
// The limit over the process's cgroups named in `proc_self_cgroup` (the contents of
// /proc/self/cgroup), their controllers mounted as `mountinfo` says (/proc/self/mountinfo), their
// files read through read_file (nullopt: no such file). nullopt: no limit anywhere.
using ReadFileFn = cgroup::ReadFileFn;
std::optional<double> CgroupCpuLimit(std::string_view proc_self_cgroup, std::string_view mountinfo,
                                     const ReadFileFn& read_file);
// The CPUs of the process's cpuset group (the innermost group up the hierarchy that has the file;
// v2 first). nullopt: no cpuset hierarchy or file.
std::optional<int> CgroupCpusetCpus(std::string_view proc_self_cgroup, std::string_view mountinfo,
                                    const ReadFileFn& read_file);

}  // namespace kimi::cpu
