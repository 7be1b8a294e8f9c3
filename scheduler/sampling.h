// Per-request sampling: penalties, temperature, top-k / top-p / min-p filters, a counter-based
// random draw, and logprobs. Everything a draw depends on belongs to its own request (its logits
// row, its history, its seed and the index of the token being drawn), so a request yields the
// same tokens alone or inside any batch.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kimi::sched {

struct SamplingParams {
  float temperature = 1.0f;         // 0: greedy
  int32_t top_k = 0;                // 0: off
  float top_p = 1.0f;               // (0, 1]
  float min_p = 0.0f;               // [0, 1)
  float repetition_penalty = 1.0f;  // HF style, over prompt and output; 1: off
  float presence_penalty = 0.0f;    // OpenAI style, over output tokens
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;
  int32_t logprobs = 0;             // top-n alternatives to report (0: only none)
  bool want_logprobs = false;       // report the chosen token's logprob
};

struct TokenChoice {
  int32_t token = -1;
  float logprob = 0.0f;  // natural log of the model's softmax, before penalties and filters
  std::vector<std::pair<int32_t, float>> top;  // best first
};

// Draws the next token from one logits row. `prompt` and `output` are the request's tokens so far
// (for penalties); `index` is the number of tokens this request has drawn before (the random
// stream position). `next`, if given, is the row the calling thread samples after this one: it is
// prefetched while this row is worked on (a hint only: the result never depends on it).
TokenChoice SampleToken(std::span<const float> logits, const SamplingParams& p,
                        std::span<const int32_t> prompt, std::span<const int32_t> output,
                        uint64_t index, std::span<const float> next = {});

// Uniform [0, 1) from (seed, index): a stateless hash, so draws never depend on call order.
double UniformAt(uint64_t seed, uint64_t index);

}  // namespace kimi::sched
