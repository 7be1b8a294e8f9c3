// State operations between steps, and the host memory that snapshots live in.
//
// The scheduler never touches state memory itself: it asks for operations (clear a KDA slot,
// snapshot a slot or pages to host memory under a handle, restore them, drop a snapshot). In one
// process they apply at once; with many ranks (each holding a shard of every slot and page) rank 0
// records them and every rank applies the same list before the next step ("prepare, then apply").
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"

namespace kimi {

enum class StateOpKind : uint8_t {
  kClearSlot,  // slot: zero the KDA state of a new sequence
  kSaveSlot,   // slot -> handle
  kLoadSlot,   // handle -> slot
  kSavePages,  // pages -> handle (every MLA layer's rows of those pages)
  kLoadPages,  // handle -> pages
  kDrop,       // free the snapshot `handle`
};

struct StateOp {
  StateOpKind kind = StateOpKind::kClearSlot;
  int64_t slot = -1;
  int64_t handle = -1;
  std::vector<int32_t> pages;
};

// Applies state ops to this process's pools; snapshots are host copies keyed by handle.
class StateStore {
 public:
  StateStore(KdaStatePool* kda, MlaKvCache* kv) : kda_(kda), kv_(kv) {}
  void Apply(const StateOp& op);
  // Host bytes held by snapshots.
  int64_t snapshot_bytes() const { return bytes_; }
  EngineState engine_state() const { return {kda_, kv_}; }

 private:
  KdaStatePool* kda_;
  MlaKvCache* kv_;
  std::unordered_map<int64_t, std::vector<float>> snapshots_;
  int64_t bytes_ = 0;
};

// Where the scheduler sends state ops.
class StateOpSink {
 public:
  virtual ~StateOpSink() = default;
  virtual void Apply(StateOp op) = 0;
};

// One process: apply at once.
class LocalStateSink : public StateOpSink {
 public:
  explicit LocalStateSink(StateStore* store) : store_(store) {}
  void Apply(StateOp op) override { store_->Apply(op); }

 private:
  StateStore* store_;
};

}  // namespace kimi
