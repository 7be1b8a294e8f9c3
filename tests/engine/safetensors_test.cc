#include "engine/safetensors.h"

#include <cstring>
#include <fstream>
#include <map>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/engine/test_models.h"
#include <sys/stat.h>

namespace kimi {
namespace {

std::string WriteSample(const std::string& dir) {
  static const float a[6] = {1, 2, 3, 4, 5, 6};
  static const uint16_t b[2] = {0x3f80, 0xc000};  // bf16 1.0, -2.0
  const std::string path = dir + "/sample.safetensors";
  const absl::Status s = WriteSafetensors(
      path,
      {{"a", DType::kF32, {2, 3}, {reinterpret_cast<const uint8_t*>(a), sizeof a}},
       {"b", DType::kBF16, {2}, {reinterpret_cast<const uint8_t*>(b), sizeof b}}},
      {{"format", "pt"}});
  EXPECT_TRUE(s.ok()) << s;
  return path;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

TEST(Safetensors, RoundTrip) {
  const std::string path = WriteSample(testing::TempDir("st-roundtrip"));
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ((*f)->tensors().size(), 2u);
  const TensorInfo* a = nullptr;
  for (const auto& t : (*f)->tensors()) {
    if (t.name == "a") a = &t;
  }
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  float v[6];
  std::memcpy(v, a->data, sizeof v);
  EXPECT_EQ(v[5], 6.0f);
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  // The header is padded so the data starts 8-byte aligned.
  const std::string bytes = ReadAll(path);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
}

// Every kind of weight memory reads the same bytes, and the huge-page copy starts every tensor on a
// 64-byte boundary whatever offsets the file gives it: the writer packs tensors back to back, so
// after a 3-byte and a 10-byte tensor the next ones start 13 and 13 + 4096 bytes into the data
// section (the AVX-512 kernels read weights in 64-byte blocks; a block across two cache lines made
// a decode token 15-17% slower).
TEST(Safetensors, EveryMemoryKindReadsTheSameBytesAndTheCopyIsAligned) {
  std::vector<std::vector<uint8_t>> bytes = {std::vector<uint8_t>(3), std::vector<uint8_t>(10),
                                             std::vector<uint8_t>(4096), std::vector<uint8_t>(66)};
  for (size_t t = 0; t < bytes.size(); ++t) {
    for (size_t i = 0; i < bytes[t].size(); ++i) bytes[t][i] = static_cast<uint8_t>(7 * t + 3 * i);
  }
  const std::string path = testing::TempDir("st-memory") + "/odd.safetensors";
  const absl::Status written =
      WriteSafetensors(path, {{"u3", DType::kU8, {3}, {bytes[0].data(), 3}},
                              {"bf5", DType::kBF16, {5}, {bytes[1].data(), 10}},
                              {"f32x1024", DType::kF32, {32, 32}, {bytes[2].data(), 4096}},
                              {"bf33", DType::kBF16, {33}, {bytes[3].data(), 66}}});
  ASSERT_TRUE(written.ok()) << written;
  const std::map<std::string, size_t> index = {{"u3", 0}, {"bf5", 1}, {"f32x1024", 2}, {"bf33", 3}};
  for (WeightMemory memory :
       {WeightMemory::kMap, WeightMemory::kMapHuge, WeightMemory::kCopyHuge}) {
    SCOPED_TRACE(WeightMemoryName(memory));
    auto f = SafetensorsFile::Open(path, memory);
    ASSERT_TRUE(f.ok()) << f.status();
    ASSERT_EQ((*f)->tensors().size(), 4u);
    for (const TensorInfo& t : (*f)->tensors()) {
      const std::vector<uint8_t>& want = bytes[index.at(t.name)];
      ASSERT_EQ(t.nbytes, static_cast<int64_t>(want.size())) << t.name;
      EXPECT_EQ(std::memcmp(t.data, want.data(), want.size()), 0) << t.name;
      const auto region = (*f)->bytes();
      EXPECT_GE(t.data, region.data()) << t.name;
      EXPECT_LE(t.data + t.nbytes, region.data() + region.size()) << t.name;
      if (memory == WeightMemory::kCopyHuge) {
        EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 64, 0u) << t.name;
      }
    }
    EXPECT_EQ((*f)->writable(), memory == WeightMemory::kCopyHuge);
  }
}

// Damaged files give a clear error, never a crash.
TEST(Safetensors, DamagedFilesAreErrors) {
  const std::string dir = testing::TempDir("st-damaged");
  const std::string good = ReadAll(WriteSample(dir));
  uint64_t n;
  std::memcpy(&n, good.data(), 8);
  const std::string bad = dir + "/bad.safetensors";
  auto expect_error = [&](const std::string& bytes, const std::string& want) {
    WriteAll(bad, bytes);
    auto f = SafetensorsFile::Open(bad);
    ASSERT_FALSE(f.ok()) << "accepted: " << want;
    EXPECT_NE(f.status().message().find(want), std::string::npos) << f.status();
  };
  expect_error("", "shorter than its header");
  expect_error(good.substr(0, 5), "shorter than its header");
  expect_error(good.substr(0, 8 + n / 2), "exceeds the file");            // cut in the header
  expect_error(good.substr(0, good.size() - 3), "truncated file");        // cut in the data
  std::string huge = good;
  huge[7] = 0x7f;                                                         // absurd header size
  expect_error(huge, "header length");
  std::string garbled = good;
  garbled[8] = '!';
  expect_error(garbled, "not a JSON object");
  std::string wrong_size = good;
  const size_t at = wrong_size.find("[2,3]");
  ASSERT_NE(at, std::string::npos);
  wrong_size.replace(at, 5, "[3,3]");
  expect_error(wrong_size, "needs 36 bytes");
  std::string dtype = good;
  const size_t f32 = dtype.find("\"F32\"");
  dtype.replace(f32, 5, "\"F8X\"");
  expect_error(dtype, "unsupported dtype");
  // A shape whose byte count overflows (2^40 x 2^40 x 4 "needed 0 bytes").
  std::string overflow = good;
  overflow.replace(at, 5, "[1099511627776,1099511627776]");
  const uint64_t grown = n + std::string("[1099511627776,1099511627776]").size() - 5;
  std::memcpy(overflow.data(), &grown, 8);
  expect_error(overflow, "bad shape");
  // A zero dimension keeps the product from overflowing: each dimension is bounded on its own.
  std::string huge_dim = good;
  huge_dim.replace(at, 5, "[0,18446744073709551615]");
  const uint64_t n2 = n + std::string("[0,18446744073709551615]").size() - 5;
  std::memcpy(huge_dim.data(), &n2, 8);
  expect_error(huge_dim, "bad shape");
  // A FIFO named as a shard: refused at once (opening it blocked forever).
  const std::string fifo = dir + "/fifo.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto f = SafetensorsFile::Open(fifo);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("not a regular file"), std::string::npos) << f.status();
}

TEST(Checkpoint, MissingDirectoryAndBadIndex) {
  auto c = Checkpoint::Open(testing::TempDir("st-empty"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("no model.safetensors"), std::string::npos);
  const std::string dir = testing::TempDir("st-index");
  WriteSample(dir);
  WriteAll(dir + "/model.safetensors.index.json",
           R"({"weight_map": {"a": "sample.safetensors", "zz": "sample.safetensors"}})");
  c = Checkpoint::Open(dir);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("tensor zz is listed"), std::string::npos) << c.status();
  WriteAll(dir + "/model.safetensors.index.json", R"({"weight_map": {"a": "../x"}})");
  EXPECT_FALSE(Checkpoint::Open(dir).ok());
  WriteAll(dir + "/model.safetensors.index.json",
           R"({"weight_map": {"a": "sample.safetensors", "b": "sample.safetensors"}})");
  c = Checkpoint::Open(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE((*c)->Find("b"), nullptr);
}

// Opening a checkpoint reports what it read: the files, their bytes and the weights' memory.
TEST(Checkpoint, ReportsTheLoad) {
  const std::string dir = testing::TempDir("st-report");
  static const float a[2] = {1, 2}, b[2] = {3, 4};
  for (const auto& [file, name, data] :
       {std::tuple{"one.safetensors", "a", a}, std::tuple{"two.safetensors", "b", b}}) {
    const absl::Status s = WriteSafetensors(
        dir + "/" + file,
        {{name, DType::kF32, {2}, {reinterpret_cast<const uint8_t*>(data), sizeof a}}}, {});
    ASSERT_TRUE(s.ok()) << s;
  }
  WriteAll(dir + "/model.safetensors.index.json",
           R"({"weight_map": {"a": "one.safetensors", "b": "two.safetensors"}})");
  for (WeightMemory memory : {WeightMemory::kCopyHuge, WeightMemory::kMap}) {
    std::vector<std::string> lines;
    auto c = Checkpoint::Open(dir, memory, [&](const std::string& l) { lines.push_back(l); });
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_EQ(lines.size(), 1u);  // the files are read in well under the progress interval
    const std::string want = memory == WeightMemory::kCopyHuge ? "read 2 files, 0.0 GB in "
                                                               : "mapped 2 files, 0.0 GB in ";
    EXPECT_EQ(lines[0].rfind(want, 0), 0u) << lines[0];
    EXPECT_NE(lines[0].find(absl::StrCat("weights in ", WeightMemoryName(memory), " memory")),
              std::string::npos)
        << lines[0];
    EXPECT_EQ(lines[0].find("GB/s") != std::string::npos, memory == WeightMemory::kCopyHuge)
        << lines[0];
  }
}

// The huge-page copy is taken only where it leaves room for the rest of the process (an eighth of
// the copy and 256 MiB); an unknown amount of memory does not stop it.
TEST(Safetensors, WeightCopyFitsWithRoomToSpare) {
  constexpr int64_t kGiB = int64_t{1} << 30, kMiB = int64_t{1} << 20;
  EXPECT_TRUE(WeightCopyFits(64 * kGiB, std::nullopt));
  EXPECT_TRUE(WeightCopyFits(kGiB, 2 * kGiB));
  EXPECT_TRUE(WeightCopyFits(kGiB, kGiB + 128 * kMiB + 256 * kMiB));
  EXPECT_FALSE(WeightCopyFits(kGiB, kGiB + 128 * kMiB + 256 * kMiB - 1));
  EXPECT_FALSE(WeightCopyFits(500 * kMiB, 300 * kMiB));  // a container limited below its model
}

}  // namespace
}  // namespace kimi
