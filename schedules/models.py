"""Transformer workloads: model shapes, parameter counts and FLOPs per layer.

FLOPs conventions (FLOPs = floating-point operations, a multiply-add counts 2):
- A linear layer with P weights on T tokens costs 2·P·T forward, 2·P·T for the input gradient (B) and
  2·P·T for the weight gradient (W).
- Attention's quadratic term (Q·Kᵀ and scores·V) costs 4·b·s²·(heads·head_dim) forward, twice that for B
  (no weights, so W = 0). It is counted over the full s×s score matrix, as in Megatron-LM's and PaLM's MFU
  formulas (Narayanan et al. 2021, eq. 3; Chowdhery et al. 2022, app. B), not halved for the causal mask.
  A layer of local attention counts the share of that square it keeps of the causal (query, key) pairs
  (``local_attention_fraction``): a sliding window of w < s keys w·s − w(w−1)/2 of s(s+1)/2, chunks of c < s
  tokens (Llama 4: causal within each chunk) (c+1)/(s+1) where c divides s.
- MoE: router 2·h·E per token; each token visits top_k routed experts (plus the shared experts).
- Embedding lookups cost no FLOPs; the LM head is a linear layer of V·h weights.
Element-wise work (norms, activations, softmax) is not counted in FLOPs.
Units: FLOPs, bytes, parameters (counts).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from simulator.errors import ConfigError, UnknownPresetError
from simulator.inputs import brief


@dataclass(frozen=True)
class LayerFlops:
    """Forward FLOPs of one transformer layer on one micro-batch, split by component (unsharded)."""

    attn_linear: float     # Q, K, V and output projections
    attn_core: float       # Q·Kᵀ and scores·V (quadratic in seq)
    mlp: float             # dense MLP (0 in an MoE layer)
    router: float          # MoE router (0 in a dense layer)
    experts: float         # routed experts (top_k per token)
    shared: float          # shared experts

    @property
    def linear(self) -> float:
        """Forward FLOPs of everything with weights."""
        return self.attn_linear + self.mlp + self.router + self.experts + self.shared

    @property
    def forward(self) -> float:
        return self.linear + self.attn_core

    @property
    def backward_input(self) -> float:
        """B: gradients w.r.t. inputs (2x the attention core, same as forward for linear parts)."""
        return self.linear + 2.0 * self.attn_core

    @property
    def backward_weight(self) -> float:
        """W: gradients w.r.t. weights."""
        return self.linear

    @property
    def total(self) -> float:
        return self.forward + self.backward_input + self.backward_weight


POSITION_EMBEDDINGS = ("rope", "alibi", "learned", "none")
#: Sublayer kinds of a hybrid model's layer pattern (ModelSpec.hybrid_pattern, Megatron-Core's
#: hybrid_override_pattern): a Mamba-2 mixer, self-attention, a dense MLP, an MoE MLP
HYBRID_KINDS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


def hybrid_blocks(kind: str) -> tuple[bool, bool]:
    """(a mixer block: attention or Mamba-2, an MLP block: dense or MoE) of a layer of ``ModelSpec.layer_kind``
    ``kind`` ("" a transformer layer: both)."""
    return kind in ("", "*", "M"), kind in ("", "-", "E")


@dataclass(frozen=True)
class ModelSpec:
    """A dense or MoE decoder-only transformer.

    name          preset or user name
    layers        transformer layers
    hidden        model width h
    ffn           dense MLP inner width (SwiGLU: width of each of gate/up)
    heads         attention (query) heads a
    kv_heads      key/value heads (GQA; = heads for MHA)
    vocab         vocabulary size V
    experts       routed experts per MoE layer (0 = dense model)
    top_k         routed experts per token
    moe_ffn       inner width of one expert (default: ffn)
    shared_experts  experts every token visits (DeepSeek)
    first_dense_layers  leading layers with a dense MLP in an MoE model (DeepSeek-V3: 3)
    capacity_factor     expert capacity as a multiple of the uniform load; tokens beyond it are dropped
                        (None = dropless)
    router_groups, router_group_topk: group-limited routing (DeepSeek-V3: the 256 experts in 8 groups of 32
                        in expert order, a token's top_k chosen within its best 4 groups: config.json n_group /
                        topk_group, Megatron-Core moe_router_num_groups / moe_router_group_topk); 0 = none
    gated_mlp     SwiGLU-style MLP with 3 matrices (Llama) instead of 2 (GPT)
    tied_embeddings  LM head shares the embedding matrix (GPT-3)
    head_dim      per-head width (default hidden / heads)
    attention_bias  biases on the Q, K and V projections (Qwen2)
    q_lora_rank, kv_lora_rank, qk_rope_dim, v_head_dim: multi-head latent attention (DeepSeek-V3) when
                  kv_lora_rank > 0; then head_dim is the no-RoPE query/key width
    dtype_bytes   bytes per parameter / activation element in training (bf16 = 2)
    total_params  a model known only by its parameter count (memory questions only)
    position_embedding  rope (rotary on Q and K), alibi (a bias the attention kernel adds) or learned
                  (absolute position table added to the token embedding)
    dropout       hidden dropout on the residual branches (None = GPT-style models with a 2-matrix MLP
                  have it, gated Llama-style ones do not)
    sliding_window  keys each query attends to in a sliding-window layer, itself included (Mistral 7B v0.1:
                  4096, GPT-OSS: 128); 0 = every layer attends causally to the whole sequence
    attention_chunk  chunked attention: each query attends causally within its chunk of this many tokens
                  (Llama 4: 8192); 0 = none (at most one of sliding_window and attention_chunk)
    global_attention_every  with sliding_window or attention_chunk: every n-th layer (layers n-1, 2n-1, ...)
                  attends to the whole sequence, the others locally (GPT-OSS: 2, Gemma 3: 6, Llama 4: 4);
                  0 = every layer attends locally (Mistral)
    moe_layer_every  in an MoE model, every n-th layer (layers n-1, 2n-1, ... from first_dense_layers on)
                  has routed experts, the others a dense MLP of width ffn (Llama 4 Maverick: 2; Hugging Face
                  interleave_moe_layer_step / decoder_sparse_step); 1 = every layer
    attention_sinks  a learned logit per head that joins every softmax row (GPT-OSS): ``heads`` parameters
                  per layer; the kernel's extra column is not priced
    qk_norm       an RMSNorm over each query and key head before rotary (Qwen3: q_norm, k_norm): 2·head_dim
                  parameters per layer, a norm kernel over Q and K each way
    hybrid_pattern  a hybrid model's layers, one character each (Megatron-Core's ``hybrid_override_pattern``,
                  Nemotron-H): ``M`` a Mamba-2 mixer, ``*`` self-attention, ``-`` a dense MLP, ``E`` an MoE MLP, each
                  a pre-norm residual block of its own; ``layers`` = its length. "" = every layer a transformer
                  layer (attention, then MLP)
    mamba_heads, mamba_head_dim, mamba_state, mamba_groups, mamba_conv, mamba_chunk: the Mamba-2 mixer (Dao & Gu
                  2024, "Transformers are SSMs", sec. 7; Megatron-Core MambaMixer): inner width d_inner =
                  mamba_heads·mamba_head_dim, state size N, B/C groups G, causal conv width, SSD chunk length Q.
                  Its in_proj writes z, x (d_inner each), B, C (G·N each) and dt (one per head); a depthwise
                  causal conv over x, B, C; the SSD scan; a gated RMSNorm of y·silu(z); out_proj back to hidden
    mtp_layers    multi-token-prediction modules (DeepSeek-V3: 1; config.json ``num_nextn_predict_layers``).
                  Module k predicts token i+k+1: it normalises the previous depth's hidden state and the
                  embedding of token i+k (enorm, hnorm), projects their concatenation (eh_proj, 2h -> h), runs
                  one transformer layer of the model's last layer's kind and the shared LM head and loss.
                  It shares the embedding and the LM head (Megatron-Core keeps a copy of the embedding on the
                  last pipeline stage for it) and runs on the last model piece (Megatron-Core's default
                  ``mtp_process`` placement). Its layer has index ``layers + k`` in per-layer functions.
    """

    name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    experts: int = 0
    top_k: int = 1
    moe_ffn: int | None = None
    shared_experts: int = 0
    first_dense_layers: int = 0
    capacity_factor: float | None = None
    router_groups: int = 0
    router_group_topk: int = 0
    gated_mlp: bool = True
    tied_embeddings: bool = False
    head_dim: int | None = None
    attention_bias: bool = False
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_dim: int = 0
    v_head_dim: int = 0
    dtype_bytes: int = 2
    total_params: float | None = None
    position_embedding: str = "rope"
    dropout: bool | None = None
    mtp_layers: int = 0
    sliding_window: int = 0
    attention_chunk: int = 0
    global_attention_every: int = 0
    moe_layer_every: int = 1
    attention_sinks: bool = False
    qk_norm: bool = False
    hybrid_pattern: str = ""
    mamba_heads: int = 0
    mamba_head_dim: int = 64
    mamba_state: int = 128
    mamba_groups: int = 8
    mamba_conv: int = 4
    mamba_chunk: int = 128

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip():     # (it titles tables and reports)
            raise ConfigError(f"model: name must be a non-empty string, got {self.name!r:.40}")
        if self.total_params is not None:
            tp = self.total_params
            if not isinstance(tp, (int, float)) or isinstance(tp, bool) or not math.isfinite(tp) or tp <= 0:
                raise ConfigError(f"model {self.name}: parameter count must be positive, got {self.total_params}")
            return
        for f in ("layers", "hidden", "ffn", "heads", "kv_heads", "vocab", "top_k", "dtype_bytes", "moe_layer_every",
                  "mamba_head_dim", "mamba_state", "mamba_groups", "mamba_conv", "mamba_chunk"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"model {self.name}: {f} must be a positive integer, got {v!r}")
        for f in ("experts", "shared_experts", "first_dense_layers", "q_lora_rank", "kv_lora_rank", "qk_rope_dim",
                  "v_head_dim", "mtp_layers", "router_groups", "router_group_topk", "sliding_window",
                  "attention_chunk", "global_attention_every", "mamba_heads"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"model {self.name}: {f} must be a non-negative integer, got {v!r}")
        for f in ("moe_ffn", "head_dim"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise ConfigError(f"model {self.name}: {f} must be a positive integer or unset, got {v!r}")
        cf = self.capacity_factor
        if cf is not None and (not isinstance(cf, (int, float)) or isinstance(cf, bool) or not math.isfinite(cf)
                               or cf <= 0):
            raise ConfigError(f"model {self.name}: capacity_factor must be a positive number or unset, got {cf!r}")
        if not all(isinstance(getattr(self, f), bool) for f in ("gated_mlp", "tied_embeddings", "attention_bias",
                                                                "attention_sinks", "qk_norm")):
            raise ConfigError(f"model {self.name}: gated_mlp, tied_embeddings, attention_bias, attention_sinks and "
                              f"qk_norm must be true or false")
        mla_only = [f for f in ("q_lora_rank", "qk_rope_dim", "v_head_dim") if getattr(self, f)]
        if mla_only and not self.kv_lora_rank:      # (they were ignored without a word)
            raise ConfigError(f"model {self.name}: {', '.join(mla_only)} shape multi-head latent attention, which "
                              f"kv_lora_rank > 0 turns on: give kv_lora_rank, or drop them")
        if self.kv_lora_rank and not (self.v_head_dim and self.qk_rope_dim):
            raise ConfigError(f"model {self.name}: multi-head latent attention (kv_lora_rank {self.kv_lora_rank}) "
                              f"needs v_head_dim and qk_rope_dim > 0 (DeepSeek-V3: 128 and 64)")
        if self.sliding_window and self.attention_chunk:
            raise ConfigError(f"model {self.name}: sliding_window and attention_chunk are two kinds of local "
                              f"attention; give one")
        if self.global_attention_every and not (self.sliding_window or self.attention_chunk):
            raise ConfigError(f"model {self.name}: global_attention_every {self.global_attention_every} needs a "
                              f"sliding_window or an attention_chunk (the layers between the global ones attend "
                              f"locally)")
        if self.position_embedding not in POSITION_EMBEDDINGS:
            raise ConfigError(f"model {self.name}: position_embedding must be one of {', '.join(POSITION_EMBEDDINGS)},"
                              f" got {self.position_embedding!r}")
        if self.dropout is not None and not isinstance(self.dropout, bool):
            raise ConfigError(f"model {self.name}: dropout must be true, false or unset, got {self.dropout!r}")
        if self.head_dim is None and self.hidden % self.heads:
            raise ConfigError(f"model {self.name}: hidden {self.hidden} is not divisible by heads {self.heads}; "
                              f"set head_dim or change --heads")
        if self.heads % self.kv_heads:
            raise ConfigError(f"model {self.name}: heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        if self.experts < 0 or (self.experts and not 1 <= self.top_k <= self.experts):
            raise ConfigError(f"model {self.name}: top_k {self.top_k} must be between 1 and experts {self.experts}")
        if self.router_groups and not (self.experts and self.experts % self.router_groups == 0
                                       and 1 <= self.router_group_topk <= self.router_groups
                                       and self.top_k <= self.router_group_topk * self.experts // self.router_groups):
            raise ConfigError(f"model {self.name}: router_groups {self.router_groups} must divide experts "
                              f"{self.experts} and router_group_topk {self.router_group_topk} be 1..router_groups, "
                              f"with room for top_k {self.top_k} experts in the chosen groups")
        if not 0 <= self.first_dense_layers <= self.layers:
            raise ConfigError(f"model {self.name}: first_dense_layers must be in 0..{self.layers}")
        self._check_hybrid()
        if self.is_moe and not self.hybrid_pattern and not any(
                (i + 1) % self.moe_layer_every == 0 for i in range(self.first_dense_layers, self.layers)):
            raise ConfigError(f"model {self.name}: no layer would have experts (moe_layer_every "
                              f"{self.moe_layer_every}, first_dense_layers {self.first_dense_layers}, layers "
                              f"{self.layers}): the model would run dense; lower moe_layer_every, or give experts 0")

    def _check_hybrid(self) -> None:
        pat = self.hybrid_pattern
        if not isinstance(pat, str):
            raise ConfigError(f"model {self.name}: hybrid_pattern must be a string of {''.join(HYBRID_KINDS)}")
        if not pat:
            return
        bad = sorted(set(pat) - set(HYBRID_KINDS))
        if bad:
            raise ConfigError(f"model {self.name}: hybrid_pattern has {''.join(bad)!r}; each layer is one of "
                              + ", ".join(f"{c} ({k})" for c, k in HYBRID_KINDS.items()))
        if len(pat) != self.layers:
            raise ConfigError(f"model {self.name}: hybrid_pattern has {len(pat)} layers, layers is {self.layers}")
        if "M" in pat and not self.mamba_heads:
            raise ConfigError(f"model {self.name}: a hybrid_pattern with Mamba layers (M) needs mamba_heads")
        if "M" in pat and self.mamba_heads % self.mamba_groups:
            raise ConfigError(f"model {self.name}: mamba_heads {self.mamba_heads} is not a multiple of mamba_groups "
                              f"{self.mamba_groups}")
        if ("E" in pat) != self.is_moe:
            raise ConfigError(f"model {self.name}: a hybrid_pattern {'with' if 'E' in pat else 'without'} MoE layers "
                              f"(E) needs {'experts' if 'E' in pat else 'experts 0'}")
        if self.first_dense_layers or self.moe_layer_every != 1 or self.mtp_layers:
            raise ConfigError(f"model {self.name}: a hybrid_pattern names each layer's kind; first_dense_layers, "
                              f"moe_layer_every and mtp_layers do not combine with it")
        if self.sliding_window or self.attention_chunk or self.is_mla:
            raise ConfigError(f"model {self.name}: local or latent attention in a hybrid model is not modelled")

    # ------------------------------------------------------------------ shapes
    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def params_only(self) -> bool:
        """True for a model given only by its parameter count."""
        return self.total_params is not None

    @property
    def d_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn if self.moe_ffn is not None else self.ffn

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def is_mtp_layer(self, layer: int) -> bool:
        """Whether layer index ``layer`` is an MTP module's layer (indices ``layers`` .. ``layers + mtp_layers - 1``)."""
        return layer >= self.layers

    @property
    def is_hybrid(self) -> bool:
        """A hybrid model (``hybrid_pattern``): each layer one Mamba-2, attention, MLP or MoE block."""
        return bool(self.hybrid_pattern)

    def layer_kind(self, layer: int) -> str:
        """Layer ``layer``'s character of ``hybrid_pattern`` (M, *, - or E), "" for a transformer layer."""
        return self.hybrid_pattern[min(layer, self.layers - 1)] if self.hybrid_pattern else ""

    def layer_blocks(self, layer: int) -> tuple[bool, bool]:
        """(has a mixer block: attention or Mamba-2, has an MLP block: dense or MoE) of layer ``layer``."""
        return hybrid_blocks(self.layer_kind(layer))

    def is_moe_layer(self, layer: int) -> bool:
        """Whether layer ``layer`` has routed experts (an MTP module's layer, index >= layers, is of the last
        layer's kind)."""
        i = min(layer, self.layers - 1)
        if self.hybrid_pattern:
            return self.hybrid_pattern[i] == "E"
        return self.is_moe and i >= self.first_dense_layers and (i + 1) % self.moe_layer_every == 0

    # ------------------------------------------------------------------ Mamba-2
    @property
    def mamba_inner(self) -> int:
        """d_inner = mamba_heads · mamba_head_dim."""
        return self.mamba_heads * self.mamba_head_dim

    def mamba_in_width(self) -> int:
        """in_proj's output width: z and x (d_inner each), B and C (groups · state each), dt (one per head)."""
        return 2 * self.mamba_inner + 2 * self.mamba_groups * self.mamba_state + self.mamba_heads

    def mamba_conv_width(self) -> int:
        """Channels of the depthwise causal conv: x, B and C."""
        return self.mamba_inner + 2 * self.mamba_groups * self.mamba_state

    def mamba_linear_params(self) -> int:
        """Weights of a Mamba-2 mixer's two linears, in_proj and out_proj (no biases, as Megatron-Core's
        MambaMixer builds them)."""
        return self.hidden * self.mamba_in_width() + self.mamba_inner * self.hidden

    def mamba_params(self) -> int:
        """Parameters of one Mamba-2 mixer: its linears, conv1d (weight and bias), dt_bias, A_log, D and the
        gated norm's weight."""
        c = self.mamba_conv_width()
        return self.mamba_linear_params() + c * (self.mamba_conv + 1) + 3 * self.mamba_heads + self.mamba_inner

    def ssd_flops(self, seq: int, micro_batch: int) -> float:
        """Forward FLOPs of the SSD scan (Dao & Gu 2024, sec. 6: chunks of Q tokens, all matmuls) on one
        micro-batch: C·Bᵀ within each chunk (2·t·Q·N per group), the chunk states Bᵀ·x (2·t·N·P per head),
        the intra-chunk outputs (C·Bᵀ masked)·x (2·t·Q·P per head) and the inter-chunk outputs C·state
        (2·t·N·P per head); the state passing between chunks (elementwise) is not counted."""
        t = float(seq) * micro_batch
        q, n, p, hh, g = min(self.mamba_chunk, seq), self.mamba_state, self.mamba_head_dim, self.mamba_heads, \
            self.mamba_groups
        return 2.0 * t * (q * n * g + hh * (2 * n * p + q * p))

    def local_attention(self, layer: int) -> tuple[str, int]:
        """Layer ``layer``'s attention: ("sliding", w) for a sliding window of w keys, ("chunked", c) for causal
        attention within chunks of c tokens, ("", 0) where it attends causally to the whole sequence (an MTP
        module's layer, index >= layers, is of the last layer's kind)."""
        if not (self.sliding_window or self.attention_chunk):
            return GLOBAL_ATTENTION
        n = self.global_attention_every
        if n and (min(layer, self.layers - 1) + 1) % n == 0:
            return GLOBAL_ATTENTION
        return ("sliding", self.sliding_window) if self.sliding_window else ("chunked", self.attention_chunk)

    # ------------------------------------------------------------------ parameters
    def _mlp_params(self, width: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden * width

    def attention_params(self) -> int:
        h, a, d = self.hidden, self.heads, self.d_head
        if self.is_mla:
            qk = d + self.qk_rope_dim
            q = (h * self.q_lora_rank + self.q_lora_rank * a * qk) if self.q_lora_rank else h * a * qk
            kv_a = h * (self.kv_lora_rank + self.qk_rope_dim)
            kv_b = self.kv_lora_rank * a * (d + self.v_head_dim)
            return q + kv_a + kv_b + a * self.v_head_dim * h
        bias = (a * d + 2 * self.kv_heads * d) if self.attention_bias else 0
        sinks = a if self.attention_sinks else 0
        qk_norm = 2 * d if self.qk_norm else 0
        return h * a * d * 2 + 2 * h * self.kv_heads * d + bias + sinks + qk_norm

    def expert_params(self) -> int:
        """Parameters of one routed expert."""
        return self._mlp_params(self.expert_ffn)

    def layer_params(self, layer: int) -> int:
        """Parameters of transformer layer ``layer`` (0-based), norms included."""
        mixer, mlp = self.layer_blocks(layer)      # each block with its pre-norm (a hybrid layer has one)
        n = 0
        if mixer:
            n += (self.mamba_params() if self.layer_kind(layer) == "M" else self.attention_params()) + self.hidden
        if mlp:
            n += (self.hidden * self.experts + self.experts * self.expert_params()
                  + self.shared_experts * self.expert_params() if self.is_moe_layer(layer)
                  else self._mlp_params(self.ffn)) + self.hidden
        return n

    def layer_expert_params(self, layer: int) -> int:
        """Parameters of the routed experts of a layer (sharded over ep)."""
        return self.experts * self.expert_params() if self.is_moe_layer(layer) else 0

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def head_params(self) -> int:
        """LM head parameters (0 extra when tied, but the last stage still holds a copy under PP)."""
        return self.vocab * self.hidden

    def mtp_extra_params(self) -> int:
        """Parameters of one MTP module besides its transformer layer: eh_proj (2h x h) and its three norms
        (enorm, hnorm, the final norm); the embedding and LM head are the model's."""
        return 2 * self.hidden * self.hidden + 3 * self.hidden

    def mtp_param_count(self) -> float:
        """Parameters of the MTP modules (not in ``param_count``: DeepSeek-V3's 671 B leave its 14 B module out,
        counting the shared embedding and head there)."""
        if self.params_only or not self.mtp_layers:
            return 0.0
        return float(self.mtp_layers * (self.layer_params(self.layers) + self.mtp_extra_params()))

    def param_count(self) -> float:
        """Total parameters (embedding, layers, final norm, untied LM head; MTP modules: ``mtp_param_count``)."""
        if self.total_params is not None:
            return float(self.total_params)
        n = self.embedding_params() + sum(self.layer_params(i) for i in range(self.layers)) + self.hidden
        if not self.tied_embeddings:
            n += self.head_params()
        return float(n)

    def active_param_count(self) -> float:
        """Parameters one token touches (MoE: top_k routed experts instead of all)."""
        n = self.param_count()
        for i in range(self.layers):
            if self.is_moe_layer(i):
                n -= (self.experts - self.top_k) * self.expert_params()
        return n

    # ------------------------------------------------------------------ FLOPs
    def _require_shape(self) -> None:
        if self.params_only:
            raise ConfigError(f"model {self.name} is given only by its parameter count; FLOPs and programs need "
                              f"its shape: use --model PRESET or --layers/--hidden/--heads")

    def layer_flops(self, layer: int, seq: int, micro_batch: int) -> LayerFlops:
        """Forward FLOPs of layer ``layer`` on one micro-batch of ``micro_batch`` sequences of ``seq`` tokens."""
        self._require_shape()
        t = float(seq) * micro_batch
        h = self.hidden
        mixer, mlp = self.layer_blocks(layer)
        attn_linear = core = 0.0
        if self.layer_kind(layer) == "M":     # the mixer's linears, and the SSD scan where attention has its core
            attn_linear, core = 2.0 * t * self.mamba_linear_params(), self.ssd_flops(seq, micro_batch)
        elif mixer:
            attn_linear = 2.0 * t * self.attention_params()
            if self.is_mla:
                core = 2.0 * micro_batch * seq * seq * self.heads * (self.d_head + self.qk_rope_dim + self.v_head_dim)
            else:
                core = 4.0 * micro_batch * seq * seq * self.heads * self.d_head
            core *= local_attention_fraction(seq, self.local_attention(layer))
        if not mlp:
            return LayerFlops(attn_linear, core, 0.0, 0.0, 0.0, 0.0)
        if self.is_moe_layer(layer):
            router = 2.0 * t * h * self.experts
            experts = 2.0 * t * self.top_k * self.expert_params()
            shared = 2.0 * t * self.shared_experts * self.expert_params()
            return LayerFlops(attn_linear, core, 0.0, router, experts, shared)
        return LayerFlops(attn_linear, core, 2.0 * t * self._mlp_params(self.ffn), 0.0, 0.0, 0.0)

    def head_flops(self, seq: int, micro_batch: int) -> float:
        """Forward FLOPs of the LM head on one micro-batch (B and W cost the same each)."""
        self._require_shape()
        return 2.0 * seq * micro_batch * self.vocab * self.hidden

    def mtp_extra_flops(self, seq: int, micro_batch: int) -> float:
        """Forward FLOPs of the MTP modules besides their transformer layers: each module's eh_proj and its
        pass through the shared LM head (B and W cost the same each)."""
        self._require_shape()
        t = float(seq) * micro_batch
        return self.mtp_layers * (2.0 * t * 2 * self.hidden * self.hidden + self.head_flops(seq, micro_batch))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


GLOBAL_ATTENTION = ("", 0)      # ModelSpec.local_attention of a layer attending to the whole sequence


def causal_window_fraction(seq: float, window: int) -> float:
    """The share of a causal attention's (query, key) pairs a sliding window of ``window`` keys (itself
    included) keeps over ``seq`` tokens: (w·s − w(w−1)/2) / (s(s+1)/2); 1 without a window or where it spans
    the sequence."""
    s, w = float(seq), float(window)
    if not window or w >= s:
        return 1.0
    return (w * s - w * (w - 1) / 2) / (s * (s + 1) / 2)


def causal_chunk_fraction(seq: int, chunk: int) -> float:
    """The share of a causal attention's (query, key) pairs that attention within chunks of ``chunk`` tokens
    keeps over ``seq`` tokens (each chunk causal on its own; the last one may be shorter); 1 without chunks or
    where one chunk spans the sequence."""
    s, c = int(seq), int(chunk)
    if not c or c >= s:
        return 1.0
    full, rest = divmod(s, c)
    return (full * c * (c + 1) / 2 + rest * (rest + 1) / 2) / (s * (s + 1) / 2)


def local_attention_fraction(seq: int, local: tuple[str, int]) -> float:
    """The share of the causal pairs a layer's attention keeps (``ModelSpec.local_attention``)."""
    kind, n = local
    if kind == "sliding":
        return causal_window_fraction(seq, n)
    if kind == "chunked":
        return causal_chunk_fraction(seq, n)
    return 1.0


def packed(model: ModelSpec, doc_tokens: int, seq: int, given=()) -> ModelSpec:
    """``model`` trained on sequences of ``seq`` tokens packed from documents of ``doc_tokens`` tokens each
    (fine-tuning data such as SQuAD, packed with per-document attention masks: THD ``cu_seqlens``): every layer
    attends causally within its document, which is chunked attention of chunk ``doc_tokens`` (the FLOPs and the
    fused kernels over b·s/d documents, ``local_attention``). Real documents vary in length: for
    Σ sᵢ² per sequence, ``doc_tokens`` = Σ sᵢ² / seq gives the same attention FLOPs. A sliding window no
    shorter than the documents never applies within one (nor a chunk no shorter than the sequence) and is
    dropped; shorter local attention is refused (packing within windows is not modelled), saying whose it is:
    the preset's own, or one given on top of it (``given``: the model fields the user set)."""
    if not isinstance(doc_tokens, int) or isinstance(doc_tokens, bool) or doc_tokens < 1:
        raise ConfigError(f"packed_doc_tokens must be a positive number of tokens, got {doc_tokens!r}")
    if doc_tokens >= seq:
        return model
    window, chunk = model.sliding_window, model.attention_chunk
    if (window and window < doc_tokens) or (chunk and chunk < seq):
        name, what, n = ("sliding_window", "sliding window", window) if window else \
            ("attention_chunk", "attention chunk", chunk)
        whose = f"the {what} of {n} tokens given for {model.name}" if name in given else \
            f"{model.name}'s own {what} of {n} tokens"
        raise ConfigError(f"packed documents (--packed-doc-tokens {doc_tokens}) within local attention ({whose}) "
                          f"are not modelled: {model.name} already attends locally; drop "
                          f"{'one of them' if name in given else '--packed-doc-tokens'}")
    return dataclasses.replace(model, attention_chunk=doc_tokens, sliding_window=0, global_attention_every=0)


def lora_target_shapes(model: ModelSpec) -> dict[str, tuple[int, int]]:
    """(k, n) of each linear a LoRA adapter can sit beside (whole, before TP): y[·, n] = x[·, k]·W."""
    a, kv, d, h = model.heads, model.kv_heads, model.d_head, model.hidden
    return {"qkv": (h, (a + 2 * kv) * d), "proj": (a * d, h),
            "fc1": (h, (2 if model.gated_mlp else 1) * model.ffn), "fc2": (model.ffn, h)}


#: stacks whose attention runs separate wq, wk, wv linears (torchtitan's Attention; schedules.kernels)
SEPARATE_QKV_STACKS = ("torchtitan", "torchtitan-compile", "torchtitan-compile-loss")


def lora_layer_params(model: ModelSpec, rank: int, targets: tuple[str, ...], stack: str = "megatron") -> int:
    """Parameters of one layer's LoRA adapters (A: k×r and B: r×n per target linear; whole, before TP). Where
    the stack runs a target as several linears (wq, wk, wv; SwiGLU's w1 and w3 outside megatron's fused fc1)
    each has an adapter of its own: one A per linear, the B's together as wide as the fused one."""
    if not rank:
        return 0
    shapes = lora_target_shapes(model)
    linears = {"qkv": 3 if stack in SEPARATE_QKV_STACKS else 1,
               "fc1": 2 if model.gated_mlp and stack != "megatron" else 1}
    return sum(rank * (shapes[t][0] * linears.get(t, 1) + shapes[t][1]) for t in targets)


def model_flops_per_step(model: ModelSpec, seq: int, global_batch: int, lora_rank: int = 0,
                         lora_targets: tuple[str, ...] = (), stack: str = "megatron") -> float:
    """Model FLOPs of one training step (forward + backward, no recomputation): the MFU numerator.

    Equals 6·N_active·tokens plus attention's 12·L·s·(heads·head_dim)·tokens, less the embedding lookup; the MTP
    modules' layers, projections and head passes count too (Megatron-Core's FLOP count includes them). LoRA
    (``lora_rank`` > 0): the frozen weights' forward and input gradients (4·N·tokens, no weight gradients),
    the attention core's forward and backward, and the adapters' 6·N_adapter·tokens."""
    layers = range(model.layers + model.mtp_layers)
    if lora_rank:
        per_seq = sum(2 * lf.linear + 3 * lf.attn_core for lf in (model.layer_flops(i, seq, 1) for i in layers)) \
            + 2 * model.head_flops(seq, 1) + 2 * model.mtp_extra_flops(seq, 1) \
            + 6.0 * seq * model.layers * lora_layer_params(model, lora_rank, lora_targets, stack)
        return per_seq * global_batch
    per_seq = sum(model.layer_flops(i, seq, 1).total for i in layers) + 3 * model.head_flops(seq, 1) \
        + 3 * model.mtp_extra_flops(seq, 1)
    return per_seq * global_batch


def layer_flops_forward(model: ModelSpec, layer: int, seq: int, micro_batch: int) -> float:
    return model.layer_flops(layer, seq, micro_batch).forward


def layer_flops_backward_input(model: ModelSpec, layer: int, seq: int, micro_batch: int) -> float:
    return model.layer_flops(layer, seq, micro_batch).backward_input


def layer_flops_backward_weight(model: ModelSpec, layer: int, seq: int, micro_batch: int) -> float:
    return model.layer_flops(layer, seq, micro_batch).backward_weight


# ---------------------------------------------------------------------------------------------- presets
# Shapes from the models' papers / released configs:
#   GPT-3 175B: Brown et al. 2020, table 2.1 (96 layers, d 12288, 96 heads, ctx 2048; vocab 50257, tied).
#   Llama 3 8B / 70B / 405B: Llama Team 2024 "The Llama 3 Herd of Models", table 3 (vocab 128,256).
#   Mixtral 8x22B: mistralai/Mixtral-8x22B-v0.1 config.json.
#   DeepSeek-V3: DeepSeek-AI 2024 tech report, sec. 4.2 and the released config.json (MLA, 1 shared +
#   256 routed experts, top-8, first 3 layers dense, one multi-token-prediction module:
#   num_nextn_predict_layers = 1; group-limited routing: n_group 8, topk_group 4).
#: Megatron-LM's 2021 GPT family (Narayanan et al. 2021, table 1, and table 2's 174.6B): size -> (heads, hidden,
#: layers); presets ``megatron-gpt-<size>`` (below). Their published runs predate FlashAttention.
_MEGATRON_GPT_2021 = {"1.7b": (24, 2304, 24), "3.6b": (32, 3072, 30), "7.5b": (32, 4096, 36),
                      "18.4b": (48, 6144, 40), "39.1b": (64, 8192, 48), "76.1b": (80, 10240, 60),
                      "145.6b": (96, 12288, 80), "174.6b": (96, 12288, 96), "310.1b": (128, 16384, 96),
                      "529.6b": (128, 20480, 105), "1t": (160, 25600, 128)}
MEGATRON_GPT_2021_PRESETS = tuple(f"megatron-gpt-{n}" for n in _MEGATRON_GPT_2021)

_PRESETS: dict[str, ModelSpec] = {
    "gpt3-175b": ModelSpec("gpt3-175b", layers=96, hidden=12288, ffn=4 * 12288, heads=96, kv_heads=96,
                           vocab=50257, gated_mlp=False, tied_embeddings=True, position_embedding="learned"),
    "llama3-8b": ModelSpec("llama3-8b", layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256),
    "llama3-70b": ModelSpec("llama3-70b", layers=80, hidden=8192, ffn=28672, heads=64, kv_heads=8, vocab=128256),
    "llama3-405b": ModelSpec("llama3-405b", layers=126, hidden=16384, ffn=53248, heads=128, kv_heads=8,
                             vocab=128256),
    "mixtral-8x22b": ModelSpec("mixtral-8x22b", layers=56, hidden=6144, ffn=16384, heads=48, kv_heads=8,
                               vocab=32768, experts=8, top_k=2),
    "deepseek-v3": ModelSpec("deepseek-v3", layers=61, hidden=7168, ffn=18432, heads=128, kv_heads=128,
                             vocab=129280, experts=256, top_k=8, moe_ffn=2048, shared_experts=1,
                             first_dense_layers=3, head_dim=128, q_lora_rank=1536, kv_lora_rank=512,
                             qk_rope_dim=64, v_head_dim=128, mtp_layers=1, router_groups=8, router_group_topk=4),
    # Llama 2 7B / 13B / 70B: Touvron et al. 2023, table 1 and the released config.json (vocab 32,000; 70B GQA 8).
    "llama2-7b": ModelSpec("llama2-7b", layers=32, hidden=4096, ffn=11008, heads=32, kv_heads=32, vocab=32000),
    "llama2-13b": ModelSpec("llama2-13b", layers=40, hidden=5120, ffn=13824, heads=40, kv_heads=40, vocab=32000),
    "llama2-70b": ModelSpec("llama2-70b", layers=80, hidden=8192, ffn=28672, heads=64, kv_heads=8, vocab=32000),
    # Nemotron-4 15B / 340B: NVIDIA 2024 tech reports (15B: arXiv 2402.16819 table 1 and sec. 2: "squared ReLU
    # activations in the MLP layers, no bias terms, dropout rate of zero, and untied input-output embeddings";
    # 340B: arXiv 2406.11704 sec. 2.1, the same architecture): squared-ReLU MLP (2 matrices), GQA 8, vocab
    # 256,000, no dropout.
    "nemotron4-15b": ModelSpec("nemotron4-15b", layers=32, hidden=6144, ffn=24576, heads=48, kv_heads=8,
                               vocab=256000, gated_mlp=False, dropout=False),
    "nemotron4-340b": ModelSpec("nemotron4-340b", layers=96, hidden=18432, ffn=73728, heads=96, kv_heads=8,
                                vocab=256000, gated_mlp=False, dropout=False),
    # Grok-1 314B: xai-org/grok-1 run.py / model.py (64 layers, emb 6144, 48 query / 8 KV heads, 8 experts top-2,
    # widening factor 8 -> ffn int(8·6144)·2/3 = 32,768 gated, vocab 131,072).
    "grok1-314b": ModelSpec("grok1-314b", layers=64, hidden=6144, ffn=32768, heads=48, kv_heads=8, vocab=131072,
                            experts=8, top_k=2),
    # MPT (mosaicml/llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml): GELU MLP with expansion 4, MHA,
    # vocab 50,368, tied embeddings, learned positions (MPTConfig's default; the benchmark table's NumParams
    # include the seq_len x d table), no dropout (MPTConfig's pdrops default to 0) (the benchmark table's models).
    **{f"mpt-{n}": ModelSpec(f"mpt-{n}", layers=L, hidden=d, ffn=4 * d, heads=a, kv_heads=a, vocab=50368,
                             gated_mlp=False, tied_embeddings=True, position_embedding="learned", dropout=False)
       for n, L, d, a in (("125m", 12, 768, 12), ("350m", 24, 1024, 16), ("760m", 24, 1536, 12),
                          ("1b", 24, 2048, 16), ("3b", 32, 2560, 20), ("7b", 32, 4096, 32), ("13b", 40, 5120, 40),
                          ("30b", 48, 7168, 64), ("70b", 80, 8192, 64))},
    # The GPT models of Megatron-LM's weak-scaling study (Narayanan et al. 2021, "Efficient Large-Scale Language
    # Model Training on GPU Clusters Using Megatron-LM", arXiv 2104.04473, table 1): heads, hidden size and
    # layers per size; every one with vocab 51,200, sequence 2,048 (learned positions), GPT-2 style GELU MLP of
    # 4·hidden, tied embeddings, Megatron's default hidden and attention dropout.
    **{f"megatron-gpt-{n}": ModelSpec(f"megatron-gpt-{n}", layers=L, hidden=d, ffn=4 * d, heads=a, kv_heads=a,
                                      vocab=51200, gated_mlp=False, tied_embeddings=True,
                                      position_embedding="learned")
       for n, (a, d, L) in _MEGATRON_GPT_2021.items()},
    # GPT 5B / 20B as NeMo runs them (NVIDIA/NeMo nemo/collections/llm/gpt/model/base.py GPTConfig5B: 24 layers,
    # 4096 wide, ffn 16384, 32 heads; GPTConfig20B: 44 layers, 6144, ffn 24576, 48 heads; sequence 2048; GPTConfig's
    # GPT-3 style defaults: learned absolute positions, shared input/output embeddings, GELU MLP, dropout);
    # Paxml's GPT5B (paxml/contrib/gpu/scripts_gpu/configs.py: NUM_LAYERS 24, MODEL_DIMS 4096, HIDDEN_DIMS 16384,
    # NUM_HEADS 32, DIMS_PER_HEAD 128) has the same shape. GPT-2 BPE vocabulary (50,257), as gpt3-175b.
    "gpt3-5b": ModelSpec("gpt3-5b", layers=24, hidden=4096, ffn=16384, heads=32, kv_heads=32, vocab=50257,
                         gated_mlp=False, tied_embeddings=True, position_embedding="learned"),
    "gpt3-20b": ModelSpec("gpt3-20b", layers=44, hidden=6144, ffn=24576, heads=48, kv_heads=48, vocab=50257,
                          gated_mlp=False, tied_embeddings=True, position_embedding="learned"),
    # Nemotron-3 8B / 22B (NVIDIA/NeMo nemo/collections/llm/gpt/model/nemotron.py Nemotron3Config8B: 32 layers,
    # 4096, ffn 16384, 32 heads, no query groups (MHA); Nemotron3Config22B: 40 layers, 6144, ffn 24576, 48 heads;
    # NemotronConfig: squared-ReLU MLP, no biases, no dropout, untied embeddings, rotary on half of each head),
    # the Nemotron tokenizer's 256,000 entries as nemotron4-*.
    "nemotron3-8b": ModelSpec("nemotron3-8b", layers=32, hidden=4096, ffn=16384, heads=32, kv_heads=32,
                              vocab=256000, gated_mlp=False, dropout=False),
    "nemotron3-22b": ModelSpec("nemotron3-22b", layers=40, hidden=6144, ffn=24576, heads=48, kv_heads=48,
                               vocab=256000, gated_mlp=False, dropout=False),
    # Qwen3 MoE (Qwen/Qwen3-30B-A3B and Qwen/Qwen3-235B-A22B config.json; Qwen3 technical report, arXiv 2505.09388,
    # table 2): every layer MoE (decoder_sparse_step 1, no mlp_only_layers), 128 experts top-8, no shared expert,
    # GQA with 4 KV heads of 128, vocab 151,936, untied. 30B-A3B: 48 layers, 2048 wide, 32 heads, experts 768 wide;
    # 235B-A22B: 94 layers, 4096, 64 heads, experts 1536 wide (30.5 B / 3.3 B and 235 B / 22 B parameters, total /
    # active, as the model cards state), with an RMSNorm over each query and key head (q_norm, k_norm).
    "qwen3-30b-a3b": ModelSpec("qwen3-30b-a3b", layers=48, hidden=2048, ffn=6144, heads=32, kv_heads=4, head_dim=128,
                               vocab=151936, experts=128, top_k=8, moe_ffn=768, qk_norm=True),
    "qwen3-235b-a22b": ModelSpec("qwen3-235b-a22b", layers=94, hidden=4096, ffn=12288, heads=64, kv_heads=4,
                                 head_dim=128, vocab=151936, experts=128, top_k=8, moe_ffn=1536, qk_norm=True),
    # Qwen2.5 dense (Qwen/Qwen2.5-{7B,14B,32B,72B} config.json, model_type qwen2; Qwen2.5 technical report, arXiv
    # 2412.15115, table 1): SwiGLU, RMSNorm, RoPE, biases on Q, K and V, GQA with heads of 128, vocab 152,064 (the
    # padded embedding), untied embeddings at these sizes, no sliding window (use_sliding_window false), no
    # dropout. 7B: 28 layers, 3584 wide, ffn 18,944, 28 / 4 heads; 14B: 48, 5120, 13,824, 40 / 8; 32B: 64, 5120,
    # 27,648, 40 / 8; 72B: 80, 8192, 29,568, 64 / 8 (7.62 / 14.77 / 32.76 / 72.71 B parameters).
    **{f"qwen2.5-{n}": ModelSpec(f"qwen2.5-{n}", layers=L, hidden=d, ffn=f, heads=a, kv_heads=kv, vocab=152064,
                                 attention_bias=True, dropout=False)
       for n, L, d, f, a, kv in (("7b", 28, 3584, 18944, 28, 4), ("14b", 48, 5120, 13824, 40, 8),
                                 ("32b", 64, 5120, 27648, 40, 8), ("72b", 80, 8192, 29568, 64, 8))},
    # Kimi K2 (moonshotai/Kimi-K2-Instruct config.json, DeepSeek-V3's architecture): 61 layers, 7168 wide, MLA
    # with 64 heads (q_lora 1536, kv_lora 512, no-RoPE 128 + RoPE 64 query/key dims, values 128), 384 routed experts
    # 2048 wide top-8 and 1 shared, the first layer dense (ffn 18432), no group-limited routing (n_group 1), no
    # MTP module, vocab 163,840, untied (1.03 T / 32.9 B parameters; the model card: 1 T / 32 B).
    "kimi-k2": ModelSpec("kimi-k2", layers=61, hidden=7168, ffn=18432, heads=64, kv_heads=64, vocab=163840,
                         experts=384, top_k=8, moe_ffn=2048, shared_experts=1, first_dense_layers=1, head_dim=128,
                         q_lora_rank=1536, kv_lora_rank=512, qk_rope_dim=64, v_head_dim=128),
    # GPT-OSS (openai/gpt-oss-120b and -20b config.json; OpenAI's gpt-oss model card, arXiv 2508.10925): 36 / 24
    # layers, 2880 wide, 64 query heads and 8 KV heads of 64, biases on the attention projections, a learned sink
    # logit per head, sliding-window attention of 128 tokens in every other layer (layer_types: sliding first,
    # then full), 128 / 32 experts 2880 wide top-4 (SwiGLU with clamping), no shared expert, vocab 201,088,
    # untied (116.8 B / 20.9 B parameters; the experts', the output projection's and the router's biases, 40 M
    # in all, are not counted). Trained in BF16 here (the released MXFP4 expert weights are a post-training format).
    "gpt-oss-120b": ModelSpec("gpt-oss-120b", layers=36, hidden=2880, ffn=2880, heads=64, kv_heads=8, head_dim=64,
                              vocab=201088, experts=128, top_k=4, attention_bias=True, attention_sinks=True,
                              sliding_window=128, global_attention_every=2),
    "gpt-oss-20b": ModelSpec("gpt-oss-20b", layers=24, hidden=2880, ffn=2880, heads=64, kv_heads=8, head_dim=64,
                             vocab=201088, experts=32, top_k=4, attention_bias=True, attention_sinks=True,
                             sliding_window=128, global_attention_every=2),
    # Llama 4 Maverick (meta-llama/Llama-4-Maverick-17B-128E config.json, text_config; Meta's model card: 400 B
    # total, 17 B active): 48 layers, 5120 wide, 40 query / 8 KV heads of 128, every other layer MoE
    # (interleave_moe_layer_step 2: layers 1, 3, ...) with 128 routed experts top-1 and one shared expert, 8192
    # wide, the others a dense SwiGLU MLP 16384 wide (intermediate_size_mlp); chunked attention over 8192-token
    # chunks except every fourth layer (no_rope_layers: those attend globally, without RoPE); vocab 202,048,
    # untied. Not modelled: the QK L2-norm of its RoPE layers (one small elementwise pass).
    "llama4-maverick": ModelSpec("llama4-maverick", layers=48, hidden=5120, ffn=16384, heads=40, kv_heads=8,
                                 head_dim=128, vocab=202048, experts=128, top_k=1, moe_ffn=8192, shared_experts=1,
                                 moe_layer_every=2, attention_chunk=8192, global_attention_every=4),
    # Nemotron-H (hybrid Mamba-2 / attention; NVIDIA 2025, "Nemotron-H: A Family of Accurate and Efficient Hybrid
    # Mamba-Transformer Models", arXiv 2504.03624; the layer patterns and shapes of Megatron-Bridge's
    # NemotronHModelProvider8B / 47B / 56B, models/nemotronh/nemotron_h_provider.py at v0.3.0): each layer one
    # Mamba-2 mixer (M), self-attention (*, GQA 8, no position embedding) or squared-ReLU MLP (-); Mamba heads of
    # 64 with 8 B/C groups, conv 4, SSD chunks of 128 (Megatron-Core's MambaMixer defaults); vocab 131,072, untied,
    # no dropout.
    "nemotron-h-8b": ModelSpec("nemotron-h-8b", layers=52, hidden=4096, ffn=21504, heads=32, kv_heads=8,
                               vocab=131072, gated_mlp=False, dropout=False, position_embedding="none",
                               hybrid_pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
                               mamba_heads=128, mamba_state=128),
    "nemotron-h-47b": ModelSpec("nemotron-h-47b", layers=98, hidden=8192, ffn=30720, heads=64, kv_heads=8,
                                vocab=131072, gated_mlp=False, dropout=False, position_embedding="none",
                                hybrid_pattern="M-M-M-M-M-M-M-M-M*-M-M-M-M-M-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M"
                                               "-M-M-M---MM---M-M*-M-M-M-M-M-",
                                mamba_heads=256, mamba_state=256),
    "nemotron-h-56b": ModelSpec("nemotron-h-56b", layers=118, hidden=8192, ffn=32768, heads=64, kv_heads=8,
                                vocab=131072, gated_mlp=False, dropout=False, position_embedding="none",
                                hybrid_pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-"
                                               "M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
                                mamba_heads=256, mamba_state=256),
    # Nemotron 3 Nano 30B-A3B (Megatron-Bridge's Nemotron3NanoProvider, same file): 52 layers of Mamba-2 (64 heads
    # of 64, state 128), attention (32 heads, 2 KV heads of 128) and MoE (128 experts 1856 wide top-6, squared ReLU,
    # a shared expert of twice that width, counted as two of the routed width), hidden 2688.
    "nemotron-3-nano": ModelSpec("nemotron-3-nano", layers=52, hidden=2688, ffn=1856, heads=32, kv_heads=2,
                                 head_dim=128, vocab=131072, experts=128, top_k=6, moe_ffn=1856, shared_experts=2,
                                 gated_mlp=False, dropout=False, position_embedding="none",
                                 hybrid_pattern="MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
                                 mamba_heads=64, mamba_state=128),
    # Small models for tests and quick experiments.
    "tiny": ModelSpec("tiny", layers=4, hidden=256, ffn=1024, heads=8, kv_heads=8, vocab=1024, gated_mlp=False),
    "tiny-moe": ModelSpec("tiny-moe", layers=4, hidden=256, ffn=512, heads=8, kv_heads=4, vocab=1024,
                          experts=8, top_k=2),
}


def list_models() -> list[str]:
    return sorted(_PRESETS)


def get_model(name: str) -> ModelSpec:
    """A preset by name; unknown names raise UnknownPresetError listing the known ones."""
    try:
        return _PRESETS[name.lower()]
    except KeyError:
        raise UnknownPresetError("model", name, _PRESETS) from None


def custom_model(*, layers: int, hidden: int, heads: int, ffn: int | None = None, kv_heads: int | None = None,
                 vocab: int = 51200, experts: int = 0, top_k: int | None = None, name: str = "custom",
                 **extra) -> ModelSpec:
    """A model from its shape, GPT-style defaults: ffn = 4·hidden, kv_heads = heads, vocab 51,200,
    2-matrix GELU MLP (pass gated_mlp=True for SwiGLU), top_k 2 for MoE."""
    if top_k is None:
        top_k = min(2, experts) if experts else 1
    extra.setdefault("gated_mlp", False)
    return ModelSpec(name=name, layers=layers, hidden=hidden, ffn=ffn if ffn else 4 * hidden, heads=heads,
                     kv_heads=kv_heads if kv_heads else heads, vocab=vocab, experts=experts, top_k=top_k, **extra)


def model_from_params(params: float, name: str | None = None, dtype_bytes: int = 2) -> ModelSpec:
    """A model known only by its parameter count (enough for parameter/gradient/optimizer memory)."""
    return ModelSpec(name=name or f"{params:.3g}-params", layers=1, hidden=1, ffn=1, heads=1, kv_heads=1,
                     vocab=1, dtype_bytes=dtype_bytes, total_params=float(params))


_FIELD_TYPES = {"int": ((int,), "an integer"), "float": ((int, float), "a number"), "bool": ((bool,), "true or false"),
                "str": ((str,), "text")}


def check_model_fields(data: dict, where: str) -> None:
    """Raise ConfigError naming the first key of a user's model mapping (a model file, an experiment's inline
    ``model:``, a preset override) that is not a ModelSpec field or whose value has the wrong type (an int
    where a count is expected, not a list or a bool; None only where the field allows it)."""
    types = {f.name: str(f.type) for f in dataclasses.fields(ModelSpec)}
    unknown = sorted(str(k) for k in data if k not in types)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(types))}")
    for key, value in data.items():
        ann = types[key]
        if value is None and "None" in ann:
            continue
        base = ann.split("|")[0].strip()
        if base not in _FIELD_TYPES:
            continue
        ok, what = _FIELD_TYPES[base]
        if isinstance(value, bool) and base != "bool" or not isinstance(value, ok):
            raise ConfigError(f"{where}: {key} must be {what}{' or null' if 'None' in ann else ''}, got {brief(value)}")


