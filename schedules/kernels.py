"""The kernels a training stack launches for one layer phase: shapes, FLOPs and bytes per rank.

``phase_kernels(model, plan, layer, phase, part=...)`` is the one entry point (the cost model prices the
list, the memory model and ``validate`` may read it). Shapes are per rank: T = micro_batch · seq / cp
tokens, TP shards the heads and the MLP width, SP shards norms / residuals over T / tp.

Stacks (``plan.stack``)
    megatron     Megatron-Core with Transformer Engine: norm fused into the following GEMM's input
                 (LayerNormLinear), QKV and gate/up as single GEMMs, fused RoPE, fused bias-SwiGLU /
                 bias-GeLU, fused bias-dropout-add, vocab-parallel fused cross-entropy, FP8 GEMMs via TE.
                 Context parallelism is TE's P2P ring (``TE_CP_STACKS``): its output merges and gradient
                 accumulators around the attention kernels (``_te_cp_passes``).
    torchtitan   PyTorch eager (torchtitan without torch.compile): RMSNorm as the chain of eager ops its
                 norms.py writes (x.float(), pow, mean, +eps, rsqrt, multiply, type_as, * weight; autograd
                 runs the chain backward), RoPE as cast + complex multiply + cast back, separate wq / wk /
                 wv and w1 / w3 GEMMs, SiLU and multiply as two kernels, plain residual adds, cross-entropy as float cast +
                 log_softmax + its backward. Its Llama expands K and V to the query heads before attention
                 (``repeat_kv``, a copy; the backward sums it back), under torch.compile too, until torchtitan
                 #2259 (2026-01): the attention kernel saves, and context parallelism rotates, expanded K, V.
                 Context parallelism is torch's (``TORCH_CP_STACKS``): its ring attention's elementwise passes
                 (fp32 merges and gradient accumulators, K, V copies; ``_torch_cp_passes``) around the
                 attention kernels, op by op in eager, fused under compile.
    torchtitan-compile
                 torchtitan under torch.compile: the same GEMMs and cross-entropy; Inductor fuses each
                 pointwise chain into one kernel (the RMSNorm, RoPE, SiLU x multiply). The loss stays eager
                 (torchtitan before 2025-04).
    torchtitan-compile-loss
                 the same with the loss compiled too (torchtitan from 2025-04-02): one cross-entropy kernel
                 reading the bf16 logits, no fp32 copy.
    llm-foundry  MosaicML llm-foundry / Composer as its published MPT benchmarks ran (torch 1.13 eager,
                 scripts/train/benchmarking/submit_benchmarks.py): eager kernels, the norm one
                 F.layer_norm kernel (low_precision_layernorm), the attention core in the Triton
                 FlashAttention kernel (``attn_impl: triton``), flash-attn's fused cross-entropy (the
                 default ``loss_fn: fused_crossentropy``), and Composer's per-micro-batch train metrics
                 (two eager cross-entropies over the logits, no gradient). Launched with
                 ``attn_impl: flash`` (``--attention-kernel flash2``) the core is flash-attn 2's varlen
                 kernel between the unpad gathers and the pad scatter of ``flash_attn_fn``.
Attention is FlashAttention-2 in megatron and torchtitan (Megatron/TE's default backend on A100/H100 and
torch SDPA's); the pricer picks each stack's attention curve (``ATTENTION_IMPL``).

Precision (``plan.dtype``): bf16, or fp8 where the transformer-block GEMMs (QKV, projection, MLP,
experts) run in FP8 (Transformer Engine delayed scaling; torchao float8 under torchtitan) while the
attention core, norms, the LM head and the optimizer stay BF16/FP32. FP8 adds cast kernels: the GEMM
inputs that no fused kernel already writes in FP8 (TE writes row- and column-wise copies: read 2 bytes,
write 2 per element), the gradient of each GEMM output in backward, and the weights once per step
(Megatron's ``is_first_microbatch`` caching; amortised here over the step's micro-batches). With
``plan.fp8_recipe`` current (Transformer Engine's Float8CurrentScaling, megatron stack; ``FP8_RECIPES``) each
of those casts first reads its input's amax (2 bytes per element), and the norms feeding FP8 GEMMs write BF16
(with its amax) and are quantized by a cast of their own; with mxfp8 (block scaling) the norms are unfused
the same way and every cast also writes a scale byte per 32 elements, row- and column-wise. torchtitan's
float8 (torchao, tensorwise dynamic scaling, ``TORCHAO_FP8_STACKS``) reads each tensor's amax before its cast.

Phases: forward; backward (input and weight gradients); backward_input; backward_weight; recomputation
is prepended to backward and backward_input (``recompute_kernels``), per layer (``plan.layer_recompute``):
full re-runs the forward kernels; selective (Megatron) the attention core; op (torchtitan's per-op
selective checkpointing) the forward kernels its policy does not save. Parts: ``layer`` (a dense layer: everything), ``attention`` (an MoE layer without its
routed experts), ``experts`` (permute, grouped GEMMs, activation, unpermute), ``ring`` (one context-parallel
KV block of attention), ``head`` (final norm, LM head, cross-entropy), ``embedding``.
Units: FLOPs, bytes (activations 2 bytes, fp32 4 bytes).
"""
from __future__ import annotations

import dataclasses
import math
from functools import lru_cache

from schedules.models import (GLOBAL_ATTENTION, SEPARATE_QKV_STACKS, ModelSpec, causal_window_fraction,
                              hybrid_blocks)
from schedules.plan import DEFAULT_RECOMPUTE_MODULES, ParallelPlan
from simulator.errors import PlanError
from simulator.kernels import ATTENTION, ELEMENTWISE, GEMM, Kernel, KernelList
from simulator.program import BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FORWARD

STACKS = ("megatron", "torchtitan", "llm-foundry", "torchtitan-compile", "torchtitan-compile-loss")
#: torchtitan under torch.compile: each TransformerBlock compiled (parallelize_llama.apply_compile); from
#: 2025-04-02 (bbb1b616e, build_cross_entropy_loss) the loss too, before that left eager ("compiling loss
#: function causes CUDA errors")
COMPILED_STACKS = ("torchtitan-compile", "torchtitan-compile-loss")
# the attention kernel each stack runs (topologies.kernel_curves prices it from its own measured curve): te =
# Transformer Engine's choice (cuDNN fused attention on Hopper and later, FlashAttention-2 on Ampere)
ATTENTION_IMPL = {"megatron": "te", "torchtitan": "flash2", "llm-foundry": "triton", "torchtitan-compile": "flash2",
                  "torchtitan-compile-loss": "flash2"}
#: a plan may ask for another FlashAttention kernel than its stack's (``plan.attention_kernel``, one of
#: schedules.plan.ATTENTION_KERNELS): auto = the stack's (above); flash2 = FlashAttention-2 (flash-attn 2.x CUDA);
#: triton = the Triton FlashAttention of 2023 stacks (llm-foundry's attn_impl: triton). E.g. llm-foundry runs
#: launched with attn_impl: flash and flash-attn 2 installed run FlashAttention-2 under that stack
#: stacks that run each pointwise op as its own kernel (torchtitan without torch.compile): the RMSNorm as its
#: chain of eager ops, the cross-entropy's fp32 copy of the logits (llm-foundry's MPT runs one F.layer_norm
#: kernel and a fused cross-entropy); schedules.memory keeps what those ops save
EAGER_POINTWISE = ("torchtitan",)
#: stacks whose attention expands K and V to the query heads before the attention kernel (GQA): torchtitan's
#: Llama ``repeat_kv`` (models/llama/model.py: ``unsqueeze(3).expand(...).reshape(...)``, a copy, then
#: ``F.scaled_dot_product_attention`` on the expanded K, V), eager and compiled, until torchtitan #2259
#: (2026-01-27, ``enable_gqa``). SDPA then saves, and context parallelism rotates, the expanded K and V
#: (schedules.memory, schedules.generate); the backward sums the repeats' gradients
REPEAT_KV_STACKS = ("torchtitan",) + COMPILED_STACKS
#: stacks whose FP8 is torchao's float8 training (torchtitan's ``[float8]``): tensorwise dynamic scaling, each
#: cast's scale from the tensor's own amax (torchao/float8/float8_scaling_utils.py ``hp_tensor_to_float8_dynamic``
#: -> float8_utils.py ``tensor_to_amax``, ``torch.max(torch.abs(x))``: a reduction read of the tensor before the
#: cast, a kernel of its own eager or compiled: a global reduction, read at torchao 36027d8), as Transformer
#: Engine's current scaling
TORCHAO_FP8_STACKS = ("torchtitan",) + COMPILED_STACKS
#: stacks whose context parallelism is torch's (``torch.distributed.tensor.experimental.context_parallel``, as
#: torchtitan runs it): with torchtitan's default ``context_parallel_rotate_method = "allgather"`` each attention
#: all-gathers every rank's K, V block once (waited after the rank's own, diagonal block), and the backward
#: all-gathers them again and passes fp32 dK, dV accumulators around the ring, one hop per block
#: (``_templated_ring_attention_backward``: accumulators in fp32, rotated by all-to-all permutes) and a last
#: hop home (schedules.generate); the other stacks pass K, V blocks around a ring (Transformer Engine's P2P)
TORCH_CP_STACKS = ("torchtitan",) + COMPILED_STACKS
#: stacks whose context parallelism is Transformer Engine's P2P ring (``AttnFuncWithCPAndKVP2P``, Megatron-Core's
#: default ``--cp-comm-type p2p``): its merges of the blocks' outputs and its gradient accumulators are kernels
#: of their own around the attention kernels (``_te_cp_passes``)
TE_CP_STACKS = ("megatron",)
#: stacks whose FlashAttention-2 path unpads the tokens around flash-attn's varlen kernel (``_varlen_core``):
#: llm-foundry's flash_attn_fn; its Triton path and the other stacks take the padded (b, s, h, d) layout
VARLEN_UNPAD_STACKS = ("llm-foundry",)
#: stacks with a fused cross-entropy (Megatron's vocab-parallel one; flash-attn's xentropy kernel, llm-foundry's
#: default loss_fn): one read of the logits, upcast in registers. The others run the loss eagerly on a fp32
#: copy of the logits (torchtitan's ``cross_entropy(pred.float(), ...)``; under torch.compile too while
#: torchtitan compiled the blocks only; a compiled loss is one Inductor kernel reading the bf16 logits)
FUSED_CE_STACKS = ("megatron", "llm-foundry", "torchtitan-compile-loss")
DTYPES = ("bf16", "fp8")
#: Transformer Engine's FP8 scaling recipe (megatron stack): delayed (the scale from an amax history; the cast
#: kernel updates the amax as it writes, and a norm feeding an FP8 GEMM writes FP8 itself) or current
#: (Float8CurrentScaling: each tensor's scale from its own amax, taken before the cast). TE's
#: Float8CurrentScalingQuantizer::quantize_impl (transformer_engine/pytorch/csrc/quantizer.cpp, read at
#: d0067d0, TE 2.x) runs nvte_compute_amax (a read of the input), the scale, then nvte_quantize_v2; a
#: LayerNormLinear's norm computes the amax of its BF16 output in the same kernel (FUSED_NORM_AMAX_FP8,
#: extensions/normalization.cpp) and the output is quantized after it (quantize_with_amax). Megatron-Core's own
#: SwiGLU and residual kernels are not TE's, so every other cast takes the amax read first. mxfp8 (MXFP8
#: block scaling, Blackwell): each quantize computes its 32-element blocks' scales in the same pass (no amax
#: read) and writes an E8M0 scale per block, row- and column-wise; the norm's MXFP8 output is not fused
#: (``Impl::UNFUSED`` unless NVTE_NORM_FWD_USE_CUDNN, which Megatron-Bridge's recipes set only for
#: DeepSeek-V3 and only from July 2026): the norm writes BF16 and a quantize follows.
FP8_RECIPES = ("delayed", "current", "mxfp8")
MX_BLOCK = 32                       # elements per MXFP8 scale (one E8M0 byte each, row- and column-wise)
PARTS = ("layer", "attention", "experts", "ring", "head", "embedding")
BF16, FP32 = 2, 4


