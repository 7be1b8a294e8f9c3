#include "engine/weights.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <set>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/tensor_set.h"
#include "kernels/cpu/cgroup.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/pack.h"
#include "kernels/cpu/thread_pool.h"

namespace kimi {
namespace {

bool IsFloat(DType t) { return t == DType::kBF16 || t == DType::kF16 || t == DType::kF32; }

absl::Status CheckTensor(const TensorSpec& spec, const TensorInfo* t) {
  if (!t) {
    return absl::NotFoundError(absl::StrCat("missing tensor ", spec.name, " (expected shape ",
                                            ShapeString(spec.shape), ")"));
  }
  if (t->shape != spec.shape && !(spec.alt_shape && t->shape == *spec.alt_shape)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", spec.name, " has shape ",
                                                   ShapeString(t->shape), " in ", t->file,
                                                   " but the config implies ",
                                                   ShapeString(spec.shape)));
  }
  const bool ok = spec.role == TensorRole::kFloat ? IsFloat(t->dtype) : t->dtype == DType::kU8;
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", spec.name, " has dtype ", DTypeName(t->dtype), ", expected ",
        spec.role == TensorRole::kFloat ? "BF16, F16 or F32" : "U8 (MXFP4 packed)"));
  }
  return absl::OkStatus();
}

WeightFormat FormatOf(DType t) {
  switch (t) {
    case DType::kBF16:
      return WeightFormat::kBF16;
    case DType::kF16:
      return WeightFormat::kF16;
    default:
      return WeightFormat::kF32;
  }
}

}  // namespace

const float* Model::Vec(const TensorInfo& t, int64_t count) {
  const int64_t n = count < 0 ? t.numel() : count;
  auto buf = std::make_unique<float[]>(n);
  for (int64_t i = 0; i < n; ++i) {
    switch (t.dtype) {
      case DType::kF32: {
        float f;
        std::memcpy(&f, t.data + 4 * i, 4);
        buf[i] = f;
        break;
      }
      case DType::kBF16: {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        buf[i] = Bf16ToF32(h);
        break;
      }
      case DType::kF16: {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        buf[i] = F16ToF32(h);
        break;
      }
      default:
        buf[i] = 0.0f;  // unreachable: CheckTensor admits only float types here
    }
  }
  owned_.push_back(std::move(buf));
  return owned_.back().get();
}

void Model::FreeDeleter::operator()(void* p) const { std::free(p); }

uint8_t* Model::NewMatrix(int64_t bytes) {
  constexpr size_t kAlign = 64;
  const size_t n =
      (static_cast<size_t>(std::max<int64_t>(bytes, 1)) + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, n);
  if (p == nullptr) throw std::bad_alloc();  // as operator new would
  owned_matrices_.emplace_back(static_cast<uint8_t*>(p));
  return owned_matrices_.back().get();
}

Weight Model::SliceColumns(const Weight& w, int64_t begin, int64_t count) {
  Weight out = w;
  out.cols = count;
  out.packed = false;
  out.layout = PackLayout::kBlocks;
  const auto* src = static_cast<const uint8_t*>(w.data);
  if (w.format == WeightFormat::kMxfp4) {
    // Two codes per byte and one scale per 32 columns: the range is whole 32-column blocks.
    uint8_t* data = NewMatrix(w.rows * count / 2);
    uint8_t* scales = NewMatrix(w.rows * count / 32);
    for (int64_t r = 0; r < w.rows; ++r) {
      std::memcpy(&data[r * count / 2], src + r * w.cols / 2 + begin / 2, count / 2);
      std::memcpy(&scales[r * count / 32], w.scales + r * w.cols / 32 + begin / 32, count / 32);
    }
    out.data = data;
    out.scales = scales;
    return out;
  }
  const int64_t es = w.format == WeightFormat::kF32 ? 4 : 2;
  uint8_t* data = NewMatrix(w.rows * count * es);
  for (int64_t r = 0; r < w.rows; ++r) {
    std::memcpy(&data[r * count * es], src + (r * w.cols + begin) * es, count * es);
  }
  out.data = data;
  return out;
}

