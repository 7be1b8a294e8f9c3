// Synthetic models for engine tests, generated once per test binary into a temporary directory.
#pragma once

#include <map>
#include <string>

#include "engine/synthetic_model.h"
#include "gtest/gtest.h"
#include "tests/temp_dir.h"

namespace kimi::testing {

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
