#include "kernels/cpu/cgroup.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace kimi::cpu::cgroup {
namespace {

// Whether the comma-separated list has `token` as one of its items.
bool HasItem(std::string_view list, std::string_view token) {
  while (true) {
    const size_t comma = list.find(',');
    if (list.substr(0, comma) == token) return true;
    if (comma == std::string_view::npos) return false;
    list.remove_prefix(comma + 1);
  }
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

}  // namespace

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

std::optional<double> ParseNumber(std::string_view s) {
  const std::vector<std::string_view> words = Words(s.substr(0, s.find('\n')));
  if (words.size() != 1) return std::nullopt;
  const std::string text(words[0]);
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void WalkGroups(std::string_view proc_self_cgroup, std::string_view mountinfo, bool v2,
                std::string_view controller, const std::function<bool(const std::string&)>& fn) {
  const std::optional<std::string> path = GroupPath(proc_self_cgroup, v2, controller);
  const std::optional<Mount> mount = FindMount(mountinfo, v2, controller);
  if (!path || !mount) return;
  for (const std::string& dir : Ancestry(*mount, *path)) {
    if (fn(dir)) return;
  }
}

namespace {

// A whole number of bytes; "max" (v2) and v1's near-2^63 "unlimited" give nullopt.
std::optional<int64_t> ParseBytes(std::string_view s) {
  const std::optional<double> v = ParseNumber(s);
  if (!v || *v < 0 || *v >= 9.0e18) return std::nullopt;
  return static_cast<int64_t>(*v);
}

}  // namespace

std::optional<int64_t> MemoryLeft(std::string_view proc_self_cgroup, std::string_view mountinfo,
                                  const ReadFileFn& read_file) {
  std::optional<int64_t> left;
  auto limit_less_usage = [&](const std::string& dir, const char* limit_file,
                              const char* usage_file) {
    const auto limit_text = read_file(dir + limit_file);
    const std::optional<int64_t> limit = limit_text ? ParseBytes(*limit_text) : std::nullopt;
    if (!limit) return;
    const auto usage_text = read_file(dir + usage_file);
    const int64_t usage = usage_text ? ParseBytes(*usage_text).value_or(0) : 0;
    left = Smaller(left, std::optional<int64_t>(std::max<int64_t>(0, *limit - usage)));
  };
  WalkGroups(proc_self_cgroup, mountinfo, true, "", [&](const std::string& dir) {
    limit_less_usage(dir, "/memory.max", "/memory.current");
    return false;
  });
  WalkGroups(proc_self_cgroup, mountinfo, false, "memory", [&](const std::string& dir) {
    limit_less_usage(dir, "/memory.limit_in_bytes", "/memory.usage_in_bytes");
    return false;
  });
  return left;
}

std::optional<int64_t> ParseMemAvailable(std::string_view meminfo) {
  for (std::string_view line : Lines(meminfo)) {
    const std::vector<std::string_view> w = Words(line);
    if (w.size() == 3 && w[0] == "MemAvailable:" && w[2] == "kB") {
      if (const std::optional<int64_t> kb = ParseBytes(w[1])) return *kb * 1024;
    }
  }
  return std::nullopt;
}

std::optional<int64_t> ProcessMemoryAvailable() {
  const std::optional<int64_t> machine =
      ParseMemAvailable(ReadWholeFile("/proc/meminfo").value_or(""));
  const std::string groups = ReadWholeFile("/proc/self/cgroup").value_or("");
  const std::string mountinfo = ReadWholeFile("/proc/self/mountinfo").value_or("");
  return Smaller(machine, MemoryLeft(groups, mountinfo, ReadWholeFile));
}

}  // namespace kimi::cpu::cgroup