def _attention_impl(stack: str, attention_kernel: str = "auto") -> str:
    """The FlashAttention kernel a stack runs (``ATTENTION_IMPL``) unless the plan names another."""
    return ATTENTION_IMPL[stack] if attention_kernel == "auto" else attention_kernel


def _unpads(stack: str, attention_impl: str) -> bool:
    return stack in VARLEN_UNPAD_STACKS and attention_impl == "flash2"


def unpads_tokens(plan: ParallelPlan) -> bool:
    """Whether the plan's attention core runs on unpadded tokens (``_varlen_core``; FlashAttention only)."""
    stack = getattr(plan, "stack", None) or "megatron"
    return plan.attention == "flash" and _unpads(stack, _attention_impl(stack, getattr(plan, "attention_kernel", "auto")))


def default_stack(vendor: str) -> str:
    """Megatron-Core + Transformer Engine on NVIDIA presets (NVIDIA's reference recipes), eager elsewhere."""
    return "megatron" if vendor == "NVIDIA" else "torchtitan"


#: stacks whose FSDP is FSDP1 (FlatParameter; Composer wraps torch's FullyShardedDataParallel with
#: use_orig_params False): a unit all-gathers into its flat parameter, whose views the modules use (no
#: copy-out), and its gradients accumulate into the flat gradient, divided in place before the reduce-scatter
#: (the gradient pre-divide: read + write, as FSDP2's copy-in). torchtitan runs FSDP2 (fully_shard).
FSDP1_STACKS = ("llm-foundry",)

#: the optimizer step as each stack runs it, in passes over one fp32 state tensor (master weights, Adam's m,
#: v; ``optimizer_bytes_per_param / 3`` bytes per element each), read or written, per parameter it updates.
#: Eager (torch.optim.AdamW foreach, torchtitan's default ``fused = False``, weight decay 0.1; Composer's
#: DecoupledAdamW, a per-tensor loop, llm-foundry's MPT yamls with weight decay 0): every op is its own pass:
#: decay p.mul_ 2, m update 3 (lerp; Composer mul_ + add_ 2 + 3), v.mul_ 2 + addcmul_ 3, sqrt 2, / sqrt(bc2)
#: 2, + eps 2, p.addcdiv_(m, denom) 4 = 20 (Composer without decay: 5 + 5 + 6 + 4 = 20); gradient clipping
#: (torch clip_grad_norm_ and FSDP's: the norm reads each gradient, then every gradient is scaled in place
#: by the clamped coefficient) 3. Fused (Megatron-Core: Apex/TE FusedAdam, one pass reading g, p, m, v and
#: writing p, m, v, then the master-to-model copy; clip_grad_norm_fp32's norm is one more read of the
#: gradients, its scale runs only when the norm exceeds the threshold): the single-pass formula in
#: ``optimizer_step_bytes`` plus one gradient read.
EAGER_OPTIMIZER_STATE_PASSES = 20 + 3
#: gradient reduction precision (``plan.grad_reduce_dtype``): bytes per element each stack's data-parallel
#: gradient reduction moves. torchtitan reduces in fp32 (its config's ``mixed_precision_reduce = "float32"``
#: default, FSDP2 MixedPrecisionPolicy(reduce_dtype=float32)); Composer's FSDP mixed
#: precision ``DEFAULT`` reduces in fp32 from Composer 0.16.4 (2023-10-11, mosaic_fsdp_utils
#: get_mixed_precision: ``reduce_dtype = torch.float32``; ``PURE`` reduces in the compute dtype); NVIDIA's
#: NeMo performance recipes set ``grad_reduce_in_fp32 = False`` (bf16 gradient buffers), Megatron-Core's
#: DistributedDataParallelConfig default. With fp32 reduction under FSDP the unit's bf16 gradients are cast
#: to fp32 before the reduce-scatter (FSDP1 ``_post_backward_hook``: ``grad.to(reduce_dtype)``; FSDP2's
#: copy-in writes the reduce_dtype buffer).
GRAD_REDUCE_DTYPES = ("auto", "bf16", "fp32")
FP32_REDUCE_STACKS = ("torchtitan", "torchtitan-compile", "torchtitan-compile-loss", "llm-foundry")
REDUCE_BYTES = {"bf16": 2.0, "fp32": 4.0}


def grad_reduce_bytes(stack: str, choice: str = "auto", grad_bytes: float = 2.0) -> float:
    """Bytes per element the gradient reduction moves: ``choice`` unless auto; auto: fp32 under the stacks
    that reduce in fp32, else the gradients' own precision (``grad_bytes``: 2 for bf16 training, 4 when the
    model trains in fp32)."""
    if choice != "auto":
        return REDUCE_BYTES[choice]
    return REDUCE_BYTES["fp32"] if stack in FP32_REDUCE_STACKS else grad_bytes


def grad_reduce_dtype(stack: str, choice: str = "auto", grad_bytes: float = 2.0) -> str:
    """The gradient reduction precision a plan runs, by name ('bf16', 'fp32'; else the bytes per element)."""
    b = grad_reduce_bytes(stack, choice, grad_bytes)
    return next((k for k, v in REDUCE_BYTES.items() if v == b), f"{b:g} bytes")


FUSED_OPTIMIZER_STACKS = ("megatron",)

#: Transformer Engine's TP communication overlap (userbuffers, ``plan.tp_comm_overlap``) as Megatron-Bridge's
#: H100 presets configure it (src/megatron/bridge/training/comm_overlap.py,
#: ``userbuffers_{bf16,fp8}_h100_h8192_tp4_mbs1_seqlen8192``, the presets of its Llama 3 70B and GPT-3 175B
#: H100 recipes; the 405B presets differ only in a few num_sm). Per GEMM: (method, num_sm, set_sm_margin,
#: num_splits). ring_exchange: the all-gather (or reduce-scatter) moves one chunk per step while the GEMM
#: runs on another: tp GEMMs of 1/tp of the rows; pipeline: the GEMM in num_splits chunks whose outputs are
#: reduce-scattered as they finish; bulk: the whole collective beside the whole GEMM (the saved input's
#: all-gather beside the dgrad GEMM, the dgrad output's reduce-scatter beside the wgrad GEMM). The
#: communication kernel holds num_sm SMs: with set_sm_margin the GEMM is launched on the others; bulk
#: kernels hold theirs while the GEMM runs (priced here for the GEMM's whole duration: an upper bound).
UB_OVERLAP = {
    "bf16": {"qkv fprop": ("ring_exchange", 1, False, 0), "proj fprop": ("pipeline", 24, True, 4),
             "fc1 fprop": ("ring_exchange", 1, False, 0), "fc2 fprop": ("pipeline", 16, True, 4),
             "proj dgrad": ("ring_exchange", 1, False, 0), "fc2 dgrad": ("ring_exchange", 1, False, 0),
             "qkv dgrad": ("bulk", 4, False, 1), "qkv wgrad": ("bulk", 24, False, 1),
             "fc1 dgrad": ("bulk", 2, False, 1), "fc1 wgrad": ("bulk", 4, False, 1)},
}
UB_OVERLAP["fp8"] = {**UB_OVERLAP["bf16"], "proj fprop": ("ring_exchange", 1, True, 0),
                     "fc2 fprop": ("ring_exchange", 1, True, 0)}
#: our GEMM kernel names (megatron stack) -> the userbuffers slot
_UB_SLOT = {"qkv": "qkv fprop", "attention proj": "proj fprop", "mlp fc1 (gate+up)": "fc1 fprop",
            "mlp fc1": "fc1 fprop", "mlp fc2": "fc2 fprop", "attention proj dgrad": "proj dgrad",
            "mlp fc2 dgrad": "fc2 dgrad", "qkv dgrad": "qkv dgrad", "qkv wgrad": "qkv wgrad",
            "mlp fc1 (gate+up) dgrad": "fc1 dgrad", "mlp fc1 (gate+up) wgrad": "fc1 wgrad",
            "mlp fc1 dgrad": "fc1 dgrad", "mlp fc1 wgrad": "fc1 wgrad"}


def ub_chunks(dtype: str, slot: str, tp: int) -> int:
    """GEMM chunks of a userbuffers slot (ring exchange: tp; pipeline: its splits; bulk: 1). The last chunk's
    reduce-scatter of a forward (fprop) slot is exposed after its GEMM (schedules.generate)."""
    method, _, _, splits = UB_OVERLAP[dtype][slot]
    return tp if method == "ring_exchange" else max(1, splits)


@lru_cache(maxsize=4096)
def ub_segments(kl: KernelList) -> tuple:
    """A layer phase's kernels as they meet TP communication overlap: ((KernelList, slot or None), ...) in
    launch order, each GEMM of a userbuffers slot (``UB_OVERLAP``) a piece of its own, the kernels between
    them pieces with no slot. schedules.generate runs each slot's collective beside its piece."""
    out, cur = [], []

    def close(kernels, slot):
        out.append((KernelList(f"{kl.label} · {slot or 'between overlaps'}", kernels, kl.stack, kl.dtype, parent=kl),
                    slot))

    for k in kl.kernels:
        slot = _UB_SLOT.get(k.name) if k.kind == GEMM else None
        if slot is None:
            cur.append(k)
            continue
        if cur:
            close(cur, None)
            cur = []
        close([k], slot)
    if cur:
        close(cur, None)
    return tuple(out)