const float* Model::Fold(const float* a, const float* b, int64_t n) {
  auto buf = std::make_unique<float[]>(n);
  for (int64_t i = 0; i < n; ++i) buf[i] = a[i] * b[i];
  owned_.push_back(std::move(buf));
  return owned_.back().get();
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir, const Options& opts) {
  std::unique_ptr<Model> m(new Model);
  m->dir_ = dir;
  auto config = LoadModelConfig(dir);
  if (!config.ok()) return config.status();
  m->full_config_ = std::move(*config);
  if (absl::Status s = ValidateLayout(m->full_config_, opts.layout); !s.ok()) return s;
  m->shard_ = Shard::For(m->full_config_, opts.layout, opts.rank);
  m->config_ = ShardConfig(m->full_config_, m->shard_);
  auto log = [&](const std::string& line) {
    if (opts.log) opts.log(line);
  };
  for (const std::string& note : m->config_.notes) log(note);
  auto ckpt = Checkpoint::Open(dir, opts.memory, opts.log);
  if (!ckpt.ok()) return ckpt.status();
  m->checkpoint_ = std::move(*ckpt);
  if (absl::Status s = m->Bind(opts); !s.ok()) return s;
  if (m->checkpoint_->Writable()) {
    const int64_t packed = m->PackMatrices(m->Matrices(/*own_experts_only=*/false));
    if (opts.log) log(absl::StrCat("packed ", packed >> 20, " MiB of weights for linear reads"));
  } else if (opts.copy_shard) {
    auto copied = m->CopyShardMatrices(opts.log);
    if (!copied.ok()) return copied.status();
    if (*copied > 0) {
      log(absl::StrCat("copied ", *copied >> 20,
                       " MiB of this rank's matrices into huge pages, packed for linear reads"));
    }
  }
  m->checkpoint_->Seal();
  m->shard_pages_.Seal();
  return m;
}