#: fields that only a model with routed experts reads (a dense model given one ignores it)
MOE_ONLY_FIELDS = ("top_k", "moe_ffn", "shared_experts", "first_dense_layers", "capacity_factor", "router_groups",
                   "router_group_topk", "moe_layer_every")


#: fields that only a model with Mamba-2 layers reads (``hybrid_pattern`` with M layers)
MAMBA_ONLY_FIELDS = ("mamba_heads", "mamba_head_dim", "mamba_state", "mamba_groups", "mamba_conv", "mamba_chunk")


def check_moe_fields(data: dict, model: "ModelSpec", where: str) -> "ModelSpec":
    """``model`` unless the user's mapping ``data`` sets an MoE-only field to other than its default on a model
    without routed experts, or a Mamba-2 field on a model without Mamba layers: then a ConfigError naming it
    (it would be silently ignored)."""
    defaults = {f.name: f.default for f in dataclasses.fields(ModelSpec)}

    def given(fields):
        return ", ".join(f"{k} (--{k.replace('_', '-')})" for k in fields if k in data and data[k] != defaults[k])
    if not model.experts and given(MOE_ONLY_FIELDS):
        raise ConfigError(f"{where}: {given(MOE_ONLY_FIELDS)} applies to MoE models, and {model.name} is dense "
                          f"(experts 0): give experts (--experts N) or drop it")
    if "M" not in model.hybrid_pattern and given(MAMBA_ONLY_FIELDS):
        raise ConfigError(f"{where}: {given(MAMBA_ONLY_FIELDS)} applies to Mamba-2 layers, and {model.name} has "
                          f"none: give a --hybrid-pattern with M layers or drop it")
    return model