def _ub_overlap(kernels: list, dtype: str, tp: int) -> list:
    """The GEMMs of a layer as they run under userbuffers overlap (UB_OVERLAP): chunked, some on fewer SMs."""
    table = UB_OVERLAP[dtype]
    out = []
    for k in kernels:
        slot = _UB_SLOT.get(k.name) if k.kind == GEMM else None
        if slot is None:
            out.append(k)
            continue
        method, num_sm, margin, _ = table[slot]
        chunks = ub_chunks(dtype, slot, tp)
        sms = num_sm if (margin or method == "bulk") else 0
        out.append(dataclasses.replace(k, chunks=chunks, sm_margin=sms))
    return out


def optimizer_step_bytes(stack: str, params: float, param_bytes: float, grad_bytes: float,
                         optimizer_bytes: float) -> float:
    """HBM bytes one rank moves in its optimizer step (Adam with gradient clipping) over ``params`` it
    updates; ``param_bytes`` / ``grad_bytes`` / ``optimizer_bytes``: bytes per parameter of the model
    weights, the gradients and the optimizer states (master weights, m, v)."""
    if stack in FUSED_OPTIMIZER_STACKS:
        return params * (param_bytes + grad_bytes + 2 * optimizer_bytes) + params * grad_bytes
    # eager: the fp32 master weights are the parameters (FSDP casts its all-gather input, not the step)
    return params * EAGER_OPTIMIZER_STATE_PASSES * optimizer_bytes / 3


def check_choice(stack: str, dtype: str, reduce_dtype: str = "auto", fp8_recipe: str = "delayed") -> None:
    if fp8_recipe not in FP8_RECIPES:
        raise PlanError(f"unknown FP8 recipe {fp8_recipe!r}; choose one of {', '.join(FP8_RECIPES)}")
    if fp8_recipe != "delayed" and dtype != "fp8":
        raise PlanError(f"FP8 recipe {fp8_recipe!r} applies to FP8 training (dtype is {dtype}): add --dtype fp8 or "
                        f"drop --fp8-recipe")
    if fp8_recipe != "delayed" and stack != "megatron":
        raise PlanError(f"FP8 recipe {fp8_recipe!r} is Transformer Engine's (the megatron stack); the {stack} "
                        f"stack's FP8 casts are priced as that stack runs them")
    if reduce_dtype not in GRAD_REDUCE_DTYPES:
        raise PlanError(f"unknown gradient reduction dtype {reduce_dtype!r}; choose one of "
                        f"{', '.join(GRAD_REDUCE_DTYPES)}")
    if stack not in STACKS:
        raise PlanError(f"unknown stack {stack!r}; choose one of {', '.join(STACKS)}")
    if dtype not in DTYPES:
        raise PlanError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")


class _Writer:
    """Collects kernels of one op; ``fp8`` GEMMs where the recipe runs them."""

    def __init__(self, stack: str, dtype: str, act_bytes: int = BF16, attention_kernel: str = "auto",
                 fp8_recipe: str = "delayed"):
        self.a = act_bytes                      # bytes per activation element (the model's dtype_bytes)
        self.fused = stack == "megatron"
        self.eager_norm = stack in EAGER_POINTWISE
        self.compiled = stack in COMPILED_STACKS      # Inductor: one kernel per pointwise chain
        self.separate_qkv = stack in SEPARATE_QKV_STACKS   # wq, wk, wv linears
        self.repeat_kv = stack in REPEAT_KV_STACKS
        self.torch_cp = stack in TORCH_CP_STACKS
        self.te_cp = stack in TE_CP_STACKS
        # fused cross-entropy: Megatron's vocab-parallel one; llm-foundry's default loss_fn fused_crossentropy
        # (flash-attn's xentropy CUDA kernel, modeling_mpt.py) reads bf16 logits and writes their gradient
        self.fused_ce = stack in FUSED_CE_STACKS
        # Composer evaluates the model's train metrics on every micro-batch (trainer._train_microbatch ->
        # _eval_train_metrics, Composer 0.14-0.17); llm-foundry's MPT registers LanguageCrossEntropy and
        # LanguagePerplexity, each a torch.nn.CrossEntropyLoss over the logits under autocast (fp32 math)
        self.train_metrics = 2 if stack == "llm-foundry" else 0
        self.attention_impl = _attention_impl(stack, attention_kernel)
        # llm-foundry's attn_impl: flash (flash_attn_fn) runs flash-attn's varlen kernel on unpadded tokens
        self.unpad = _unpads(stack, self.attention_impl)
        self.fp8 = dtype == "fp8"
        # Transformer Engine's current scaling (FP8_RECIPES): an amax read before each cast, norms write BF16
        self.current_scaling = self.fp8 and self.fused and fp8_recipe == "current"
        self.mxfp8 = self.fp8 and self.fused and fp8_recipe == "mxfp8"       # block scales, unfused norm output
        # each cast reads its tensor's amax first: TE's current scaling, torchao's dynamic scaling
        self.amax_read = self.current_scaling or (self.fp8 and stack in TORCHAO_FP8_STACKS)
        # bytes per element a cast moves: read the input, write row- and column-wise FP8 (+ MXFP8 block scales)
        self.cast_bytes = self.a + 2 + (2 / MX_BLOCK if self.mxfp8 else 0.0)
        self.local = GLOBAL_ATTENTION     # the layer's local attention (ModelSpec.local_attention)
        self.kind = ""                    # the layer's hybrid-pattern block (ModelSpec.layer_kind)
        self.frozen = False               # LoRA: the model's weights take no gradient (no weight-gradient GEMMs)
        self.lora_rank = 0                # LoRA adapters' rank beside the lora_targets linears (0: none)
        self.lora_targets: tuple = ()
        self.out: list[Kernel] = []

    def lora(self, plan) -> "_Writer":
        """This writer for ``plan``'s LoRA fine-tuning (``ParallelPlan.lora_rank``; nothing without it)."""
        rank = getattr(plan, "lora_rank", 0)
        self.frozen, self.lora_rank = rank > 0, rank
        self.lora_targets = getattr(plan, "lora_targets", ()) if rank else ()
        return self

    def gemm(self, name: str, m: float, n: float, k: float, batch: float = 1, fp8_ok: bool = True) -> None:
        m, n, k, batch = int(round(m)), int(round(n)), int(round(k)), max(1, int(round(batch)))
        if m <= 0 or n <= 0 or k <= 0:
            return
        dt = "fp8" if (self.fp8 and fp8_ok) else "bf16"
        eb = 1 if dt == "fp8" else self.a
        self.out.append(Kernel(name, GEMM, 2.0 * batch * m * n * k, eb * batch * (m * k + k * n) + self.a * batch * m * n,
                               m, n, k, batch, dt))

    def ew(self, name: str, nbytes: float) -> None:
        if nbytes > 0:
            self.out.append(Kernel(name, ELEMENTWISE, 0.0, float(nbytes)))

    def cast(self, name: str, elements: float, amax_known: bool = False) -> None:
        """FP8 cast with amax of a self.a tensor (row- and column-wise FP8 copies); where each tensor's scale
        comes from its own amax (``amax_read``: TE's current scaling, torchao's dynamic scaling) the amax is
        read first, unless the kernel that wrote the tensor computed it (``amax_known``)."""
        if self.fp8:
            if self.amax_read and not amax_known:
                self.ew(f"{name}: amax", elements * self.a)
            self.ew(name, elements * self.cast_bytes)

    def attention(self, name: str, pass_: str, b: float, sq: float, skv: float, heads: float, d_qk: float,
                  d_v: float, causal: bool, share: float = 1.0, window: int = 0) -> None:
        """A fused attention kernel; ``window``: a causal sliding window's keys per query (0: none), whose
        FLOPs are the pairs it keeps (``causal_window_fraction``); ``share``: the fraction of such kernels a
        rank runs on average (its FLOPs and bytes; the rate stays the shape's)."""
        window = window if causal and 0 < window < sq else 0
        keep = causal_window_fraction(sq, window) if window else 1.0
        fwd = 2.0 * b * sq * skv * heads * (d_qk + d_v) * (0.5 if causal else 1.0) * share * keep
        flops = fwd if pass_ == "fwd" else 2.5 * fwd
        io = self.a * b * heads * (sq * d_qk + skv * d_qk + skv * d_v + sq * d_v) * share   # Q, K, V, O
        self.out.append(Kernel(name, ATTENTION, flops, io * (1 if pass_ == "fwd" else 2.5), 0, 0, 0, int(b), "bf16",
                               pass_, int(sq), int(skv), int(round((d_qk + d_v) / 2)), int(heads), causal,
                               self.attention_impl, window=int(window)))


# ---------------------------------------------------------------------------------------------- pieces
def _norm(w: _Writer, name: str, rows: float, h: int, back: bool, into_fp8_gemm: bool) -> None:
    if w.eager_norm:
        _eager_rmsnorm(w, name, rows, h, back)
        if not back and w.fp8 and into_fp8_gemm:
            w.cast(f"{name} fp8 cast", rows * h)
        return
    if back:
        w.ew(f"{name} bwd", rows * h * 3 * w.a)
        return
    # TE LayerNormLinear writes FP8 under delayed scaling; under current scaling (BF16 and its amax) and MXFP8
    # (BF16) a quantize of its own follows
    unfused = w.current_scaling or w.mxfp8
    out_bytes = 1 if (w.fp8 and w.fused and into_fp8_gemm and not unfused) else w.a
    w.ew(name, rows * h * (w.a + out_bytes))
    if w.fp8 and into_fp8_gemm and (not w.fused or unfused):
        w.cast(f"{name} fp8 cast", rows * h, amax_known=w.current_scaling)


def _eager_rmsnorm(w: _Writer, name: str, rows: float, h: int, back: bool) -> None:
    """torchtitan's eager RMSNorm (torchtitan/models/norms.py, norm_type = "rmsnorm"):
    ``(x.float() * rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight``, one kernel per
    op; the row statistics (mean, +eps, rsqrt) touch rows·4 bytes. Backward: autograd's kernels for each op
    (the weight gradient a multiply and a row reduction, the fp32 cast of the gradient, the x·r and pow
    products and their sum, the cast back). Bytes per element: 28 + 4a forward, 60 + 8a backward."""
    n, a, f = rows * h, w.a, FP32
    if not back:
        w.ew(f"{name}: x.float()", n * (a + f))
        w.ew(f"{name}: pow(2)", n * 2 * f)
        w.ew(f"{name}: mean", n * f + rows * f)
        w.ew(f"{name}: + eps", rows * 2 * f)
        w.ew(f"{name}: rsqrt", rows * 2 * f)
        w.ew(f"{name}: x * r", n * 2 * f + rows * f)
        w.ew(f"{name}: type_as", n * (f + a))
        w.ew(f"{name}: * weight", n * 2 * a)
        return
    w.ew(f"{name} bwd: grad * weight", n * 2 * a)
    w.ew(f"{name} bwd: weight grad (mul + row sum)", n * 4 * a)
    w.ew(f"{name} bwd: grad.float()", n * (a + f))
    w.ew(f"{name} bwd: grad * r", n * 2 * f + rows * f)
    w.ew(f"{name} bwd: r grad (mul + row sum)", n * 4 * f)
    w.ew(f"{name} bwd: mean grad (expand)", n * f)
    w.ew(f"{name} bwd: pow grad", n * 3 * f)
    w.ew(f"{name} bwd: sum of x grads", n * 3 * f)
    w.ew(f"{name} bwd: cast to input dtype", n * (f + a))


