// Fake cgroup trees for the tests of kernels/cpu/cgroup.h and cpu_budget.h.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "kernels/cpu/cgroup.h"

namespace kimi::cpu::testing {

// A fake file system: path -> contents.
inline cgroup::ReadFileFn Files(std::map<std::string, std::string> files) {
  return [files = std::move(files)](const std::string& path) -> std::optional<std::string> {
    const auto it = files.find(path);
    if (it == files.end()) return std::nullopt;
    return it->second;
  };
}

// /proc/self/mountinfo of a host with the cgroup v2 hierarchy at /sys/fs/cgroup.
inline constexpr char kV2Mount[] =
    "22 1 0:21 / / rw,relatime - ext4 /dev/vda1 rw\n"
    "30 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n";

}  // namespace kimi::cpu::testing
