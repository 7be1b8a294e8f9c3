// Scratch directories for the unit tests of every folder.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include <unistd.h>

namespace kimi::testing {

// An empty directory `name` in this process's scratch directory ($TEST_TMPDIR or the system's temp
// dir, then kimi-test-<pid>), which is removed when the test binary exits: ctest runs every test
// in a process of its own, so scratch left behind would pile up in /tmp run after run.
inline std::string TempDir(const std::string& name) {
  static const std::filesystem::path* root = [] {
    const char* base = std::getenv("TEST_TMPDIR");
    auto* p = new std::filesystem::path(base ? base : std::filesystem::temp_directory_path());
    *p /= "kimi-test-" + std::to_string(::getpid());
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(*root, ec);
    });
    return p;
  }();
  const std::filesystem::path dir = *root / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace kimi::testing
