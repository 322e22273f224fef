"""Memory per rank: parameters, gradients and optimizer state by ZeRO stage, activations by schedule.

Model states (Rajbhandari et al. 2020, "ZeRO", sec. 3 and 5): with Ψ parameters per model-parallel rank,
bf16 weights (2Ψ), bf16 gradients (2Ψ) and K = 12 bytes of Adam state per parameter; ZeRO-1 shards the
optimizer state over the data-parallel group, ZeRO-2 also the gradients, ZeRO-3 / FSDP also the weights.
Dense weights are replicated dp·cp times, expert weights dp·cp/ep times.

Activations per layer and micro-batch (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", sec. 4), in bytes with 2-byte activations and 1-byte dropout masks, s = seq/cp:
    none:   s·b·h·(34 + 5·a·s/h)          no tensor parallelism
    TP:     s·b·h·(10 + 24/t + 5·a·s/(h·t))
    TP+SP:  s·b·h·(34/t + 5·a·s/(h·t))
    selective recompute drops the 5·a·s²·b attention-core term; full recompute keeps only each layer's
    input, 2·s·b·h (/t with SP), and rebuilds one layer's activations during its backward.
The 34 is 11 (attention) + 19 (MLP) + 4 (layer norms); we keep the published split and scale the parts that
depend on the shape: K/V by kv_heads/heads (GQA), the MLP's 16·s·b·h by ffn/(4h) (x1.5 for SwiGLU, which
stores gate, up and their product) and, in MoE layers, by top_k expert widths plus the permuted tokens.

In-flight micro-batches per stage come from walking the schedule's order (``schedules.pipeline``): GPipe
holds m, 1F1B p - s on stage s, interleaved p + (p-1)/v stage-equivalents on stage 0, ZB-H1 as 1F1B.
The embedding output and the LM-head logits are not counted. Units: bytes.
"""
from __future__ import annotations

from schedules.models import ModelSpec
from schedules.plan import ParallelPlan

CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "buffers")


# ---------------------------------------------------------------------------------------------- layout
def chunk_layers(model: ModelSpec, plan: ParallelPlan) -> list[list[int]]:
    """Layers of each model piece (virtual stage), in piece order (``ParallelPlan.piece_layers``)."""
    return plan.piece_layers(model)


def stage_chunks(model: ModelSpec, plan: ParallelPlan, stage: int) -> list[list[int]]:
    """Layers of each chunk held by pipeline stage ``stage`` (chunk c holds piece ``plan.piece(stage, c)``)."""
    vs = chunk_layers(model, plan)
    return [vs[plan.piece(stage, c)] for c in range(plan.chunks)]


def holds_embedding(plan: ParallelPlan, stage: int) -> bool:
    """A chunk of the stage holds the first model piece."""
    return any(plan.piece(stage, c) == 0 for c in range(plan.chunks))


def holds_head(model: ModelSpec, plan: ParallelPlan, stage: int) -> bool:
    """A chunk of the stage holds the last model piece, with the LM head (a separate copy of tied embeddings
    under PP)."""
    last = any(plan.piece(stage, c) == plan.pieces - 1 for c in range(plan.chunks))
    return last and not (model.tied_embeddings and plan.pp == 1)


def layer_param_split(model: ModelSpec, plan: ParallelPlan, layer: int) -> tuple[float, float]:
    """(dense, expert) parameters of one layer held by one rank (TP shards all; EP shards the experts)."""
    expert = model.layer_expert_params(layer)
    dense = model.layer_params(layer) - expert
    return dense / plan.tp, expert / (plan.tp * plan.ep)


