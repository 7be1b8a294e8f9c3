// kimi-bench [--filter REGEX] [--json] [--repeats N] [--models_dir DIR] [--models a,b]
// Prints every performance figure of DESIGN.md's contract with its baseline measured in the same
// run and their ratio (--json: one JSON object per line with name, value, unit, baseline, ratio).
// Figures: decode.b1.<model>[.t1], decode.b8|b32|b64.<model>[.bf16], prefill.<N>.<model>
// (N: --prefill_tokens, 512 by default), prefill.gemm[.bf16], kda.prefill.per_token_16k_over_1k,
// state.128k.hybrid_over_mla, scheduler.overhead.b64, matvec.mxfp4, matvec.bf16, experts.mxfp4,
// mla.decode.64k (--list names them).
// Models are read from --models_dir/<preset> and generated there (seed 1) when missing.
#include <algorithm>
#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kernels/cpu/cpu_budget.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"
#include "tools/bench/bench.h"
#include "tools/parse_flags.h"

ABSL_FLAG(std::string, filter, "", "run only figures whose name matches this regex");
ABSL_FLAG(bool, json, false, "print one JSON object per figure");
ABSL_FLAG(int, repeats, 5, "rounds per figure (medians are reported)");
ABSL_FLAG(std::string, models_dir, "models", "directory holding (or receiving) the presets");
ABSL_FLAG(std::string, models, "kimi-linear-small,k3-mini", "presets for the decode figures");
ABSL_FLAG(std::string, scheduler_model, "k3-mini", "preset for scheduler.overhead.b64");
ABSL_FLAG(std::string, tiktoken, "",
          "base vocabulary for generated models (default: MODELS_DIR/cl100k_base.tiktoken)");
ABSL_FLAG(std::string, weight_memory, "",
          "map | map-huge | copy-huge (default: the engine's, see engine/safetensors.h)");
ABSL_FLAG(std::string, kda_state_dtype, "fp32",
          "fp32 | bf16: the KDA state pools' recurrent states (the server's --kda-state-dtype)");
ABSL_FLAG(double, idle_wait, 20.0, "seconds to wait for an idle machine before each round");
ABSL_FLAG(bool, list, false, "list the figure names and exit");
ABSL_FLAG(int, profile_steps, 0,
          "run only this many steps (tokens, at batch 1) of each selected decode figure and print "
          "their median time, without baselines (for a profiler)");
ABSL_FLAG(int, prefill_tokens, 512,
          "prompt length of the prefill.<N>.<model> figures: one sequence's prompt as one step "
          "from fresh state (512: the server's default token budget)");
ABSL_FLAG(int, gemm_k, 1024,
          "K of prefill.gemm's product (512 x 4096 x K), which also gives the batched decode and "
          "prefill figures their compute peak (K3's hidden size is 7168)");
ABSL_FLAG(bool, matmul_profile, false,
          "with --profile_steps: run the steps once more with MatMul timing on and print where "
          "their MatMul time goes, by shape");