def _rotary(w: _Writer, tokens: float, width: float) -> None:
    if w.fused or w.compiled:
        w.ew("rotary (fused)", tokens * width * 2 * w.a)
    else:   # torchtitan: x.float() -> complex multiply -> type_as(x)
        w.ew("rotary cast fp32", tokens * width * (w.a + FP32))
        w.ew("rotary complex mul", tokens * width * 2 * FP32)
        w.ew("rotary cast bf16", tokens * width * (FP32 + w.a))


def _residual(w: _Writer, name: str, rows: float, h: int, dropout: bool, back: bool) -> None:
    if back:    # gradient of a residual branch: one add (the dropout mask multiply where there is one)
        w.ew(f"{name} bwd", rows * h * 3 * w.a + (rows * h * (1 + 2 * w.a) if dropout else 0.0))
        return
    if w.fused:     # Megatron fused bias-dropout-add: read x and the residual, write the sum (+ 1-byte mask)
        w.ew(f"{name} (bias-dropout-add)", rows * h * (3 * w.a + (1 if dropout else 0)))
    else:
        if dropout:
            w.ew(f"{name} dropout", rows * h * (2 * w.a + 1))
        w.ew(f"{name} add", rows * h * 3 * w.a)


def _activation(w: _Writer, rows: float, width: float, gated: bool, back: bool, into_fp8: bool) -> None:
    if gated:
        if back:
            w.ew("swiglu bwd", rows * width * 5 * w.a)
        elif w.fused or w.compiled:
            w.ew("swiglu (fused)", rows * width * 3 * w.a)
        else:
            w.ew("silu", rows * width * 2 * w.a)
            w.ew("mul", rows * width * 3 * w.a)
    else:
        w.ew("gelu bwd" if back else ("bias-gelu (fused)" if w.fused else "gelu"), rows * width * (3 if back else 2)
             * w.a)
    if into_fp8 and not back:
        w.cast("fc2 input fp8 cast", rows * width)


def _linear(w: _Writer, name: str, phase: str, m: float, n: float, k: float, batch: float = 1,
            fp8_ok: bool = True, target: str = "") -> None:
    """A linear layer y[m,n] = x[m,k]·W[k,n] (per expert when batch > 1) in one phase. Under LoRA (``w.frozen``)
    its weight takes no gradient, and a linear named in ``w.lora_targets`` (``target``) has an adapter."""
    if phase == FORWARD:
        w.gemm(name, m, n, k, batch, fp8_ok)
        if target in w.lora_targets:
            _lora_adapter(w, name, phase, m, n, k)
        return
    if target in w.lora_targets:
        _lora_adapter(w, name, phase, m, n, k)
    if fp8_ok and w.fp8 and not (w.frozen and phase == BACKWARD_WEIGHT):
        w.cast(f"{name} grad fp8 cast", batch * m * n)
    if phase in (BACKWARD, BACKWARD_INPUT):
        w.gemm(f"{name} dgrad", m, k, n, batch, fp8_ok)
    if phase in (BACKWARD, BACKWARD_WEIGHT) and not w.frozen:
        w.gemm(f"{name} wgrad", n, k, m, batch, fp8_ok)


def _lora_adapter(w: _Writer, name: str, phase: str, m: float, n: float, k: float) -> None:
    """A LoRA adapter beside linear ``name`` (Megatron-Bridge ``peft/utils.py::ParallelLinearAdapter`` and
    ``peft/lora_layers.py::LoRALinear``): linear_in A (k → r) and linear_out B (r → n) in BF16 whatever the base
    GEMMs' precision, the output scaled by alpha / r (one elementwise pass), then added to the base output.
    Backward: the scale's gradient, B's and A's input and weight gradients, and the adapter's input gradient
    summed into the base linear's. Per rank the adapters are sharded like the base weight; their TP collectives
    are the program's (schedules.generate ``_lora_tp_items``)."""
    r = w.lora_rank
    if phase == FORWARD:
        w.gemm(f"{name} lora A", m, r, k, fp8_ok=False)
        w.gemm(f"{name} lora B", m, n, r, fp8_ok=False)
        w.ew(f"{name} lora scale", 2 * w.a * m * n)
        w.ew(f"{name} lora add", 3 * w.a * m * n)
        return
    if phase in (BACKWARD, BACKWARD_INPUT):
        w.ew(f"{name} lora scale bwd", 2 * w.a * m * n)
        w.gemm(f"{name} lora B dgrad", m, r, n, fp8_ok=False)
        w.gemm(f"{name} lora A dgrad", m, k, r, fp8_ok=False)
        w.ew(f"{name} lora input grad add", 3 * w.a * m * k)
    if phase in (BACKWARD, BACKWARD_WEIGHT):
        w.gemm(f"{name} lora B wgrad", n, r, m, fp8_ok=False)
        w.gemm(f"{name} lora A wgrad", r, k, m, fp8_ok=False)


class _Shape:
    """Per-rank sizes of one layer under a plan."""

    def __init__(self, m: ModelSpec, p: ParallelPlan):
        self.b = p.micro_batch
        self.s = p.seq / p.cp                       # query tokens per sequence on this rank
        self.T = self.b * self.s
        self.tp = p.tp
        self.rows = self.T / p.tp if p.sp else self.T    # rows of norms / residuals
        self.heads = m.heads / p.tp
        self.kv = max(m.kv_heads / p.tp, 1.0 if not m.is_mla else 0.0)
        self.h = m.hidden
        self.d = m.d_head


def _has_dropout(m: ModelSpec) -> bool:
    """GPT-style models (2-matrix MLP) train with hidden dropout, Llama-style do not, unless the model says."""
    return (not m.gated_mlp) if m.dropout is None else m.dropout


def _attention_block(w: _Writer, m: ModelSpec, p: ParallelPlan, sh: _Shape, phase: str) -> None:
    T, h = sh.T, sh.h
    dropout = _has_dropout(m)
    if phase == BACKWARD_WEIGHT:       # only the weight gradients
        _attention_linears(w, m, sh, phase)
        return
    back = phase != FORWARD
    if not back:
        _norm(w, "input norm", sh.rows, h, False, True)
        _attention_linears(w, m, sh, FORWARD, part="in")
        if m.qk_norm:
            _norm(w, "q, k norm", T * (sh.heads + sh.kv), sh.d, False, False)
        if m.position_embedding == "rope":
            _rotary(w, T, (sh.heads + sh.kv) * (m.qk_rope_dim if m.is_mla else sh.d))
        _core(w, m, p, sh, "fwd")
        w.cast("proj input fp8 cast", T * sh.heads * (m.v_head_dim if m.is_mla else sh.d))
        _attention_linears(w, m, sh, FORWARD, part="out")
        _residual(w, "attention residual", sh.rows, h, dropout, False)
    else:
        _residual(w, "attention residual", sh.rows, h, dropout, True)
        _attention_linears(w, m, sh, phase, part="out")
        _core(w, m, p, sh, "bwd")
        if m.position_embedding == "rope":
            _rotary(w, T, (sh.heads + sh.kv) * (m.qk_rope_dim if m.is_mla else sh.d))
        if m.qk_norm:
            _norm(w, "q, k norm", T * (sh.heads + sh.kv), sh.d, True, False)
        _attention_linears(w, m, sh, phase, part="in")
        _norm(w, "input norm", sh.rows, h, True, True)


def _attention_linears(w: _Writer, m: ModelSpec, sh: _Shape, phase: str, part: str = "both") -> None:
    T, h, heads = sh.T, sh.h, sh.heads
    if part in ("in", "both"):
        if m.is_mla:
            qk = m.d_head + m.qk_rope_dim
            if m.q_lora_rank:
                _linear(w, "q down", phase, T, m.q_lora_rank, h)
                if phase == FORWARD:
                    w.ew("q norm", T * m.q_lora_rank * 2 * w.a)
                _linear(w, "q up", phase, T, heads * qk, m.q_lora_rank)
            else:
                _linear(w, "q proj", phase, T, heads * qk, h)
            _linear(w, "kv down", phase, T, m.kv_lora_rank + m.qk_rope_dim, h)
            if phase == FORWARD:
                w.ew("kv norm", T * m.kv_lora_rank * 2 * w.a)
            _linear(w, "kv up", phase, T, heads * (m.d_head + m.v_head_dim), m.kv_lora_rank)
        elif w.separate_qkv:     # torchtitan's Attention: wq, wk, wv (models/llama/model.py)
            for nm, n in (("wq", heads), ("wk", sh.kv), ("wv", sh.kv)):
                _linear(w, nm, phase, T, n * sh.d, h, target="qkv")
        else:
            _linear(w, "qkv", phase, T, (heads + 2 * sh.kv) * sh.d, h, target="qkv")
    if part in ("out", "both"):
        _linear(w, "attention proj", phase, T, h, heads * (m.v_head_dim if m.is_mla else sh.d), target="proj")


def _core(w: _Writer, m: ModelSpec, p: ParallelPlan, sh: _Shape, pass_: str) -> None:
    """The attention core on this rank's own KV block (the other cp-1 blocks are ``ring`` ops)."""
    d_qk, d_v = attention_head_dims(m)
    # repeat_kv (REPEAT_KV_STACKS): K and V, each read at its kv heads and written at the query heads; the
    # backward sums the gradient of the expanded K and V back (the same bytes)
    repeat = _repeats_kv(w, m, sh)
    if repeat and pass_ == "fwd":
        w.ew("repeat_kv (k, v to the query heads)", repeat_kv_bytes(sh.T, sh.heads, sh.kv, sh.d, w.a))
    _core_kernel(w, m, p, sh, pass_, d_qk, d_v)
    if p.cp > 1:
        _cp_passes(w, sh, pass_, d_qk, d_v, attention_kv_heads(m, p), own_block=True)
    if repeat and pass_ == "bwd":
        w.ew("repeat_kv bwd (sum of the repeats)", repeat_kv_bytes(sh.T, sh.heads, sh.kv, sh.d, w.a))


