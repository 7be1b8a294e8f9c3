#include "kernels/cpu/cpu_budget.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include <sched.h>

namespace kimi::cpu {
namespace {

std::vector<std::string_view> Lines(std::string_view s) {
  std::vector<std::string_view> out;
  while (!s.empty()) {
    const size_t end = s.find('\n');
    out.push_back(s.substr(0, end));
    if (end == std::string_view::npos) break;
    s.remove_prefix(end + 1);
  }
  return out;
}

// Whitespace-separated words.
std::vector<std::string_view> Words(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
    const size_t start = i;
    while (i < s.size() && s[i] != ' ' && s[i] != '\t') ++i;
    if (i > start) out.push_back(s.substr(start, i - start));
  }
  return out;
}

// Whether the comma-separated list has `token` as one of its items.
bool HasItem(std::string_view list, std::string_view token) {
  while (true) {
    const size_t comma = list.find(',');
    if (list.substr(0, comma) == token) return true;
    if (comma == std::string_view::npos) return false;
    list.remove_prefix(comma + 1);
  }
}

// A whole number or decimal, surrounding whitespace allowed.
std::optional<double> ParseNumber(std::string_view s) {
  const std::vector<std::string_view> words = Words(s.substr(0, s.find('\n')));
  if (words.size() != 1) return std::nullopt;
  const std::string text(words[0]);
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// mountinfo writes space, tab, newline and backslash in paths as \ooo (octal).
std::string Unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      const std::string_view digits = s.substr(i + 1, 3);
      if (std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '7'; })) {
        out.push_back(
            static_cast<char>((digits[0] - '0') * 64 + (digits[1] - '0') * 8 + (digits[2] - '0')));
        i += 3;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

struct Mount {
  std::string root;   // the hierarchy's directory mounted there ("/" unless a namespace or bind)
  std::string point;  // where it is mounted
};

// The cgroup v2 hierarchy's mount, or (v2 false) the v1 hierarchy that has `controller`.
std::optional<Mount> FindMount(std::string_view mountinfo, bool v2, std::string_view controller) {
  for (std::string_view line : Lines(mountinfo)) {
    // id parent major:minor root point options [optional fields] - fstype source super-options
    const std::vector<std::string_view> f = Words(line);
    const auto dash = std::find(f.begin(), f.end(), std::string_view("-"));
    if (f.size() < 6 || dash - f.begin() < 6 || f.end() - dash < 4) continue;
    const std::string_view fstype = dash[1], options = dash[3];
    const bool match =
        v2 ? fstype == "cgroup2" : fstype == "cgroup" && HasItem(options, controller);
    if (match) return Mount{Unescape(f[3]), Unescape(f[4])};
  }
  return std::nullopt;
}

// The process's group in a hierarchy (/proc/self/cgroup): "0::PATH" for v2, "ID:CONTROLLERS:PATH"
// with `controller` among the controllers for v1.
std::optional<std::string> GroupPath(std::string_view proc_self_cgroup, bool v2,
                                     std::string_view controller) {
  for (std::string_view line : Lines(proc_self_cgroup)) {
    const size_t c1 = line.find(':');
    if (c1 == std::string_view::npos) continue;
    const size_t c2 = line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    const std::string_view id = line.substr(0, c1), controllers = line.substr(c1 + 1, c2 - c1 - 1);
    const bool match = v2 ? id == "0" && controllers.empty() : HasItem(controllers, controller);
    if (match) return std::string(line.substr(c2 + 1));
  }
  return std::nullopt;
}

// The group's directory and each parent's up to the mount point, innermost first. A group outside
// the mount's root (not visible from this mount namespace) gives the mount point alone.
std::vector<std::string> Ancestry(const Mount& m, std::string path) {
  std::string rel;
  if (m.root == "/") {
    rel = path;
  } else if (path.compare(0, m.root.size(), m.root) == 0 &&
             (path.size() == m.root.size() || path[m.root.size()] == '/')) {
    rel = path.substr(m.root.size());
  }
  while (!rel.empty() && rel.back() == '/') rel.pop_back();
  std::string base = m.point;  // joined with the groups' paths, which start with '/'
  while (!base.empty() && base.back() == '/') base.pop_back();
  std::vector<std::string> dirs;
  std::string dir = base + rel;
  while (true) {
    dirs.push_back(dir.empty() ? "/" : dir);
    if (dir.size() <= base.size()) break;
    dir.resize(std::max(dir.rfind('/'), base.size()));
  }
  return dirs;
}

// fn(dir) for the process's group in a hierarchy (v2, or the v1 one with `controller`) and then
// each parent up to the mount point, until fn returns true. Nothing without that hierarchy.
template <class Fn>
void WalkGroups(std::string_view proc_self_cgroup, std::string_view mountinfo, bool v2,
                std::string_view controller, Fn fn) {
  const std::optional<std::string> path = GroupPath(proc_self_cgroup, v2, controller);
  const std::optional<Mount> mount = FindMount(mountinfo, v2, controller);
  if (!path || !mount) return;
  for (const std::string& dir : Ancestry(*mount, *path)) {
    if (fn(dir)) return;
  }
}

std::optional<double> Smaller(std::optional<double> a, std::optional<double> b) {
  if (!a) return b;
  if (!b) return a;
  return std::min(*a, *b);
}

std::optional<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

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
