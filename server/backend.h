// What the gRPC services share: the loaded model, its tokenizer, the engine loop, configuration,
// metrics and keys. Built once at start-up; `ready` flips when the model has loaded and a warm-up
// step has run, after which the pointers never change.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "engine/weights.h"
#include "scheduler/engine_loop.h"
#include "server/auth.h"
#include "server/config.h"
#include "server/metrics.h"
#include "tokenizer/tokenizer.h"

namespace kimi::server {

struct Backend {
  ServerConfig config;
  ApiKeys keys;
  Metrics* metrics = nullptr;
  std::unique_ptr<Model> model;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<sched::EngineLoop> loop;
  std::atomic<bool> ready{false};
  // Set on the engine thread when the warm-up request ends (before that step's metrics).
  std::atomic<bool> warmed_up{false};
  std::atomic<uint64_t> next_id{1};
};

}  // namespace kimi::server