def load_model_file(path: str | Path) -> ModelSpec:
    """A model from a YAML file whose keys are ModelSpec fields (``preset: NAME`` may name a base)."""
    from simulator.yamlio import load_yaml

    p = Path(path)
    data = load_yaml(p, "model file")
    if not isinstance(data, dict):
        raise ConfigError(f"model file {p}: expected a mapping of ModelSpec fields, got {type(data).__name__}")
    data = dict(data)
    base = data.pop("preset", None)
    check_model_fields(data, f"model file {p}")
    if isinstance(data.get("hybrid_pattern"), str):
        data.setdefault("layers", len(data["hybrid_pattern"]))        # (a hybrid model: one layer per character)
    if base is not None:
        return check_moe_fields(data, dataclasses.replace(get_model(str(base)), **data), f"model file {p}")
    missing = [f for f in ("layers", "hidden", "heads") if f not in data]
    if missing:
        raise ConfigError(f"model file {p}: missing {', '.join(missing)} (or give `preset: NAME`)")
    data.setdefault("name", p.stem)
    return check_moe_fields(data, custom_model(**data), f"model file {p}")


# ---------------------------------------------------------------------------------------------- Hugging Face
# config.json keys of the architectures we read (transformers' LlamaConfig, MistralConfig, MixtralConfig,
# Qwen2Config, Qwen2MoeConfig, Qwen3Config, Qwen3MoeConfig, DeepseekV2Config, DeepseekV3Config, GptOssConfig). All
# of them use a gated (SwiGLU) MLP, and all default tie_word_embeddings to false and num_key_value_heads to the heads.
HF_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2",
                  "deepseek_v3", "gpt_oss", "llama4", "llama4_text", "nemotron_h")


