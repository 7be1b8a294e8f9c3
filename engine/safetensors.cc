#include "engine/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/cpu/cgroup.h"
#include "nlohmann/json.hpp"
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace kimi {
namespace {

using json = nlohmann::json;

// A header larger than this is not a safetensors file (the format itself caps it at 100 MB).
constexpr uint64_t kMaxHeader = 100ull << 20;

absl::Status Corrupt(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(path, ": not a valid safetensors file: ", what));
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

// Default: the anonymous huge-page copy. Measured with kimi-bench (benchmarks/README.md): it gives
// 2 MiB pages whatever state the page cache is in, while a file mapping only gets them when the
// file system supports large folios and the file was not already cached in small pages.
WeightMemory DefaultWeightMemory() {
  static const WeightMemory m = [] {
    WeightMemory w = WeightMemory::kCopyHuge;
    if (const char* env = std::getenv("KIMI_WEIGHT_MEMORY")) ParseWeightMemory(env, &w);
    return w;
  }();
  return m;
}

bool WeightCopyFits(int64_t bytes, std::optional<int64_t> available) {
  return !available || bytes + bytes / 8 + (int64_t{256} << 20) <= *available;
}

const char* WeightMemoryName(WeightMemory m) {
  switch (m) {
    case WeightMemory::kMap:
      return "map";
    case WeightMemory::kMapHuge:
      return "map-huge";
    case WeightMemory::kCopyHuge:
      return "copy-huge";
  }
  return "?";
}

bool ParseWeightMemory(std::string_view name, WeightMemory* out) {
  for (WeightMemory m : {WeightMemory::kMap, WeightMemory::kMapHuge, WeightMemory::kCopyHuge}) {
    if (name == WeightMemoryName(m)) {
      *out = m;
      return true;
    }
  }
  return false;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

namespace {

// Where each tensor of the copy starts: a multiple of this. A file's tensors sit at whatever
// offsets its writer chose (the format pads only the header, to 8 bytes), so in a copy of the file
// image the synthetic presets' matrices started 16 or 48 bytes past a cache line and every 64-byte
// weight load of the AVX-512 kernels touched two lines. On the Zen 5 host a 100512 x 512 bf16
// product at one x row read 0.76-0.86 of the streaming read from such an address, 0.99-1.11 from an
// aligned one (2 threads, three alternations).
constexpr uint64_t kTensorAlign = 64;

// Reads bytes [offset, offset + n) of the file into dst.
absl::Status ReadAt(int fd, const std::string& path, uint8_t* dst, size_t n, uint64_t offset) {
  for (size_t done = 0; done < n;) {
    const ssize_t got = ::pread(fd, dst + done, std::min<size_t>(n - done, 64 << 20),
                                static_cast<off_t>(offset + done));
    if (got <= 0) {
      return absl::InternalError(absl::StrCat("cannot read ", path, ": ",
                                              got == 0 ? "unexpected end" : std::strerror(errno)));
    }
    done += static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

// The header's JSON and where the data section begins, read with pread (the file is not mapped
// yet).
absl::Status ReadHeader(int fd, const std::string& path, size_t size, std::string* header,
                        uint64_t* data_begin) {
  if (size < 8) {
    return Corrupt(path, absl::StrCat("file is ", size, " bytes, shorter than its header"));
  }
  uint8_t len_bytes[8];
  if (absl::Status s = ReadAt(fd, path, len_bytes, 8, 0); !s.ok()) return s;
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeader || header_len > size - 8) {
    return Corrupt(path, absl::StrCat("header length ", header_len, " exceeds the file (", size,
                                      " bytes); truncated or not safetensors"));
  }
  header->resize(header_len);
  *data_begin = 8 + header_len;
  return ReadAt(fd, path, reinterpret_cast<uint8_t*>(header->data()), header_len, 8);
}

// Anonymous memory of `size` bytes (a multiple of 2 MiB) starting on a 2 MiB boundary, with
// MADV_HUGEPAGE so every page can be huge; nullptr on failure.
uint8_t* MapHugeAnonymous(size_t size) {
  constexpr size_t kHuge = size_t{2} << 20;
  void* map =
      ::mmap(nullptr, size + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) return nullptr;
  auto* raw = static_cast<uint8_t*>(map);
  const size_t lead = (kHuge - reinterpret_cast<uintptr_t>(raw) % kHuge) % kHuge;
  if (lead) ::munmap(raw, lead);
  if (kHuge - lead) ::munmap(raw + lead + size, kHuge - lead);
  ::madvise(raw + lead, size, MADV_HUGEPAGE);
  return raw + lead;
}

}  // namespace

absl::StatusOr<HugePages> HugePages::Allocate(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  HugePages p;
  p.size_ = std::max<size_t>(kHuge, (bytes + kHuge - 1) / kHuge * kHuge);
  p.data_ = MapHugeAnonymous(p.size_);
  if (p.data_ == nullptr) {
    p.size_ = 0;
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", bytes, " bytes of huge pages (", std::strerror(errno), ")"));
  }
  return p;
}

HugePages& HugePages::operator=(HugePages&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(data_, size_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

HugePages::~HugePages() {
  if (data_) ::munmap(data_, size_);
}

void HugePages::Seal() {
  if (data_) ::mprotect(data_, size_, PROT_READ);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path,
                                                                       WeightMemory memory) {
  // O_NONBLOCK: a FIFO named as a shard would block the open (and then the read) forever; it is
  // refused below as not a regular file, and reads of regular files ignore the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) return absl::InternalError(absl::StrCat("cannot stat ", path));
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile);
  f->size_ = static_cast<size_t>(st.st_size);
  std::string header_text;
  uint64_t data_begin = 0;
  if (absl::Status s = ReadHeader(fd, path, f->size_, &header_text, &data_begin); !s.ok()) {
    return s;
  }
  json h = json::parse(header_text, nullptr, /*allow_exceptions=*/false);
  if (h.is_discarded() || !h.is_object()) return Corrupt(path, "header is not a JSON object");
  const uint64_t data_size = f->size_ - data_begin;
  std::vector<std::pair<uint64_t, uint64_t>>
      ranges;  // [begin, end) in the data section, per tensor
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return Corrupt(path, "__metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (m.value().is_string()) f->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const json& e = it.value();
    const std::string& name = it.key();
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
        !e.contains("data_offsets") || !e["dtype"].is_string() || !e["shape"].is_array() ||
        !e["data_offsets"].is_array() || e["data_offsets"].size() != 2) {
      return Corrupt(path, absl::StrCat("entry for tensor ", name, " is malformed"));
    }
    TensorInfo t;
    t.name = name;
    t.file = path.substr(path.find_last_of('/') + 1);
    if (!ParseDType(e["dtype"].get<std::string>(), &t.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", name,
                                                     " has unsupported dtype ",
                                                     e["dtype"].get<std::string>()));
    }
    // The byte count of the shape, checked for overflow (a [2^40, 2^40] tensor "needed 0 bytes"
    // and an empty entry matched it).
    uint64_t bytes = DTypeSize(t.dtype);
    for (const auto& d : e["shape"]) {
      // Each dimension bounded too: after a 0 the product cannot overflow, and 2^64 - 1 would read
      // as -1 below.
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 62) ||
          __builtin_mul_overflow(bytes, d.get<uint64_t>(), &bytes) || bytes > (uint64_t{1} << 62)) {
        return Corrupt(path, absl::StrCat("tensor ", name, " has a bad shape ", e["shape"].dump()));
      }
      t.shape.push_back(d.get<int64_t>());
    }
    const auto& off = e["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return Corrupt(path, absl::StrCat("tensor ", name, " has bad data_offsets"));
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return Corrupt(path, absl::StrCat("tensor ", name, " spans bytes [", begin, ", ", end,
                                        ") but the data section has ", data_size,
                                        " bytes (truncated file?)"));
    }
    if (static_cast<uint64_t>(t.numel() * DTypeSize(t.dtype)) != end - begin) {
      return Corrupt(path, absl::StrCat("tensor ", name, " of shape ", ShapeString(t.shape), " ",
                                        DTypeName(t.dtype), " needs ",
                                        t.numel() * DTypeSize(t.dtype), " bytes, header gives ",
                                        end - begin));
    }
    t.nbytes = static_cast<int64_t>(end - begin);
    ranges.emplace_back(begin, end);
    f->tensors_.push_back(std::move(t));
  }
  // The tensors in file order.
  std::vector<size_t> order(ranges.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  for (size_t i = 1; i < order.size(); ++i) {
    if (ranges[order[i]].first < ranges[order[i - 1]].second) {
      return Corrupt(path, "tensors overlap");
    }
  }

  if (memory == WeightMemory::kCopyHuge) {
    // The tensors alone, in file order, each from a kTensorAlign boundary, in anonymous 2 MiB
    // pages (the header is not kept: its metadata is parsed above).
    std::vector<uint64_t> at(ranges.size());
    uint64_t used = 0;
    for (size_t i : order) {
      at[i] = used;
      used += (ranges[i].second - ranges[i].first + kTensorAlign - 1) / kTensorAlign * kTensorAlign;
    }
    auto pages = HugePages::Allocate(used);
    if (!pages.ok()) {
      return absl::InternalError(
          absl::StrCat(pages.status().message(), " for the weights of ", path));
    }
    f->copy_ = std::move(*pages);
    uint8_t* arena = f->copy_.data();
    f->size_ = used;
    for (size_t i : order) {
      const uint64_t n = ranges[i].second - ranges[i].first;
      if (absl::Status s = ReadAt(fd, path, arena + at[i], n, data_begin + ranges[i].first);
          !s.ok()) {
        return s;  // the copy is unmapped with the file
      }
      f->tensors_[i].data = arena + at[i];
    }
    f->writable_ = true;
    return f;
  }

  void* map = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("cannot map ", path, ": ", std::strerror(errno)));
  }
  if (memory == WeightMemory::kMapHuge) {
    ::madvise(map, f->size_, MADV_HUGEPAGE);
#ifdef MADV_POPULATE_READ
    ::madvise(map, f->size_, MADV_POPULATE_READ);
#endif
  }
  if (memory == WeightMemory::kMap) ::madvise(map, f->size_, MADV_WILLNEED);
  f->map_ = map;
  const auto* bytes = static_cast<const uint8_t*>(map);
  for (size_t i = 0; i < ranges.size(); ++i) {
    f->tensors_[i].data = bytes + data_begin + ranges[i].first;
  }
  return f;
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(
    const std::string& dir, WeightMemory memory,
    const std::function<void(const std::string&)>& log) {
  auto ckpt = std::unique_ptr<Checkpoint>(new Checkpoint);
  ckpt->dir_ = dir;
  const std::string index_path = dir + "/model.safetensors.index.json";
  const std::string single_path = dir + "/model.safetensors";
  std::vector<std::string> files;
  std::map<std::string, std::string> weight_map;
  if (FileExists(index_path)) {
    std::ifstream in(index_path);
    std::stringstream ss;
    ss << in.rdbuf();
    json idx = json::parse(ss.str(), nullptr, false);
    if (idx.is_discarded() || !idx.is_object() || !idx.contains("weight_map") ||
        !idx["weight_map"].is_object()) {
      return absl::DataLossError(
          absl::StrCat(index_path, ": not a valid index (needs a \"weight_map\" object)"));
    }
    std::set<std::string> names;
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
      if (!it.value().is_string()) {
        return absl::DataLossError(absl::StrCat(index_path, ": weight_map entry ", it.key(),
                                                " is not a file name"));
      }
      const std::string file = it.value().get<std::string>();
      if (file.find('/') != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": shard name ", file, " must be a plain file name"));
      }
      weight_map[it.key()] = file;
      names.insert(file);
    }
    files.assign(names.begin(), names.end());
  } else if (FileExists(single_path)) {
    files.push_back("model.safetensors");
  } else {
    return absl::NotFoundError(absl::StrCat(
        dir, ": no model.safetensors or model.safetensors.index.json (not a checkpoint)"));
  }
  // A real checkpoint is tens to hundreds of GB in shards of a few GB: copying it takes minutes,
  // so the copy reports its progress.
  std::vector<uint64_t> file_bytes(files.size(), 0);
  uint64_t total = 0, done = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    struct stat st;
    if (::stat((dir + "/" + files[i]).c_str(), &st) == 0) file_bytes[i] = st.st_size;
    total += file_bytes[i];
  }
  auto gb = [](double bytes) { return absl::StrFormat("%.1f", bytes / 1e9); };
  if (memory == WeightMemory::kCopyHuge) {
    const std::optional<int64_t> available = cpu::cgroup::ProcessMemoryAvailable();
    if (!WeightCopyFits(static_cast<int64_t>(total), available)) {
      memory = WeightMemory::kMap;
      if (log) {
        log(absl::StrCat("a copy of the weights (", gb(total), " GB) would not fit the ",
                         gb(*available),
                         " GB this process may still use (the machine's and its "
                         "cgroups' memory): mapping the files instead, with slower decode (4 KiB "
                         "pages, weights not packed)"));
      }
    }
  }
  LoadProgress progress;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string& name = files[i];
    auto f = SafetensorsFile::Open(dir + "/" + name, memory);
    if (!f.ok()) return f.status();
    done += file_bytes[i];
    if (log && memory == WeightMemory::kCopyHuge && i + 1 < files.size() && progress.Due()) {
      log(absl::StrCat("read ", i + 1, " of ", files.size(), " files, ", gb(done), " of ",
                       gb(total), " GB (", gb(done / progress.Seconds()), " GB/s)"));
    }
    for (const TensorInfo& t : (*f)->tensors()) {
      if (!weight_map.empty()) {
        auto it = weight_map.find(t.name);
        if (it == weight_map.end() || it->second != name) continue;  // not this shard's copy
      }
      if (!ckpt->tensors_.emplace(t.name, t).second) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, " appears twice"));
      }
    }
    ckpt->files_.push_back(std::move(*f));
  }
  for (const auto& [name, file] : weight_map) {
    if (!ckpt->tensors_.count(name)) {
      return absl::DataLossError(absl::StrCat("tensor ", name, " is listed in ", index_path,
                                              " under ", file, " but that file lacks it"));
    }
  }
  if (log) {
    const double s = progress.Seconds();
    log(absl::StrCat(
        memory == WeightMemory::kCopyHuge ? "read " : "mapped ", files.size(),
        files.size() == 1 ? " file, " : " files, ", gb(done), " GB in ", absl::StrFormat("%.1f", s),
        " s", memory == WeightMemory::kCopyHuge ? absl::StrCat(" (", gb(done / s), " GB/s)") : "",
        ", weights in ", WeightMemoryName(memory), " memory"));
  }
  return ckpt;
}

