// kimi-mkmodel --preset NAME --out DIR --seed N [--tiktoken RANKS]
// Writes a deterministic synthetic checkpoint in the published layout.
#include <chrono>
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/synthetic_model.h"
#include "tools/parse_flags.h"

ABSL_FLAG(std::string, preset, "", "model preset");
ABSL_FLAG(std::string, out, "", "output directory");
ABSL_FLAG(uint64_t, seed, 0, "random seed (same seed, same bytes)");
ABSL_FLAG(std::string, tiktoken, "",
          "base vocabulary in tiktoken format (e.g. cl100k_base ranks); default: 256 single bytes");

int main(int argc, char** argv) {
  kimi::tools::ParseFlags(
      argc, argv,
      absl::StrCat("Writes a synthetic Kimi checkpoint (config.json, safetensors, tiktoken.model, "
                   "tokenizer_config.json).\n  kimi-mkmodel --preset ",
                   absl::StrJoin(kimi::SyntheticPresets(), "|"), " --out DIR --seed N"));
  kimi::SyntheticOptions o;
  o.preset = absl::GetFlag(FLAGS_preset);
  o.out_dir = absl::GetFlag(FLAGS_out);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.tiktoken_path = absl::GetFlag(FLAGS_tiktoken);
  if (o.preset.empty() || o.out_dir.empty()) {
    std::fprintf(stderr, "kimi-mkmodel: --preset and --out are required (presets: %s)\n",
                 absl::StrJoin(kimi::SyntheticPresets(), ", ").c_str());
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  o.progress = [&](const std::string& line) {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "[%6.1fs] %s\n", s, line.c_str());
  };
  if (absl::Status s = kimi::WriteSyntheticModel(o); !s.ok()) {
    std::fprintf(stderr, "kimi-mkmodel: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
