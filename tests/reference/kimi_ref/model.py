"""Whole-model float64 reference forward pass for model_type kimi_linear and kimi_k3.

Written from /work/shared/KIMI_LINEAR.md section 3 and /work/shared/KIMI_K3.md section 5. Weights are read by
their checkpoint names and decoded from the stored dtype (bf16/fp16/fp32, MXFP4 routed experts) to float64; all
arithmetic is float64. One token sequence is run as a single prefill; KDA is run token by token.
"""
import json
import os

import torch

from . import ops
from .st import Checkpoint

F64 = torch.float64


class Config:
    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            top = json.load(f)
        self.model_type = top.get("model_type")
        if self.model_type == "kimi_k3":
            c = top["text_config"]
            self.prefix = "language_model."
        elif self.model_type == "kimi_linear":
            c = top
            self.prefix = ""
        else:
            raise ValueError(f"unsupported model_type {self.model_type!r}")
        self.k3 = self.model_type == "kimi_k3"
        self.raw = c
        self.hidden = c["hidden_size"]
        self.num_layers = c["num_hidden_layers"]
        self.vocab = c["vocab_size"]
        self.eps = c.get("rms_norm_eps", 1e-5)
        self.act = c.get("hidden_act", "silu")
        self.situ_beta = c.get("activation_situ_beta", 4.0)
        self.situ_linear_beta = c.get("activation_situ_linear_beta", 25.0)
        self.first_dense = c.get("first_k_dense_replace", 0)
        self.moe_freq = c.get("moe_layer_freq", 1)
        self.num_experts = c.get("num_experts")
        self.top_k = c.get("num_experts_per_token")
        self.renorm = c.get("moe_renormalize", True)
        self.scaling = c.get("routed_scaling_factor", 1.0)
        self.use_grouped = c.get("use_grouped_topk", False)
        self.n_group = c.get("num_expert_group", 1) or 1
        self.topk_group = c.get("topk_group", 1) or 1
        if c.get("moe_router_activation_func", "sigmoid") != "sigmoid":
            raise ValueError("only sigmoid routers are described in the fact files")
        self.latent = c.get("routed_expert_hidden_size")
        self.latent_norm = c.get("latent_moe_use_norm", False)
        self.n_heads = c["num_attention_heads"]
        self.q_lora = c.get("q_lora_rank")
        self.kv_lora = c["kv_lora_rank"]
        self.nope = c["qk_nope_head_dim"]
        self.rope = c["qk_rope_head_dim"]
        self.vdim = c["v_head_dim"]
        self.mla_gate = c.get("mla_use_output_gate", False)
        if not c.get("mla_use_nope", True):
            raise ValueError("only NoPE MLA is described in the fact files")
        la = c["linear_attn_config"]
        self.kda_layers = set(la["kda_layers"])          # 1-based
        self.kda_heads = la["num_heads"]
        self.kda_dim = la["head_dim"]
        self.conv = la.get("short_conv_kernel_size", 4)
        self.full_rank_gate = la.get("use_full_rank_gate", False)
        self.lower_bound = la.get("gate_lower_bound")
        self.attn_res_block = c.get("attn_res_block_size")

    def is_kda(self, l):
        return (l + 1) in self.kda_layers

    def is_moe(self, l):
        return self.num_experts is not None and l >= self.first_dense and l % self.moe_freq == 0