absl::Status Model::Bind(const Options& opts) {
  const ModelConfig& c = full_config_;  // the checkpoint as a whole
  const std::vector<TensorSpec> specs = ExpectedTensors(c);
  std::unordered_map<std::string, const TensorInfo*> found;
  for (const TensorSpec& spec : specs) {
    const TensorInfo* t = checkpoint_->Find(spec.name);
    if (absl::Status s = CheckTensor(spec, t); !s.ok()) return s;
    found.emplace(spec.name, t);
  }
  int64_t skipped = 0;
  for (const auto& [name, t] : checkpoint_->tensors()) {
    if (found.count(name)) continue;
    if (IsSkippedTensor(c, name)) {
      ++skipped;
      continue;
    }
    return absl::InvalidArgumentError(absl::StrCat("unexpected tensor ", name, " ",
                                                   ShapeString(t.shape), " in ", t.file,
                                                   ": not part of the layout config.json implies"));
  }
  if (skipped > 0 && opts.log) {
    opts.log(absl::StrCat("skipped ", skipped, " tensors outside the text model (vision tower, "
                          "rotary buffers)"));
  }

  const std::string& pre = c.tensor_prefix;
  auto info = [&](const std::string& name) -> const TensorInfo& {
    return *found.at(pre + name);
  };
  auto mat = [&](const std::string& name) {
    const TensorInfo& t = info(name + ".weight");
    Weight w;
    w.data = t.data;
    w.format = FormatOf(t.dtype);
    w.rows = t.shape[0];
    w.cols = t.shape[1];
    return w;
  };
  auto packed = [&](const std::string& base) {
    if (!c.moe.mxfp4_experts) return mat(base);
    const TensorInfo& p = info(base + ".weight_packed");
    Weight w;
    w.data = p.data;
    w.scales = info(base + ".weight_scale").data;
    w.format = WeightFormat::kMxfp4;
    w.rows = p.shape[0];
    w.cols = p.shape[1] * 2;
    return w;
  };
  auto vec = [&](const std::string& name, int64_t count = -1) { return Vec(info(name), count); };

  // This rank's piece (the whole model in one process). Rows of a [out, in] matrix are views;
  // column ranges are copied once into owned memory.
  const Shard& sh = shard_;
  const int t = sh.tp_size(), tr = sh.tp_rank();
  const int64_t kda_heads = c.kda.num_heads / t, kda_h0 = tr * kda_heads;
  const int64_t hd = c.kda.head_dim, kda_c0 = kda_h0 * hd, kda_p = kda_heads * hd;
  const int64_t mla_heads = c.mla.num_heads / t, mla_h0 = tr * mla_heads;
  const int64_t qk = c.mla.qk_head_dim(), nv = c.mla.qk_nope_head_dim + c.mla.v_head_dim;
  const int64_t vd = c.mla.v_head_dim;
  auto rows = [](Weight w, int64_t begin, int64_t count) { return w.Rows(begin, count); };
  auto cols = [&](Weight w, int64_t begin, int64_t count) {
    return w.cols == count ? w : SliceColumns(w, begin, count);
  };
  // A gated MLP split over tp by its intermediate columns (or whole when parts == 1).
  auto mlp = [&](Weight gate, Weight up, Weight down, int parts, int part) {
    const int64_t n = gate.rows / parts, i0 = part * n;
    return MlpWeights{rows(gate, i0, n), rows(up, i0, n), cols(down, i0, n)};
  };

  ModelWeights& w = weights_;
  if (sh.first_stage()) w.embed = mat("model.embed_tokens");
  if (sh.last_stage()) {
    // lm_head split by vocabulary rows over the stage group; the logits are gathered.
    const Weight full = mat("lm_head");
    const int g = sh.layout.group();
    const int64_t chunk = (c.vocab + g - 1) / g;
    const int64_t v0 = std::min<int64_t>(c.vocab, sh.local * chunk);
    w.lm_head = rows(full, v0, std::min<int64_t>(chunk, c.vocab - v0));
    w.lm_head_rows_per_rank = chunk;
    w.final_norm = vec("model.norm.weight");
    if (c.attn_res_block > 0) {
      w.attn_res_out = Fold(vec("model.output_attn_res_norm.weight"),
                            vec("model.output_attn_res_proj.weight"), c.hidden);
    }
  }
  w.layers.resize(c.num_layers);
  for (int64_t l = sh.first_layer; l < sh.end_layer; ++l) {
    LayerWeights& L = w.layers[l];
    const std::string p = absl::StrCat("model.layers.", l, ".");
    L.input_norm = vec(p + "input_layernorm.weight");
    L.post_norm = vec(p + "post_attention_layernorm.weight");
    if (c.attn_res_block > 0) {
      L.attn_res_attn = Fold(vec(p + "self_attention_res_norm.weight"),
                             vec(p + "self_attention_res_proj.weight"), c.hidden);
      L.attn_res_mlp =
          Fold(vec(p + "mlp_res_norm.weight"), vec(p + "mlp_res_proj.weight"), c.hidden);
    }
    const std::string a = p + "self_attn.";
    if (c.layer_kinds[l] == LayerKind::kKda) {
      // Heads [kda_h0, kda_h0 + kda_heads): their channels [kda_c0, kda_c0 + kda_p).
      KdaWeights& k = L.kda;
      k.q_proj = rows(mat(a + "q_proj"), kda_c0, kda_p);
      k.k_proj = rows(mat(a + "k_proj"), kda_c0, kda_p);
      k.v_proj = rows(mat(a + "v_proj"), kda_c0, kda_p);
      const int64_t taps = c.kda.conv_kernel;
      k.q_conv = vec(a + "q_conv1d.weight") + kda_c0 * taps;
      k.k_conv = vec(a + "k_conv1d.weight") + kda_c0 * taps;
      k.v_conv = vec(a + "v_conv1d.weight") + kda_c0 * taps;
      k.f_a = mat(a + "f_a_proj");
      k.f_b = rows(mat(a + "f_b_proj"), kda_c0, kda_p);
      k.b_proj = rows(mat(a + "b_proj"), kda_h0, kda_heads);
      if (c.kda.full_rank_gate) {
        k.g_proj = rows(mat(a + "g_proj"), kda_c0, kda_p);
      } else {
        k.g_a = mat(a + "g_a_proj");
        k.g_b = rows(mat(a + "g_b_proj"), kda_c0, kda_p);
      }
      // K3 pads A_log to head_dim: the first num_heads entries are the heads'.
      k.a_log = vec(a + "A_log", c.kda.num_heads) + kda_h0;
      k.dt_bias = vec(a + "dt_bias") + kda_c0;
      k.o_norm = vec(a + "o_norm.weight");
      k.o_proj = cols(mat(a + "o_proj"), kda_c0, kda_p);
    } else {
      MlaWeights& m = L.mla;
      if (c.mla.q_lora_rank > 0) {
        m.q_a_proj = mat(a + "q_a_proj");
        m.q_a_norm = vec(a + "q_a_layernorm.weight");
        m.q_b_proj = rows(mat(a + "q_b_proj"), mla_h0 * qk, mla_heads * qk);
      } else {
        m.q_proj = rows(mat(a + "q_proj"), mla_h0 * qk, mla_heads * qk);
      }
      m.kv_a_proj = mat(a + "kv_a_proj_with_mqa");  // the latent is shared by all heads
      m.kv_a_norm = vec(a + "kv_a_layernorm.weight");
      m.kv_b_proj = rows(mat(a + "kv_b_proj"), mla_h0 * nv, mla_heads * nv);
      m.uk_t = TransposeUk(m.kv_b_proj);
      if (c.mla.output_gate) m.g_proj = rows(mat(a + "g_proj"), mla_h0 * vd, mla_heads * vd);
      m.o_proj = cols(mat(a + "o_proj"), mla_h0 * vd, mla_heads * vd);
    }
    L.is_moe = c.IsMoeLayer(l);
    if (!L.is_moe) {
      L.mlp = mlp(mat(p + "mlp.gate_proj"), mat(p + "mlp.up_proj"), mat(p + "mlp.down_proj"), t,
                  tr);
      continue;
    }
    MoeWeights& e = L.moe;
    const std::string b = p + "block_sparse_moe.";
    e.router = mat(b + "gate");
    e.bias = vec(b + "gate.e_score_correction_bias");
    if (c.moe.latent_dim > 0) {
      e.latent_down = mat(b + "routed_expert_down_proj");
      e.latent_up = mat(b + "routed_expert_up_proj");
      if (c.moe.latent_norm) e.latent_norm = vec(b + "routed_expert_norm.weight");
    }
    // Expert parallel: this rank owns a contiguous range of experts but binds views of all (a
    // mapped file costs nothing until read), so it can serve as a replica of a hot expert.
    // Otherwise each expert is split over tp by its intermediate columns.
    const int64_t E = c.moe.num_experts;
    e.experts.resize(E);
    for (int64_t x = 0; x < E; ++x) {
      const std::string ep = absl::StrCat(b, "experts.", x, ".");
      const int parts = sh.ep_size() > 1 ? 1 : t;
      e.experts[x] = mlp(packed(ep + "w1"), packed(ep + "w3"), packed(ep + "w2"), parts,
                         parts > 1 ? tr : 0);
    }
    if (c.moe.num_shared > 0) {
      // Split with the dense MLPs under tp alone; replicated when experts are parallel.
      const int parts = sh.ep_size() > 1 ? 1 : t;
      e.shared = mlp(mat(b + "shared_experts.gate_proj"), mat(b + "shared_experts.up_proj"),
                     mat(b + "shared_experts.down_proj"), parts, parts > 1 ? tr : 0);
    }
  }
  if (opts.log) {
    opts.log(absl::StrCat("bound ", specs.size(), " tensors from ", checkpoint_->dir()));
  }
  return absl::OkStatus();
}

