#include "engine/expert_jobs.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>

#include "engine/layers.h"
#include "kernels/cpu/ops.h"

namespace kimi::layers {

void ExpertJob::Gather() const {
  for (int64_t i = 0; i < n; ++i) std::copy_n(src + rows[i] * width, width, in + i * width);
}

void ExpertJob::Run(const ModelConfig& c) const {
  if (gate) {
    GatedMlpDown(c, *w, gate, up, out, n);
    return;
  }
  if (rows) Gather();
  GatedMlp(c, *w, Input(), out, n);
}

double JobCost(const MlpWeights& w, int64_t n, bool down_only) {
  const double bytes =
      static_cast<double>((down_only ? 0 : w.gate.Bytes() + w.up.Bytes()) + w.down.Bytes());
  return bytes * (1.0 + static_cast<double>(n) / 16.0);
}

namespace {

// A whole gated MLP job (not one whose gate and up are given) that every thread may work on: gate
// and up in chunks of the intermediate rows, each chunk's activation on its own columns, then,
// once every such chunk is done, down in chunks of its output rows. Which rows a product computes
// never changes their bits, so the result is the whole job's.
//
// Why: a side-by-side section ends when its last expert does, on one thread, while the other has
// nothing left (a kimi-linear-small expert streams 3 MiB, about 190 us). On the AMX host, the tail
// shared in every other section of a run: batch-32 and batch-64 kimi-linear-small's sections
// idled 5-11 us at their end instead of 112-132 and took 52-160 us less of about 3.8 / 4.8 ms;
// steps alternated every ten in one process (median of 8 per-pair ratios), with the tail against
// without: batch 8 / 32 / 64 0.988 / 0.993 / 0.991. k3-mini's experts (104 KB) idle 6-21 us at
// the end, less than the chunks' calls cost (its sections 0.5-2% slower so): hence
// kSharedTailMinBytes.
class SharedTail {
 public:
  // 8 and 4 chunks (at most one a 32-row group): on kimi-linear-small, 4 and 2 measured the same.
  static constexpr int64_t kGateUpChunks = 8, kDownChunks = 4;

  SharedTail(const ModelConfig& c, const ExpertJob& job)
      : c_(c),
        job_(job),
        width_(job.w->gate.rows),
        gate_(Scratch(job.n * width_)),
        up_(Scratch(job.n * width_)),
        gate_up_(Bounds(width_, kGateUpChunks)),
        down_(Bounds(job.w->down.rows, kDownChunks)) {
    if (job.rows) job.Gather();  // before any thread takes a chunk
  }

  // Takes chunks until none is left.
  void Work() {
    const int64_t gate_up = static_cast<int64_t>(gate_up_.size()) - 1;
    const int64_t total = gate_up + static_cast<int64_t>(down_.size()) - 1;
    for (;;) {
      const int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
      if (i >= total) return;
      if (i < gate_up) {
        GateUp(gate_up_[i], gate_up_[i + 1]);
        done_.fetch_add(1, std::memory_order_release);
        continue;
      }
      // Down reads every gate and up chunk: wait for those other threads still compute (a chunk
      // at most).
      cpu::WaitUntil([&] { return done_.load(std::memory_order_acquire) == gate_up; });
      Down(down_[i - gate_up], down_[i - gate_up + 1]);
    }
  }

 private:
  // `count` chunks of [0, rows), on whole 32-row groups (a packed weight's rows may only be split
  // at its groups: 8 or 16 rows).
  static std::vector<int64_t> Bounds(int64_t rows, int64_t count) {
    const int64_t groups = (rows + 31) / 32;
    count = std::clamp<int64_t>(count, 1, groups);
    std::vector<int64_t> b(count + 1);
    for (int64_t i = 0; i <= count; ++i) b[i] = std::min(rows, groups * i / count * 32);
    return b;
  }
  void GateUp(int64_t r0, int64_t r1) {
    const MlpWeights& w = *job_.w;
    const Weight gate = w.gate.Rows(r0, r1 - r0), up = w.up.Rows(r0, r1 - r0);
    const cpu::MatMulTarget targets[] = {{gate_.get() + r0, width_, &gate},
                                         {up_.get() + r0, width_, &up}};
    cpu::MatMulMany(targets, job_.Input(), w.gate.cols, job_.n);
    for (int64_t t = 0; t < job_.n; ++t) {
      GatedActivation(c_, gate_.get() + t * width_ + r0, up_.get() + t * width_ + r0, r1 - r0);
    }
  }
  void Down(int64_t r0, int64_t r1) {
    const Weight down = job_.w->down.Rows(r0, r1 - r0);
    cpu::MatMul(job_.out + r0, job_.w->down.rows, gate_.get(), width_, down, job_.n);
  }