void SafetensorsFile::Seal() {
  if (!writable_) return;
  copy_.Seal();
  writable_ = false;
}

bool Checkpoint::Writable() const {
  for (const auto& f : files_) {
    if (!f->writable()) return false;
  }
  return !files_.empty();
}

void Checkpoint::Seal() {
  for (const auto& f : files_) f->Seal();
}

std::vector<std::span<const uint8_t>> Checkpoint::Regions() const {
  std::vector<std::span<const uint8_t>> r;
  for (const auto& f : files_) r.push_back(f->bytes());
  return r;
}

const TensorInfo* Checkpoint::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  // nlohmann's default object sorts keys; the data follows the caller's order via the offsets.
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    if (static_cast<uint64_t>(numel * DTypeSize(t.dtype)) != t.bytes.size()) {
      return absl::InternalError(absl::StrCat("WriteSafetensors: ", t.name, " has ",
                                              t.bytes.size(), " bytes for shape ",
                                              ShapeString(t.shape)));
    }
    header[t.name] = {{"dtype", std::string(DTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(text.size() >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const TensorToWrite& t : tensors) {
    out.write(reinterpret_cast<const char*>(t.bytes.data()),
              static_cast<std::streamsize>(t.bytes.size()));
  }
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("write failed: ", tmp));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

}  // namespace kimi