Weight Model::TransposeUk(const Weight& kv_b) {
  const MlaConfig& m = config_.mla;
  const int64_t H = m.num_heads, N = m.qk_nope_head_dim, V = m.v_head_dim, R = m.kv_lora_rank;
  Weight w;
  w.rows = H * R;
  w.cols = N;
  std::vector<float> row(R);
  if (kv_b.format == WeightFormat::kBF16) {
    auto* buf = reinterpret_cast<uint16_t*>(NewMatrix(w.rows * w.cols * 2));
    const auto* src = static_cast<const uint16_t*>(kv_b.data);
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t r = 0; r < R; ++r) buf[(h * R + r) * N + n] = src[(h * (N + V) + n) * R + r];
      }
    }
    w.data = buf;
    w.format = WeightFormat::kBF16;
    return w;
  }
  auto* buf = reinterpret_cast<float*>(NewMatrix(w.rows * w.cols * 4));
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t n = 0; n < N; ++n) {
      cpu::DequantizeRow(row.data(), kv_b, h * (N + V) + n);
      for (int64_t r = 0; r < R; ++r) buf[(h * R + r) * N + n] = row[r];
    }
  }
  w.data = buf;
  w.format = WeightFormat::kF32;
  return w;
}

std::vector<Weight*> Model::Matrices(bool own_experts_only) {
  // Every matrix MatMul reads (a tied lm_head is the embedding too; DequantizeRow reads packed
  // rows). Not kv_b_proj: MLA reads it row by row (DequantizeRow) and per head.
  std::vector<Weight*> all;
  const auto add = [&](Weight& w) {
    if (w.data) all.push_back(&w);
  };
  const auto add_mlp = [&](MlpWeights& m) {
    add(m.gate);
    add(m.up);
    add(m.down);
  };
  ModelWeights& w = weights_;
  add(w.lm_head);
  for (LayerWeights& L : w.layers) {
    KdaWeights& k = L.kda;
    for (Weight* x : {&k.q_proj, &k.k_proj, &k.v_proj, &k.f_a, &k.f_b, &k.b_proj, &k.g_a, &k.g_b,
                      &k.g_proj, &k.o_proj}) {
      add(*x);
    }
    MlaWeights& m = L.mla;
    for (Weight* x : {&m.q_proj, &m.q_a_proj, &m.q_b_proj, &m.kv_a_proj, &m.g_proj, &m.o_proj}) {
      add(*x);
    }
    // Read per head with Rows(): packed only when a head's rows are whole groups.
    if (config_.mla.kv_lora_rank % PackGroupRows(cpu::PreferredPackLayout(m.uk_t.format)) == 0) {
      add(m.uk_t);
    }
    add_mlp(L.mlp);
    add(L.moe.router);
    add(L.moe.latent_down);
    add(L.moe.latent_up);
    const int64_t E = static_cast<int64_t>(L.moe.experts.size());
    const int ep = shard_.ep_size();
    for (int64_t x = 0; x < E; ++x) {
      if (!own_experts_only || ep == 1 || x / (E / ep) == shard_.ep_rank()) {
        add_mlp(L.moe.experts[x]);
      }
    }
    add_mlp(L.moe.shared);
  }
  return all;
}