  const ModelConfig& c_;
  const ExpertJob& job_;
  const int64_t width_;  // the intermediate width
  ScratchBuffer gate_, up_;
  const std::vector<int64_t> gate_up_, down_;  // chunk bounds
  std::atomic<int64_t> next_{0}, done_{0};     // chunks taken; gate and up chunks finished
};

}  // namespace

void RunExpertJobs(const ModelConfig& c, std::vector<ExpertJob>& jobs,
                   int64_t shared_tail_min_bytes) {
  const int threads = cpu::ThreadPool::Global().num_threads();
  double total = 0.0;
  for (const ExpertJob& j : jobs) total += j.cost;
  std::vector<int> small;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (threads > 1 && jobs[i].cost <= total / threads) {
      small.push_back(static_cast<int>(i));
    } else {
      jobs[i].Run(c);
    }
  }
  std::vector<double> load(threads, 0.0);
  std::stable_sort(small.begin(), small.end(),
                   [&](int a, int b) { return jobs[a].cost > jobs[b].cost; });
  double small_total = 0.0;
  for (int i : small) {
    *std::min_element(load.begin(), load.end()) += jobs[i].cost;
    small_total += jobs[i].cost;
  }
  const double worst = *std::max_element(load.begin(), load.end());
  if (small.size() > 1 && worst <= 1.25 * small_total / threads) {
    // The last routed expert in the order below (the cheapest), shared at the end. A routed one:
    // it streams its weights, as the last ones beside it did; the shared experts over many tokens
    // lean on the tile unit and, shared at the end on both threads, left the memory idle (the
    // sections took as long as with their idle ends).
    std::unique_ptr<SharedTail> tail;
    const auto routed = std::find_if(small.rbegin(), small.rend(), [&](int i) {
      return jobs[i].rows != nullptr && jobs[i].gate == nullptr;
    });
    if (routed != small.rend()) {
      const MlpWeights& w = *jobs[*routed].w;
      if (w.gate.Bytes() + w.up.Bytes() + w.down.Bytes() >= shared_tail_min_bytes) {
        tail = std::make_unique<SharedTail>(c, jobs[*routed]);
        small.erase(std::next(routed).base());
      }
    }
    // Each job to the next free thread: the packing above only decides whether side by side pays;
    // handing jobs out as threads free up absorbs cost estimates that are off (MXFP4 decode, cache
    // misses) and a descheduled thread on a shared host. Even threads take the longest job left,
    // odd ones the shortest, so an expert of many tokens (compute-bound) runs beside one of a token
    // or two (streaming its weights) rather than beside its like. Against longest first for all,
    // steps alternated every ten in one process on a 2-vCPU Zen 4 host (median of 8-10 per-pair
    // ratios): kimi-linear-small batch 8 0.99 / 0.99 of the time, batch 32 0.97 / 0.98 /
    // 0.99 (0.99 with bf16 activations), batch 64 1.00; k3-mini batch 1 / 8 / 32 / 64 1.00 / 1.00 /
    // 1.01 / 1.00, kimi-linear-small batch 1 1.01.
    std::mutex mu;
    size_t front = 0, back = small.size();  // jobs small[front .. back) are left
    cpu::ThreadPool::Global().ParallelFor(threads, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        for (;;) {
          size_t next;
          {
            std::lock_guard<std::mutex> lock(mu);
            if (front == back) break;
            next = t % 2 == 0 ? front++ : --back;
          }
          jobs[small[next]].Run(c);
        }
        if (tail) tail->Work();
      }
    });
    return;
  }
  for (int i : small) jobs[i].Run(c);
}

}  // namespace kimi::layers