def rank_params(model: ModelSpec, plan: ParallelPlan, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters one rank of pipeline stage ``stage`` holds before ZeRO sharding."""
    if model.params_only:
        return model.param_count() / plan.tp, 0.0
    dense = expert = 0.0
    for layers in stage_chunks(model, plan, stage):
        for layer in layers:
            d, e = layer_param_split(model, plan, layer)
            dense += d
            expert += e
    if holds_embedding(plan, stage):
        dense += model.embedding_params() / plan.tp
    if holds_head(model, plan, stage):
        dense += model.head_params() / plan.tp
    if any(plan.piece(stage, c) == plan.pieces - 1 for c in range(plan.chunks)):
        dense += model.hidden          # final norm
    return dense, expert


def shard_degrees(plan: ParallelPlan) -> tuple[int, int]:
    """(dense, expert) data-parallel replication: the ZeRO sharding degrees."""
    return plan.dp * plan.cp, plan.dp * plan.cp // plan.ep


def model_state_bytes(model: ModelSpec, plan: ParallelPlan, stage: int) -> dict[str, float]:
    """Resident parameters, gradients and optimizer state (bytes) of one rank of ``stage``."""
    dense, expert = rank_params(model, plan, stage)
    dd, de = shard_degrees(plan)
    z = plan.zero_stage
    sharded = dense / dd + expert / de
    full = dense + expert
    return {
        "parameters": model.dtype_bytes * (sharded if z >= 3 else full),
        "gradients": plan.grad_bytes_per_param * (sharded if z >= 2 else full),
        "optimizer": plan.optimizer_bytes_per_param * (sharded if z >= 1 else full),
    }


# ---------------------------------------------------------------------------------------------- activations
def _layer_terms(model: ModelSpec, plan: ParallelPlan, layer: int) -> tuple[float, float, float, float]:
    """(replicated, tp-split, attention-core, weight-input) activation bytes of one layer, micro-batch,
    before dividing by t. ``weight-input`` is the part the weight-gradient pass (W) needs."""
    s = plan.seq / plan.cp
    b, h, a = plan.micro_batch, model.hidden, model.heads
    sbh = s * b * h
    gfac = 1.5 if model.gated_mlp else 1.0
    kv = model.kv_heads / model.heads
    # attention: QKV input 2, dropout mask 1 (replicated); Q 2, K and V 2·kv each, projection input 2 (split)
    attn_split = (2 + 4 * kv + 2) * sbh
    if model.is_moe_layer(layer):
        width = (model.top_k * model.expert_ffn * _load(model) + model.shared_experts * model.expert_ffn)
        mlp_split = 4.0 * s * b * width * gfac + 2.0 * model.top_k * sbh
        w_in = 6.0 * sbh + 2.0 * s * b * width * gfac
    else:
        mlp_split = 4.0 * s * b * model.ffn * gfac
        w_in = 6.0 * sbh + 2.0 * s * b * model.ffn * gfac
    replicated = 10.0 * sbh
    core = 5.0 * a * s * s * b
    return replicated, attn_split + mlp_split, core, w_in


def _load(model: ModelSpec) -> float:
    return 1.0 if model.capacity_factor is None else min(1.0, model.capacity_factor)


def layer_activation_bytes(model: ModelSpec, plan: ParallelPlan, layer: int, recompute: str | None = None
                           ) -> float:
    """Activation bytes one rank keeps per layer and micro-batch until its backward."""
    if model.params_only:
        return 0.0
    recompute = plan.recompute if recompute is None else recompute
    t = plan.tp
    rep, split, core, _ = _layer_terms(model, plan, layer)
    if recompute == "full":
        s = plan.seq / plan.cp
        return 2.0 * s * plan.micro_batch * model.hidden / (t if plan.sp else 1)
    core = 0.0 if recompute == "selective" else core
    if plan.sp:
        return (rep + split + core) / t
    return rep + (split + core) / t


def weight_grad_fraction(model: ModelSpec, plan: ParallelPlan, layer: int) -> float:
    """Fraction of a layer's stored activations the W pass needs (freed at W, the rest at B)."""
    if plan.recompute == "full" or model.params_only:
        return 0.0
    rep, split, core, w_in = _layer_terms(model, plan, layer)
    total = rep + split + (0.0 if plan.recompute == "selective" else core)
    return min(1.0, w_in / total)


def weight_pass_share(model: ModelSpec, plan: ParallelPlan) -> float | None:
    """Share of a micro-batch's activations that W still needs after B, over the whole model (weighted by
    bytes): the memory accounting under which zero-bubble schedules with a memory limit are built (the
    zero-bubble runtime frees at B all but the weight-gradient inputs). None when B and W are not split."""
    if not plan.splits_backward or model.params_only:
        return None
    act = [layer_activation_bytes(model, plan, l) for l in range(model.layers)]
    w = sum(weight_grad_fraction(model, plan, l) * a for l, a in enumerate(act))
    return round(w / sum(act), 4) if sum(act) else 1.0


def recompute_transient_bytes(model: ModelSpec, plan: ParallelPlan, layer: int) -> float:
    """Activations rebuilt while one layer's backward runs (full recompute only)."""
    if plan.recompute != "full":
        return 0.0
    return layer_activation_bytes(model, plan, layer, recompute="none")


def activation_peak(model: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Peak activation bytes on ``stage`` walking its schedule (alloc at F, free at B / W)."""
    if model.params_only:
        return 0.0
    chunks = stage_chunks(model, plan, stage)
    held = [sum(layer_activation_bytes(model, plan, l) for l in ls) for ls in chunks]
    wfrac = [sum(weight_grad_fraction(model, plan, l) * layer_activation_bytes(model, plan, l) for l in ls)
             for ls in chunks]
    transient = [max((recompute_transient_bytes(model, plan, l) for l in ls), default=0.0) for ls in chunks]
    order = plan.stage_order(stage, model)
    cur = peak = 0.0
    for a in order:
        c = a.chunk
        if a.phase == "F":
            cur += held[c]
            peak = max(peak, cur)
        elif a.phase == "B":
            peak = max(peak, cur + transient[c])
            cur -= held[c]
        elif a.phase == "Bi":
            peak = max(peak, cur + transient[c])
            cur -= held[c] - wfrac[c]
        else:
            cur -= wfrac[c]
    return peak


def in_flight_microbatches(plan: ParallelPlan, stage: int) -> float:
    """Peak micro-batches of activations held by ``stage`` (stage-equivalents under interleaving)."""
    from schedules.pipeline import peak_in_flight

    return peak_in_flight(plan.stage_order(stage)) / plan.chunks


# ---------------------------------------------------------------------------------------------- buffers
def max_layer_params(model: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Largest per-rank parameter count among the FSDP units (layers, embedding, head) of a stage."""
    if model.params_only:
        return 0.0
    best = 0.0
    for ls in stage_chunks(model, plan, stage):
        for l in ls:
            best = max(best, sum(layer_param_split(model, plan, l)))
    if holds_embedding(plan, stage):
        best = max(best, model.embedding_params() / plan.tp)
    if holds_head(model, plan, stage):
        best = max(best, model.head_params() / plan.tp)
    return best


def buffer_bytes(model: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Transient communication buffers, an estimate (the engine's memory timeline gives the exact peak,
    which depends on how far communication lags compute): ZeRO-3 gathered weights of (1 + prefetch) units
    plus one unit's full gradients before its reduce-scatter; ZeRO-2 unsharded gradients of two units or
    buckets (the one being reduced and the one being produced)."""
    z = plan.zero_stage
    if plan.dp * plan.cp == 1:
        return 0.0
    if z >= 3:
        unit = max_layer_params(model, plan, stage)
        return unit * (model.dtype_bytes * (1 + plan.fsdp_prefetch) + plan.grad_bytes_per_param)
    if z == 2:
        dense, expert = rank_params(model, plan, stage)
        unit = max(plan.bucket_bytes, plan.grad_bytes_per_param * max_layer_params(model, plan, stage))
        return min(2 * unit, plan.grad_bytes_per_param * (dense + expert))
    return 0.0


# ---------------------------------------------------------------------------------------------- summary
def memory_per_rank(model: ModelSpec, plan: ParallelPlan, *, world_size: int | None = None
                    ) -> dict[str, dict[str, float]]:
    """Peak memory of one rank of each rank class ("stage0", "stage1", ...), bytes by category:
    parameters, gradients, optimizer, activations, buffers, and total (= peak) = their sum."""
    plan.validate(model, world_size)
    out = {}
    for s in range(plan.pp):
        d = model_state_bytes(model, plan, s)
        d["activations"] = activation_peak(model, plan, s)
        d["buffers"] = buffer_bytes(model, plan, s)
        d["total"] = sum(d[c] for c in CATEGORIES)
        d["peak"] = d["total"]
        out[f"stage{s}"] = d
    return out