def _global_attention_every(layer_types, layers: int, where: str) -> int:
    """``global_attention_every`` of a config's ``layer_types`` list ("sliding_attention" / "full_attention" per
    layer): 0 when every layer slides, n when exactly layers n-1, 2n-1, ... attend to the whole sequence."""
    if not isinstance(layer_types, list) or len(layer_types) != layers or \
            not set(layer_types) <= {"sliding_attention", "full_attention"}:
        raise ConfigError(f"{where}: layer_types must list 'sliding_attention' or 'full_attention' for each of the "
                          f"{layers} layers")
    full = [i for i, t in enumerate(layer_types) if t == "full_attention"]
    if not full:
        return 0
    n = full[0] + 1
    if full != [i for i in range(layers) if (i + 1) % n == 0]:
        raise ConfigError(f"{where}: layer_types whose full-attention layers are not every n-th layer (layers n-1, "
                          f"2n-1, ...) are not modelled")
    return n


def _nemotron_h_from_hf(cfg: dict, name: str | None, where: str) -> ModelSpec:
    """Nemotron-H / Nemotron 3 (transformers' NemotronHConfig): the layer pattern ``hybrid_override_pattern``,
    the Mamba-2 mixer's ``mamba_num_heads``, ``mamba_head_dim``, ``ssm_state_size``, ``n_groups``,
    ``conv_kernel``, ``chunk_size``, a squared-ReLU MLP (``mlp_hidden_act`` relu2), MoE layers (E) from
    ``n_routed_experts`` (a shared expert of ``moe_shared_expert_intermediate_size`` counts as that many
    experts of the routed width), attention without position embedding."""
    from simulator.inputs import integer

    def key(*names, default=None, required=False):
        for k in names:
            if cfg.get(k) is not None:
                return cfg[k]
        if required:
            raise ConfigError(f"{where}: missing {names[0]!r} (a nemotron_h config.json has it)")
        return default

    def count(*names, default=None, lo=1):
        return integer(key(*names, default=default, required=default is None), f"{where}: {names[0]}", lo=lo)

    pattern = key("hybrid_override_pattern", required=True)
    if not isinstance(pattern, str):
        raise ConfigError(f"{where}: hybrid_override_pattern must be a string of M, *, - and E")
    act = key("mlp_hidden_act", default="relu2")
    if act not in ("relu2", "squared_relu"):
        raise ConfigError(f"{where}: mlp_hidden_act {act!r} is not modelled (Nemotron-H's relu2 is)")
    kw = dict(name=name or "nemotron_h", layers=count("num_hidden_layers"), hidden=count("hidden_size"),
              ffn=count("intermediate_size"), heads=count("num_attention_heads"),
              kv_heads=count("num_key_value_heads", "num_attention_heads"),
              vocab=count("vocab_size"), gated_mlp=False, dropout=False, position_embedding="none",
              tied_embeddings=bool(key("tie_word_embeddings", default=False)), hybrid_pattern=pattern,
              mamba_heads=count("mamba_num_heads"), mamba_head_dim=count("mamba_head_dim", default=64),
              mamba_state=count("ssm_state_size", default=128), mamba_groups=count("n_groups", "mamba_n_groups", default=8),
              mamba_conv=count("conv_kernel", "mamba_d_conv", default=4),
              mamba_chunk=count("chunk_size", "mamba_chunk_size", default=128))
    head_dim = key("head_dim", "attention_head_dim")
    if head_dim is not None:
        kw["head_dim"] = integer(head_dim, f"{where}: head_dim", lo=1)
    if "E" in pattern:
        moe = count("moe_intermediate_size")
        shared = count("moe_shared_expert_intermediate_size", default=0, lo=0)
        if shared % moe:
            raise ConfigError(f"{where}: moe_shared_expert_intermediate_size {shared} is not a multiple of "
                              f"moe_intermediate_size {moe}")
        kw.update(experts=count("n_routed_experts"), top_k=count("num_experts_per_tok"), moe_ffn=moe,
                  shared_experts=shared // moe)
    try:
        return ModelSpec(**kw)
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from None


def model_from_hf_config(source, name: str | None = None) -> ModelSpec:
    """A ModelSpec from a Hugging Face ``config.json`` (path or parsed dict): dense Llama / Mistral / Qwen,
    MoE Mixtral / Qwen-MoE (a wider shared expert counts as several of the routed width; MoE in every
    decoder_sparse_step-th layer), DeepSeek V2/V3 (MLA, shared experts, dense first layers), GPT-OSS (sliding-window
    layers, attention sinks), Llama 4 (chunked attention, MoE in every interleave_moe_layer_step-th layer).
    Unknown architectures and shapes we cannot express are errors."""
    if isinstance(source, dict):
        cfg, where = source, "config.json"
    else:
        from simulator.inputs import load_json

        p = Path(source)
        where = str(p)
        cfg = load_json(p, "model config")       # bounded read (not /dev/zero), deep nesting, huge numbers
        if not isinstance(cfg, dict):
            raise ConfigError(f"model config {p}: expected a JSON object")
        name = name or (p.parent.name if p.name == "config.json" and p.parent.name else p.stem)
    mtype = cfg.get("model_type")
    if mtype == "llama4":           # Llama4ForConditionalGeneration: the language model's config is text_config
        cfg = cfg.get("text_config")
        if not isinstance(cfg, dict):
            raise ConfigError(f"{where}: a llama4 config.json needs its text_config")
        mtype = cfg.get("model_type", "llama4_text")
    if mtype not in HF_MODEL_TYPES:
        raise ConfigError(f"{where}: model_type {mtype!r} is not supported; known: {', '.join(HF_MODEL_TYPES)}")
    if mtype == "nemotron_h":
        return _nemotron_h_from_hf(cfg, name, where)

    def key(k, default=None, required=False):
        v = cfg.get(k, default)
        if required and v is None:
            raise ConfigError(f"{where}: missing {k!r} (a {mtype} config.json has it)")
        return v

    def flag(k):
        v = key(k, False)
        if v is not None and not isinstance(v, bool):
            raise ConfigError(f"{where}: {k} must be true or false, got {v!r:.40}")
        return bool(v)

    def count(k, default=None, required=False, lo=0):
        from simulator.inputs import integer
        return integer(key(k, default, required), f"{where}: {k}", lo=lo)

    heads = key("num_attention_heads", required=True)
    kw = dict(name=name or mtype, layers=key("num_hidden_layers", required=True), hidden=key("hidden_size", required=True),
              ffn=key("intermediate_size", required=True), heads=heads,
              kv_heads=heads if key("num_key_value_heads") is None else count("num_key_value_heads", lo=1),
              vocab=key("vocab_size", required=True), gated_mlp=True,
              tied_embeddings=flag("tie_word_embeddings"),
              attention_bias=mtype in ("qwen2", "qwen2_moe") or flag("attention_bias"),
              qk_norm=mtype in ("qwen3", "qwen3_moe"))      # Qwen3's attention: q_norm and k_norm on every layer
    if key("head_dim") is not None and mtype not in ("deepseek_v2", "deepseek_v3"):
        kw["head_dim"] = key("head_dim")
    # sliding-window attention: Mistral's sliding_window (null: none) on every layer; Qwen's only where
    # use_sliding_window is set (then on the layers from max_window_layers on); GPT-OSS's layer_types
    window = key("sliding_window")
    n_layers = count("num_hidden_layers", required=True, lo=1)
    if mtype.startswith("qwen") and not flag("use_sliding_window"):
        window = None
    if window is not None and mtype != "gpt_oss" and key("layer_types") is None:
        window = count("sliding_window", lo=1)
        if mtype.startswith("qwen") and 0 < count("max_window_layers", 0) < n_layers:
            raise ConfigError(f"{where}: sliding-window attention on the layers from max_window_layers on only is not "
                              f"modelled (every layer, or none)")
        kw["sliding_window"] = window
    elif window is not None:
        kw.update(sliding_window=count("sliding_window", lo=1),
                  global_attention_every=_global_attention_every(key("layer_types"), n_layers, where))
    if mtype == "llama4_text":
        # every fourth layer (no_rope_layers 0: NoPE) attends globally, the others within their chunk
        nope = key("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(n_layers)]
        if not isinstance(nope, list) or len(nope) != n_layers:
            raise ConfigError(f"{where}: no_rope_layers must give 0 or 1 for each of the {n_layers} layers")
        kw.update(ffn=key("intermediate_size_mlp", required=True),
                  experts=count("num_local_experts", required=True, lo=1),
                  top_k=key("num_experts_per_tok", 1), moe_ffn=key("intermediate_size", required=True),
                  shared_experts=1, moe_layer_every=count("interleave_moe_layer_step", 1, lo=1))
        if key("moe_layers") is not None and key("moe_layers") != list(range(kw["moe_layer_every"] - 1, n_layers,
                                                                             kw["moe_layer_every"])):
            raise ConfigError(f"{where}: moe_layers other than every interleave_moe_layer_step-th layer are not "
                              f"modelled")
        if key("attention_chunk_size") is not None:
            kw.update(attention_chunk=count("attention_chunk_size", lo=1),
                      global_attention_every=_global_attention_every(
                          ["full_attention" if not r else "sliding_attention" for r in nope], n_layers, where))
    if mtype == "gpt_oss":
        kw.update(experts=count("num_local_experts", required=True, lo=1),
                  top_k=key("num_experts_per_tok") or key("experts_per_token", required=True), attention_sinks=True)
    if mtype == "mixtral":
        kw.update(experts=count("num_local_experts", required=True, lo=1), top_k=key("num_experts_per_tok", 2))
    elif mtype in ("qwen2_moe", "qwen3_moe"):
        if key("mlp_only_layers"):
            raise ConfigError(f"{where}: dense layers listed by mlp_only_layers are not modelled; only leading dense "
                              f"layers and every decoder_sparse_step-th layer MoE are")
        kw["moe_layer_every"] = count("decoder_sparse_step", 1, lo=1)
        moe = count("moe_intermediate_size", required=True, lo=1)
        shared = count("shared_expert_intermediate_size", 0) if key("shared_expert_intermediate_size") is not None else 0
        if shared % moe:
            raise ConfigError(f"{where}: shared_expert_intermediate_size {shared} is not a multiple of "
                              f"moe_intermediate_size {moe}")
        # Qwen-MoE's one wide shared expert = shared / moe experts of the routed width (same parameters and
        # FLOPs; its 1-wide sigmoid gate, h parameters per layer, is left out)
        kw.update(experts=count("num_experts", required=True, lo=1), top_k=key("num_experts_per_tok", required=True),
                  moe_ffn=moe, shared_experts=shared // moe)
    elif mtype in ("deepseek_v2", "deepseek_v3"):
        if key("moe_layer_freq", 1) != 1:
            raise ConfigError(f"{where}: moe_layer_freq != 1 is not modelled")
        n_group, topk_group = key("n_group") or 1, key("topk_group") or 1
        grouped = topk_group < n_group          # group-limited routing (DeepSeek-V3: 4 of 8 groups)
        kw.update(experts=count("n_routed_experts", required=True, lo=1),
                  top_k=key("num_experts_per_tok", required=True),
                  moe_ffn=key("moe_intermediate_size", required=True), shared_experts=key("n_shared_experts", 0) or 0,
                  first_dense_layers=count("first_k_dense_replace", lo=0) if key("first_k_dense_replace") is not None
                  else 0,
                  head_dim=key("qk_nope_head_dim", required=True),
                  q_lora_rank=key("q_lora_rank") or 0, kv_lora_rank=key("kv_lora_rank", required=True),
                  qk_rope_dim=key("qk_rope_head_dim", required=True), v_head_dim=key("v_head_dim", required=True),
                  mtp_layers=count("num_nextn_predict_layers", 0) if key("num_nextn_predict_layers") is not None else 0,
                  router_groups=n_group if grouped else 0, router_group_topk=topk_group if grouped else 0)
        if kw["first_dense_layers"] >= n_layers:
            raise ConfigError(f"{where}: first_k_dense_replace {kw['first_dense_layers']} leaves none of the "
                              f"{n_layers} layers an MoE layer (at most {n_layers - 1})")
    try:
        return ModelSpec(**kw)
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from None