def _repeats_kv(w: _Writer, m: ModelSpec, sh: _Shape) -> bool:
    """Whether this stack's attention reads K and V expanded to the query heads (repeat_kv under GQA)."""
    return w.repeat_kv and not m.is_mla and sh.heads > sh.kv


def attention_head_dims(m: ModelSpec) -> tuple[float, float]:
    """(d_qk, d_v): the query / key and value head widths the attention kernel reads (MLA: nope + rope keys)."""
    return (m.d_head + m.qk_rope_dim, m.v_head_dim) if m.is_mla else (m.d_head, m.d_head)


def attention_kv_heads(m: ModelSpec, p: ParallelPlan) -> float:
    """K, V heads per rank the attention kernel reads: every query head under MLA and under repeat_kv
    (``REPEAT_KV_STACKS``), else the model's kv heads (TP never splits them below one per rank)."""
    if m.is_mla or p.stack in REPEAT_KV_STACKS:
        return m.heads / p.tp
    return max(m.kv_heads / p.tp, 1.0)


#: the names of context-parallel attention's elementwise kernels (``_cp_passes``). They run inside the attention
#: op: torchtitan's per-op checkpointing saves that op's outputs and re-runs none of them (``op_policy``)
CP_PREFIX = "cp: "


def _cp_passes(w: _Writer, sh: _Shape, pass_: str, d_qk: float, d_v: float, kv_heads: float,
               own_block: bool) -> None:
    """The elementwise kernels of the stack's context-parallel attention on the rank's own block or one other
    block (torch's ``_torch_cp_passes``, Transformer Engine's ``_te_cp_passes``; none for other stacks)."""
    if w.torch_cp:
        _torch_cp_passes(w, sh, pass_, d_qk, d_v, kv_heads, own_block)
    elif w.te_cp:
        _te_cp_passes(w, sh, pass_, d_qk, d_v, kv_heads, own_block)


def _te_cp_passes(w: _Writer, sh: _Shape, pass_: str, d_qk: float, d_v: float, kv_heads: float,
                  own_block: bool) -> None:
    """The elementwise kernels of Transformer Engine's P2P ring attention (``TE_CP_STACKS``; read in
    transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py, ``AttnFuncWithCPAndKVP2P``,
    BF16, causal, Megatron's sbhd layout, as of TE 2.4), on this rank's own block (``own_block``: once per layer and pass) or
    on one other block (per ring step, averaged over the CP ranks: with its load balancing half the other
    blocks cover every query of the rank, half only the second half of them, so a merge or an accumulation
    touches 0.75 of its tensor on average). Forward: K and V concatenated into the ring's send buffer
    (``torch.cat``), the softmax statistics cloned from the first block and corrected after each other block
    (fp32, read both, write one), the outputs merged after the ring: the first block's scaled into the output
    (``flash_attn_fwd_out_correction_init``, read and write), each other block's scaled and added to it
    (``flash_attn_fwd_out_correction``: read the output and the block's, write the output), each also reading
    two fp32 statistics per row and head. Backward: K, V copied into the ring buffer, dQ, dK and dV of the
    first block copied into their accumulators and each other block's added (``copy_`` / ``add_``, one kernel
    per tensor, in BF16; the dK, dV accumulator then travels the ring). Older releases add small passes, not
    priced: statistics in fp64 before 2.4, the output zero-filled and the first block added before 2.2
    (2a·o more per layer forward), a dK, dV concatenation per block in the fused backward up to 1.13.
    Elements per rank: o = T·heads·d_v (the output), dq = T·heads·d_qk, k = T·kv_heads·d_qk, v =
    T·kv_heads·d_v; rows = T·heads softmax statistics (4 bytes each)."""
    a, f = w.a, FP32
    o = sh.T * sh.heads * d_v
    dq = sh.T * sh.heads * d_qk
    k, v = sh.T * kv_heads * d_qk, sh.T * kv_heads * d_v
    rows = sh.T * sh.heads
    part = 0.75                          # of a tensor a merge or accumulation of another block touches
    if pass_ == "fwd" and own_block:
        w.ew(CP_PREFIX + "k, v cat into the ring buffer", 2 * a * (k + v))
        w.ew(CP_PREFIX + "softmax lse clone (fp32)", 2 * f * rows)
        w.ew(CP_PREFIX + "output correction, first block", 2 * a * o + 2 * f * rows)
    elif pass_ == "fwd":
        w.ew(CP_PREFIX + "softmax lse correction (fp32)", part * 3 * f * rows)
        w.ew(CP_PREFIX + "output correction (scale and add)", part * (3 * a * o + 2 * f * rows))
    elif own_block:
        w.ew(CP_PREFIX + "k, v copy into the ring buffer", 2 * a * (k + v))
        for name, n in (("dq", dq), ("dk", k), ("dv", v)):
            w.ew(CP_PREFIX + f"{name} copy (first block)", 2 * a * n)
    else:
        for name, n in (("dq", dq), ("dk", k), ("dv", v)):
            w.ew(CP_PREFIX + f"{name} add", part * 3 * a * n)


def _torch_cp_passes(w: _Writer, sh: _Shape, pass_: str, d_qk: float, d_v: float, kv_heads: float,
                     own_block: bool) -> None:
    """The elementwise passes of torch's context-parallel attention (``TORCH_CP_STACKS``;
    torch/distributed/tensor/experimental/_attention.py, ``_templated_ring_attention`` and its backward, as of
    early 2025) on this rank's own block (``own_block``: once per layer and pass) or on one other block (per
    ring step, averaged over the CP ranks: with round-robin load balancing half the other blocks update the
    whole output, half its second half through ``_partial_update``, a ``torch.cat`` that rewrites the tensor).
    Eager (torchtitan without compile), op by op: forward, K, V ``.contiguous()`` (the attention's inputs are
    transposed views), a ``torch.cat`` of K, V before each exchange but the last, each block's output cast to
    fp32 and merged, out - sigmoid(lse_b - lse) * (out - out_b) (32 bytes per element), the final cast back;
    backward, fp32 accumulators for dQ, dK, dV (zeroed, each block's gradient added: 8 + a bytes per element),
    the K, V ``torch.cat`` and the fp32 dK, dV ``torch.cat`` before each hop, the final casts. Compiled
    (torchtitan compiles each block with fullgraph=True, the ring attention traced into the graph): Inductor
    fuses each chain into one pass over the tensors it reads and writes, and drops the K, V concatenations the
    all-gather rotation never sends (all but the first): forward, the all-gather's K, V copy, the output's
    fp32 accumulator (read it, the block's output, write it: 8 + a), the casts in and out; backward, the
    all-gather's copy, each accumulation (8 + a, written straight into the next hop's buffer), the casts.
    Elements per rank: q = T·heads·d_v (the output's), kv = T·kv_heads·(d_qk + d_v)."""
    a, f = w.a, FP32
    q = sh.T * sh.heads * d_v
    kv = sh.T * kv_heads * (d_qk + d_v)
    add = 2 * f + a                       # fp32 += bf16: read both, write fp32
    part = 0.75 * (q + kv)                # elements a block's gradients cover, on average (half: a half)
    rewrite = 0.5 * f * q                 # fused: half the blocks rewrite the output's other half (read, write)
    if w.compiled:
        if own_block:
            w.ew(CP_PREFIX + "k, v copy for the all-gather", 2 * a * kv)
            w.ew(CP_PREFIX + "fp32 accumulators: casts in and out",
                 2 * (a + f) * (q if pass_ == "fwd" else q + kv))
        elif pass_ == "fwd":
            w.ew(CP_PREFIX + "merge block output (fp32, fused)", add * 0.75 * q + rewrite)
        else:
            w.ew(CP_PREFIX + "accumulate dq, dk, dv (fp32, fused)", add * part + 0.5 * f * (q + kv))
        return
    if pass_ == "fwd" and own_block:
        w.ew(CP_PREFIX + "k, v contiguous", 2 * a * kv)
        w.ew(CP_PREFIX + "output to fp32, then back", 2 * (a + f) * q)
    elif pass_ == "fwd":
        w.ew(CP_PREFIX + "k, v cat for the exchange", 2 * a * kv)
        w.ew(CP_PREFIX + "merge block output (fp32)", (a + f + 8 * f) * 0.75 * q + 2 * rewrite)
    elif own_block:
        w.ew(CP_PREFIX + "k, v contiguous", 2 * a * kv)
        w.ew(CP_PREFIX + "fp32 dq, dk, dv: zeros, add, casts back", (f + add + f + a) * (q + kv))
        w.ew(CP_PREFIX + "dk, dv cat for the hop (fp32)", 2 * f * kv)
    else:
        w.ew(CP_PREFIX + "k, v cat for the exchange", 2 * a * kv)
        w.ew(CP_PREFIX + "accumulate dq, dk, dv (fp32)", add * part + 0.5 * 2 * f * (q + kv))
        w.ew(CP_PREFIX + "dk, dv cat for the hop (fp32)", 2 * f * kv)


def _ring_block_kernels(w: _Writer, sh: _Shape, pass_: str, d_qk: float, d_v: float) -> None:
    """The attention kernel of one other rank's KV block, averaged over the CP ranks. Causal load balancing
    (Transformer Engine's P2P ring, ``cp_p2p_fwd_prepare_qkv``; torch's ``_templated_ring_attention``) gives
    each rank chunks i and 2cp-1-i of the sequence; a block from an earlier rank is attended by all the rank's
    s queries over its first chunk (s/2 keys, "lower-triangle"), one from a later rank by the rank's second
    chunk (s/2 queries) over all its s keys ("upper-triangle"), each without a mask: over the ring half the
    blocks are each, so each kernel counts half (``share``), and each runs at its own shape's rate."""
    half = sh.s / 2
    w.attention(f"ring attention {pass_} (all queries, first half of the keys)", pass_, sh.b, sh.s, half,
                sh.heads, d_qk, d_v, False, share=0.5)
    w.attention(f"ring attention {pass_} (second half of the queries, all keys)", pass_, sh.b, half, sh.s,
                sh.heads, d_qk, d_v, False, share=0.5)


def repeat_kv_bytes(tokens: float, heads: float, kv_heads: float, d_head: float, act_bytes: float) -> float:
    """Bytes repeat_kv moves for K and V together: each read at ``kv_heads`` and written at ``heads`` (per rank)."""
    return 2 * act_bytes * tokens * d_head * (kv_heads + heads)


