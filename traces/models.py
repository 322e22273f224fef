"""The small Llama-style transformer the collector trains (imports torch: collector only).

Pre-norm decoder blocks: RMSNorm -> causal multi-head attention with rotary embeddings -> residual,
RMSNorm -> SwiGLU MLP (or a top-k mixture of experts) -> residual; token embedding in front, final
RMSNorm and an untied LM head behind. No biases (as Llama).

Parallel forms, all with explicit torch.distributed collectives so every one shows up in a trace:

- tensor parallel (Megatron-LM, Shoeybi et al. 2019): q/k/v and the MLP gate/up projections are
  column-parallel, the attention output and MLP down projections row-parallel; ``_CopyToTP`` (identity
  forward, all_reduce backward) enters each parallel region and ``_ReduceFromTP`` (all_reduce forward,
  identity backward) leaves it: two all_reduces of the (batch, seq, hidden) activation per block in the
  forward, two in the backward. Embedding, norms and the LM head are replicated. With ``tp_group=None``
  a block holds one rank's shard and runs no collective (the layer benchmark times a shard's compute).
- pipeline parallel: a ``Transformer`` may hold only blocks [first, last) and the embedding / head only on
  the first / last stage.
- expert parallel (GShard/Switch-style, capacity-based): each rank holds ``experts / ep`` experts; tokens
  are routed top-k, packed into fixed-capacity slots per expert and exchanged with ``all_to_all_single``
  (even splits, so sizes are deterministic), processed, and returned by a second all_to_all.

Units: parameter counts are elements; FLOPs are not computed here (the simulator's ``schedules`` does).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the collected model.

    layers   decoder blocks
    hidden   model width
    heads    attention heads (hidden % heads == 0)
    seq      tokens per sample
    vocab    vocabulary size
    ffn      SwiGLU inner width (0: Llama's 8/3 * hidden rounded up to a multiple of 16)
    experts  0: dense MLP; else experts per MoE layer (every block is MoE)
    top_k    experts per token
    capacity_factor  expert capacity = ceil(tokens * top_k / experts * capacity_factor)
    """

    layers: int = 4
    hidden: int = 128
    heads: int = 4
    seq: int = 64
    vocab: int = 512
    ffn: int = 0
    experts: int = 0
    top_k: int = 1
    capacity_factor: float = 1.0

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "seq", "vocab"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads or (self.hidden // self.heads) % 2:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads}) into an even "
                             f"head size (rotary embeddings rotate pairs)")
        if self.experts and not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top_k ({self.top_k}) must be in 1..experts ({self.experts})")
        if self.ffn == 0:
            object.__setattr__(self, "ffn", 16 * math.ceil(8 * self.hidden / 3 / 16))

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def params(self) -> int:
        """Total parameter count (all experts included)."""
        h, f = self.hidden, self.ffn
        mlp = 3 * h * f
        per_layer = 4 * h * h + 2 * h + (self.experts * mlp + h * self.experts if self.experts else mlp)
        return self.layers * per_layer + 2 * self.vocab * h + h

    def to_dict(self) -> dict:
        d = asdict(self)
        d["params"] = self.params()
        return d