int64_t Model::PackMatrices(const std::vector<Weight*>& all) {
  ModelWeights& w = weights_;
  // One entry per tensor; views sharing it (a tied embedding) learn the layout afterwards.
  std::map<const void*, Weight*> unique;
  for (Weight* x : all) {
    if (cpu::CanPack(*x)) unique.emplace(x->data, x);
  }
  std::vector<Weight*> todo;
  for (auto& [data, x] : unique) todo.push_back(x);
  cpu::ParallelFor(static_cast<int64_t>(todo.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) cpu::PackInPlace(todo[i]);
  });
  int64_t bytes = 0;
  for (Weight* x : todo) bytes += x->Bytes();
  for (Weight* x : all) {
    if (unique.count(x->data) && unique[x->data]->packed) {
      x->packed = true;
      x->layout = unique[x->data]->layout;
    }
  }
  if (w.embed.data == w.lm_head.data) {
    w.embed.packed = w.lm_head.packed;
    w.embed.layout = w.lm_head.layout;
  }
  return bytes;
}

absl::StatusOr<int64_t> Model::CopyShardMatrices(
    const std::function<void(const std::string&)>& log) {
  // A mapped checkpoint costs a rank nothing for the bytes it never reads, but the bytes it does
  // read come in 4 KiB page-cache pages, in the stored layout: on the Zen 4 host a k3-mini decode
  // token read 20 GB/s that way against 41 from a packed huge-page copy. So the matrices this rank
  // multiplies by are copied out (views included: a tensor-parallel rank copies only its rows),
  // and those already in the model's own memory (column slices, uk_t) are packed where they are.
  const std::vector<Weight*> mine = Matrices(/*own_experts_only=*/true);
  const std::vector<std::span<const uint8_t>> regions = checkpoint_->Regions();
  auto mapped = [&](const void* p) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (const auto& r : regions) {
      if (b >= r.data() && b < r.data() + r.size()) return true;
    }
    return false;
  };
  constexpr int64_t kAlign = 64;  // the kernels read weights in 64-byte blocks
  auto padded = [](int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; };
  // One copy per mapped start (a view's data and, for MXFP4, its scales), as long as the longest
  // view starting there.
  std::map<const void*, int64_t> bytes;
  auto need = [&](const void* src, int64_t n) {
    if (src != nullptr && n > 0 && mapped(src)) bytes[src] = std::max(bytes[src], n);
  };
  for (const Weight* w : mine) {
    need(w->data, w->DataBytes());
    need(w->scales, w->ScaleBytes());
  }
  std::map<const void*, int64_t> at;  // source -> offset in the copy
  int64_t total = 0;
  for (const auto& [src, n] : bytes) {
    at.emplace(src, total);
    total += padded(n);
  }
  if (total == 0) {
    PackMatrices(mine);
    return 0;
  }
  if (const std::optional<int64_t> available = cpu::cgroup::ProcessMemoryAvailable();
      !WeightCopyFits(total, available)) {
    if (log) {
      log(absl::StrFormat(
          "a copy of this rank's matrices (%.1f GB) would not fit the %.1f GB it may still use "
          "(the machine's and its cgroups' memory): they stay mapped, with slower decode",
          total / 1e9, *available / 1e9));
    }
    return 0;
  }
  auto pages = HugePages::Allocate(static_cast<size_t>(total));
  if (!pages.ok()) return pages.status();
  shard_pages_ = std::move(*pages);
  uint8_t* base = shard_pages_.data();
  // In rounds of about 1 GB, so that a copy of minutes (a rank's share of a real checkpoint, read
  // from its files) reports its progress like the whole-model copy does.
  const std::vector<std::pair<const void*, int64_t>> copies(bytes.begin(), bytes.end());
  LoadProgress progress;
  int64_t done = 0;
  for (size_t first = 0; first < copies.size();) {
    size_t end = first;
    int64_t round = 0;
    while (end < copies.size() && round < (int64_t{1} << 30)) round += copies[end++].second;
    cpu::ParallelFor(static_cast<int64_t>(end - first), 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const auto& [src, n] = copies[first + i];
        std::memcpy(base + at.at(src), src, static_cast<size_t>(n));
      }
    });
    done += round;
    first = end;
    if (log && first < copies.size() && progress.Due()) {
      log(absl::StrFormat("copied %.1f of %.1f GB of this rank's matrices (%.1f GB/s)", done / 1e9,
                          total / 1e9, done / 1e9 / progress.Seconds()));
    }
  }
  for (Weight* w : mine) {
    if (auto it = at.find(w->data); it != at.end()) w->data = base + it->second;
    if (auto it = at.find(w->scales); w->scales && it != at.end()) w->scales = base + it->second;
  }
  PackMatrices(mine);
  return total;
}

int64_t Model::ActiveWeightBytes() const {
  const ModelConfig& c = full_config_;
  int64_t bytes = weights_.lm_head.Bytes() + weights_.embed.Bytes() / c.vocab;  // + one embed row
  for (const TensorSpec& s : ExpectedTensors(c)) {
    if (s.group == TensorGroup::kEmbedding || s.group == TensorGroup::kLmHead) continue;
    const TensorInfo* t = checkpoint_->Find(s.name);
    if (!t) continue;
    if (s.group == TensorGroup::kRoutedExpert) {
      // top_k of num_experts experts are read per token.
      bytes += t->nbytes * c.moe.top_k / c.moe.num_experts;
      continue;
    }
    bytes += t->nbytes;
  }
  return bytes;
}

}  // namespace kimi
