// The process's control groups (cgroup v2, v1, or both in the hybrid layout): where the files of
// its group and of each parent are, and the memory they still allow it. The CPU budget
// (cpu_budget.h) reads its quota and cpuset through the same walk.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kimi::cpu::cgroup {

// Reads a whole file (nullopt: no such file); tests pass fake trees.
using ReadFileFn = std::function<std::optional<std::string>(const std::string& path)>;
std::optional<std::string> ReadWholeFile(const std::string& path);

// fn(dir) for the process's group in a hierarchy (v2, or the v1 one with `controller`) and then
// each parent up to the mount point, until fn returns true. Nothing without that hierarchy.
// proc_self_cgroup and mountinfo are the contents of /proc/self/cgroup and /proc/self/mountinfo.
void WalkGroups(std::string_view proc_self_cgroup, std::string_view mountinfo, bool v2,
                std::string_view controller, const std::function<bool(const std::string&)>& fn);

// The bytes the process's groups still allow it to use: over the group and its parents, the
// smallest limit less usage (v2 memory.max and memory.current, v1 memory.limit_in_bytes and
// memory.usage_in_bytes, both hierarchies in the hybrid layout). nullopt: no limit anywhere.
std::optional<int64_t> MemoryLeft(std::string_view proc_self_cgroup, std::string_view mountinfo,
                                  const ReadFileFn& read_file);
// MemAvailable of /proc/meminfo, in bytes; nullopt when missing.
std::optional<int64_t> ParseMemAvailable(std::string_view meminfo);
// What this process may still allocate: the machine's available memory, capped by its cgroups'.
// nullopt when neither can be read.
std::optional<int64_t> ProcessMemoryAvailable();

// The tighter of two limits, either of which may be absent (no limit).
template <class T>
std::optional<T> Smaller(std::optional<T> a, std::optional<T> b) {
  if (!a) return b;
  if (!b) return a;
  return *a < *b ? a : b;
}

// Pieces shared with cpu_budget.cc.
std::vector<std::string_view> Lines(std::string_view s);
// Whitespace-separated words.
std::vector<std::string_view> Words(std::string_view s);
// A whole number or decimal, surrounding whitespace allowed.
std::optional<double> ParseNumber(std::string_view s);

}  // namespace kimi::cpu::cgroup