# ---------------------------------------------------------------------------------------------- TP autograd
class _CopyToTP(torch.autograd.Function):
    """Identity forward, all_reduce of the input gradient backward (Megatron's f)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """all_reduce forward, identity backward (Megatron's g)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _AllToAll(torch.autograd.Function):
    """Even-split all_to_all_single forward; the inverse exchange of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad.contiguous(), group=ctx.group)
        return out, None


# ---------------------------------------------------------------------------------------------- layers
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary_tables(seq: int, head_dim: int, base: float = 10000.0):
    """cos, sin tables of shape (seq, head_dim/2) for rotary embeddings (Su et al. 2021)."""
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    ang = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    return ang.cos(), ang.sin()


def apply_rotary(x, cos, sin):
    """x: (batch, heads, seq, head_dim)."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: int = 1, tp_group=None):
        super().__init__()
        if cfg.heads % tp:
            raise ValueError(f"heads ({cfg.heads}) must be divisible by tp ({tp})")
        self.tp, self.tp_group = tp, tp_group
        self.local_heads = cfg.heads // tp
        self.head_dim = cfg.head_dim
        width = self.local_heads * self.head_dim
        self.wq = nn.Linear(cfg.hidden, width, bias=False)
        self.wk = nn.Linear(cfg.hidden, width, bias=False)
        self.wv = nn.Linear(cfg.hidden, width, bias=False)
        self.wo = nn.Linear(width, cfg.hidden, bias=False)

    def forward(self, x, cos, sin):
        if self.tp > 1 and self.tp_group is not None:
            x = _CopyToTP.apply(x, self.tp_group)
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, self.local_heads, self.head_dim).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = self.wo(y.transpose(1, 2).reshape(b, s, -1))
        if self.tp > 1 and self.tp_group is not None:
            y = _ReduceFromTP.apply(y, self.tp_group)
        return y


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); column/row parallel over ``tp``."""

    def __init__(self, hidden: int, ffn: int, tp: int = 1, tp_group=None):
        super().__init__()
        if ffn % tp:
            raise ValueError(f"ffn ({ffn}) must be divisible by tp ({tp})")
        self.tp, self.tp_group = tp, tp_group
        self.gate = nn.Linear(hidden, ffn // tp, bias=False)
        self.up = nn.Linear(hidden, ffn // tp, bias=False)
        self.down = nn.Linear(ffn // tp, hidden, bias=False)

    def forward(self, x):
        if self.tp > 1 and self.tp_group is not None:
            x = _CopyToTP.apply(x, self.tp_group)
        y = self.down(F.silu(self.gate(x)) * self.up(x))
        if self.tp > 1 and self.tp_group is not None:
            y = _ReduceFromTP.apply(y, self.tp_group)
        return y


class MoE(nn.Module):
    """Top-k mixture of experts with fixed capacity, experts sharded over ``ep`` ranks."""

    def __init__(self, cfg: ModelConfig, ep: int = 1, ep_group=None):
        super().__init__()
        if cfg.experts % ep:
            raise ValueError(f"experts ({cfg.experts}) must be divisible by ep ({ep})")
        self.cfg, self.ep, self.ep_group = cfg, ep, ep_group
        self.local = cfg.experts // ep
        self.router = nn.Linear(cfg.hidden, cfg.experts, bias=False)
        self.experts = nn.ModuleList(MLP(cfg.hidden, cfg.ffn) for _ in range(self.local))

    def capacity(self, tokens: int) -> int:
        c = self.cfg
        return max(1, math.ceil(tokens * c.top_k / c.experts * c.capacity_factor))

    def forward(self, x):
        b, s, h = x.shape
        tokens = x.reshape(-1, h)
        n, e = tokens.shape[0], self.cfg.experts
        cap = self.capacity(n)
        probs = torch.softmax(self.router(tokens), dim=-1)
        weight, expert = probs.topk(self.cfg.top_k, dim=-1)                 # (n, k)
        flat_expert = expert.reshape(-1)                                       # (n*k,)
        onehot = F.one_hot(flat_expert, e)
        slot = ((onehot.cumsum(0) - 1) * onehot).sum(-1)                       # position inside its expert
        keep = slot < cap                                                      # tokens over capacity drop
        dest = (flat_expert * cap + slot)[keep]
        src_token = torch.arange(n, device=x.device).repeat_interleave(self.cfg.top_k)[keep]
        buf = tokens.new_zeros(e * cap, h).index_copy(0, dest, tokens[src_token])
        if self.ep > 1:   # (ep, local experts, cap, h): chunk r goes to rank r
            buf = _AllToAll.apply(buf, self.ep_group)
        # received: (ep sources, local experts, cap, h) -> per local expert
        buf = buf.view(self.ep, self.local, cap, h)
        out = torch.stack([self.experts[i](buf[:, i].reshape(-1, h)).view(self.ep, cap, h)
                           for i in range(self.local)], dim=1)
        out = out.reshape(e * cap, h)
        if self.ep > 1:
            out = _AllToAll.apply(out, self.ep_group)
        gathered = out[dest] * weight.reshape(-1)[keep].unsqueeze(-1)
        y = tokens.new_zeros(n, h).index_add(0, src_token, gathered)
        return y.view(b, s, h)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: int = 1, tp_group=None, ep: int = 1, ep_group=None):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden)
        self.attn = Attention(cfg, tp, tp_group)
        self.mlp_norm = RMSNorm(cfg.hidden)
        self.mlp = MoE(cfg, ep, ep_group) if cfg.experts else MLP(cfg.hidden, cfg.ffn, tp, tp_group)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """Blocks ``[first, last)`` of the model; embedding if ``first == 0``, norm + head if ``last == layers``.

    ``forward(x)`` takes token ids on the first stage, else the (batch, seq, hidden) activation, and
    returns logits on the last stage, else the activation.
    """

    def __init__(self, cfg: ModelConfig, first: int = 0, last: int | None = None, tp: int = 1, tp_group=None,
                 ep: int = 1, ep_group=None):
        super().__init__()
        last = cfg.layers if last is None else last
        self.cfg, self.first, self.last = cfg, first, last
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden) if first == 0 else None
        self.layers = nn.ModuleList(Block(cfg, tp, tp_group, ep, ep_group) for _ in range(first, last))
        self.norm = RMSNorm(cfg.hidden) if last == cfg.layers else None
        self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False) if last == cfg.layers else None
        self._rotary: dict = {}   # (device, dtype, seq) -> (cos, sin); constants, so not buffers (no DDP sync)

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)
        key = (x.device, x.dtype, x.shape[1])
        if key not in self._rotary:
            self._rotary[key] = tuple(t.to(x.device, x.dtype) for t in rotary_tables(x.shape[1], self.cfg.head_dim))
        cos, sin = self._rotary[key]
        for layer in self.layers:
            x = layer(x, cos, sin)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x


def split_layers(layers: int, stages: int) -> list[tuple[int, int]]:
    """[first, last) blocks of each pipeline stage; the remainder goes to the earliest stages."""
    if stages > layers:
        raise ValueError(f"pp ({stages}) cannot exceed layers ({layers})")
    base, extra = divmod(layers, stages)
    bounds, start = [], 0
    for s in range(stages):
        n = base + (1 if s < extra else 0)
        bounds.append((start, start + n))
        start += n
    return bounds


def load_shard(part: Transformer, full: Transformer, tp_rank: int = 0, ep_rank: int = 0) -> Transformer:
    """Copy into ``part`` (a pipeline stage and/or tensor / expert shard) its slice of ``full``'s weights, so
    that every parallel form computes exactly what the unsharded model does.

    Blocks map by offset (``part.layers.i`` is ``full.layers.(first + i)``), local experts by EP rank
    (``experts.i`` is ``experts.(ep_rank * local + i)``), and a tensor whose shape differs from the full one
    is its ``tp_rank``-th chunk along the one dimension that differs (rows of column-parallel weights,
    columns of row-parallel ones)."""
    src = full.state_dict()
    out = {}
    for key, t in part.state_dict().items():
        parts = key.split(".")
        if parts[0] == "layers":
            parts[1] = str(int(parts[1]) + part.first)
            if len(parts) > 4 and parts[3] == "experts":
                parts[4] = str(ep_rank * part.layers[0].mlp.local + int(parts[4]))
        w = src[".".join(parts)]
        if w.shape != t.shape:
            (dim,) = [d for d in range(w.dim()) if w.shape[d] != t.shape[d]]
            w = w.narrow(dim, tp_rank * t.shape[dim], t.shape[dim])
        out[key] = w
    part.load_state_dict(out)
    return part
