#include "kernels/cpu/cpu_budget.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

#include "kernels/cpu/cgroup.h"
#include <sched.h>

namespace kimi::cpu {
namespace {

using cgroup::ParseNumber;
using cgroup::ReadWholeFile;
using cgroup::Smaller;
using cgroup::WalkGroups;
using cgroup::Words;

}  // namespace

std::optional<double> ParseCpuMax(std::string_view cpu_max) {
  const std::vector<std::string_view> w = Words(cpu_max.substr(0, cpu_max.find('\n')));
  if (w.empty() || w.size() > 2 || w[0] == "max") return std::nullopt;
  const std::optional<double> quota = ParseNumber(w[0]);
  const std::optional<double> period = w.size() == 2 ? ParseNumber(w[1]) : 100000.0;
  if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;
  return *quota / *period;
}

std::optional<double> ParseCfsQuota(std::string_view quota_us, std::string_view period_us) {
  const std::optional<double> quota = ParseNumber(quota_us), period = ParseNumber(period_us);
  if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;  // -1: no limit
  return *quota / *period;
}

std::optional<int> ParseCpuList(std::string_view list) {
  const std::vector<std::string_view> words = Words(list.substr(0, list.find('\n')));
  if (words.size() != 1) return std::nullopt;
  int count = 0;
  std::string_view rest = words[0];
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const size_t dash = item.find('-');
    const std::optional<double> lo = ParseNumber(item.substr(0, dash));
    const std::optional<double> hi =
        dash == std::string_view::npos ? lo : ParseNumber(item.substr(dash + 1));
    if (!lo || !hi || *lo < 0 || *hi < *lo) return std::nullopt;
    count += static_cast<int>(*hi - *lo) + 1;
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return count;
}

std::optional<double> CgroupCpuLimit(std::string_view proc_self_cgroup, std::string_view mountinfo,
                                     const ReadFileFn& read_file) {
  // v2 (unified): cpu.max in every group. Systems in the hybrid layout may have both
  // hierarchies, with the cpu controller in v1; the smaller limit of the two applies.
  std::optional<double> limit;
  WalkGroups(proc_self_cgroup, mountinfo, true, "", [&](const std::string& dir) {
    if (auto text = read_file(dir + "/cpu.max")) limit = Smaller(limit, ParseCpuMax(*text));
    return false;
  });
  WalkGroups(proc_self_cgroup, mountinfo, false, "cpu", [&](const std::string& dir) {
    const auto quota = read_file(dir + "/cpu.cfs_quota_us");
    const auto period = read_file(dir + "/cpu.cfs_period_us");
    if (quota && period) limit = Smaller(limit, ParseCfsQuota(*quota, *period));
    return false;
  });
  return limit;
}

std::optional<int> CgroupCpusetCpus(std::string_view proc_self_cgroup, std::string_view mountinfo,
                                    const ReadFileFn& read_file) {
  // v2: a group without the cpuset controller has no file and takes its parent's CPUs.
  std::optional<int> cpus;
  const auto read_cpus = [&](const std::string& dir, const char* file) {
    if (auto text = read_file(dir + file)) cpus = ParseCpuList(*text);
    return cpus.has_value();
  };
  WalkGroups(proc_self_cgroup, mountinfo, true, "",
             [&](const std::string& dir) { return read_cpus(dir, "/cpuset.cpus.effective"); });
  if (!cpus) {
    WalkGroups(proc_self_cgroup, mountinfo, false, "cpuset", [&](const std::string& dir) {
      return read_cpus(dir, "/cpuset.effective_cpus") || read_cpus(dir, "/cpuset.cpus");
    });
  }
  return cpus;
}

CpuBudget ProcessCpuBudget() {
  CpuBudget b;
  b.online = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  b.affinity = b.online;
  // A mask large enough for any CPU number the kernel may report (CPU_SETSIZE is 1024).
  const int max_cpus = std::max(b.online, 1024) * 4;
  cpu_set_t* set = CPU_ALLOC(max_cpus);
  if (set != nullptr) {
    const size_t bytes = CPU_ALLOC_SIZE(max_cpus);
    CPU_ZERO_S(bytes, set);
    if (sched_getaffinity(0, bytes, set) == 0) b.affinity = std::max(1, CPU_COUNT_S(bytes, set));
    CPU_FREE(set);
  }
  const std::string cgroup = ReadWholeFile("/proc/self/cgroup").value_or("");
  const std::string mountinfo = ReadWholeFile("/proc/self/mountinfo").value_or("");
  b.quota = CgroupCpuLimit(cgroup, mountinfo, ReadWholeFile);
  b.group = std::clamp(CgroupCpusetCpus(cgroup, mountinfo, ReadWholeFile).value_or(b.online),
                       b.affinity, std::max(b.online, b.affinity));
  return b;
}

int CpuBudget::QuotaCpus() const {
  return quota ? std::max(1, static_cast<int>(std::ceil(*quota))) : std::max(group, affinity);
}

int RankThreads(const CpuBudget& b, int ranks) {
  return std::max(1, std::min(b.usable(), b.shared() / std::max(1, ranks)));
}

std::string DescribeCpuBudget(const CpuBudget& b) {
  char quota[48] = "no cgroup CPU quota";
  if (b.quota) std::snprintf(quota, sizeof quota, "cgroup CPU quota %.2f", *b.quota);
  char line[200];
  std::snprintf(line, sizeof line,
                "%d CPU%s (%d in the affinity mask, %d in the cgroup's cpuset, %d online; %s)",
                b.usable(), b.usable() == 1 ? "" : "s", b.affinity, b.group, b.online, quota);
  return line;
}

}  // namespace kimi::cpu
