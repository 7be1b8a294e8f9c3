// Reading and writing the safetensors format: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets}}, then the tensor bytes. Files are memory-mapped, never read
// whole; a checkpoint is one `model.safetensors` or shards listed in `model.safetensors.index.json`.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"

namespace kimi {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the memory map
  int64_t nbytes = 0;
  std::string file;  // file name within the checkpoint directory

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

std::string ShapeString(const std::vector<int64_t>& shape);

// Where checkpoint bytes live while the model runs. Decode streams every active weight once per
// token, so the page size matters: 4 KiB pages cost TLB misses that 2 MiB pages avoid.
enum class WeightMemory {
  kMap,       // a plain private mapping of the file (page-cache pages as they are)
  kMapHuge,   // the mapping with MADV_HUGEPAGE, prefaulted: 2 MiB page-cache folios where the
              // file system and the cache state allow
  kCopyHuge,  // the tensors read into anonymous 2 MiB-aligned memory with MADV_HUGEPAGE, each
              // from a 64-byte boundary (costs the copy at load; the page cache can then be
              // dropped)
};
// Whether a copy of `bytes` of weights fits in `available` (nullopt: unknown, taken as yes) with
// room left for the rest of the process: an eighth of the copy and 256 MiB.
bool WeightCopyFits(int64_t bytes, std::optional<int64_t> available);
// $KIMI_WEIGHT_MEMORY (map, map-huge, copy-huge) or the default (see safetensors.cc for why).
WeightMemory DefaultWeightMemory();
const char* WeightMemoryName(WeightMemory m);
bool ParseWeightMemory(std::string_view name, WeightMemory* out);

// Anonymous memory of at least `bytes` bytes in 2 MiB pages (2 MiB aligned, MADV_HUGEPAGE),
// unmapped when the owner goes. The weights' home when they are copied out of their files.
class HugePages {
 public:
  static absl::StatusOr<HugePages> Allocate(size_t bytes);
  HugePages() = default;
  HugePages(HugePages&& o) noexcept { *this = std::move(o); }
  HugePages& operator=(HugePages&& o) noexcept;
  ~HugePages();
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // Makes the memory read-only (after the weights are written and packed).
  void Seal();

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;  // mapped bytes (a multiple of 2 MiB)
};

// One mapped .safetensors file. Every header entry is checked against the file size on open.
class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path, WeightMemory memory = DefaultWeightMemory());
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The memory holding the tensors: the whole file mapped (header included), or for kCopyHuge the
  // copy of its tensors.
  std::span<const uint8_t> bytes() const {
    return {copy_.data() ? copy_.data() : static_cast<const uint8_t*>(map_), size_};
  }
  // A kCopyHuge file is private writable memory until Seal() makes it read-only.
  bool writable() const { return writable_; }
  void Seal();

 private:
  SafetensorsFile() = default;
  void* map_ = nullptr;  // the file mapped (not kCopyHuge)
  HugePages copy_;       // kCopyHuge: the tensors' copy
  size_t size_ = 0;      // bytes of bytes(): the file, or the tensors' copy with its padding
  bool writable_ = false;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The pace of a long load's progress lines (the checkpoint's copy, a rank's copy of its matrices).
class LoadProgress {
 public:
  static constexpr double kSeconds = 10.0;
  // Whether a line is due: kSeconds since the start or since the last line due.
  bool Due() {
    const auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - last_).count() < kSeconds) return false;
    last_ = now;
    return true;
  }
  // Seconds since the start (at least 1 ms, for a rate).
  double Seconds() const {
    return std::max(
        1e-3, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_ = start_;
};

// All tensors of a checkpoint directory, by name.
class Checkpoint {
 public:
  // `log` (optional) receives the progress of a long load: with kCopyHuge, which reads every
  // byte, a line at most every LoadProgress::kSeconds while files remain, then one for the whole.
  // kCopyHuge maps the files instead (with a line to `log`) where the copy would not fit the
  // memory the machine and the process's cgroups still allow (cpu::cgroup::ProcessMemoryAvailable):
  // a container's memory limit would otherwise end the load in the OOM killer.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(
      const std::string& dir, WeightMemory memory = DefaultWeightMemory(),
      const std::function<void(const std::string&)>& log = nullptr);

  const TensorInfo* Find(std::string_view name) const;
  const std::map<std::string, TensorInfo, std::less<>>& tensors() const { return tensors_; }
  const std::string& dir() const { return dir_; }
  // The memory of every open file, for benchmarks that stream the same kind of pages.
  std::vector<std::span<const uint8_t>> Regions() const;
  // True when every tensor lives in private writable memory (kCopyHuge, before Seal): the loader
  // may then rewrite weights in place (packing) before sealing them read-only.
  bool Writable() const;
  void Seal();

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorInfo, std::less<>> tensors_;
};

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;
};

// Writes one .safetensors file (header padded to 8 bytes, tensors in the given order).
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace kimi
