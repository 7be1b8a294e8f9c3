// kimi-plan --config config.json [--context N] [--json]
// Sizes a model from its config alone: tensors, parameters, bytes, per-request state.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "engine/model_config.h"
#include "engine/plan.h"
#include "nlohmann/json.hpp"
#include "tools/parse_flags.h"

ABSL_FLAG(std::string, config, "", "path to config.json (or a checkpoint directory)");
ABSL_FLAG(int64_t, context, 131072, "context length for the per-request memory figures");
ABSL_FLAG(bool, json, false, "print one JSON object instead of a table");
ABSL_FLAG(int, tp, 1, "tensor-parallel ranks per stage");
ABSL_FLAG(int, ep, 1, "expert-parallel ranks per stage");
ABSL_FLAG(int, pp, 1, "pipeline stages");
ABSL_FLAG(std::string, kda_state_dtype, "fp32",
          "fp32 | bf16: the KDA recurrent states' dtype (kimi-server --kda-state-dtype)");

namespace {

std::string Bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) {
    b /= 1024.0;
    ++u;
  }
  return absl::StrFormat("%.2f %s", b, units[u]);
}

}  // namespace

int main(int argc, char** argv) {
  kimi::tools::ParseFlags(
      argc, argv,
      "Sizes a Kimi model from config.json alone.\n  kimi-plan --config config.json "
      "[--tp N --ep N --pp N] [--context N] [--kda_state_dtype fp32|bf16] [--json]");
  std::string path = absl::GetFlag(FLAGS_config);
  if (path.empty()) {
    std::fprintf(stderr, "kimi-plan: --config is required\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_context) < 1) {
    std::fprintf(stderr, "kimi-plan: --context must be at least 1 token\n");
    return 2;
  }
  const std::string state_dtype = absl::GetFlag(FLAGS_kda_state_dtype);
  kimi::KdaStateDtype dtype;
  if (!kimi::ParseKdaStateDtype(state_dtype, &dtype)) {
    std::fprintf(stderr, "kimi-plan: --kda_state_dtype '%s': expected fp32 or bf16\n",
                 state_dtype.c_str());
    return 2;
  }
  std::ifstream probe(path + "/config.json");
  if (probe) path += "/config.json";
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "kimi-plan: cannot open %s\n", path.c_str());
    return 1;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  auto config = kimi::ParseModelConfig(ss.str());
  if (!config.ok()) {
    std::fprintf(stderr, "kimi-plan: %s: %s\n", path.c_str(),
                 std::string(config.status().message()).c_str());
    return 1;
  }
  config->kda.state_dtype = dtype;
  const kimi::ModelPlan p = kimi::PlanModel(*config);
  kimi::ParallelLayout layout;
  layout.tp = absl::GetFlag(FLAGS_tp);
  layout.ep = absl::GetFlag(FLAGS_ep);
  layout.pp = absl::GetFlag(FLAGS_pp);
  if (absl::Status s = kimi::ValidateLayout(*config, layout); !s.ok()) {
    std::fprintf(stderr, "kimi-plan: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  const kimi::ParallelPlan pp = kimi::PlanParallel(*config, layout, absl::GetFlag(FLAGS_context));
  const int64_t ctx = absl::GetFlag(FLAGS_context);
  const int64_t request_bytes = p.kda_state_bytes + p.kv_bytes_per_token * ctx;
  if (absl::GetFlag(FLAGS_json)) {
    nlohmann::ordered_json j;
    j["model_type"] = config->family == kimi::ModelFamily::kKimiK3 ? "kimi_k3" : "kimi_linear";
    j["layers"] = config->num_layers;
    j["kda_layers"] = p.kda_layers;
    j["mla_layers"] = p.mla_layers;
    j["moe_layers"] = p.moe_layers;
    j["tensors"] = p.tensors;
    j["parameters"] = p.parameters;
    j["active_parameters"] = p.active_parameters;
    j["weight_bytes"] = p.weight_bytes;
    j["active_weight_bytes"] = p.active_weight_bytes;
    j["kda_state_bytes_per_request"] = p.kda_state_bytes;
    j["kda_state_dtype"] = kimi::KdaStateDtypeName(dtype);
    j["mla_kv_bytes_per_token"] = p.kv_bytes_per_token;
    j["attn_res_bytes_per_token"] = p.attn_res_bytes_per_token;
    j["context"] = ctx;
    j["state_bytes_per_request_at_context"] = request_bytes;
    nlohmann::ordered_json par;
    par["tp"] = layout.tp;
    par["ep"] = layout.ep;
    par["pp"] = layout.pp;
    par["ranks"] = pp.ranks;
    par["weight_bytes_per_rank"] = pp.weight_bytes_per_rank;
    par["kda_state_bytes_per_request_per_rank"] = pp.kda_state_bytes_per_rank;
    par["mla_kv_bytes_per_token_per_rank"] = pp.kv_bytes_per_token_per_rank;
    par["state_bytes_per_request_per_rank_at_context"] = pp.request_bytes_per_rank;
    par["traffic_bytes_per_decode_token_per_rank"] = {{"tp", pp.tp_bytes},
                                                      {"ep", pp.ep_bytes},
                                                      {"pp", pp.pp_bytes},
                                                      {"vocab", pp.vocab_bytes}};
    par["expert_dispatch_bytes_per_token"] = pp.dispatch_bytes_per_token;
    par["expert_dispatch_bytes_per_token_full_hidden"] = pp.dispatch_bytes_full_hidden;
    j["parallel"] = par;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("model             %s, %lld layers (%lld KDA, %lld MLA, %lld MoE)\n",
              config->family == kimi::ModelFamily::kKimiK3 ? "kimi_k3" : "kimi_linear",
              static_cast<long long>(config->num_layers), static_cast<long long>(p.kda_layers),
              static_cast<long long>(p.mla_layers), static_cast<long long>(p.moe_layers));
  std::printf("tensors           %lld\n", static_cast<long long>(p.tensors));
  std::printf("parameters        %lld (%lld active per token)\n",
              static_cast<long long>(p.parameters), static_cast<long long>(p.active_parameters));
  std::printf("weights           %s (%s read per decode token)\n", Bytes(p.weight_bytes).c_str(),
              Bytes(p.active_weight_bytes).c_str());
  std::printf("KDA state         %s per request (constant in context; %s recurrent state)\n",
              Bytes(p.kda_state_bytes).c_str(), kimi::KdaStateDtypeName(dtype));
  std::printf("MLA KV cache      %s per token\n", Bytes(p.kv_bytes_per_token).c_str());
  std::printf("AttnRes cache     %s per token in flight\n",
              Bytes(p.attn_res_bytes_per_token).c_str());
  std::printf("request at %lld   %s of state + KV\n", static_cast<long long>(ctx),
              Bytes(request_bytes).c_str());
  if (pp.ranks > 1) {
    std::printf("\nparallel          tp %d, ep %d, pp %d = %d ranks (heaviest rank shown)\n",
                layout.tp, layout.ep, layout.pp, pp.ranks);
    std::printf("  weights         %s per rank\n", Bytes(pp.weight_bytes_per_rank).c_str());
    std::printf("  KDA state       %s per request per rank\n",
                Bytes(pp.kda_state_bytes_per_rank).c_str());
    std::printf("  MLA KV cache    %s per token per rank\n",
                Bytes(pp.kv_bytes_per_token_per_rank).c_str());
    std::printf("  request at %lld %s per rank\n", static_cast<long long>(ctx),
                Bytes(pp.request_bytes_per_rank).c_str());
    std::printf("  per decode token sent by a rank: tp %s, ep %s, pp %s, vocab gather %s\n",
                Bytes(pp.tp_bytes).c_str(), Bytes(pp.ep_bytes).c_str(),
                Bytes(pp.pp_bytes).c_str(), Bytes(pp.vocab_bytes).c_str());
  }
  if (config->moe.latent_dim > 0) {
    std::printf("expert dispatch   %s per token each way in the latent (%s with the full hidden: "
                "%.2fx)\n",
                Bytes(pp.dispatch_bytes_per_token).c_str(),
                Bytes(pp.dispatch_bytes_full_hidden).c_str(),
                static_cast<double>(pp.dispatch_bytes_per_token) /
                    static_cast<double>(pp.dispatch_bytes_full_hidden));
  }
  return 0;
}
