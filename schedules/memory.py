"""Memory per rank: parameters, gradients and optimizer state by ZeRO stage, activations by schedule.

Model states (Rajbhandari et al. 2020, "ZeRO", sec. 3 and 5): with Ψ parameters per model-parallel rank,
bf16 weights (2Ψ), bf16 gradients (2Ψ) and K = 12 bytes of Adam state per parameter; ZeRO-1 shards the
optimizer state over the data-parallel group, ZeRO-2 also the gradients, ZeRO-3 / FSDP also the weights.
Dense weights are replicated dp·cp times, expert weights edp = tp·cp·dp/(ep·etp) times (dp·cp/ep unfolded).

Activations per layer and micro-batch, two attention implementations (``plan.attention``):

flash (default): the tensors a layer's kernels save for backward, one entry each (``saved_tensors``), as
    Megatron-Core with Transformer Engine and torchtitan run a Llama-style layer (no dropout): the input and
    output of each RMSNorm (the norm's backward reads its input, the following GEMM's weight gradient its
    output), the rotated Q and the K, V the FlashAttention kernel keeps with its output O and fp32
    log-sum-exp (Dao 2023, "FlashAttention-2", alg. 2: no s×s matrix is stored), the MLP's fc1 output (gate
    and up for SwiGLU) and the activation output fc2 reads; MoE layers add the router's fp32 probabilities,
    the permuted tokens and the experts' outputs the combine reads. The LM head keeps the final norm's
    input/output and the fp32 softmax of the vocabulary-parallel cross-entropy, with the logits (and their fp32
    copy under an eager cross-entropy) live beside them while the loss runs. The attention output is
    also the output projection's input (one tensor, counted once); rotary and residual adds save nothing.
    Norm tensors are sharded over TP only with SP; the rest always are. torchtitan's eager stack (its
    RMSNorm a chain of eager ops, SwiGLU silu then multiply) saves each norm's fp32 input copy and unweighted
    output, and SiLU's output, where fused kernels keep the bf16 input only; Megatron's selective
    recomputation keeps them (it re-runs only the attention core); torchtitan's own per-op checkpointing
    (recompute op, below) recomputes the pointwise ops and keeps none of them.
eager: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", sec. 4,
    with the s×s scores, in bytes with 2-byte activations and 1-byte dropout masks, s = seq/cp:
    none:   s·b·h·(34 + 5·a·s/h)          no tensor parallelism
    TP:     s·b·h·(10 + 24/t + 5·a·s/(h·t))
    TP+SP:  s·b·h·(34/t + 5·a·s/(h·t))
    The 34 is 11 (attention) + 19 (MLP) + 4 (layer norms); we keep the published split and scale the parts
    that depend on the shape: K/V by kv_heads/heads (GQA), the MLP's 16·s·b·h by ffn/(4h) (x1.5 for SwiGLU,
    which stores gate, up and their product) and, in MoE layers, by top_k expert widths plus the permuted
    tokens. An eager-pointwise stack adds its norms' fp32 copies and unweighted outputs and SwiGLU's SiLU
    output, the flash model's own entries (``_eager_pointwise_extra``). The LM head's logits are not counted.
Selective recompute drops the attention core's internals (eager: the 5·a·s²·b scores; flash: the
log-sum-exp) and, with Megatron-Core's other ``recompute_modules``, what each module saved (``Saved.freed_by``:
the norms' outputs, MLA's rotated q and k, v, a dense MLP's fc1 and activation outputs, the experts'
activation output, the whole MoE block's tensors, the shared experts'; module inputs stay as the checkpoint's
inputs), rebuilt one layer at a time during backward (``recompute_transient_bytes``); full recompute keeps
only each layer's input, 2·s·b·h (/t with SP), and rebuilds one layer's activations during its backward;
with ``recompute_every`` N only every N-th layer is checkpointed (``plan.layer_recompute``), the others keep
everything. Op recompute (torchtitan's per-op policy,
``schedules.kernels.op_policy``) keeps the block's input (the checkpoint input) and the outputs of the ops
the policy saves, read off the forward kernels: the odd-numbered GEMMs' outputs (wq, wv, w1, w2 per rank:
w2's is the unreduced m×h partial sum under TP), the attention output and its fp32 log-sum-exp, and with
SP the two reduce-scatter outputs; the rest is rebuilt during the layer's backward.

FSDP / ZeRO-3 residency (``fsdp_residency``): a unit's parameters are all-gathered when a forward or
backward needs them and are not resident; ``reshard_after_forward`` frees them after each forward. Without
PP they are freed after each backward (FSDP2's default). Under PP they stay gathered after backward until
the unit's last use in the step and its gradients accumulate unsharded and are reduce-scattered once per
step, as torch.distributed.pipelining runs FSDP2 (``set_reshard_after_backward(False)``,
``set_requires_gradient_sync(False)`` until the last micro-batch); ``auto`` reshards after forward only
without PP (torchtitan's default ``fsdp_reshard_after_forward = "default"``).

In-flight micro-batches per stage come from walking the schedule's order (``schedules.pipeline``): GPipe
holds m, 1F1B p - s on stage s, interleaved p + (p-1)/v stage-equivalents on stage 0, ZB-H1 as 1F1B.
The embedding output is not counted (its backward reads only the token ids). Units: bytes.
"""
from __future__ import annotations

from typing import NamedTuple

from schedules.kernels import (EAGER_POINTWISE, FUSED_CE_STACKS, TORCH_CP_STACKS, attention_head_dims,
                               attention_kv_heads, recomputed_norms, unpads_tokens)
