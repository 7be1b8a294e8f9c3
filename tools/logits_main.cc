// kimi-logits --model DIR --tokens 1,2,3 --out FILE.safetensors [--chunks 2,1 | --decode]
// Runs a token sequence through the engine as one request and writes the logits of every position
// (`logits` [T, vocab], fp32), for comparison with the PyTorch reference in tests/reference.
// --chunks splits the prompt into prefill chunks of the given sizes (the rest in one more chunk);
// --decode feeds one token per step.
#include <cstdio>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/engine.h"
#include "tools/parse_flags.h"
#include "tools/tensor_io.h"

ABSL_FLAG(std::string, model, "", "checkpoint directory");
ABSL_FLAG(std::string, tokens, "", "comma-separated token ids");
ABSL_FLAG(std::string, chunks, "", "comma-separated prefill chunk sizes");
ABSL_FLAG(bool, decode, false, "one token per step");
ABSL_FLAG(std::string, out, "", "output .safetensors");

namespace {

bool ParseList(const std::string& text, std::vector<int32_t>* out) {
  if (text.empty()) return true;
  for (absl::string_view part : absl::StrSplit(text, ',')) {  // "1,,2" is an error
    int32_t v;
    if (!absl::SimpleAtoi(part, &v)) return false;
    out->push_back(v);
  }
  return true;
}

int Fail(const std::string& msg, int status = 1) {
  std::fprintf(stderr, "kimi-logits: %s\n", msg.c_str());
  return status;
}
int UsageError(const std::string& msg) { return Fail(msg, 2); }

}  // namespace

int main(int argc, char** argv) {
  kimi::tools::ParseFlags(argc, argv, "Writes the engine's logits for a token sequence.");
  std::vector<int32_t> tokens, chunks;
  if (!ParseList(absl::GetFlag(FLAGS_tokens), &tokens) || tokens.empty()) {
    return UsageError("--tokens must be a non-empty comma-separated list of ids");
  }
  if (!ParseList(absl::GetFlag(FLAGS_chunks), &chunks)) {
    return UsageError("--chunks must be a comma-separated list of sizes");
  }
  // Checked before the model runs (it wrote its temporary file, then failed to rename it).
  if (absl::GetFlag(FLAGS_out).empty()) {
    return UsageError("--out is required (the .safetensors to write)");
  }
  if (absl::GetFlag(FLAGS_decode) && !chunks.empty()) {
    return UsageError("--chunks and --decode: one or the other (--decode runs one token a step)");
  }
  auto model = kimi::Model::Load(absl::GetFlag(FLAGS_model));
  if (!model.ok()) return Fail(std::string(model.status().message()));
  const kimi::ModelConfig& c = (*model)->config();
  const int64_t T = static_cast<int64_t>(tokens.size());

  std::vector<int64_t> sizes;
  if (absl::GetFlag(FLAGS_decode)) {
    sizes.assign(T, 1);
  } else {
    int64_t used = 0;
    for (int32_t n : chunks) {
      if (n <= 0 || used + n > T) return Fail("--chunks must be positive and fit the tokens");
      sizes.push_back(n);
      used += n;
    }
    if (used < T) sizes.push_back(T - used);
  }
  const int64_t page_size = 16;
  kimi::KdaStatePool kda(c, 1);
  kimi::MlaKvCache kv(c, (T + page_size - 1) / page_size, page_size);
  std::vector<int32_t> pages(kv.num_pages());
  for (size_t i = 0; i < pages.size(); ++i) {  // scattered, to exercise the page table
    pages[i] = static_cast<int32_t>(pages.size() - 1 - i);
  }
  kimi::EngineState state{&kda, &kv};
  kimi::Engine engine(**model);
  kimi::tools::HostTensor logits = kimi::tools::F32({T, c.vocab});
  int64_t pos = 0;
  for (int64_t n : sizes) {
    kimi::SequenceStep s;
    s.kda_slot = 0;
    s.pages = pages;
    s.pos0 = pos;
    s.tokens = std::span<const int32_t>(tokens.data() + pos, n);
    s.logits = kimi::LogitsWanted::kAll;
    kimi::StepOutput out;
    if (absl::Status st = engine.Step({&s, 1}, state, &out); !st.ok()) {
      return Fail(std::string(st.message()));
    }
    std::copy(out.logits.begin(), out.logits.end(), logits.f32.begin() + pos * c.vocab);
    pos += n;
  }
  kimi::tools::TensorMap result;
  result["logits"] = std::move(logits);
  if (absl::Status st = kimi::tools::WriteTensors(absl::GetFlag(FLAGS_out), result); !st.ok()) {
    return Fail(std::string(st.message()));
  }
  return 0;
}