class ReferenceModel:
    """Options:
    plain_residual: K3 only; wire the layers with a plain residual h = h + f(norm(h)) instead of Block AttnRes
                    (a deliberately wrong model, used to prove the test would catch that bug).
    kv_a_eps:       eps of kv_a_layernorm (and K3 q_a_layernorm). Default: 1e-6 for Kimi Linear (HF KimiRMSNorm
                    default, KL 3.2), rms_norm_eps for K3 (brief's decision for KIMI_K3.md 5.4).
    """

    def __init__(self, model_dir, plain_residual=False, kv_a_eps=None):
        self.cfg = Config(model_dir)
        self.ckpt = Checkpoint(model_dir)
        self.plain_residual = plain_residual
        if kv_a_eps is None:
            kv_a_eps = self.cfg.eps if self.cfg.k3 else 1e-6
        self.kv_a_eps = kv_a_eps
        self._cache = {}

    # -- weights ------------------------------------------------------------------------------------------------

    def w(self, name, cache=True):
        full = self.cfg.prefix + name
        if cache and full in self._cache:
            return self._cache[full]
        t = self.ckpt.get(full, F64)
        if cache:
            self._cache[full] = t
        return t

    def has(self, name):
        return (self.cfg.prefix + name) in self.ckpt

    def linear_w(self, name):
        """A [out, in] projection weight, dense (name.weight) or MXFP4 (name.weight_packed + name.weight_scale)."""
        if self.has(name + ".weight"):
            return self.w(name + ".weight", cache=False)
        p = self.ckpt.get(self.cfg.prefix + name + ".weight_packed")
        s = self.ckpt.get(self.cfg.prefix + name + ".weight_scale")
        return ops.mxfp4_dequant(p, s)

    # -- blocks -------------------------------------------------------------------------------------------------

    def glu(self, gate, up):
        if self.cfg.act == "situ":
            return ops.situ_glu(gate, up, self.cfg.situ_beta, self.cfg.situ_linear_beta)
        if self.cfg.act == "silu":
            return ops.silu_glu(gate, up)
        raise ValueError(f"unsupported hidden_act {self.cfg.act}")

    def mlp(self, x, p, g="gate_proj", u="up_proj", d="down_proj"):
        gw, uw, dw = self.linear_w(f"{p}.{g}"), self.linear_w(f"{p}.{u}"), self.linear_w(f"{p}.{d}")
        return self.glu(x @ gw.T, x @ uw.T) @ dw.T

    def kda(self, x, p):
        """KL 3.1 / K3 5.3. x [T,hidden] (already input_layernorm'ed)."""
        c = self.cfg
        T = x.shape[0]
        H, K = c.kda_heads, c.kda_dim
        outs = []
        for n in ("q", "k", "v"):
            y = x @ self.w(f"{p}.{n}_proj.weight", False).T
            y, _ = ops.causal_conv_silu(y, self.w(f"{p}.{n}_conv1d.weight").reshape(H * K, -1))
            outs.append(y.view(T, H, K))
        q, k, v = outs
        g_raw = (x @ self.w(f"{p}.f_a_proj.weight").T) @ self.w(f"{p}.f_b_proj.weight").T
        g = ops.kda_gate(g_raw.view(T, H, K), self.w(f"{p}.A_log"), self.w(f"{p}.dt_bias"),
                         c.lower_bound if c.k3 else None)
        beta = torch.sigmoid(x @ self.w(f"{p}.b_proj.weight").T)                  # [T,H]
        q, k = ops.l2norm(q, 1e-6), ops.l2norm(k, 1e-6)
        o, _ = ops.kda_recurrent(q[None], k[None], v[None], g[None], beta[None], scale=K ** -0.5)
        o = o[0]                                                                   # [T,H,V]
        if c.full_rank_gate:
            gate = x @ self.w(f"{p}.g_proj.weight", False).T
        else:
            gate = (x @ self.w(f"{p}.g_a_proj.weight").T) @ self.w(f"{p}.g_b_proj.weight").T
        o = ops.rmsnorm(o, self.w(f"{p}.o_norm.weight"), c.eps) * torch.sigmoid(gate.view(T, H, K))
        return o.reshape(T, H * K) @ self.w(f"{p}.o_proj.weight", False).T

    def mla(self, x, p):
        """KL 3.2 / K3 5.4 (NoPE, plain form)."""
        c = self.cfg
        T = x.shape[0]
        Hh, Dn, Dr, Dv, R = c.n_heads, c.nope, c.rope, c.vdim, c.kv_lora
        if c.q_lora:
            cq = ops.rmsnorm(x @ self.w(f"{p}.q_a_proj.weight").T, self.w(f"{p}.q_a_layernorm.weight"),
                             self.kv_a_eps)
            q = cq @ self.w(f"{p}.q_b_proj.weight").T
        else:
            q = x @ self.w(f"{p}.q_proj.weight").T
        q = q.view(T, Hh, Dn + Dr)
        ckv = x @ self.w(f"{p}.kv_a_proj_with_mqa.weight").T
        c_kv, k_pe = ckv[:, :R], ckv[:, R:]
        c_kv = ops.rmsnorm(c_kv, self.w(f"{p}.kv_a_layernorm.weight"), self.kv_a_eps)
        o = ops.mla_attention(q, c_kv, k_pe, self.w(f"{p}.kv_b_proj.weight"), scale=(Dn + Dr) ** -0.5)
        o = o.reshape(T, Hh * Dv)
        if c.mla_gate:
            o = o * torch.sigmoid(x @ self.w(f"{p}.g_proj.weight", False).T)
        return o @ self.w(f"{p}.o_proj.weight", False).T

    def moe(self, x, p):
        """KL 3.4 (plain MoE) / K3 5.5 (Latent MoE). x [T,hidden] (post_attention_layernorm'ed)."""
        c = self.cfg
        logits = x @ self.w(f"{p}.gate.weight").T
        bias = self.w(f"{p}.gate.e_score_correction_bias")
        ng, tg = (c.n_group, c.topk_group) if c.use_grouped else (1, 1)
        ids, wts = ops.moe_route(logits, bias, c.top_k, c.scaling, c.renorm, ng, tg)
        z = x @ self.w(f"{p}.routed_expert_down_proj.weight").T if c.latent else x
        y = torch.zeros(x.shape[0], z.shape[1], dtype=F64)
        for e in sorted(set(ids.reshape(-1).tolist())):
            rows, slot = (ids == e).nonzero(as_tuple=True)
            ye = self.mlp(z[rows], f"{p}.experts.{e}", "w1", "w3", "w2")
            y.index_add_(0, rows, wts[rows, slot].unsqueeze(1) * ye)
        if c.latent:
            if c.latent_norm:
                y = ops.rmsnorm(y, self.w(f"{p}.routed_expert_norm.weight"), c.eps)
            y = y @ self.w(f"{p}.routed_expert_up_proj.weight").T
        if self.has(f"{p}.shared_experts.gate_proj.weight"):
            y = y + self.mlp(x, f"{p}.shared_experts")
        return y

    def attn(self, x, l):
        p = f"model.layers.{l}.self_attn"
        return self.kda(x, p) if self.cfg.is_kda(l) else self.mla(x, p)

    def ffn(self, x, l):
        if self.cfg.is_moe(l):
            return self.moe(x, f"model.layers.{l}.block_sparse_moe")
        return self.mlp(x, f"model.layers.{l}.mlp")

    def res_mix(self, prefix, bank, name):
        """K3 5.1 apply_attn_res with weights {name}_norm.weight, {name}_proj.weight."""
        out, _ = ops.attn_res(torch.stack(bank, 1), prefix, self.w(f"{name}_norm.weight"),
                              self.w(f"{name}_proj.weight"), self.cfg.eps)
        return out

    # -- forward ------------------------------------------------------------------------------------------------

    def forward(self, ids):
        """ids: list of token ids. Returns logits [T, vocab] float64."""
        c = self.cfg
        ids = torch.tensor(list(ids), dtype=torch.int64)
        emb = self.w("model.embed_tokens.weight", cache=False)[ids]          # no embedding scale
        lnw = lambda l, n: self.w(f"model.layers.{l}.{n}.weight")
        if not c.k3 or self.plain_residual:
            # KL 3.0 (and the deliberately wrong plain-residual K3 wiring)
            h = emb
            for l in range(c.num_layers):
                h = h + self.attn(ops.rmsnorm(h, lnw(l, "input_layernorm"), c.eps), l)
                h = h + self.ffn(ops.rmsnorm(h, lnw(l, "post_attention_layernorm"), c.eps), l)
            hf = h
        else:
            # K3 5.1 Block AttnRes schedule
            B = c.attn_res_block
            prefix, bank = emb, []
            for l in range(c.num_layers):
                lp = f"model.layers.{l}"
                x = prefix if not bank else self.res_mix(prefix, bank, f"{lp}.self_attention_res")
                if l % B == 0:
                    bank.append(prefix)        # close the block: snapshot of the pre-attention prefix
                    prefix = None
                a = self.attn(ops.rmsnorm(x, lnw(l, "input_layernorm"), c.eps), l)
                prefix = a if prefix is None else prefix + a
                x = self.res_mix(prefix, bank, f"{lp}.mlp_res")
                prefix = prefix + self.ffn(ops.rmsnorm(x, lnw(l, "post_attention_layernorm"), c.eps), l)
            hf = self.res_mix(prefix, bank, "model.output_attn_res")
        h = ops.rmsnorm(hf, self.w("model.norm.weight"), c.eps)
        return h @ self.w("lm_head.weight", cache=False).T