int main(int argc, char** argv) {
  kimi::tools::ParseFlags(
      argc, argv,
      "kimi-bench [--filter REGEX] [--json] [--repeats N]: performance figures with same-run "
      "baselines");
  using namespace kimi::bench;
  Context ctx;
  ctx.models_dir = absl::GetFlag(FLAGS_models_dir);
  ctx.tiktoken = absl::GetFlag(FLAGS_tiktoken);
  ctx.weight_memory = absl::GetFlag(FLAGS_weight_memory);
  const std::string state_dtype = absl::GetFlag(FLAGS_kda_state_dtype);
  if (!kimi::ParseKdaStateDtype(state_dtype, &ctx.kda_state_dtype)) {
    std::fprintf(stderr, "kimi-bench: --kda_state_dtype '%s': expected fp32 or bf16\n",
                 state_dtype.c_str());
    return 2;
  }
  ctx.repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  ctx.json = absl::GetFlag(FLAGS_json);
  ctx.idle_wait_s = absl::GetFlag(FLAGS_idle_wait);
  ctx.profile_steps = absl::GetFlag(FLAGS_profile_steps);
  ctx.matmul_profile = absl::GetFlag(FLAGS_matmul_profile);
  ctx.prefill_tokens = std::max(1, absl::GetFlag(FLAGS_prefill_tokens));
  const std::string filter = absl::GetFlag(FLAGS_filter);
  if (!filter.empty()) {
    try {
      ctx.filter.emplace(filter);
    } catch (const std::regex_error& e) {
      std::fprintf(stderr, "kimi-bench: --filter '%s' is not a regular expression: %s\n",
                   filter.c_str(), e.what());
      return 2;
    }
  }
  const std::vector<std::string> models =
      absl::StrSplit(absl::GetFlag(FLAGS_models), ',', absl::SkipEmpty());

  std::vector<std::string> names;
  for (const std::string& m : models) {
    names.push_back(absl::StrCat("decode.b1.", m));
    names.push_back(absl::StrCat("decode.b1.", m, ".t1"));
    for (int n : {8, 32, 64}) names.push_back(absl::StrCat("decode.b", n, ".", m));
    for (int n : {8, 32, 64}) names.push_back(absl::StrCat("decode.b", n, ".", m, ".bf16"));
    names.push_back(ctx.PrefillName(m));
  }
  for (const char* name : {"prefill.gemm", "prefill.gemm.bf16", "kda.prefill.per_token_16k_over_1k",
                           "state.128k.hybrid_over_mla", "scheduler.overhead.b64", "matvec.mxfp4",
                           "matvec.bf16", "experts.mxfp4", "mla.decode.64k"}) {
    names.push_back(name);
  }
  if (absl::GetFlag(FLAGS_list)) {
    for (const std::string& name : names) std::printf("%s\n", name.c_str());
    return 0;
  }
  if (std::none_of(names.begin(), names.end(),
                   [&](const std::string& name) { return ctx.Wants(name); })) {
    std::fprintf(stderr, "kimi-bench: no figure matches --filter '%s' (--list names them)\n",
                 filter.c_str());
    return 2;
  }
  ctx.Log(absl::StrCat(
      "threads ", kimi::cpu::ThreadPool::Global().num_threads(), " (the process may use ",
      kimi::cpu::DescribeCpuBudget(kimi::cpu::ProcessCpuBudget()), "), isa ",
      kimi::cpu::IsaName(kimi::cpu::MatMulIsa()), ", cpu ", HostCpu(), ", repeats ", ctx.repeats));

  // The roofline figures (batched decode, prefill.<N>) measure the GEMM peak in their own rounds:
  // build the library GEMMs when they or the prefill.gemm figures run.
  bool rooflines = false;
  for (const std::string& m : models) {
    for (int n : {8, 32, 64}) {
      rooflines |= ctx.Wants(absl::StrCat("decode.b", n, ".", m));
      rooflines |= ctx.Wants(absl::StrCat("decode.b", n, ".", m, ".bf16"));
    }
    rooflines |= ctx.Wants(ctx.PrefillName(m));
  }
  std::unique_ptr<GemmPeakMeter> meter;
  if ((ctx.Wants("prefill.gemm") || ctx.Wants("prefill.gemm.bf16") || rooflines) &&
      ctx.profile_steps == 0) {
    meter = std::make_unique<GemmPeakMeter>(
        std::max<int64_t>(32, absl::GetFlag(FLAGS_gemm_k) / 32 * 32));
    RunGemm(ctx, *meter);
  }
  for (const std::string& m : models) RunDecode(ctx, m, meter.get());
  RunAttentionScaling(ctx);
  RunMlaDecode(ctx);
  RunState(ctx);
  RunSchedulerOverhead(ctx, absl::GetFlag(FLAGS_scheduler_model));
  RunMatvec(ctx);
  return 0;
}