def _core_kernel(w: _Writer, m: ModelSpec, p: ParallelPlan, sh: _Shape, pass_: str, d_qk: float, d_v: float) -> None:
    # causal over this rank's s = seq/cp queries and keys (under CP: the ring's diagonal block); a layer of local
    # attention runs its fused kernel on what it keeps (_flash), an eager one computes every score and masks them
    if p.attention == "eager":
        _eager_core(w, pass_, sh.b, sh.s, sh.s, sh.heads, d_qk, d_v, True, _has_dropout(m))
    elif w.unpad:
        _varlen_core(w, sh, pass_, d_qk, d_v)
    else:
        _flash(w, "flash attention " + pass_, pass_, sh, d_qk, d_v)


def _flash(w: _Writer, name: str, pass_: str, sh: _Shape, d_qk: float, d_v: float) -> None:
    """The fused causal attention kernel of one layer over this rank's s queries and keys: a sliding window's
    kernel skips the tiles outside the window (``Kernel.window``); chunked attention (Llama 4) is causal
    attention within each chunk, a kernel over the b·s/c chunks of c tokens (and the shorter last one)."""
    kind, n = w.local
    if kind == "chunked" and n < sh.s:
        full, rest = divmod(int(sh.s), n)
        w.attention(name, pass_, sh.b * full, n, n, sh.heads, d_qk, d_v, True)
        if rest:
            w.attention(name + " (last chunk)", pass_, sh.b, rest, rest, sh.heads, d_qk, d_v, True)
        return
    w.attention(name, pass_, sh.b, sh.s, sh.s, sh.heads, d_qk, d_v, True, window=n if kind == "sliding" else 0)


def _varlen_core(w: _Writer, sh: _Shape, pass_: str, d_qk: float, d_v: float) -> None:
    """llm-foundry's ``attn_impl: flash`` (llmfoundry/models/layers/attention.py ``flash_attn_fn``): Q, K and V
    each go through flash-attn's ``bert_padding.unpad_input`` (IndexFirstAxis: a ``torch.gather`` of the
    (b·s, width) rows, index broadcast: read and write every element) into flash-attn 2's varlen kernel, whose
    output ``pad_input`` scatters back (IndexPutFirstAxis: a zeroed output, then the rows written: 3 passes).
    Backward: the pad's gather of the output gradient (2 passes), the varlen kernel, then each unpad's
    backward (a zeroed gradient and ``scatter_``: 3 passes). Every token is kept (pretraining has no padding),
    so the varlen kernel runs the padded batch's shape. The host syncs of ``unpad_input`` (``nonzero``,
    ``max().item()``) are not priced."""
    q = sh.T * sh.heads * d_qk                  # elements per rank
    k, v = sh.T * sh.kv * d_qk, sh.T * sh.kv * d_v
    o = sh.T * sh.heads * d_v
    if pass_ == "fwd":
        w.ew("unpad q, k, v (flash-attn varlen)", 2 * w.a * (q + k + v))
        _flash(w, "flash attention fwd", pass_, sh, d_qk, d_v)
        w.ew("pad attention output", 3 * w.a * o)
        return
    w.ew("pad attention output bwd", 2 * w.a * o)
    _flash(w, "flash attention bwd", pass_, sh, d_qk, d_v)
    w.ew("unpad q, k, v bwd", 3 * w.a * (q + k + v))


def _eager_core(w: _Writer, pass_: str, b: float, sq: float, skv: float, heads: float, d_qk: float,
                d_v: float, causal: bool, dropout: bool) -> None:
    """The attention core without FlashAttention: the s×s scores go through HBM (``--attention eager``).

    Megatron's CoreAttention (the GPT runs of Narayanan et al. 2021 and Korthikanti et al. 2022): scores
    S = Q·Kᵀ as a batched GEMM (``torch.baddbmm``, the 1/√d scale in its alpha), one fused scale-mask-softmax
    kernel (``FusedScaleMaskSoftmax``: read S, write P), attention dropout (``torch.nn.Dropout``: read P, write
    the dropped P and a 1-byte mask) where the model trains with dropout, then O = P·V (``torch.bmm``).
    Unfused stacks (PyTorch's math SDPA path) apply the causal mask as its own kernel before the softmax.
    Backward: dP = dO·Vᵀ and dV = Pᵀ·dO, the dropout's mask multiply, the softmax backward (read dP and P,
    write dS), the mask's where() (unfused), dQ = dS·K and dK = dSᵀ·Q. Every position of the s×s block is
    computed (no causal skipping). Each batched GEMM runs over b·heads matrices; elementwise kernels move
    their bytes through HBM. (Context parallelism needs FlashAttention: ParallelPlan rejects it with eager.)"""
    bh = b * heads
    a = w.a
    el = bh * sq * skv                        # score elements
    mask_kernel = causal and not w.fused
    if pass_ == "fwd":
        w.gemm("attention scores (QK^T)", sq, skv, d_qk, bh, fp8_ok=False)
        if mask_kernel:
            w.ew("causal mask", el * 2 * a)
        w.ew("scale-mask-softmax (fused)" if w.fused else "softmax", el * 2 * a)
        if dropout:
            w.ew("attention dropout", el * (2 * a + 1))
        w.gemm("attention values (PV)", sq, d_v, skv, bh, fp8_ok=False)
        return
    w.gemm("attention values (PV) dgrad dP", sq, skv, d_v, bh, fp8_ok=False)
    w.gemm("attention values (PV) dgrad dV", skv, d_v, sq, bh, fp8_ok=False)
    if dropout:
        w.ew("attention dropout bwd", el * (2 * a + 1))
    w.ew("softmax bwd", el * 3 * a)
    if mask_kernel:
        w.ew("causal mask bwd", el * 2 * a)
    w.gemm("attention scores (QK^T) dgrad dQ", sq, d_qk, skv, bh, fp8_ok=False)
    w.gemm("attention scores (QK^T) dgrad dK", skv, d_qk, sq, bh, fp8_ok=False)


def _ssd_gemms(m: ModelSpec, sh: _Shape) -> list[tuple[str, float, float, float, float]]:
    """The SSD scan's matmuls on this rank (Dao & Gu 2024, sec. 6; mamba_ssm's Triton kernels
    _bmm_chunk_fwd, _chunk_state_fwd, _chunk_scan_fwd): (name, m, n, k, batch) per chunk of Q tokens, each
    batched over the micro-batch's chunks and this rank's heads (or B/C groups)."""
    q = min(m.mamba_chunk, sh.s)
    chunks = sh.b * math.ceil(sh.s / q)
    heads, groups = m.mamba_heads / sh.tp, m.mamba_groups / sh.tp
    n, p = m.mamba_state, m.mamba_head_dim
    return [("ssd C·Bᵀ", q, q, n, chunks * groups), ("ssd chunk states", n, p, q, chunks * heads),
            ("ssd intra-chunk outputs", q, p, q, chunks * heads), ("ssd inter-chunk outputs", q, p, n, chunks * heads)]


def _mamba_block(w: _Writer, m: ModelSpec, sh: _Shape, phase: str) -> None:
    """A Mamba-2 layer as Megatron-Core's MambaMixer runs it (norm fused into in_proj, mamba_ssm's fused
    conv + scan, whose last kernel applies the gate silu(z), the mixer's group RMSNorm, out_proj) and its
    residual. The SSD scan is priced as its matmuls at the GEMM curve (BF16: the Triton kernels run tl.dot)
    and its chunk states' traffic at HBM bandwidth: no SSD kernel measurement is in the data. Backward: the
    fused function recomputes the conv and the scan's C·Bᵀ and chunk states, then runs two gradient matmuls
    per forward one."""
    T, h, a = sh.T, sh.h, w.a
    di, conv = m.mamba_inner / sh.tp, m.mamba_conv_width() / sh.tp
    heads = m.mamba_heads / sh.tp
    q = min(m.mamba_chunk, sh.s)
    # the chunk states (b, chunks, heads, P, N): _chunk_state_fwd writes them in fp32 (2 bytes beyond the
    # matmul's output as counted), _state_passing_fwd reads them and writes the passed states in the activation
    # dtype, which the inter-chunk matmul reads (counted there); its backward reads and writes fp32 gradients
    states = sh.b * math.ceil(sh.s / q) * heads * m.mamba_head_dim * m.mamba_state
    passing, passing_bwd = states * (FP32 - a + FP32 + a), states * (FP32 + FP32 + (FP32 - a) + a)
    gemms = _ssd_gemms(m, sh)
    if phase == BACKWARD_WEIGHT:
        _linear(w, "out_proj", phase, T, h, di)
        _linear(w, "in_proj", phase, T, m.mamba_in_width() / sh.tp, h)
        return
    if phase == FORWARD:
        _norm(w, "input norm", sh.rows, h, False, True)
        _linear(w, "in_proj", phase, T, m.mamba_in_width() / sh.tp, h)
        w.ew("conv1d + silu", T * conv * 2 * a)
        w.ew("ssd dt softplus + cumsum", T * heads * (a + 2 * FP32))
        for name, mm, nn, kk, batch in gemms:
            w.gemm(name, mm, nn, kk, batch, fp8_ok=False)
            if name == "ssd chunk states":
                w.ew("ssd state passing", passing)
        w.ew("ssd gate y·silu(z) (in the scan kernel)", T * di * 2 * a)    # reads z, writes y beside the output
        w.ew("group rmsnorm", T * di * 2 * a)
        w.cast("out_proj input fp8 cast", T * di)
        _linear(w, "out_proj", phase, T, h, di)
        _residual(w, "mamba residual", sh.rows, h, _has_dropout(m), False)
        return
    _residual(w, "mamba residual", sh.rows, h, _has_dropout(m), True)
    _linear(w, "out_proj", phase, T, h, di)
    w.ew("group rmsnorm bwd", T * di * 3 * a)
    w.ew("ssd gate bwd", T * di * 5 * a)          # reads z, y and the gradient, writes dz and dy
    for name, mm, nn, kk, batch in gemms[:2]:       # recomputed: C·Bᵀ, the chunk states and their passing
        w.gemm(f"{name} (recompute)", mm, nn, kk, batch, fp8_ok=False)
    w.ew("ssd state passing (recompute)", passing)
    w.ew("ssd state passing bwd", passing_bwd)
    for name, mm, nn, kk, batch in gemms:           # the gradients of both operands of each matmul
        w.gemm(f"{name} bwd (left)", mm, kk, nn, batch, fp8_ok=False)
        w.gemm(f"{name} bwd (right)", kk, nn, mm, batch, fp8_ok=False)
    w.ew("ssd dt bwd", T * heads * (2 * a + 2 * FP32))
    w.ew("conv1d bwd (+ recompute)", T * conv * 5 * a)
    _linear(w, "in_proj", phase, T, m.mamba_in_width() / sh.tp, h)
    _norm(w, "input norm", sh.rows, h, True, True)


