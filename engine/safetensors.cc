#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

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
  if (map_) ::munmap(map_, map_size_);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path,
                                                                       WeightMemory memory) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot stat ", path));
  }
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile);
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ < 8) {
    ::close(fd);
    return Corrupt(path, absl::StrCat("file is ", f->size_, " bytes, shorter than its header"));
  }
  void* map = MAP_FAILED;
  if (memory == WeightMemory::kCopyHuge) {
    // Anonymous memory in whole 2 MiB pages, filled with pread (no second copy in a mapping).
    constexpr size_t kHuge = size_t{2} << 20;
    f->map_size_ = (f->size_ + kHuge - 1) / kHuge * kHuge;
    map = ::mmap(nullptr, f->map_size_ + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
    if (map != MAP_FAILED) {
      // Trim to a 2 MiB-aligned start so every page can be huge.
      auto* raw = static_cast<uint8_t*>(map);
      const size_t lead = (kHuge - reinterpret_cast<uintptr_t>(raw) % kHuge) % kHuge;
      if (lead) ::munmap(raw, lead);
      if (kHuge - lead) ::munmap(raw + lead + f->map_size_, kHuge - lead);
      map = raw + lead;
      ::madvise(map, f->map_size_, MADV_HUGEPAGE);
      auto* dst = static_cast<uint8_t*>(map);
      for (size_t done = 0; done < f->size_;) {
        const ssize_t n = ::pread(fd, dst + done, std::min<size_t>(f->size_ - done, 64 << 20),
                                  static_cast<off_t>(done));
        if (n <= 0) {
          const int err = errno;
          ::munmap(map, f->map_size_);
          ::close(fd);
          return absl::InternalError(absl::StrCat("cannot read ", path, ": ",
                                                  n == 0 ? "unexpected end" : std::strerror(err)));
        }
        done += static_cast<size_t>(n);
      }
      f->writable_ = true;
    }
  } else {
    f->map_size_ = f->size_;
    map = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map != MAP_FAILED && memory == WeightMemory::kMapHuge) {
      ::madvise(map, f->size_, MADV_HUGEPAGE);
#ifdef MADV_POPULATE_READ
      ::madvise(map, f->size_, MADV_POPULATE_READ);
#endif
    }
  }
  ::close(fd);
  if (map == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("cannot map ", path, ": ", std::strerror(errno)));
  }
  f->map_ = map;
  const auto* bytes = static_cast<const uint8_t*>(map);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxHeader || header_len > f->size_ - 8) {
    return Corrupt(path, absl::StrCat("header length ", header_len, " exceeds the file (",
                                      f->size_, " bytes); truncated or not safetensors"));
  }
  const std::string_view header(reinterpret_cast<const char*>(bytes + 8), header_len);
  json h = json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (h.is_discarded() || !h.is_object()) return Corrupt(path, "header is not a JSON object");
  const uint64_t data_begin = 8 + header_len;
  const uint64_t data_size = f->size_ - data_begin;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
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
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned()) {
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
    t.data = bytes + data_begin + begin;
    t.nbytes = static_cast<int64_t>(end - begin);
    ranges.emplace_back(begin, end);
    f->tensors_.push_back(std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) return Corrupt(path, "tensors overlap");
  }
  if (memory == WeightMemory::kMap) ::madvise(map, f->size_, MADV_WILLNEED);
  return f;
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir,
                                                             WeightMemory memory) {
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
  for (const std::string& name : files) {
    auto f = SafetensorsFile::Open(dir + "/" + name, memory);
    if (!f.ok()) return f.status();
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
  return ckpt;
}

void SafetensorsFile::Seal() {
  if (!writable_) return;
  ::mprotect(map_, map_size_, PROT_READ);
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
