// Synthetic models for engine tests, generated once per test binary into a temporary directory.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "engine/synthetic_model.h"
#include "gtest/gtest.h"

namespace kimi::testing {

// A per-process scratch directory, removed when the test binary exits.
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
  const std::filesystem::path p = *root / name;
  std::filesystem::create_directories(p);
  return p.string();
}

// Path of a freshly written preset (seed 1), cached for the life of the process.
inline const std::string& PresetDir(const std::string& preset) {
  static std::map<std::string, std::string>* dirs = new std::map<std::string, std::string>;
  auto it = dirs->find(preset);
  if (it != dirs->end()) return it->second;
  SyntheticOptions o;
  o.preset = preset;
  o.out_dir = TempDir(preset);
  o.seed = 1;
  const absl::Status s = WriteSyntheticModel(o);
  EXPECT_TRUE(s.ok()) << s;
  return dirs->emplace(preset, o.out_dir).first->second;
}

}  // namespace kimi::testing