def _mlp(w: _Writer, m: ModelSpec, sh: _Shape, phase: str, width: float, rows: float, name: str,
         batch: float = 1) -> None:
    """A dense or expert MLP on ``rows`` tokens (per expert when batch > 1), ``width`` inner size per rank."""
    gated, h = m.gated_mlp, sh.h
    back = phase != FORWARD
    up = [("fc1 (gate+up)", 2 * width)] if (gated and w.fused) else (
        [("w1 (gate)", width), ("w3 (up)", width)] if gated else [("fc1", width)])
    dense = name == "mlp"           # LoRA adapters sit beside a dense MLP's linears (not experts')
    fc1, fc2 = ("fc1", "fc2") if dense else ("", "")
    if not back:
        for nm, n in up:
            _linear(w, f"{name} {nm}", phase, rows, n, h, batch, target=fc1)
        _activation(w, rows * batch, width, gated, False, w.fp8)
        _linear(w, f"{name} fc2", phase, rows, h, width, batch, target=fc2)
    else:
        _linear(w, f"{name} fc2", phase, rows, h, width, batch, target=fc2)
        if phase != BACKWARD_WEIGHT:
            _activation(w, rows * batch, width, gated, True, False)
        for nm, n in up:
            _linear(w, f"{name} {nm}", phase, rows, n, h, batch, target=fc1)


def _mlp_block(w: _Writer, m: ModelSpec, sh: _Shape, phase: str, moe: bool) -> None:
    """Norm, dense MLP (or router + shared experts of an MoE layer), residual."""
    h, T = sh.h, sh.T
    dropout = _has_dropout(m)
    back = phase != FORWARD
    if not back:
        _norm(w, "post-attention norm", sh.rows, h, False, not moe)
    elif phase != BACKWARD_WEIGHT:
        _residual(w, "mlp residual", sh.rows, h, dropout, True)
    if moe:
        _linear(w, "router", phase, sh.rows, m.experts, h, fp8_ok=False)
        if not back:
            w.ew("router softmax/top-k", sh.rows * m.experts * (w.a + FP32) + sh.rows * m.top_k * 8)
        if m.shared_experts:
            _mlp(w, m, sh, phase, m.shared_experts * m.expert_ffn / sh.tp, T, "shared expert")
    else:
        _mlp(w, m, sh, phase, m.ffn / sh.tp, T, "mlp")
    if not back:
        _residual(w, "mlp residual", sh.rows, h, dropout, False)
    elif phase != BACKWARD_WEIGHT:
        _norm(w, "post-attention norm", sh.rows, h, True, not moe)