from schedules.models import ModelSpec, lora_layer_params
from schedules.plan import DEFAULT_RECOMPUTE_MODULES, ParallelPlan

CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "buffers")


# ---------------------------------------------------------------------------------------------- layout
def chunk_layers(model: ModelSpec, plan: ParallelPlan) -> list[list[int]]:
    """Layers of each model piece (virtual stage), in piece order (``ParallelPlan.piece_layers``)."""
    return plan.piece_layers(model)


def layer_name(model: ModelSpec, layer: int) -> str:
    """A layer's unit name in programs: ``L<i>``; an MTP module's layer ``MTP<k>`` (k from 1)."""
    return f"MTP{layer - model.layers + 1}" if model.is_mtp_layer(layer) else f"L{layer}"


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


def head_unit_params(model: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Dense parameters one rank of ``stage`` holds with the LM head: the head (a separate copy of tied
    embeddings under PP), the final norm and the MTP modules' parts besides their layers (eh_proj, norms; under
    PP the last stage also keeps a copy of the embedding for them, as Megatron-Core's ``mtp_process`` stage
    does). 0 for a stage without the last model piece."""
    if not any(plan.piece(stage, c) == plan.pieces - 1 for c in range(plan.chunks)):
        return 0.0
    n = model.hidden + (model.head_params() / plan.tp if holds_head(model, plan, stage) else 0.0)
    if model.mtp_layers and not model.params_only:
        n += model.mtp_layers * (2 * model.hidden * model.hidden / plan.tp + 3 * model.hidden)
        if plan.pp > 1 and not holds_embedding(plan, stage):
            n += model.embedding_params() / plan.tp
    return n


def layer_param_split(model: ModelSpec, plan: ParallelPlan, layer: int) -> tuple[float, float]:
    """(dense, expert) parameters of one layer held by one rank (TP shards the dense part; EP and the
    experts' TP, etp, shard the experts)."""
    expert = model.layer_expert_params(layer)
    dense = model.layer_params(layer) - expert
    return dense / plan.tp, expert / (plan.expert_tp * plan.ep)


def stage_layer_params(model: ModelSpec, plan: ParallelPlan, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters of the transformer layers one rank of ``stage`` holds (no embedding / head)."""
    dense = expert = 0.0
    for layers in stage_chunks(model, plan, stage):
        for layer in layers:
            d, e = layer_param_split(model, plan, layer)
            dense += d
            expert += e
    return dense, expert


def rank_params(model: ModelSpec, plan: ParallelPlan, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters one rank of pipeline stage ``stage`` holds before ZeRO sharding."""
    if model.params_only:
        return model.param_count() / plan.tp, 0.0
    dense, expert = stage_layer_params(model, plan, stage)
    if holds_embedding(plan, stage):
        dense += model.embedding_params() / plan.tp
    dense += head_unit_params(model, plan, stage)      # LM head, final norm, MTP projections
    return dense, expert


def shard_degrees(plan: ParallelPlan) -> tuple[int, int]:
    """(dense, expert) data-parallel replication: the ZeRO sharding degrees."""
    return plan.dp * plan.cp, plan.edp


FP8_WEIGHT_COPY_BYTES = 2    # Transformer Engine keeps row- and column-wise FP8 copies of each FP8 GEMM weight


def fp8_weight_copy_bytes(model: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """FP8 recipes (Transformer Engine): the row- and column-wise FP8 copies of the transformer-block GEMM
    weights a rank keeps across a step's micro-batches (``is_first_microbatch`` caching), 2 bytes per block
    parameter next to the BF16 weight. Not under ZeRO-3 / FSDP, where a unit's weights exist only while
    gathered (counted with the gathered buffer's dtype)."""
    if getattr(plan, "dtype", "bf16") != "fp8" or plan.zero_stage >= 3 or model.params_only:
        return 0.0
    return FP8_WEIGHT_COPY_BYTES * sum(stage_layer_params(model, plan, stage))


def fp8_param_gather_params(model: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Parameters kept in FP8 only under Megatron-Core's ``--fp8-param-gather`` (``plan.fp8_param_gather``): the
    transformer-block weights of the stage (no BF16 copy; 0 without it)."""
    if not getattr(plan, "fp8_param_gather", False) or model.params_only:
        return 0.0
    return sum(stage_layer_params(model, plan, stage))


def lora_layer_rank_params(model: ModelSpec, plan: ParallelPlan) -> float:
    """LoRA adapter parameters of one transformer layer held by one rank (sharded over TP like the linears they
    sit beside; 0 without LoRA)."""
    if not getattr(plan, "lora_rank", 0):
        return 0.0
    return lora_layer_params(model, plan.lora_rank, plan.lora_targets, plan.stack) / plan.tp


def lora_rank_params(model: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """LoRA adapter parameters one rank of ``stage`` holds (``plan.lora_rank``; 0 without LoRA): those of its
    transformer layers."""
    if not getattr(plan, "lora_rank", 0) or model.params_only:
        return 0.0
    return sum(len(c) for c in stage_chunks(model, plan, stage)) * lora_layer_rank_params(model, plan)


def trainable_rank_params(model: ModelSpec, plan: ParallelPlan, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters one rank of ``stage`` trains (gradients, optimizer state, data-parallel
    reduction) before ZeRO sharding: every parameter, or under LoRA only the adapters (the model is frozen)."""
    if getattr(plan, "lora_rank", 0):
        return lora_rank_params(model, plan, stage), 0.0
    return rank_params(model, plan, stage)


def model_state_bytes(model: ModelSpec, plan: ParallelPlan, stage: int) -> dict[str, float]:
    """Resident parameters (with FP8 recipes' weight copies), gradients and optimizer state (bytes) of one rank
    of ``stage``. Under ``fp8_param_gather`` the block weights exist only as their FP8 row- and column-wise
    copies: their BF16 bytes are not resident. Under LoRA the frozen model's weights are resident (sharded only
    by ZeRO-3 / FSDP: Megatron's distributed optimizer shards what trains) beside the adapters, and gradients
    and optimizer state are the adapters' alone."""
    dense, expert = rank_params(model, plan, stage)
    dd, de = shard_degrees(plan)
    z = plan.zero_stage
    sharded = dense / dd + expert / de
    full = dense + expert
    fp8_only = fp8_param_gather_params(model, plan, stage)        # zero 1 / 2 only (ParallelPlan checks)
    t_dense, t_expert = trainable_rank_params(model, plan, stage)
    t_sharded, t_full = t_dense / dd + t_expert / de, t_dense + t_expert
    adapters = t_dense if getattr(plan, "lora_rank", 0) else 0.0       # (the adapters are what trains)
    return {
        "parameters": model.dtype_bytes * ((sharded if z >= 3 else full) - fp8_only)
        + fp8_weight_copy_bytes(model, plan, stage) + model.dtype_bytes * adapters / (dd if z >= 3 else 1),
        "gradients": plan.grad_bytes_per_param * (t_sharded if z >= 2 else t_full),
        "optimizer": plan.optimizer_bytes_per_param * (t_sharded if z >= 1 else t_full),
    }


# ---------------------------------------------------------------------------------------------- activations
STATS_BYTES = 4      # fp32 softmax statistics and probabilities (FlashAttention LSE, router, cross-entropy)


class Saved(NamedTuple):
    """One tensor saved for backward, per micro-batch, whole (before any TP sharding)."""

    name: str
    nbytes: float
    shard: str          # "tp": sharded over TP always; "sp": only with sequence parallelism; "none": per rank
    reader: str         # "B": freed by the input-gradient pass; "W": read by the weight-gradient pass
    freed_by: tuple[str, ...] = ()   # selective recompute modules that discard it (``recomputed_modules``)

    @property
    def core(self) -> bool:
        """Attention-core internals: what Megatron's default selective recomputation (core_attn) drops."""
        return "core_attn" in self.freed_by


def recomputed_modules(model: ModelSpec, plan: ParallelPlan, layer: int) -> frozenset[str]:
    """The ``Saved.freed_by`` tags that selective recomputation of ``plan.recompute_modules`` discards in
    ``layer``: the modules themselves, with ``layernorm`` split into the norms Megatron-Core recomputes there
    (``schedules.kernels.recomputed_norms``)."""
    mods = set(plan.recompute_modules)
    if "layernorm" in mods:
        norm_in, norm_post = recomputed_norms(model, plan, model.is_moe_layer(layer))
        mods |= {x for x, on in (("layernorm-input", norm_in), ("layernorm-post", norm_post)) if on}
    return frozenset(mods)


def saved_tensors(model: ModelSpec, plan: ParallelPlan, layer: int) -> list[Saved]:
    """The tensors one transformer layer's kernels save for backward under FlashAttention (see module doc)."""
    s = plan.seq / plan.cp
    tok, e, h = s * plan.micro_batch, model.dtype_bytes, model.hidden
    a = model.heads
    if model.is_mla:
        dqk, dv, kvh = model.d_head + model.qk_rope_dim, model.v_head_dim, a
    else:
        dqk = dv = model.d_head
        # the attention kernel saves the K and V it reads: at the query heads under torchtitan's repeat_kv
        kvh = attention_kv_heads(model, plan) * plan.tp
    # FP8 recipes save the inputs of the FP8 GEMMs in FP8 (1 byte) for the weight gradients; FlashAttention's
    # backward still reads its output in BF16, so the projection keeps an FP8 copy beside it
    f = 1 if getattr(plan, "dtype", "bf16") == "fp8" else e
    # torchtitan's eager RMSNorm (schedules.kernels) saves its fp32 input copy (pow and the x·r product) and
    # its unweighted output (the weight gradient) instead of the bf16 input a fused norm keeps
    eager = plan.stack in EAGER_POINTWISE
    n1, n2, up = ("layernorm-input",), ("layernorm-post",), ("mla_up_proj",) if model.is_mla else ()
    kind = model.layer_kind(layer)
    if kind == "M":
        return mamba_saved_tensors(model, plan)
    mixer, mlp_block = model.layer_blocks(layer)
    out = [Saved("norm1 input", e * tok * h, "sp", "B"),
           Saved("norm1 output (QKV input)", f * tok * h, "sp", "W", n1)]
    if eager:
        out += [Saved("norm1 fp32 input copy beyond the input (eager RMSNorm)", (4 - e) * tok * h, "sp", "B", n1),
                Saved("norm1 unweighted output (eager RMSNorm)", e * tok * h, "sp", "B", n1)]
    if model.is_mla:          # latent projections: the latent norm's input (B) and output (up-projection input, W)
        for lat in ((model.q_lora_rank,) if model.q_lora_rank else ()) + (model.kv_lora_rank + model.qk_rope_dim,):
            out += [Saved("latent norm input", e * tok * lat, "sp", "B"),
                    Saved("latent norm output", e * tok * lat, "sp", "W")]
    if model.qk_norm:         # each head's RMSNorm (Qwen3) keeps its input, the Q and K heads out of the QKV GEMM
        qk = tok * (a + max(model.kv_heads, plan.tp)) * dqk      # (TP keeps at least one K head per rank)
        out.append(Saved("q, k norm input", e * qk, "tp", "B"))
        if eager:
            out += [Saved("q, k norm fp32 input copy beyond the input (eager RMSNorm)", (4 - e) * qk, "tp", "B"),
                    Saved("q, k norm unweighted output (eager RMSNorm)", e * qk, "tp", "B")]
    out += [Saved("q (rotated)", e * tok * a * dqk, "tp", "B", up),
            Saved("k, v" if kvh == model.kv_heads or model.is_mla else "k, v (expanded by repeat_kv)",
                  e * tok * kvh * (dqk + dv), "tp", "B", up),
            Saved("attention output (projection input)", e * tok * a * dv, "tp", "W"),
            Saved("softmax log-sum-exp", STATS_BYTES * tok * a, "tp", "B", ("core_attn",))]
    norm2 = [Saved("norm2 input", e * tok * h, "sp", "B"),
             Saved("norm2 output (MLP input)", f * tok * h, "sp", "W", n2)]
    if eager:
        norm2 += [Saved("norm2 fp32 input copy beyond the input (eager RMSNorm)", (4 - e) * tok * h, "sp", "B", n2),
                  Saved("norm2 unweighted output (eager RMSNorm)", e * tok * h, "sp", "B", n2)]
    extra = []      # (listed after norm2: a layer's tensors in this order, as they always were)
    if f != e:
        extra.append(Saved("attention output fp8 copy (projection input)", f * tok * a * dv, "tp", "W"))
    if unpads_tokens(plan):
        # llm-foundry's flash_attn_fn: the varlen kernel keeps its unpadded output, the projection the padded one
        extra.append(Saved("attention output, unpadded (flash-attn varlen)", e * tok * a * dv, "tp", "B"))
    out = (out if mixer else []) + (norm2 if mlp_block else []) + (extra if mixer else [])
    if not mlp_block:
        return _lora_saved(plan, out, e / f)
    fc1 = 2 if model.gated_mlp else 1          # SwiGLU's fc1 writes gate and up
    if model.is_moe_layer(layer):
        routed = model.top_k * _load(model)
        width = routed * model.expert_ffn              # routed experts' widths per token
        shared = model.shared_experts * model.expert_ffn
        # a rank holds its expert-TP group's tokens (tok/tp·etp) at full hidden width, and the same expert
        # widths per token (width/etp for etp times the tokens): the dispatcher gathers the routed tokens over
        # the experts' TP group (etp = tp unless folded; the expert GEMMs run on those rows, schedules.kernels)
        gathered = plan.expert_tp
        moe = ("moe",)
        out += [Saved("router probabilities", STATS_BYTES * tok * model.experts, "sp", "B", moe),
                Saved("permuted tokens (expert input)", f * tok * routed * h * gathered, "tp", "W", moe),
                Saved("expert fc1 output", e * tok * fc1 * width, "tp", "B", moe),
                Saved("expert activation output (fc2 input)", f * tok * width, "tp", "W", ("moe", "moe_act")),
                Saved("expert outputs (combine input)", e * tok * routed * h * gathered, "tp", "B", moe)]
        if shared:
            sx = ("moe", "shared_experts")
            out += [Saved("shared expert fc1 output", e * tok * fc1 * shared, "tp", "B", sx),
                    Saved("shared expert activation output (fc2 input)", f * tok * shared, "tp", "W", sx)]
    else:
        mlp = ("mlp",)
        out += [Saved("fc1 output", e * tok * fc1 * model.ffn, "tp", "B", mlp),
                Saved("activation output (fc2 input)", f * tok * model.ffn, "tp", "W", mlp)]
        if eager and model.gated_mlp:     # eager SwiGLU: silu(w1 x) * w3 x, the multiply saves silu's output
            out.append(Saved("silu output (eager SwiGLU)", e * tok * model.ffn, "tp", "B", mlp))
    return _lora_saved(plan, out, e / f)


#: LoRA: the saved input of each target linear (what its weight gradient would read), by tensor name
LORA_INPUTS = {"norm1 output (QKV input)": "qkv", "attention output (projection input)": "proj",
               "norm2 output (MLP input)": "fc1", "activation output (fc2 input)": "fc2"}


def _lora_saved(plan: ParallelPlan, out: list[Saved], bf16_per_saved: float = 1.0) -> list[Saved]:
    """A layer's saved tensors under LoRA (``plan.lora_rank``): a frozen linear's input is not kept for a weight
    gradient (Transformer Engine and autograd save it only for a weight that requires one), so every tensor
    only the W pass reads goes, but a target linear's adapter keeps its BF16 input for A's weight gradient
    (read in W), and FlashAttention's backward still reads its output (the projection's input, then read in
    B). The adapters' rank-r intermediates (a few hundred KiB per layer) are not counted. ``bf16_per_saved``:
    BF16 bytes per byte the recipe saves a GEMM input in (2 under FP8 recipes, which save FP8 copies)."""
    if not getattr(plan, "lora_rank", 0):
        return out
    kept = []
    for t in out:
        target = LORA_INPUTS.get(t.name)
        if t.name == "attention output (projection input)":
            kept.append(t if target in plan.lora_targets else t._replace(reader="B"))
        elif target in plan.lora_targets:
            # a column-parallel target's adapter (qkv, fc1) saves the norm output Megatron-Bridge hands it
            # gathered over the sequence (return_layernorm_output_gathered under SP): whole on every rank
            kept.append(t._replace(nbytes=t.nbytes * bf16_per_saved,
                                   shard="none" if target in ("qkv", "fc1") else t.shard))
        elif t.reader != "W":
            kept.append(t)
    return kept


def mamba_saved_tensors(model: ModelSpec, plan: ParallelPlan) -> list[Saved]:
    """What a Mamba-2 layer saves for backward (Megatron-Core's MambaMixer on mamba_ssm's fused
    ``mamba_split_conv1d_scan_combined``, which saves in_proj's output and the scan's output before the gate,
    and recomputes the conv in backward; the mixer's own RMSNorm then keeps its input, the gated output): the
    layer norm's input, in_proj's input (FP8 under FP8 recipes), in_proj's output (z, x, B, C, dt), the scan
    output y, the gated y·silu(z), the group norm's fp32 statistics and its output (out_proj's input, FP8 under
    FP8 recipes). The chunk states the scan passes between chunks are recomputed in its backward."""
    tok, e, h = plan.seq / plan.cp * plan.micro_batch, model.dtype_bytes, model.hidden
    f = 1 if getattr(plan, "dtype", "bf16") == "fp8" else e
    di = model.mamba_inner
    return [Saved("norm input", e * tok * h, "sp", "B"),
            Saved("norm output (in_proj input)", f * tok * h, "sp", "W", ("layernorm-input",)),
            Saved("in_proj output (z, x, B, C, dt)", e * tok * model.mamba_in_width(), "tp", "B"),
            Saved("scan output y (before the gate)", e * tok * di, "tp", "B"),
            Saved("gated y·silu(z) (the group norm's input)", e * tok * di, "tp", "B"),
            Saved("group norm statistics", STATS_BYTES * tok * model.mamba_groups, "tp", "B"),
            Saved("gated norm output (out_proj input)", f * tok * di, "tp", "W")]


def head_saved_tensors(model: ModelSpec, plan: ParallelPlan) -> list[Saved]:
    """Tensors the final norm, LM head and vocabulary-parallel cross-entropy keep (fp32 softmax of the
    logits: Megatron-Core ``VocabParallelCrossEntropy`` saves them in fp32; torchtitan upcasts the logits), and
    those of each MTP module besides its layer (its norms, eh_proj input and its own pass through the head)."""
    tok, e, h = plan.seq / plan.cp * plan.micro_batch, model.dtype_bytes, model.hidden
    out = [Saved("final norm input", e * tok * h, "sp", "B"), Saved("final norm output", e * tok * h, "sp", "W"),
           Saved("cross-entropy softmax (fp32)", STATS_BYTES * tok * model.vocab, "tp", "B")]
    for k in range(model.mtp_layers):     # each MTP module: its norms, eh_proj's input and its own head pass
        out += [Saved(f"mtp {k + 1} enorm / hnorm inputs", 2 * e * tok * h, "sp", "B"),
                Saved(f"mtp {k + 1} eh_proj input", 2 * e * tok * h, "sp", "W"),
                Saved(f"mtp {k + 1} final norm input", e * tok * h, "sp", "B"),
                Saved(f"mtp {k + 1} final norm output", e * tok * h, "sp", "W"),
                Saved(f"mtp {k + 1} cross-entropy softmax (fp32)", STATS_BYTES * tok * model.vocab, "tp", "B")]
    return _lora_saved(plan, out)       # LoRA: a frozen head keeps no input for its weight gradient


def head_transient_bytes(model: ModelSpec, plan: ParallelPlan, backward: bool = False) -> float:
    """Bytes per rank live beside the head's saved tensors while the loss runs. Forward: the LM head's logits
    in the activation dtype, plus their fp32 copy under torchtitan's eager cross-entropy
    (``F.cross_entropy(pred.float(), ...)``, also under torch.compile while torchtitan compiled the blocks
    only), which log_softmax reads while it writes its saved fp32 output; a fused cross-entropy (Megatron's,
    flash-attn's, a compiled loss: ``FUSED_CE_STACKS``) upcasts in registers. Backward (``backward``): under
    the eager loss the logits are gone (torchtitan's train step ``del pred`` before ``loss.backward()``;
    the copy and the linear save neither) and log_softmax's backward holds nll_loss's fp32 gradient and
    writes its own, both the logits' size, beside its saved output (8 bytes per logit; the cast back to the
    activation dtype then needs 4 + 2); a fused loss writes the logits' gradient in their dtype. Under TP the
    eager loss is torchtitan's loss_parallel, whose decomposed ops hold more (below)."""
    if model.params_only or plan.attention == "eager":
        return 0.0
    tok = plan.seq / plan.cp * plan.micro_batch
    a = model.dtype_bytes
    if plan.stack in FUSED_CE_STACKS:
        per = a                         # the logits, then their gradient, in the activation dtype
    elif plan.tp > 1:
        # torchtitan's loss_parallel (schedules.kernels._head): forward, beside the logits and their fp32 copy,
        # x - max and its exp (the output, saved, replaces the exp); backward, beside the saved output, nll's
        # zeroed gradient, exp of the output and their sum (then the product replaces the exp)
        per = 12 if backward else a + 8
    else:
        per = 8 if backward else a + 4
    return per * tok * model.vocab / plan.tp


def _per_rank(t: Saved, plan: ParallelPlan) -> float:
    return t.nbytes / (plan.tp if (t.shard == "tp" or (t.shard == "sp" and plan.sp)) else 1)


def op_saved_tensors(model: ModelSpec, plan: ParallelPlan, layer: int) -> list[Saved]:
    """What torchtitan's per-op checkpointing keeps of one layer per micro-batch (see module doc), bytes per
    rank (shard "none"): the outputs of the forward kernels ``op_policy`` saves, the block input, and the
    reduce-scatter outputs under SP (``_save_list`` names reduce_scatter_tensor)."""
    from schedules.kernels import op_policy, phase_kernels

    e = model.dtype_bytes
    rows = plan.seq / plan.cp * plan.micro_batch / (plan.tp if plan.sp else 1)
    out = [Saved("layer input (checkpoint input)", e * rows * model.hidden, "none", "B")]
    for k in op_policy(model, phase_kernels(model, plan, layer, "forward"))[0]:
        if k.kind == "attention":
            out += [Saved(f"{k.name} output", e * k.batch * k.seq_q * k.heads * k.head_dim, "none", "W"),
                    Saved(f"{k.name} log-sum-exp", STATS_BYTES * k.batch * k.seq_q * k.heads, "none", "B")]
        else:
            out.append(Saved(f"{k.name} output", e * k.batch * k.m * k.n, "none", "B"))
    if plan.sp and plan.tp > 1:
        out += [Saved(f"{n} reduce-scatter output", e * rows * model.hidden, "none", "B")
                for n in ("attention", "mlp")]
    return out


def _eager_terms(model: ModelSpec, plan: ParallelPlan, layer: int) -> tuple[float, float, float, float]:
    """Korthikanti (eager attention): (replicated, tp-split, attention-core, weight-input) activation bytes of
    one layer and micro-batch, before dividing by t. ``weight-input`` is the part the W pass needs."""
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


def _eager_pointwise_extra(model: ModelSpec, plan: ParallelPlan, layer: int) -> float:
    """Bytes per rank an eager-pointwise stack (torchtitan without torch.compile) keeps beyond the fused kernels
    Korthikanti's counts assume, one layer and micro-batch: ``saved_tensors``' own "(eager ...)" entries (each
    RMSNorm's fp32 input copy beyond its input and its unweighted output, SwiGLU's SiLU output), so the eager
    and flash models cannot drift apart."""
    return sum(_per_rank(x, plan) for x in saved_tensors(model, plan, layer) if "(eager " in x.name)


def _load(model: ModelSpec) -> float:
    return 1.0 if model.capacity_factor is None else min(1.0, model.capacity_factor)


_SPLIT_CACHE: dict = {}
_SPLIT_CACHE_MAX = 20_000


def _layer_split_bytes(model: ModelSpec, plan: ParallelPlan, layer: int, recompute: str) -> tuple[float, float]:
    """(activation bytes one rank keeps per micro-batch, of which the W pass reads) without full recompute.

    A layer enters only through whether it is an MoE layer, its hybrid block and its own recomputation (what
    saved_tensors, op_saved_tensors and phase_kernels read of it), so layers alike share one cached answer: a
    stage's walk asks it several times per layer, and a plan search for thousands of plans."""
    key = (model, plan, model.is_moe_layer(layer), model.layer_kind(layer), plan.layer_recompute(layer), recompute)
    hit = _SPLIT_CACHE.get(key)
    if hit is None:
        if len(_SPLIT_CACHE) >= _SPLIT_CACHE_MAX:
            _SPLIT_CACHE.clear()
        hit = _SPLIT_CACHE[key] = _layer_split_bytes_of(model, plan, layer, recompute)
    return hit


def _layer_split_bytes_of(model: ModelSpec, plan: ParallelPlan, layer: int, recompute: str) -> tuple[float, float]:
    """``_layer_split_bytes`` computed for ``layer`` itself."""
    if plan.attention == "eager":
        rep, split, core, w_in = _eager_terms(model, plan, layer)
        core = 0.0 if recompute in ("selective", "op") else core
        t = plan.tp
        total = (rep + split + core) / t if plan.sp else rep + (split + core) / t
        total_unsharded = rep + split + core
        w_pass = total * min(1.0, w_in / total_unsharded)
        if plan.stack in EAGER_POINTWISE and recompute != "op":      # (per-op checkpointing recomputes them)
            total += _eager_pointwise_extra(model, plan, layer)
        return total, w_pass
    if recompute == "op":
        kept = op_saved_tensors(model, plan, layer)
    else:
        freed = recomputed_modules(model, plan, layer) if recompute == "selective" else frozenset()
        kept = [x for x in saved_tensors(model, plan, layer) if not freed.intersection(x.freed_by)]
    return sum(_per_rank(x, plan) for x in kept), sum(_per_rank(x, plan) for x in kept if x.reader == "W")


def layer_activation_bytes(model: ModelSpec, plan: ParallelPlan, layer: int, recompute: str | None = None
                           ) -> float:
    """Activation bytes one rank keeps per layer and micro-batch until its backward."""
    if model.params_only:
        return 0.0
    recompute = plan.layer_recompute(layer) if recompute is None else recompute
    if recompute == "full":
        s = plan.seq / plan.cp
        return model.dtype_bytes * s * plan.micro_batch * model.hidden / (plan.tp if plan.sp else 1)
    return _layer_split_bytes(model, plan, layer, recompute)[0]


def head_activation_bytes(model: ModelSpec, plan: ParallelPlan) -> tuple[float, float]:
    """(bytes, of which the W pass reads) the LM head keeps per micro-batch (flash model; eager keeps the
    published formulas, which leave the head out)."""
    if model.params_only or plan.attention == "eager":
        return 0.0, 0.0
    ts = head_saved_tensors(model, plan)
    return sum(_per_rank(x, plan) for x in ts), sum(_per_rank(x, plan) for x in ts if x.reader == "W")


def weight_grad_fraction(model: ModelSpec, plan: ParallelPlan, layer: int) -> float:
    """Fraction of a layer's stored activations the W pass needs (freed at W, the rest at B)."""
    rc = plan.layer_recompute(layer)
    if rc == "full" or model.params_only:
        return 0.0
    total, w = _layer_split_bytes(model, plan, layer, rc)
    return w / total if total else 0.0


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
    """Activations rebuilt while one layer's backward runs (full and op recompute): what the layer would keep
    without recomputation beyond what it keeps."""
    rc = plan.layer_recompute(layer)
    if rc == "full":
        return layer_activation_bytes(model, plan, layer, recompute="none")
    if rc == "op" or (rc == "selective" and plan.recompute_modules != DEFAULT_RECOMPUTE_MODULES):
        return max(0.0, layer_activation_bytes(model, plan, layer, recompute="none")
                   - layer_activation_bytes(model, plan, layer))
    return 0.0


def cp_transient_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """torch's context parallelism (``schedules.kernels.TORCH_CP_STACKS``) while a layer's attention backward
    runs: the all-gathered K, V blocks (cp of them, in the activation dtype, expanded by repeat_kv where the
    stack repeats), the own block's contiguous copy, and the fp32 accumulators of dQ and dK, dV beside the
    fp32 dK, dV buffer of the hop in flight. 0 for other stacks and without CP. Bytes per rank."""
    if plan.cp <= 1 or plan.stack not in TORCH_CP_STACKS:
        return 0.0
    tokens = plan.seq / plan.cp * plan.micro_batch
    d_qk, d_v = attention_head_dims(model)
    q, kv = tokens * model.heads / plan.tp * d_v, tokens * attention_kv_heads(model, plan) * (d_qk + d_v)
    return model.dtype_bytes * kv * (plan.cp + 1) + STATS_BYTES * (q + 2 * kv)


#: the saved tensors of a layer's MLP or MoE block (``saved_tensors`` names): the backward runs that block
#: first, so they are freed by the time the attention core's backward runs
_MLP_SAVED = ("norm2", "fc1 output", "activation output", "silu output", "router", "permuted", "expert",
              "shared expert")


def backward_transient_bytes(model: ModelSpec, plan: ParallelPlan, layer: int) -> float:
    """Bytes live beside the held activations while one layer's backward runs: what recomputation rebuilds
    (``recompute_transient_bytes``), or, while the attention core's backward runs, what it rebuilt for the
    attention block (the MLP block's part already freed, at most) beside torch's context-parallel buffers
    (``cp_transient_bytes``), whichever is larger."""
    rebuilt = recompute_transient_bytes(model, plan, layer)
    cp = cp_transient_bytes(model, plan)
    if not cp:
        return rebuilt
    mlp = sum(_per_rank(x, plan) for x in saved_tensors(model, plan, layer) if x.name.startswith(_MLP_SAVED))
    return max(rebuilt, max(0.0, rebuilt - mlp) + cp)


def activation_peak(model: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Peak activation bytes on ``stage`` walking its schedule (alloc at F, free at B / W)."""
    if model.params_only:
        return 0.0
    chunks = stage_chunks(model, plan, stage)
    held = [sum(layer_activation_bytes(model, plan, l) for l in ls) for ls in chunks]
    wfrac = [sum(weight_grad_fraction(model, plan, l) * layer_activation_bytes(model, plan, l) for l in ls)
             for ls in chunks]
    transient = [max((backward_transient_bytes(model, plan, l) for l in ls), default=0.0) for ls in chunks]
    head_t = [0.0] * plan.chunks        # the LM head's forward transient (the logits while the loss runs)
    head_b = [0.0] * plan.chunks        # its backward transient
    head_freed = [0.0] * plan.chunks    # what its backward frees before the layers' backward (B / W split: Bi)
    head_freed_bi = [0.0] * plan.chunks
    for c in range(plan.chunks):        # the chunk holding the last model piece runs the LM head
        if plan.piece(stage, c) == plan.pieces - 1:
            head, head_w = head_activation_bytes(model, plan)
            held[c] += head
            wfrac[c] += head_w
            head_t[c] = head_transient_bytes(model, plan)
            head_b[c] = head_transient_bytes(model, plan, backward=True)
            head_freed[c], head_freed_bi[c] = head, head - head_w
    order = plan.stage_order(stage, model)
    cur = peak = 0.0
    for a in order:
        c = a.chunk
        if a.phase == "F":
            cur += held[c]
            peak = max(peak, cur + head_t[c])
        elif a.phase in ("B", "Bi"):
            # a chunk's backward runs its units in reverse: the LM head first (its saved tensors freed at its
            # end, but for what its weight gradient keeps under a B / W split), then the layers, the largest
            # transient with every layer of the chunk still held (the first one's, for equal layers)
            freed = head_freed[c] if a.phase == "B" else head_freed_bi[c]
            peak = max(peak, cur + head_b[c], cur - freed + transient[c])
            cur -= held[c] if a.phase == "B" else held[c] - wfrac[c]
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
    best = max(best, head_unit_params(model, plan, stage))
    return best


def fsdp_units(model: ModelSpec, plan: ParallelPlan, stage: int) -> list[list[tuple[str, float, float]]]:
    """(name, dense, expert) per-rank parameters of the FSDP units of each chunk of ``stage``, in forward
    order: the embedding (first virtual stage), the layers, the LM head with the final norm (last)."""
    nv = plan.pp * plan.virtual_stages
    out = []
    for c, layers in enumerate(stage_chunks(model, plan, stage)):
        vs = c * plan.pp + stage
        units = [("embedding", model.embedding_params() / plan.tp, 0.0)] if vs == 0 else []
        units += [(layer_name(model, l), *layer_param_split(model, plan, l)) for l in layers]
        if vs == nv - 1:
            units.append(("lm_head", head_unit_params(model, plan, stage), 0.0))
        out.append(units)
    return out


def fsdp_residency(plan: ParallelPlan, uses: list[tuple[object, str]]) -> list[tuple[bool, bool]]:
    """(gather, release) for each use (unit key, phase "F" / "B" / "Bi") of an FSDP unit on one rank, in
    program order: gather when the unit's parameters are not resident; release after a forward when
    resharding after forward, after a backward without PP, and after the unit's last use of the step."""
    last = {k: i for i, (k, _) in enumerate(uses)}
    raf = plan.reshard_after_forward
    held: set = set()
    out = []
    for i, (k, phase) in enumerate(uses):
        gather = k not in held
        held.add(k)
        release = last[k] == i or (raf if phase == "F" else plan.pp == 1)
        if release:
            held.discard(k)
        out.append((gather, release))
    return out


def fsdp_buffer_bytes(model: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """ZeRO-3/FSDP transient bytes, an upper estimate: the peak of gathered parameters walking the stage's
    uses (``fsdp_residency``) plus ``fsdp_prefetch`` gathers issued ahead, and the unsharded gradients
    before their reduce-scatter: one unit's without PP, the whole stage's under PP (reduce-scattered once
    per step)."""
    dd, de = shard_degrees(plan)
    size = {}
    chunks = []
    for c, units in enumerate(fsdp_units(model, plan, stage)):
        chunks.append([(c, n) for n, _, _ in units])
        for n, d, e in units:
            size[(c, n)] = (d if dd > 1 else 0.0) + (e if de > 1 else 0.0)
    uses = []
    for a in plan.stage_order(stage, model):
        if a.phase == "F":
            uses += [(k, "F") for k in chunks[a.chunk]]
        elif a.phase in ("B", "Bi"):
            uses += [(k, a.phase) for k in reversed(chunks[a.chunk])]
    res = fsdp_residency(plan, uses)
    held = peak = 0.0
    for j, ((k, _), (gather, release)) in enumerate(zip(uses, res)):
        held += size[k] if gather else 0.0
        ahead = sum(size[uses[i][0]] for i in range(j + 1, min(len(uses), j + 1 + plan.fsdp_prefetch)) if res[i][0])
        peak = max(peak, held + ahead)
        held -= size[k] if release else 0.0
    if getattr(plan, "lora_rank", 0):       # LoRA: only the layers' adapters take gradients
        adapters = lora_layer_rank_params(model, plan) if dd > 1 else 0.0
        trained = {k: (adapters if k[1] not in ("embedding", "lm_head") else 0.0) for k in size}
    else:
        trained = size
    grads = sum(trained.values()) if plan.pp > 1 else max(trained.values(), default=0.0)
    return peak * model.dtype_bytes + grads * plan.grad_buffer_bytes_per_param


#: userbuffers Transformer Engine allocates for TP communication overlap: one per overlapped GEMM slot (the ten
#: of Megatron-Bridge's TransformerLayerTPOverlapCfg), each of the shape Megatron-Bridge's
#: _initialize_tp_communicators passes to initialize_ub: [seq · micro_batch / cp, hidden] (training/initialize.py)
USERBUFFERS = 10


def userbuffer_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """Resident bytes of the TP-overlap userbuffers (``plan.tp_comm_overlap``; 0 without it), in the model's
    activation dtype (FP8 recipes keep some of them in 1-byte FP8: an upper bound there)."""
    if not getattr(plan, "tp_comm_overlap", False):
        return 0.0
    return USERBUFFERS * plan.seq * plan.micro_batch / plan.cp * model.hidden * model.dtype_bytes


def buffer_bytes(model: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Communication buffers: the TP-overlap userbuffers (resident, ``userbuffer_bytes``) plus transient
    ones, an estimate (the engine's memory timeline gives the exact peak, which depends on how far
    communication lags compute): ZeRO-3 gathered weights and unsharded gradients (``fsdp_buffer_bytes``);
    ZeRO-2 unsharded gradients of two units or buckets (the one being reduced and the one being produced)."""
    return userbuffer_bytes(model, plan) + _transient_buffer_bytes(model, plan, stage)


def _transient_buffer_bytes(model: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    z = plan.zero_stage
    if plan.dp * plan.cp == 1:
        return 0.0
    if z >= 3:
        return 0.0 if model.params_only else fsdp_buffer_bytes(model, plan, stage)
    if z == 2:
        dense, expert = trainable_rank_params(model, plan, stage)
        layer = (lora_layer_rank_params(model, plan) if plan.lora_rank
                 else max_layer_params(model, plan, stage))
        unit = max(plan.bucket_bytes, plan.grad_buffer_bytes_per_param * layer)
        return min(2 * unit, plan.grad_buffer_bytes_per_param * (dense + expert))
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
