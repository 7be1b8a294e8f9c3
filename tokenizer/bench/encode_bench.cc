// kimi-tokenizer-bench: encode throughput (MB/s) of our tokenizer against the npm `tiktoken`
// package on the same text, in the same run. Text: a fixed, deterministically generated mix of
// English prose, code, numbers, CJK, emoji, accented Latin and whitespace runs. Ranks: cl100k_base
// (models/cl100k_base.tiktoken from scripts/fetch_vocab.sh). Two figures: cl100k's own pattern,
// and Kimi's pattern (our PCRE2 rewrite vs tiktoken/lite running the original Rust-regex form).
//
//   kimi-tokenizer-bench [--mb N] [--repeats N] [--ranks FILE]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tools/parse_flags.h"
#include <unistd.h>

ABSL_FLAG(double, mb, 2.0, "megabytes of text to encode");
ABSL_FLAG(int, repeats, 5, "runs of each case (the best is reported)");
ABSL_FLAG(
    std::string, ranks, "",
    "cl100k_base ranks in tiktoken format (default: models/cl100k_base.tiktoken of the source "
    "tree or $KIMI_SOURCE_DIR)");

namespace {

constexpr char kCl100kPattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string MakeText(size_t bytes) {
  static const std::vector<std::string> kPieces = {"the",
                                                   "quick",
                                                   "brown",
                                                   "fox",
                                                   "jumps",
                                                   "over",
                                                   "lazy",
                                                   "dog",
                                                   "Kimi",
                                                   "model",
                                                   "serving",
                                                   "tokenizer",
                                                   "attention",
                                                   "state",
                                                   "recurrent",
                                                   "don't",
                                                   "we'll",
                                                   "it's",
                                                   "HTTP",
                                                   "JSON",
                                                   "int main() {",
                                                   "return 0;",
                                                   "}",
                                                   "for (int i = 0; i < n; ++i)",
                                                   "x += y[i] * 2;",
                                                   "2024",
                                                   "3.14159",
                                                   "1,000,000",
                                                   "0x7fff",
                                                   "人工智能",
                                                   "模型推理",
                                                   "注意力机制",
                                                   "こんにちは",
                                                   "세계",
                                                   "café",
                                                   "naïve",
                                                   "Straße",
                                                   "😀",
                                                   "🚀✨",
                                                   "👩‍💻",
                                                   "\n",
                                                   "\n\n",
                                                   "    ",
                                                   "\t",
                                                   "—",
                                                   "«quoted»",
                                                   "(parenthetical)",
                                                   "e-mail@example.com",
                                                   "https://example.org/path?q=1"};
  std::mt19937 rng(12345);
  std::uniform_int_distribution<size_t> pick(0, kPieces.size() - 1);
  std::string text;
  while (text.size() < bytes) {
    const std::string& p = kPieces[pick(rng)];
    text += p;
    if (p.back() != '\n' && p.back() != ' ' && rng() % 4 != 0) text += ' ';
    if (rng() % 23 == 0) text += ". ";
  }
  return text;
}

double EncodeMbPerSecond(const kimi::tokenizer::Tokenizer& tok, const std::string& text,
                         int repeats, size_t* count) {
  *count = tok.Encode(text, /*allow_special=*/false).size();  // warm-up
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    *count = tok.Encode(text, false).size();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s);
  }
  return static_cast<double>(text.size()) / 1e6 / best;
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

}  // namespace

int main(int argc, char** argv) {
  kimi::tools::ParseFlags(argc, argv,
                          "Encode throughput (MB/s) against npm tiktoken on the same text.\n"
                          "  kimi-tokenizer-bench [--mb N] [--repeats N] [--ranks FILE]");
  const char* src = std::getenv("KIMI_SOURCE_DIR");
  std::string root = src ? src : KIMI_SOURCE_DIR;
  const double mb = absl::GetFlag(FLAGS_mb);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  std::string ranks_path = absl::GetFlag(FLAGS_ranks);
  if (ranks_path.empty()) ranks_path = root + "/models/cl100k_base.tiktoken";
  if (!(mb > 0) || repeats < 1) {
    std::fprintf(stderr, "kimi-tokenizer-bench: --mb must be above 0 and --repeats at least 1\n");
    return 2;
  }
  std::ifstream in(ranks_path);
  if (!in) {
    std::fprintf(stderr, "cannot open %s: run ./scripts/fetch_vocab.sh first\n",
                 ranks_path.c_str());
    return 2;
  }
  std::stringstream ranks;
  ranks << in.rdbuf();
  const std::string text = MakeText(static_cast<size_t>(mb * 1e6));
  const std::string text_path = (std::filesystem::temp_directory_path() /
                                 absl::StrCat("kimi_tokenizer_bench_", getpid(), ".txt"))
                                    .string();
  std::ofstream(text_path, std::ios::binary) << text;
  const absl::Cleanup remove_text = [&] { std::remove(text_path.c_str()); };

  struct Case {
    const char* name;
    const char* pattern;
    std::string npm_pattern;
  };
  const Case cases[] = {
      {"cl100k_base", kCl100kPattern, "-"},
      {"kimi_pattern+cl100k_ranks", kimi::tokenizer::kKimiPattern, kimi::tokenizer::kKimiPattern}};
  std::printf("text: %.2f MB, best of %d runs each\n", text.size() / 1e6, repeats);
  std::printf("%-28s %12s %12s %8s %10s\n", "case", "ours MB/s", "npm MB/s", "ratio", "tokens");
  int rc = 0;
  for (const Case& c : cases) {
    auto tok = kimi::tokenizer::Tokenizer::FromParts(ranks.str(), c.pattern, {});
    if (!tok.ok()) {
      std::fprintf(stderr, "%s\n", std::string(tok.status().message()).c_str());
      return 1;
    }
    size_t ours_count = 0;
    const double ours = EncodeMbPerSecond(**tok, text, repeats, &ours_count);
    const std::string cmd = "node " + ShellQuote(root + "/tokenizer/bench/npm_encode_bench.js") +
                            " " + ShellQuote(text_path) + " cl100k_base " +
                            ShellQuote(c.npm_pattern) + " " + std::to_string(repeats);
    double npm = 0;
    size_t npm_count = 0;
    if (FILE* p = popen(cmd.c_str(), "r")) {
      if (std::fscanf(p, "%lf %zu", &npm, &npm_count) != 2) npm = 0;
      pclose(p);
    }
    if (npm <= 0) {
      std::printf("%-28s %12.2f %12s %8s %10zu\n", c.name, ours, "n/a", "n/a", ours_count);
      rc = 1;
      continue;
    }
    std::printf("%-28s %12.2f %12.2f %7.2fx %10zu%s\n", c.name, ours, npm, ours / npm, ours_count,
                npm_count == ours_count ? "" : "  (token counts differ!)");
    if (npm_count != ours_count) rc = 1;
  }
  return rc;
}