def _experts(w: _Writer, m: ModelSpec, p: ParallelPlan, sh: _Shape, phase: str, load: float) -> None:
    """Routed experts on this EP rank: permute, grouped GEMMs, activation, unpermute. Unfolded, the rank
    computes its TP shard of its experts for all the micro-batch's tokens routed to them (gathered over TP);
    folded, for the tokens its expert-TP group (etp ranks, T/tp each) routes to them."""
    local = max(1, m.experts // p.ep)
    tokens = sh.T / p.tp * p.expert_tp              # the expert-TP group's tokens (sh.T when etp = tp)
    routed = tokens * m.top_k * load                 # token-expert pairs this rank computes
    per_expert = routed / local
    if phase != BACKWARD_WEIGHT:
        w.ew("moe permute" + (" bwd" if phase != FORWARD else ""), routed * sh.h * 2 * w.a)
    if phase == FORWARD:    # TE's GroupedLinear quantizes its (permuted) input: no norm to fuse the cast into
        w.cast("experts fc1 input fp8 cast", routed * sh.h)
    _mlp(w, m, sh, phase, m.expert_ffn / p.expert_tp, per_expert, "experts (grouped)", batch=local)
    if phase != BACKWARD_WEIGHT:
        w.ew("moe unpermute" + (" bwd" if phase != FORWARD else ""), routed * sh.h * 2 * w.a + tokens * sh.h * w.a)


def _head(w: _Writer, m: ModelSpec, sh: _Shape, phase: str) -> None:
    """The final norm, LM head and loss; then, with multi-token prediction, each MTP module's parts besides its
    transformer layer (a layer unit of its own): the embedding of the shifted tokens, enorm and hnorm, eh_proj
    (2h -> h, column-parallel) and its own final norm, pass through the shared head and loss. Megatron-Core runs
    those parts before and after the module's layer; they are priced here, after it, on the same stream.

    An eager loss (torchtitan's ``F.cross_entropy(pred.float(), ...)``) runs log_softmax as one kernel and, in
    backward, nll_loss's zeroed gradient then log_softmax's backward. Under TP, torchtitan wraps it in
    ``loss_parallel()`` (the default while TP is on) and DTensor runs torch.distributed.tensor.parallel.loss's
    decomposition on each vocabulary shard: log_softmax as amax, x - max, exp, sum and - logsumexp, and one
    fused nll_loss + log_softmax backward, (zeros + exp(logp)) * grad, each op a pass over the fp32 logits."""
    v = m.vocab / sh.tp
    T, h = sh.T, sh.h
    loss_parallel = not w.fused_ce and sh.tp > 1
    for k in range(m.mtp_layers + 1):
        pre = f"mtp {k} " if k else ""
        if phase == FORWARD:
            if k:
                w.ew(f"{pre}embedding gather", T * h * 2 * w.a)
                _norm(w, f"{pre}enorm", sh.rows, h, False, False)
                _norm(w, f"{pre}hnorm", sh.rows, h, False, False)
                _linear(w, f"{pre}eh_proj", phase, T, h / sh.tp, 2 * h)
            _norm(w, f"{pre}final norm", sh.rows, h, False, False)
            _linear(w, f"{pre}lm head", phase, T, v, h, fp8_ok=False)
            if w.fused_ce:  # fused cross-entropy (Megatron vocab-parallel, flash-attn xentropy): one read of the logits
                w.ew(f"{pre}cross-entropy (fused)", T * v * w.a)
            else:
                w.ew(f"{pre}logits float cast", T * v * (w.a + FP32))
                if loss_parallel:
                    w.ew(f"{pre}log_softmax (loss parallel: amax, x - max, exp, sum, - logsumexp)", T * v * 8 * FP32)
                else:
                    w.ew(f"{pre}log_softmax", T * v * 2 * FP32)
            if not k:
                for i in range(w.train_metrics):    # no-grad eager cross-entropies of the train metrics
                    w.ew(f"train metric {i + 1} logits float cast", T * v * (w.a + FP32))
                    w.ew(f"train metric {i + 1} log_softmax", T * v * 2 * FP32)
            continue
        if phase != BACKWARD_WEIGHT:
            if w.fused_ce:
                w.ew(f"{pre}cross-entropy bwd (fused)", T * v * 2 * w.a)
            else:
                if loss_parallel:
                    w.ew(f"{pre}nll_loss + log_softmax bwd (loss parallel: zeros, exp, add, mul)", T * v * 8 * FP32)
                else:
                    w.ew(f"{pre}nll_loss grad (zeros)", T * v * FP32)
                    w.ew(f"{pre}log_softmax bwd", T * v * 3 * FP32)
                w.ew(f"{pre}logits grad cast", T * v * (FP32 + w.a))
        _linear(w, f"{pre}lm head", phase, T, v, h, fp8_ok=False)
        if phase != BACKWARD_WEIGHT:
            _norm(w, f"{pre}final norm", sh.rows, h, True, False)
        if k:
            _linear(w, f"{pre}eh_proj", phase, T, h / sh.tp, 2 * h)
            if phase != BACKWARD_WEIGHT:
                _norm(w, f"{pre}enorm", sh.rows, h, True, False)
                _norm(w, f"{pre}hnorm", sh.rows, h, True, False)
            if phase != BACKWARD_INPUT and not w.frozen:     # into the last stage's embedding copy (as _embedding)
                w.ew(f"{pre}embedding grad", T * h * (w.a + 2 * FP32))


def _embedding(w: _Writer, sh: _Shape, vocab: int, phase: str, learned_positions: bool = False) -> None:
    if phase == FORWARD:
        w.ew("embedding gather", sh.T * sh.h * 2 * w.a)
        if learned_positions:
            w.ew("position embedding add", sh.T * sh.h * 3 * w.a)
    elif phase != BACKWARD_INPUT and not w.frozen:
        # dense fp32 gradient zeroed, then scatter-added (read + write) per token
        w.ew("embedding grad", vocab / sh.tp * sh.h * FP32 + sh.T * sh.h * (w.a + 2 * FP32))


# ---------------------------------------------------------------------------------------------- entry point
def phase_kernels(model: ModelSpec, plan: ParallelPlan, layer: int | None, phase: str, *, part: str = "layer",
                  load: float = 1.0, recompute: bool = True) -> KernelList:
    """The kernels of one op: ``part`` of layer ``layer`` in ``phase`` on one rank and micro-batch.

    ``load`` scales the routed tokens of an MoE layer (routing skew); ``recompute`` adds the plan's
    recomputation to backward / backward_input. Cached: equal arguments return the same object."""
    stack = getattr(plan, "stack", None) or "megatron"
    dtype = getattr(plan, "dtype", None) or "bf16"
    check_choice(stack, dtype)
    if part not in PARTS:
        raise PlanError(f"unknown kernel part {part!r}; known: {', '.join(PARTS)}")
    moe = layer is not None and model.is_moe_layer(layer)
    # the layer's attention: the routed experts' kernels are the same in every layer of a kind
    local = model.local_attention(layer) if layer is not None and part != "experts" else GLOBAL_ATTENTION
    kind = model.layer_kind(layer) if layer is not None and part != "experts" else ""
    rc = plan.layer_recompute(layer) if recompute else "none"
    return _cached(model, plan, moe, local, phase, part, round(load, 9), rc, stack, dtype, kind)


def recompute_kernels(model: ModelSpec, plan: ParallelPlan, layer: int, part: str = "layer",
                      load: float = 1.0) -> KernelList:
    """The kernels layer ``layer``'s recomputation runs before its backward (``plan.layer_recompute``)."""
    stack = getattr(plan, "stack", None) or "megatron"
    dtype = getattr(plan, "dtype", None) or "bf16"
    check_choice(stack, dtype)
    moe = model.is_moe_layer(layer)
    rc = plan.layer_recompute(layer)
    w = _Writer(stack, dtype, model.dtype_bytes, getattr(plan, "attention_kernel", "auto"),
                getattr(plan, "fp8_recipe", "delayed")).lora(plan)
    w.local = model.local_attention(layer) if part != "experts" else GLOBAL_ATTENTION
    w.kind = model.layer_kind(layer) if part != "experts" else ""
    if part in ("layer", "attention", "experts"):
        _recompute(w, model, plan, moe, part, round(load, 9), rc, stack, dtype)
    return KernelList(f"{part} recompute ({rc})", w.out, stack, dtype)


def op_policy(model: ModelSpec, kernels) -> tuple[list[Kernel], list[Kernel]]:
    """torchtitan's per-op selective checkpointing (``_apply_ac_to_transformer_block`` with
    ``selective_ac_option = "op"``, parallelisms/parallelize_llama.py at 2847ccce) applied to a block's
    forward kernels: (saved, recomputed). Its policy keeps the outputs of ``_save_list`` ops (aten.mm, the SDPA
    flash / efficient attention ops, reduce_scatter_tensor; later commits add aten.max) "except every second
    mm": the 2nd, 4th, ... aten.mm of the block (wk, wo, w3 in torchtitan's Llama) are recomputed with every
    pointwise op (norms, rotary, SiLU, multiply, residual add, casts). Float8 linears reach the policy as
    aten.mm on Float8Tensor arguments, so FP8 GEMMs count alike. Non-reentrant checkpointing stops
    recomputing once every tensor backward needs is rebuilt (``set_checkpoint_early_stop``, on by default),
    so the block's last residual add (after the last mm; an add saves nothing) is not re-run. The TP
    collectives of recomputed ops are not issued again here (torchtitan's policy saves reduce_scatter
    outputs, so with SP only the all-gathers would repeat); full recomputation re-issues the layer's forward
    collectives (schedules.generate)."""
    saved, rec = [], []
    mm = 0
    for k in kernels:
        if k.kind == GEMM:
            mm += 1
            (saved if mm % 2 else rec).append(k)
        elif k.kind == ATTENTION or k.name.startswith(CP_PREFIX):
            saved.append(k)
        else:
            rec.append(k)
    last_gemm = max((i for i, k in enumerate(rec) if k.kind == GEMM), default=-1)
    if not _has_dropout(model):
        rec = [k for i, k in enumerate(rec) if i < last_gemm or not k.name.startswith("mlp residual")]
    return saved, rec


def _recompute(w: _Writer, model, plan, moe, part, load, rc, stack, dtype) -> None:
    """Append the recomputation of one layer part (mode ``rc``) to ``w`` (a layer of ``w.local`` attention)."""
    if rc == "full":
        w.out.extend(_cached(model, plan, moe, w.local, FORWARD, part, load, "none", stack, dtype, w.kind).kernels)
    elif rc == "selective":
        _recompute_modules(w, model, plan, moe, part, load)
    elif rc == "op":
        w.out.extend(op_policy(model, _cached(model, plan, moe, w.local, FORWARD, part, load, "none", stack,
                                              dtype, w.kind))[1])


def recomputed_norms(m: ModelSpec, p: ParallelPlan, moe: bool) -> tuple[bool, bool]:
    """(input norm, pre-MLP norm) that recompute module ``layernorm`` re-runs. Megatron-Core recomputes a norm
    only where it is a module of its own: with Transformer Engine the input norm is fused into the QKV linear
    (TELayerNormColumnParallelLinear) except under MLA, whose down-projections take a separate TENorm, and the
    pre-MLP norm into fc1 except in an MoE layer (the router and the dispatcher read it). Other stacks keep
    both norms separate."""
    if getattr(p, "recompute", "none") != "selective" or "layernorm" not in getattr(p, "recompute_modules", ()):
        return False, False
    if (getattr(p, "stack", None) or "megatron") == "megatron":
        return bool(m.is_mla), moe
    return True, True


def _recompute_modules(w: _Writer, m: ModelSpec, p: ParallelPlan, moe: bool, part: str, load: float) -> None:
    """Megatron-Core's selective recomputation of ``p.recompute_modules`` (``schedules.plan.RECOMPUTE_MODULES``)
    for one layer part: the forward kernels of each module, in the layer's order. ``core_attn`` alone is
    Megatron's selective recomputation (the attention core)."""
    mods = getattr(p, "recompute_modules", DEFAULT_RECOMPUTE_MODULES)
    sh = _Shape(m, p)
    T, h = sh.T, sh.h
    norm_in, norm_post = recomputed_norms(m, p, moe)
    mixer, mlp = hybrid_blocks(w.kind)
    mixer = mixer and w.kind != "M"        # (a Mamba-2 block has no recompute module)
    if part in ("layer", "attention") and mixer:
        if norm_in:
            _norm(w, "input norm", sh.rows, h, False, True)
        if "mla_up_proj" in mods and m.is_mla:
            qk = m.d_head + m.qk_rope_dim
            if m.q_lora_rank:
                _linear(w, "q up", FORWARD, T, sh.heads * qk, m.q_lora_rank)
            _linear(w, "kv up", FORWARD, T, sh.heads * (m.d_head + m.v_head_dim), m.kv_lora_rank)
            if m.position_embedding == "rope":
                _rotary(w, T, (sh.heads + sh.kv) * m.qk_rope_dim)
        if "core_attn" in mods:
            _core(w, m, p, sh, "fwd")
    if part in ("layer", "attention") and mlp:
        if norm_post:
            _norm(w, "post-attention norm", sh.rows, h, False, not moe)
        if moe:
            if "moe" in mods:
                _linear(w, "router", FORWARD, sh.rows, m.experts, h, fp8_ok=False)
                w.ew("router softmax/top-k", sh.rows * m.experts * (w.a + FP32) + sh.rows * m.top_k * 8)
            if m.shared_experts and ("moe" in mods or "shared_experts" in mods):
                _mlp(w, m, sh, FORWARD, m.shared_experts * m.expert_ffn / sh.tp, T, "shared expert")
        elif "mlp" in mods:
            _mlp(w, m, sh, FORWARD, m.ffn / sh.tp, T, "mlp")
    if part in ("layer", "experts") and moe:
        if "moe" in mods:
            _experts(w, m, p, sh, FORWARD, load)
        elif "moe_act" in mods:
            routed = sh.T / p.tp * p.expert_tp * m.top_k * load
            _activation(w, routed, m.expert_ffn / p.expert_tp, m.gated_mlp, False, w.fp8)


@lru_cache(maxsize=4096)
def _cached(model, plan, moe, local, phase, part, load, rc, stack, dtype, kind="") -> KernelList:
    """The kernels of one op of a layer kind: MoE or dense, its local attention (``ModelSpec.local_attention``),
    its hybrid-pattern block (``ModelSpec.layer_kind``: "" a transformer layer)."""
    w = _Writer(stack, dtype, model.dtype_bytes, getattr(plan, "attention_kernel", "auto"),
                getattr(plan, "fp8_recipe", "delayed")).lora(plan)
    w.local = local
    w.kind = kind
    sh = _Shape(model, plan)
    mixer, mlp = hybrid_blocks(kind)
    if phase in (BACKWARD, BACKWARD_INPUT) and part in ("layer", "attention", "experts"):
        _recompute(w, model, plan, moe, part, load, rc, stack, dtype)
    if part in ("layer", "attention") and phase == FORWARD:
        if kind == "M":
            _mamba_block(w, model, sh, phase)
        elif mixer:
            _attention_block(w, model, plan, sh, phase)
        if mlp:
            _mlp_block(w, model, sh, phase, moe)
    elif part in ("layer", "attention"):      # backward runs the MLP block's kernels first
        if mlp:
            _mlp_block(w, model, sh, phase, moe)
        if kind == "M":
            _mamba_block(w, model, sh, phase)
        elif mixer:
            _attention_block(w, model, plan, sh, phase)
    elif part == "experts":
        _experts(w, model, plan, sh, phase, load)
    elif part == "ring":
        d_qk, d_v = attention_head_dims(model)
        passes = ["fwd"] if phase == FORWARD else (
            ["fwd", "bwd"] if rc == "full" or (rc == "selective" and "core_attn" in plan.recompute_modules)
            else ["bwd"])
        for ps in passes:   # an off-diagonal KV block: _ring_block_kernels
            _ring_block_kernels(w, sh, ps, d_qk, d_v)
            _cp_passes(w, sh, ps, d_qk, d_v, attention_kv_heads(model, plan), own_block=False)
        if phase == BACKWARD_WEIGHT:
            w.out.clear()
    elif part == "head":
        _head(w, model, sh, phase)
    elif part == "embedding":
        _embedding(w, sh, model.vocab, phase, model.position_embedding == "learned")
    if w.fp8 and part in ("layer", "attention", "experts") and phase == FORWARD:
        # FP8 weights: cast (row + column-wise) once per step, amortised over the micro-batches
        params = {"": model.attention_params() + (0 if moe else model._mlp_params(model.ffn)),
                  "M": model.mamba_linear_params(), "*": model.attention_params(), "-": model._mlp_params(model.ffn),
                  "E": 0}[kind] / plan.tp
        if part == "experts":
            params = model.experts // plan.ep * model.expert_params() / plan.expert_tp
        n_mb = max(1, plan.num_microbatches)
        fp8_params = getattr(plan, "fp8_param_gather", False)
        # (frozen FP8 parameters of a LoRA plan: cast once when loaded, their transposes cached ever after)
        if fp8_params and not getattr(plan, "lora_rank", 0):
            # Megatron-Core --fp8-param-gather: after the step the optimizer casts its shard of the fp32 (FP32
            # bytes) main weights to the FP8 parameter (TE cast_master_weights_to_fp8: read 4 bytes, write 1; current
            # scaling reads the shard's amax first); the gathered FP8 weight's column-wise copy is made by a
            # transpose (read 1 byte, write 1) at the step's first micro-batch
            from schedules.memory import shard_degrees       # (memory imports this module)
            dense_shard, expert_shard = shard_degrees(plan)
            shard = params / max(1, expert_shard if part == "experts" else dense_shard)
            if w.amax_read:
                w.ew("fp8 param shard amax (per step / micro-batches)", shard * FP32 / n_mb)
            w.ew("fp8 param shard cast (per step / micro-batches)", shard * (FP32 + 1) / n_mb)
            w.ew("fp8 weight transpose (per step / micro-batches)", params * 2 / n_mb)
        elif not fp8_params:
            if w.amax_read:
                w.ew("fp8 weight amax (per step / micro-batches)", params * w.a / n_mb)
            w.ew("fp8 weight cast (per step / micro-batches)", params * w.cast_bytes / n_mb)
        w.ew("fp8 amax/scale update", 0.0)
    if getattr(plan, "tp_comm_overlap", False) and plan.tp > 1 and part in ("layer", "attention"):
        w.out = _ub_overlap(w.out, dtype, plan.tp)
    attention = {"sliding": " sliding-window", "chunked": " chunked"}.get(local[0], "")
    name = f"{'moe' if moe else 'dense'}{f'{attention} ({local[1]})' if local[0] else ''}"
    if kind:
        name = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}[kind]
    label = f"{name} {part} {phase}" if part in ("layer", "attention", "experts") else f"{part} {phase}"
    return KernelList(label, w.out, stack, dtype)
