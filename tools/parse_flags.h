// Command-line parsing for the project's Abseil-flag tools (kimi-bench, kimi-plan, kimi-loadtest,
// ...), so that --help lists each tool's own flags.
#pragma once

#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/string_view.h"

namespace kimi::tools {

// Sets the usage message and parses argv; returns the positional arguments (argv[0] first).
// Abseil's --help and --helpshort show only the flags of files named after the program
// (kimi-plan.cc, kimi-plan_main.cc, ...), which ours are not (tools/plan_main.cc): without this
// they printed "No flags matched". Every flag Abseil does not define itself is the tool's own.
// Files are named from the source tree's root ("Flags from tools/plan_main.cc"), not the build's
// path.
inline std::vector<char*> ParseFlags(int argc, char** argv, absl::string_view usage) {
  const auto own = [](absl::string_view file) { return !absl::StrContains(file, "absl/flags/"); };
  const auto relative = [](absl::string_view file) {
    constexpr absl::string_view kSelf = __FILE__, kFromRoot = "tools/parse_flags.h";
    if (absl::EndsWith(kSelf, kFromRoot)) {
      absl::ConsumePrefix(&file, kSelf.substr(0, kSelf.size() - kFromRoot.size()));
    }
    while (absl::ConsumePrefix(&file, "/") || absl::ConsumePrefix(&file, "./")) {
    }
    return std::string(file);
  };
  absl::FlagsUsageConfig config;
  config.contains_help_flags = own;
  config.contains_helpshort_flags = own;
  config.normalize_filename = relative;
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace kimi::tools
