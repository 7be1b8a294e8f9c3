#include "engine/distributed.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kimi {
namespace {

class Writer {
 public:
  template <typename T>
  void Put(T v) {
    const size_t n = out_.size();
    out_.resize(n + sizeof v);
    std::memcpy(&out_[n], &v, sizeof v);
  }
  template <typename T>
  void PutVector(const std::vector<T>& v) {
    Put<int64_t>(static_cast<int64_t>(v.size()));
    const size_t n = out_.size();
    out_.resize(n + v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(&out_[n], v.data(), v.size() * sizeof(T));
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  template <typename T>
  bool Get(T* v) {
    if (pos_ + sizeof(T) > in_.size()) return false;
    std::memcpy(v, &in_[pos_], sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  template <typename T>
  bool GetVector(std::vector<T>* v) {
    int64_t n;
    if (!Get(&n) || n < 0 || pos_ + n * sizeof(T) > in_.size()) return false;
    v->resize(n);
    if (n) std::memcpy(v->data(), &in_[pos_], n * sizeof(T));
    pos_ += n * sizeof(T);
    return true;
  }
  bool done() const { return pos_ == in_.size(); }

 private:
  const std::string& in_;
  size_t pos_ = 0;
};

absl::Status ApplyAll(StateStore& store, const std::vector<StateOp>& ops) {
  for (const StateOp& op : ops) store.Apply(op);
  return absl::OkStatus();
}

// Length, then bytes, from rank 0.
absl::StatusOr<std::string> ReceiveMessage(Communicator* world) {
  int64_t size = 0;
  if (absl::Status s = world->Broadcast(&size, sizeof size, 0); !s.ok()) return s;
  std::string bytes(size, '\0');
  if (absl::Status s = world->Broadcast(bytes.data(), size, 0); !s.ok()) return s;
  return bytes;
}

// Every rank joins this after a heartbeat (rank 0's Idle, the followers' loop), so a rank that
// hangs while the server is idle ends the job within the deadline, instead of hanging the next
// request's first collective for as long.
absl::Status HeartbeatBarrier(Communicator* world) {
  if (absl::Status s = world->Barrier(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("idle heartbeat: ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace

std::string StepMessage::Encode() const {
  Writer w;
  w.Put<uint8_t>(static_cast<uint8_t>(command));
  w.Put<int64_t>(static_cast<int64_t>(ops.size()));
  for (const StateOp& op : ops) {
    w.Put<uint8_t>(static_cast<uint8_t>(op.kind));
    w.Put<int64_t>(op.slot);
    w.Put<int64_t>(op.handle);
    w.PutVector(op.pages);
  }
  w.Put<int64_t>(static_cast<int64_t>(seqs.size()));
  for (const Seq& s : seqs) {
    w.Put<int64_t>(s.kda_slot);
    w.Put<int64_t>(s.pos0);
    w.Put<uint8_t>(s.logits);
    w.PutVector(s.pages);
    w.PutVector(s.tokens);
  }
  return w.Take();
}

absl::StatusOr<StepMessage> StepMessage::Decode(const std::string& bytes) {
  StepMessage m;
  Reader r(bytes);
  uint8_t command;
  int64_t n_ops, n_seqs;
  auto bad = [] { return absl::DataLossError("malformed step message from rank 0"); };
  if (!r.Get(&command) || !r.Get(&n_ops) || n_ops < 0) return bad();
  m.command = static_cast<Command>(command);
  for (int64_t i = 0; i < n_ops; ++i) {
    StateOp op;
    uint8_t kind;
    if (!r.Get(&kind) || !r.Get(&op.slot) || !r.Get(&op.handle) || !r.GetVector(&op.pages)) {
      return bad();
    }
    op.kind = static_cast<StateOpKind>(kind);
    m.ops.push_back(std::move(op));
  }
  if (!r.Get(&n_seqs) || n_seqs < 0) return bad();
  for (int64_t i = 0; i < n_seqs; ++i) {
    Seq s;
    if (!r.Get(&s.kda_slot) || !r.Get(&s.pos0) || !r.Get(&s.logits) || !r.GetVector(&s.pages) ||
        !r.GetVector(&s.tokens)) {
      return bad();
    }
    m.seqs.push_back(std::move(s));
  }
  if (!r.done()) return bad();
  return m;
}

std::vector<SequenceStep> StepMessage::Batch() const {
  std::vector<SequenceStep> batch;
  for (const Seq& s : seqs) {
    SequenceStep step;
    step.kda_slot = s.kda_slot;
    step.pages = s.pages;
    step.pos0 = s.pos0;
    step.tokens = s.tokens;
    step.logits = static_cast<LogitsWanted>(s.logits);
    batch.push_back(step);
  }
  return batch;
}

LeaderStepRunner::LeaderStepRunner(const Model& model, EngineComms comms,
                                   const DistributedOptions& options)
    : engine_(model, comms, options.engine),
      comms_(comms),
      options_(options),
      kda_(model.config(), options.slots),
      kv_(model.config(), options.pages, options.page_size),
      store_(&kda_, &kv_),
      sink_(&store_),
      last_sent_(std::chrono::steady_clock::now()) {}

absl::Status LeaderStepRunner::Send(const StepMessage& m) {
  const std::string bytes = m.Encode();
  int64_t size = static_cast<int64_t>(bytes.size());
  if (absl::Status s = comms_.world->Broadcast(&size, sizeof size, 0); !s.ok()) return s;
  if (absl::Status s = comms_.world->Broadcast(const_cast<char*>(bytes.data()), size, 0);
      !s.ok()) {
    return s;
  }
  last_sent_ = std::chrono::steady_clock::now();
  return absl::OkStatus();
}

absl::Status LeaderStepRunner::Run(std::span<const SequenceStep> batch, StepOutput* out) {
  StepMessage m;
  m.command = Command::kStep;
  m.ops = std::move(sink_.pending);
  sink_.pending.clear();
  for (const SequenceStep& s : batch) {
    m.seqs.push_back({s.kda_slot, s.pos0, static_cast<uint8_t>(s.logits),
                      std::vector<int32_t>(s.pages.begin(), s.pages.end()),
                      std::vector<int32_t>(s.tokens.begin(), s.tokens.end())});
  }
  if (absl::Status s = Send(m); !s.ok()) return s;
  EngineState state{&kda_, &kv_};
  return engine_.Step(batch, state, out);
}

absl::Status LeaderStepRunner::Idle() {
  if (std::chrono::steady_clock::now() - last_sent_ < options_.heartbeat) return absl::OkStatus();
  StepMessage m;
  m.command = Command::kHeartbeat;
  m.ops = std::move(sink_.pending);  // ops of finished requests: keep every shard in step
  sink_.pending.clear();
  if (absl::Status s = Send(m); !s.ok()) return s;
  return HeartbeatBarrier(comms_.world);
}

void LeaderStepRunner::Stop() {
  if (stopped_) return;
  stopped_ = true;
  StepMessage m;
  m.command = Command::kStop;
  (void)Send(m);  // best effort: a rank that is gone is reported by mpirun
}

absl::Status FollowerLoop(const Model& model, EngineComms comms,
                          const DistributedOptions& options) {
  Engine engine(model, comms, options.engine);
  KdaStatePool kda(model.config(), options.slots);
  MlaKvCache kv(model.config(), options.pages, options.page_size);
  StateStore store(&kda, &kv);
  EngineState state{&kda, &kv};
  StepOutput out;  // kept between steps: its buffers are reused
  for (;;) {
    auto bytes = ReceiveMessage(comms.world);
    if (!bytes.ok()) {
      return absl::Status(bytes.status().code(),
                          absl::StrCat(bytes.status().message(),
                                       "; rank 0 sent no step or heartbeat (it died or hangs)"));
    }
    auto m = StepMessage::Decode(*bytes);
    if (!m.ok()) return m.status();
    if (absl::Status s = ApplyAll(store, m->ops); !s.ok()) return s;
    if (m->command == Command::kStop) return absl::OkStatus();
    if (m->command == Command::kHeartbeat) {
      if (absl::Status s = HeartbeatBarrier(comms.world); !s.ok()) return s;
      continue;
    }
    const std::vector<SequenceStep> batch = m->Batch();
    if (absl::Status s = engine.Step(batch, state, &out); !s.ok()) return s;
  }
}

}  // namespace kimi
