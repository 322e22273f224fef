"""ParallelPlan: how a model is split over GPUs, its rank mesh, process groups and validation.

Degrees: world size = dp · tp · pp · cp. Expert parallelism (ep) is carved out of data parallelism as in
Megatron-LM: ep must divide dp, an EP group holds ranks that differ only in the inner ``ep`` part of their
dp coordinate, and expert weights are replicated only dp·cp/ep times (the "edp" group); the experts are
tensor-parallel as the dense layers (etp = tp).

MoE parallel folding (Megatron-Core's expert_tensor_parallel_size, the expert grid of parallel_state): with
an expert TP degree ``etp`` other than tp, or an ep that dp does not hold, the experts get a grid of their
own over each pipeline stage's tp·cp·dp ranks, in rank order: etp innermost, then ep, then the expert
data-parallel degree edp = tp·cp·dp / (ep·etp) ("etp", "ep", "edp" groups). DeepSeek-V3's recipes run
TP2 with EP64 and etp 1 on 32-way data parallelism this way.

``expert_grid``: Megatron-Core from 0.10 (NeMo 24.12 on) always builds that expert grid
(``RankGenerator(tp=etp, ep, dp=edp, pp, cp=1)``), also with etp = tp. It equals the carved grid above when
cp = 1; with cp > 1 its EP groups take context-parallel peers first (ep index = (local // etp) % ep, local =
tp + tp·cp_index + tp·cp·dp_index), where the carved grid of Megatron-Core <= 0.9 strides EP over tp·cp
ranks. "folded" (the default) folds every plan with ep > 1 and cp > 1 (and those above); "carved" keeps
the older grid where it can (etp = tp and ep dividing dp).

Rank mesh: ``axis_order`` lists the axes from innermost (fastest-varying rank) to outermost. Megatron's
default "tp-cp-ep-dp-pp" keeps a TP group on consecutive ranks (inside one NVLink domain). When "ep" is in
the order, the "dp" axis stands for the outer dp/ep part of data parallelism.

Process-group families: tp, cp, dp, pp, ep, etp (expert TP: the tp groups unless folded), plus "dp_cp" (dense gradient reduction when cp > 1: CP ranks
hold the same weights), "edp" (expert gradient reduction when ep > 1) and "embed" (first and last stage,
tied embeddings), "mirror" (DualPipe: stages s and pp-1-s, which hold copies of the same two pieces).
Units: bytes, tokens.
"""
from __future__ import annotations

import dataclasses
import functools
import heapq
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from schedules import pipeline as pl
from simulator.errors import ConfigError, PlanError
from simulator.inputs import MAX_BYTES, brief

SCHEDULE_NAMES = tuple(pl.SCHEDULES)
RECOMPUTE = ("none", "selective", "full", "op")
#: Megatron-Core's fine-grained recomputation (``--recompute-granularity selective --recompute-modules``,
#: TransformerConfig.recompute_modules; its default is core_attn): core_attn the attention core, layernorm the
#: input and pre-MLP norms, mla_up_proj the MLA up-projections and rotary, mlp a dense layer's MLP, moe_act the
#: routed experts' activation, moe the whole MoE block (router, dispatch, experts, combine: its all-to-alls run
#: again), shared_experts the shared experts' MLP. layernorm, mla_up_proj and moe_act checkpoint without
#: keeping their outputs (CheckpointWithoutOutput); the others keep their inputs.
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe_act", "moe", "shared_experts")
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)     # Megatron's selective recomputation: the attention core
ATTENTION = ("flash", "eager")
ATTENTION_KERNELS = ("auto", "flash2", "triton")      # FlashAttention kernels (schedules.kernels.ATTENTION_IMPL)
RESHARD = ("auto", "true", "false")
EXPERT_GRIDS = ("folded", "carved")
#: MoE token dispatchers: Megatron-Core's alltoall (each token sent once per routed expert) and the
#: deduplicating ones of its flex dispatcher, DeepEP and HybridEP (once per destination GPU inside a scale-up
#: domain, once per destination domain across domains: RDMA to one GPU there, NVLink forwarding inside)
MOE_DISPATCHERS = ("alltoall", "deepep", "hybridep")
LORA_TARGETS = ("qkv", "proj", "fc1", "fc2")   # linears that can carry LoRA adapters (all four: the default)
LORA_STYLES = ("megatron", "dtensor")           # how adapters run under TP (ParallelPlan.lora_style)
AXES = ("tp", "cp", "ep", "dp", "pp")


@dataclass(frozen=True)
class ParallelPlan:
    """A parallel training plan (all sizes are per step unless noted).

    dp, tp, pp, ep, cp   data, tensor, pipeline, expert and context parallel degrees
    etp                  expert tensor-parallel degree (0 = tp; see "MoE parallel folding" above)
    expert_grid          folded (Megatron-Core >= 0.10) | carved (<= 0.9): the EP groups' grid with cp > 1 (above)
    sp                   sequence parallelism with TP (norms/dropout sharded over the sequence)
    zero                 ZeRO stage 0-3 (0 = plain DDP); ``fsdp=True`` is ZeRO-3 with FSDP's per-layer units
    micro_batch          sequences per micro-batch per DP replica
    global_batch         sequences per step over the whole job (default micro_batch · dp · m with
                         m = 4·pp micro-batches under PP, 1 without)
    schedule             pipeline schedule: gpipe | 1f1b | interleaved | zb / zb-h1 | zb-h2 | zb-v | zb-auto |
                         dualpipe | dualpipev (``schedules.pipeline``)
    virtual_stages       model chunks per pipeline rank (interleaved 1F1B; zb-v and dualpipe(v) hold 2)
    memory_limit         zb-auto: activations a stage may hold, in micro-batches of that stage (default pp:
                         ZB-1p; 2·pp: ZB-2p)
    memory_limit_bytes   zb-auto: the same limit in bytes of activations per rank (converted with the
                         busiest stage's activations per micro-batch)
    stage_layers         layers per pipeline stage (pp entries) or per model piece (pp·chunks entries, piece
                         order); None = balanced by estimated time (``piece_layer_counts``)
    first_stage_layers, last_stage_layers: layers of the first and last model piece (Megatron's
                         decoder_first/last_pipeline_num_layers); the rest are balanced
    bucket_bytes         gradient bucket size (PyTorch DDP's default 25 MB)
    recompute            activation recomputation: none | selective (Megatron: the attention core) | full
                         (whole layer) | op (torchtitan's per-op selective checkpointing: matmul and
                         attention outputs kept, every other matmul and the pointwise ops recomputed)
    recompute_modules    with recompute selective: the modules recomputed (``RECOMPUTE_MODULES``, Megatron's
                         names); default core_attn, Megatron's selective recomputation
    recompute_every      with recompute full: only every N-th layer is checkpointed (layers l with
                         (l + 1) % N == 0), the others keep all activations; torchtitan's
                         ``selective_ac_option = N`` ("selective layer"); 1 = every layer
    seq                  sequence length (tokens)
    overlap_grad_reduce  launch gradient reductions during backward (else after it)
    overlap_param_gather ZeRO-1/2: gather updated parameters on the comm stream (else blocking the step end)
    fsdp_prefetch        ZeRO-3/FSDP: how many layers ahead parameters are all-gathered
    axis_order           rank mesh order, innermost first
    skew                 MoE routing skew: EP rank e gets (1 + skew·(1 - 2e/(ep-1))) times the uniform
                         expert load (busiest +skew, least busy -skew); 0 = uniform routing
    layer_split          "balanced" (layer counts balance estimated stage time, embedding and LM head
                         included: Llama 3 405B's 126 layers on 16 stages get 7 on the first and last) or
                         "even" (require divisibility)
    grad_bytes_per_param, optimizer_bytes_per_param: mixed-precision Adam stores 2-byte gradients and
                         12 bytes of optimizer state (fp32 master weights, momentum, variance) per
                         parameter: 16 bytes with the 2-byte weights (Rajbhandari et al. 2020, sec. 3.1)
    attention            flash (FlashAttention: no s×s scores kept, the default) | eager (the s×s scores
                         go through HBM and are kept: schedules.kernels prices QK^T, softmax, dropout, PV)
    attention_kernel     the FlashAttention kernel priced (attention flash only): auto (the stack's:
                         megatron Transformer Engine's, cuDNN on Hopper+ and FlashAttention-2 on Ampere;
                         llm-foundry the Triton kernel; torchtitan FlashAttention-2) | flash2 | triton
    fsdp_reshard_after_forward  ZeRO-3/FSDP: free gathered parameters after each forward: auto (only without
                         PP, as torchtitan) | true | false (see schedules.memory, FSDP residency)
    dtype                GEMM precision: bf16 | fp8 (FP8 transformer-block GEMMs, schedules.kernels)
    fp8_recipe           Transformer Engine's FP8 scaling (megatron stack): delayed | current | mxfp8
                         (schedules.kernels.FP8_RECIPES: current reads each tensor's amax before its cast;
                         mxfp8 writes block scales and its norms write BF16 before a quantize)
    fp8_param_gather     Megatron-Core's ``--fp8-param-gather`` (dtype fp8, megatron stack, distributed
                         optimizer: zero 1 or 2): the transformer-block GEMM weights are kept in FP8 only (no
                         BF16 copy), the optimizer casts its updated shard and the parameter all-gather carries
                         1 byte per such weight (schedules.memory, schedules.generate, schedules.kernels)
    stack                training stack whose kernels are priced: megatron | torchtitan | llm-foundry (schedules.kernels)
    grad_reduce_dtype    precision of the data-parallel gradient reduction: auto (the stack's: fp32 under
                         torchtitan and llm-foundry, the gradients' own under megatron) | bf16 | fp32
    tp_comm_overlap      Megatron-Core + Transformer Engine's TP communication overlap (userbuffers;
                         Megatron-Bridge ``CommOverlapConfig(tp_comm_overlap=True)``): each TP all-gather /
                         reduce-scatter of a layer runs beside the GEMM it feeds or drains, the GEMMs split
                         into chunks and some on fewer SMs (schedules.kernels.UB_OVERLAP); needs tp > 1, sp
                         and the megatron stack
    moe_dispatcher       alltoall (Megatron-Core's alltoall dispatcher: a token goes once to each of its
                         top_k experts' ranks) | deepep | hybridep (Megatron-Core's flex dispatcher: once to
                         each GPU holding one of its experts within a scale-up domain, once to each other
                         domain holding one across domains; see schedules.generate.ep_dispatch_bytes)
    lora_rank            LoRA fine-tuning (Hu et al. 2021): 0 trains every weight; r > 0 freezes the whole model
                         (no weight gradients, gradients and optimizer state only for the adapters) and adds
                         rank-r adapters (x·A·B, A: k×r, B: r×n, BF16) beside the ``lora_targets`` linears of
                         every dense transformer layer (schedules.kernels, schedules.memory, schedules.generate)
    lora_targets         the linears that carry adapters: any of qkv, proj (attention output), fc1, fc2
                         (Megatron-Bridge's LoRA default: all four; NeMo 1 and Megatron-Bridge's Llama 3 70B
                         performance configs: qkv only)
    lora_style           how the adapters run under TP: megatron (Megatron-Bridge's ParallelLinearAdapter, with
                         TP collectives of its own as large as the layer's: schedules.generate) | dtensor (PyTorch
                         DTensor's LoRA-aware parallel styles, NeMo AutoModel: only the rank-r intermediate is
                         gathered or reduced, a few KiB, not priced)
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1
    sp: bool = False
    zero: int = 0
    fsdp: bool = False
    micro_batch: int = 1
    global_batch: int | None = None
    schedule: str = "1f1b"
    virtual_stages: int = 1
    bucket_bytes: float = 25e6
    recompute: str = "none"
    recompute_modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES
    recompute_every: int = 1
    seq: int = 2048
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    fsdp_prefetch: int = 1
    axis_order: str = "tp-cp-ep-dp-pp"
    skew: float = 0.0
    layer_split: str = "balanced"
    memory_limit: float | None = None
    memory_limit_bytes: float | None = None
    stage_layers: tuple | None = None
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    grad_bytes_per_param: float = 2.0
    optimizer_bytes_per_param: float = 12.0
    attention: str = "flash"
    attention_kernel: str = "auto"
    fsdp_reshard_after_forward: str = "auto"
    dtype: str = "bf16"
    fp8_recipe: str = "delayed"
    fp8_param_gather: bool = False
    stack: str = "megatron"
    grad_reduce_dtype: str = "auto"
    etp: int = 0
    expert_grid: str = "folded"
    tp_comm_overlap: bool = False
    moe_dispatcher: str = "alltoall"
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = LORA_TARGETS
    lora_style: str = "megatron"

    # ------------------------------------------------------------------ derived
    @property
    def grad_reduce_bytes(self) -> float:
        """Bytes per gradient element the data-parallel reduction moves (bf16 2, fp32 4; auto: the stack's)."""
        from schedules.kernels import grad_reduce_bytes
        return grad_reduce_bytes(self.stack, self.grad_reduce_dtype, self.grad_bytes_per_param)

    @property
    def grad_buffer_bytes_per_param(self) -> float:
        """Bytes per parameter of a unit's unsharded gradients until their reduction: the gradients, plus
        their copy in the reduction's precision where it differs (the bf16 gradients cast to fp32)."""
        g, r = self.grad_bytes_per_param, self.grad_reduce_bytes
        return g + (r if r != g else 0.0)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def expert_tp(self) -> int:
        """Tensor-parallel degree of the routed experts (etp; tp unless set)."""
        return self.etp or self.tp

    @property
    def folded(self) -> bool:
        """Whether the experts have a grid of their own (MoE parallel folding, see the module docstring)."""
        return self.ep > 1 and (self.expert_tp != self.tp or self.dp % self.ep != 0
                                or (self.cp > 1 and self.expert_grid == "folded"))

    @property
    def edp(self) -> int:
        """Expert data-parallel degree: the replicas of each expert's weights (tp·cp·dp / (ep·etp))."""
        return self.tp * self.cp * self.dp // (self.ep * self.expert_tp)

    @property
    def zero_stage(self) -> int:
        """Effective ZeRO stage (FSDP full sharding is stage 3)."""
        return 3 if self.fsdp else self.zero

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step per DP replica (gradient accumulation steps)."""
        if self.global_batch is None:
            return 4 * self.pp if self.pp > 1 else 1
        return max(1, self.global_batch // (self.micro_batch * self.dp))

    @property
    def effective_global_batch(self) -> int:
        return self.micro_batch * self.dp * self.num_microbatches

    @property
    def tokens_per_step(self) -> int:
        return self.effective_global_batch * self.seq

    @property
    def reshard_after_forward(self) -> bool:
        """ZeRO-3/FSDP frees gathered parameters after each forward (auto: only without PP)."""
        if self.fsdp_reshard_after_forward == "auto":
            return self.pp == 1
        return self.fsdp_reshard_after_forward == "true"

    def layer_recompute(self, layer: int | None) -> str:
        """The recomputation of transformer layer ``layer``: ``recompute``, except that with recompute full and
        ``recompute_every`` N only layers l with (l + 1) % N == 0 are checkpointed ("none" for the others), as
        torchtitan counts its blocks (``_apply_ac_to_transformer_block``: ``_count % ac_freq == 0``, the count
        starting at 1; under PP torchtitan counts per process, the same when a stage's first layer is a
        multiple of N). The embedding and the LM head (layer None) are never recomputed."""
        if layer is None:
            return "none"
        if self.recompute == "full" and self.recompute_every > 1:
            return "full" if (layer + 1) % self.recompute_every == 0 else "none"
        return self.recompute

    @property
    def splits_backward(self) -> bool:
        """Whether backward may be split into B (input) and W (weight) ops."""
        return self.schedule in pl.SPLIT_BACKWARD

    @property
    def chunks(self) -> int:
        """Model chunks each pipeline stage holds (2 for zb-v, dualpipe, dualpipev)."""
        return pl.model_chunks(self.schedule, self.virtual_stages)

    @property
    def pieces(self) -> int:
        """Model pieces (virtual stages) the layers are split into (pp for dualpipe: two copies)."""
        return pl.num_pieces(self.schedule, self.pp, self.virtual_stages)

    def piece(self, stage: int, chunk: int) -> int:
        """Model piece held by ``chunk`` of ``stage``."""
        return pl.piece(self.schedule, self.pp, self.virtual_stages, stage, chunk)

    def stage_order(self, stage: int, model=None) -> tuple:
        """Stage ``stage``'s pipeline order (``schedules.pipeline.stage_order``). With the model, schedules
        built by the zero-bubble list scheduler get its pass times and the share of activations W keeps."""
        w_frac = costs = None
        limit = self.memory_limit
        if model is not None and self.schedule in ("zb-h2", "zb-v", "zb-auto") and not model.params_only:
            from schedules.memory import weight_pass_share
            w_frac = weight_pass_share(model, self)
            costs = pass_times(model, self)
            if self.memory_limit_bytes is not None:
                limit = self.memory_limit_microbatches(model)
        elif self.memory_limit_bytes is not None:
            raise PlanError("a memory limit in bytes needs the model's activation sizes")
        return pl.stage_order(self.schedule, self.pp, self.num_microbatches, self.virtual_stages, stage,
                              limit, w_frac, costs)

    def memory_limit_microbatches(self, model) -> float:
        """``memory_limit_bytes`` as micro-batches of the busiest stage's activations (rounded down to 1/100)."""
        from schedules.memory import head_activation_bytes, layer_activation_bytes, stage_chunks

        def stage_bytes(s: int) -> float:
            layers = sum(layer_activation_bytes(model, self, l) for ls in stage_chunks(model, self, s) for l in ls)
            has_head = any(self.piece(s, c) == self.pieces - 1 for c in range(self.chunks))
            return layers + (head_activation_bytes(model, self)[0] if has_head else 0.0)
        per = max(stage_bytes(s) for s in range(self.pp))
        lim = math.floor(100 * self.memory_limit_bytes / per) / 100 if per else float("inf")
        if lim < 1:
            raise PlanError(f"--memory-limit {self.memory_limit_bytes / 1e9:g} GB holds less than one "
                            f"micro-batch's activations ({per / 1e9:.3g} GB on the busiest stage)")
        return lim

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(world_size=self.world_size, num_microbatches=self.num_microbatches,
                 global_batch=self.effective_global_batch, zero_stage=self.zero_stage, expert_tp=self.expert_tp)
        return d

    # ------------------------------------------------------------------ validation
    def validate(self, model=None, world_size: int | None = None) -> "ParallelPlan":
        """Raise PlanError with an actionable message if the plan cannot run; return self."""
        self._check_types()
        if world_size is not None and self.world_size != world_size:
            raise PlanError(
                f"dp({self.dp}) × tp({self.tp}) × pp({self.pp}) × cp({self.cp}) = {self.world_size} != "
                f"{world_size} GPUs; choose degrees whose product is {world_size}"
                + (f" (e.g. --dp {world_size // (self.tp * self.pp * self.cp)})"
                   if world_size % (self.tp * self.pp * self.cp) == 0 else ""))
        if self.zero > 3:
            raise PlanError(f"ZeRO stage must be 0, 1, 2 or 3, got {self.zero}")
        if self.fsdp and self.zero not in (0, 3):
            raise PlanError(f"--fsdp is full sharding (ZeRO-3); it cannot be combined with --zero {self.zero}")
        if self.schedule not in SCHEDULE_NAMES:
            raise PlanError(f"unknown pipeline schedule {self.schedule!r}; known: {', '.join(SCHEDULE_NAMES)}")
        if self.recompute not in RECOMPUTE:
            raise PlanError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        mods = self.recompute_modules
        if not isinstance(mods, tuple) or not mods:
            raise PlanError(f"recompute_modules must be a non-empty tuple of module names, got {mods!r}")
        bad = [x for x in mods if x not in RECOMPUTE_MODULES]
        if bad:
            raise PlanError(f"unknown recompute module(s) {', '.join(map(repr, bad))}; known (Megatron-Core's "
                            f"recompute_modules): {', '.join(RECOMPUTE_MODULES)}")
        if len(set(mods)) != len(mods):
            raise PlanError(f"recompute_modules names a module twice: {', '.join(mods)}")
        if mods != DEFAULT_RECOMPUTE_MODULES and self.recompute != "selective":
            raise PlanError(f"recompute_modules {','.join(mods)} chooses what selective recomputation re-runs: it "
                            f"needs --recompute selective (recompute is {self.recompute})")
        if "moe" in mods and "moe_act" in mods:
            raise PlanError("recompute_modules: moe re-runs the whole MoE block, moe_act included; name one of them")
        if self.zero_stage < 3:
            for broken, what in ((self.fsdp_prefetch != 1, f"--fsdp-prefetch {self.fsdp_prefetch}"),
                                 (self.fsdp_reshard_after_forward != "auto",
                                  f"--fsdp-reshard-after-forward {self.fsdp_reshard_after_forward}")):
                if broken:
                    raise PlanError(f"{what} sets how FSDP / ZeRO-3 gathers each unit's parameters; this plan runs "
                                    f"ZeRO stage {self.zero_stage}: add --fsdp (or --zero 3) or drop it")
        if self.recompute_every > 1 and self.recompute != "full":
            raise PlanError(f"recompute_every {self.recompute_every} checkpoints every N-th layer fully: it needs "
                            f"--recompute full (recompute is {self.recompute})")
        if self.attention not in ATTENTION:
            raise PlanError(f"attention must be one of {', '.join(ATTENTION)}, got {self.attention!r}")
        if self.attention_kernel not in ATTENTION_KERNELS:
            raise PlanError(f"attention_kernel must be one of {', '.join(ATTENTION_KERNELS)}, "
                            f"got {self.attention_kernel!r}")
        if self.attention_kernel != "auto" and self.attention != "flash":
            raise PlanError(f"attention_kernel {self.attention_kernel} chooses a FlashAttention kernel; with "
                            f"attention {self.attention} no FlashAttention runs: use --attention flash or "
                            f"--attention-kernel auto")
        if self.fsdp_reshard_after_forward not in RESHARD:
            raise PlanError(f"fsdp_reshard_after_forward must be one of {', '.join(RESHARD)}, "
                            f"got {self.fsdp_reshard_after_forward!r}")
        if self.expert_grid not in EXPERT_GRIDS:
            raise PlanError(f"expert_grid must be one of {', '.join(EXPERT_GRIDS)}, got {self.expert_grid!r}")
        if self.moe_dispatcher not in MOE_DISPATCHERS:
            raise PlanError(f"moe_dispatcher must be one of {', '.join(MOE_DISPATCHERS)}, got {self.moe_dispatcher!r}")
        if self.tp_comm_overlap is True and self.lora_rank:
            raise PlanError("--tp-comm-overlap with LoRA is not modelled: its overlaps pair the TP collectives with "
                            "weight-gradient GEMMs a frozen model does not run")
        if self.tp_comm_overlap is True:
            why = ("it overlaps the TP collectives, so it needs --tp > 1" if self.tp <= 1 else
                   "Transformer Engine overlaps the sequence-parallel all-gathers and reduce-scatters, so it "
                   "needs --sp (Megatron-Bridge turns it off without sequence parallelism)" if not self.sp else
                   f"it is Transformer Engine's userbuffers overlap: it needs --stack megatron (stack is "
                   f"{self.stack})" if self.stack != "megatron" else
                   f"the {self.schedule} schedule splits backward into input and weight passes, whose "
                   f"overlap is not modelled" if self.schedule in pl.SPLIT_BACKWARD else None)
            if why:
                raise PlanError(f"--tp-comm-overlap: {why}")
        if self.layer_split not in ("balanced", "even"):
            raise PlanError(f"layer_split must be 'balanced' or 'even', got {self.layer_split!r}")
        if not 0.0 <= self.skew <= 1.0:
            raise PlanError(f"skew must be in [0, 1] (relative extra load on the busiest EP rank), got {self.skew}")
        if self.skew and self.ep == 1:
            raise PlanError("routing skew needs expert parallelism: set --ep > 1 or skew 0")
        from schedules.kernels import check_choice
        check_choice(self.stack, self.dtype, self.grad_reduce_dtype, self.fp8_recipe)
        if self.fp8_param_gather is True:
            for broken, why in (
                    (self.dtype != "fp8", "it keeps FP8 weights: it needs --dtype fp8"),
                    (self.stack != "megatron", f"it is Megatron-Core's: it needs --stack megatron (stack is "
                                               f"{self.stack})"),
                    (self.zero_stage not in (1, 2), "it casts the distributed optimizer's shard: it needs --zero 1 "
                                                    "or 2 (ZeRO-3 / FSDP with FP8 parameters is not modelled)"),
                    (self.fp8_recipe == "mxfp8", "MXFP8 parameters (block scales, column-wise data quantized from "
                                                 "the fp32 weights) are not modelled: use --fp8-recipe delayed or "
                                                 "current")):
                if broken:
                    raise PlanError(f"--fp8-param-gather: {why}")
        self.axes  # parses axis_order
        if self.global_batch is not None:
            per = self.micro_batch * self.dp
            if self.global_batch < per or self.global_batch % per:
                raise PlanError(f"global batch {self.global_batch} is not a multiple of micro_batch({self.micro_batch})"
                                f" × dp({self.dp}) = {per}; use e.g. --global-batch {per * max(1, self.global_batch // per)}")
        m, p, v = self.num_microbatches, self.pp, self.virtual_stages
        if v > 1 and self.schedule not in ("interleaved", "zb-v", "dualpipe", "dualpipev"):
            raise PlanError(f"virtual_stages={v} needs --schedule interleaved (schedule is {self.schedule})")
        if self.schedule in ("zb-v", "dualpipe", "dualpipev") and v > 2:
            raise PlanError(f"{self.schedule} holds exactly two model chunks per stage; use --virtual-stages 1 or 2")
        if self.schedule == "interleaved" and p < 2:
            raise PlanError("the interleaved schedule needs pp >= 2; use --schedule 1f1b or raise --pp")
        if self.schedule in ("dualpipe", "dualpipev"):
            pl._check_dualpipe(self.schedule, p, m, v)
        if self.memory_limit is not None and self.memory_limit_bytes is not None:
            raise PlanError("give the zb-auto memory limit in micro-batches or in bytes, not both")
        if self.memory_limit_bytes is not None:
            lim = self.memory_limit_bytes
            if self.schedule != "zb-auto":
                raise PlanError(f"--memory-limit applies to --schedule zb-auto (schedule is {self.schedule})")
            if not isinstance(lim, (int, float)) or isinstance(lim, bool) or not math.isfinite(lim) or lim <= 0:
                raise PlanError(f"memory_limit_bytes must be a positive number of bytes, got {lim!r}")
            if model is not None and not model.params_only:
                self.memory_limit_microbatches(model)
        if self.memory_limit is not None:
            lim = self.memory_limit
            if self.schedule != "zb-auto":
                raise PlanError(f"--memory-limit applies to --schedule zb-auto (schedule is {self.schedule})")
            if not isinstance(lim, (int, float)) or isinstance(lim, bool) or not math.isfinite(lim) or lim < 1:
                raise PlanError(f"memory_limit must be at least 1 micro-batch of activations, got {lim!r}")
        self._check_stage_layers()
        if self.etp and self.ep == 1 and self.etp != self.tp:
            raise PlanError(f"etp({self.etp}) is the experts' tensor parallelism inside expert parallelism; "
                            f"with ep 1 the experts follow tp({self.tp}): drop --etp or set --ep > 1")
        if self.folded and self.tp > 1 and not self.sp:
            why = (" (the expert grid of Megatron-Core >= 0.10 with cp > 1; --expert-grid carved for the older one)"
                   if self.expert_tp == self.tp and self.dp % self.ep == 0 else "")
            raise PlanError(f"MoE parallel folding (ep {self.ep}, etp {self.expert_tp}){why} with tp({self.tp}) "
                            f"needs sequence parallelism, as Megatron-Core requires: add --sp")
        if self.folded and (self.tp * self.cp * self.dp) % (self.ep * self.expert_tp):
            fold = (f"ep × etp = {self.ep}×{self.expert_tp} must divide tp·cp·dp = {self.tp * self.cp * self.dp} "
                    f"(MoE parallel folding over a pipeline stage's ranks)")
            if self.expert_tp == self.tp:       # folded only because dp does not hold ep
                raise PlanError(f"ep({self.ep}) must divide dp({self.dp}) (experts carved out of data parallelism), "
                                f"or {fold}; use --dp a multiple of {self.ep}, --etp 1 or a smaller --ep")
            others = " or ".join(dict.fromkeys(f"--etp {e}" for e in (1, self.tp)))
            raise PlanError(f"with etp({self.expert_tp}) other than tp({self.tp}) the experts fold: {fold}; use "
                            f"{others} or a smaller --ep")
        if self.cp > 1 and self.seq % (2 * self.cp):
            raise PlanError(f"seq {self.seq} must be divisible by 2·cp = {2 * self.cp} (load-balanced ring attention)")
        if self.sp and self.seq % (self.tp * self.cp):
            raise PlanError(f"sequence parallelism needs seq ({self.seq}) divisible by tp·cp = {self.tp * self.cp}")
        if model is not None:
            self._validate_model(model)
        return self

    def _check_types(self) -> None:
        """Every field has its type and a finite, sensible value (a plan may come from YAML or Python)."""
        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)

        for f in ("dp", "tp", "pp", "ep", "cp", "micro_batch", "virtual_stages", "seq", "recompute_every"):
            v = getattr(self, f)
            if not is_int(v) or v < 1:
                raise PlanError(f"{f} must be a positive integer, got {v!r}")
        for f in ("zero", "fsdp_prefetch", "etp"):
            v = getattr(self, f)
            if not is_int(v) or v < 0:
                raise PlanError(f"{f} must be a non-negative integer, got {v!r}")
        if self.global_batch is not None and (not is_int(self.global_batch) or self.global_batch < 1):
            raise PlanError(f"global_batch must be a positive integer (sequences per step), got {self.global_batch!r}")
        for f in ("sp", "fsdp", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
                  "fp8_param_gather"):
            v = getattr(self, f)
            if not isinstance(v, bool):
                raise PlanError(f"{f} must be true or false, got {v!r}")
        for f, lo, strict in (("bucket_bytes", 0.0, True), ("grad_bytes_per_param", 0.0, True),
                              ("optimizer_bytes_per_param", 0.0, False), ("skew", 0.0, False)):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) \
                    or (v <= lo if strict else v < lo):
                raise PlanError(f"{f} must be a finite number {'>' if strict else '>='} {lo:g}, got {v!r}")
        for f in ("schedule", "recompute", "axis_order", "layer_split", "attention", "attention_kernel",
                  "fsdp_reshard_after_forward",
                  "expert_grid", "moe_dispatcher"):
            v = getattr(self, f)
            if not isinstance(v, str):
                raise PlanError(f"{f} must be a string, got {v!r}")
        if self.lora_style not in LORA_STYLES:
            raise PlanError(f"lora_style must be one of {', '.join(LORA_STYLES)}, got {self.lora_style!r}")
        if not is_int(self.lora_rank) or self.lora_rank < 0:
            raise PlanError(f"lora_rank must be a non-negative integer (0: full training), got {self.lora_rank!r}")
        t = self.lora_targets
        if not isinstance(t, tuple) or not t or not all(isinstance(x, str) for x in t) \
                or set(t) - set(LORA_TARGETS) or len(set(t)) != len(t):
            raise PlanError(f"lora_targets must name each at most once some of {', '.join(LORA_TARGETS)}, got {t!r}")

    def _validate_model(self, model) -> None:
        if model.params_only:
            if self.pp > 1 or self.ep > 1 or self.lora_rank:
                what = "LoRA adapters need" if self.lora_rank else "pp and ep need"
                raise PlanError(f"model {model.name} is given only by its parameter count; {what} its "
                                f"shape (use --model PRESET or --layers/--hidden/--heads)")
            return
        t = self.tp
        if model.heads % t:
            raise PlanError(f"tp({t}) must divide the {model.heads} attention heads of {model.name}")
        if not model.is_mla and model.kv_heads % t and t % model.kv_heads:
            raise PlanError(f"tp({t}) and the {model.kv_heads} KV heads of {model.name} must divide one another")
        if t > model.kv_heads and not model.is_mla:
            raise PlanError(f"tp({t}) > kv heads ({model.kv_heads}) of {model.name}: KV heads would be replicated "
                            f"across TP ranks; use --tp <= {model.kv_heads}")
        if model.ffn % t or (model.is_moe and model.expert_ffn % t):
            raise PlanError(f"tp({t}) must divide the MLP width ({model.ffn}) of {model.name}")
        if getattr(model, "is_hybrid", False):
            self._validate_hybrid(model)
        chunks = self.pieces
        if model.layers < max(1, chunks - 2):
            raise PlanError(f"{model.name} has {model.layers} layers for {chunks} model pieces of pp {self.pp} × "
                            f"{self.chunks} chunks (at most the embedding's and the LM head's pieces may be left "
                            f"without layers); lower --pp or --virtual-stages")
        self.piece_layer_counts(model)     # user-given counts must add up
        if self.layer_split == "even" and model.layers % chunks:
            raise PlanError(f"{model.name} has {model.layers} layers, not divisible by pp×virtual_stages = "
                            f"{self.pp}×{self.virtual_stages} = {chunks}; choose a divisor of {model.layers} or "
                            f"use layer_split='balanced'")
        if self.recompute == "full" and self.recompute_every > model.layers:
            raise PlanError(f"recompute_every {self.recompute_every} checkpoints layers {self.recompute_every - 1}, "
                            f"{2 * self.recompute_every - 1}, ...; {model.name} has {model.layers} layers, so none "
                            f"would be: use --recompute-every {model.layers} or less")
        if self.lora_rank and (model.is_moe or model.is_mla or getattr(model, "is_hybrid", False)):
            what = "an MoE" if model.is_moe else "an MLA" if model.is_mla else "a hybrid Mamba"
            raise PlanError(f"LoRA (--lora-rank) is modelled for dense attention models; {model.name} is {what} model "
                            f"(adapters beside experts, latent projections or Mamba mixers are not modelled)")
        if self.lora_rank:
            from schedules.models import SEPARATE_QKV_STACKS, lora_target_shapes
            shapes = lora_target_shapes(model)
            narrow = min(min(shapes[t]) for t in self.lora_targets)
            if "qkv" in self.lora_targets and self.stack in SEPARATE_QKV_STACKS:      # wk, wv: kv heads wide
                narrow = min(narrow, model.kv_heads * model.d_head)
            if self.lora_rank > narrow:
                raise PlanError(f"lora_rank {self.lora_rank} is wider than the narrowest width of {model.name}'s "
                                f"target linears ({narrow}): a low-rank adapter's rank is below its linear's "
                                f"(typically 8-64)")
        if self.ep > 1 and not model.is_moe:
            raise PlanError(f"ep({self.ep}) > 1 but {model.name} is a dense model (no experts); use --ep 1")
        if self.moe_dispatcher != "alltoall" and not model.is_moe:
            raise PlanError(f"moe_dispatcher {self.moe_dispatcher} dispatches tokens to experts, but {model.name} is a "
                            f"dense model (no experts); leave --moe-dispatcher at its default (alltoall)")
        if self.recompute == "op" and (model.is_moe or model.is_mla or self.attention != "flash"):
            raise PlanError(f"recompute op is torchtitan's per-op checkpointing of a dense block with SDPA flash "
                            f"attention; {model.name} with attention {self.attention} is not one: use --recompute "
                            f"selective or full")
        if self.recompute == "selective" and self.recompute_modules != DEFAULT_RECOMPUTE_MODULES:
            mods = self.recompute_modules
            if self.attention != "flash":
                raise PlanError(f"recompute_modules {','.join(mods)}: modules other than core_attn are priced "
                                f"with FlashAttention's saved tensors; use --attention flash")
            if "mla_up_proj" in mods and not model.is_mla:
                raise PlanError(f"recompute module mla_up_proj re-runs MLA's up-projections; {model.name} has no "
                                f"multi-head latent attention")
            moe_only = [x for x in ("moe_act", "moe", "shared_experts") if x in mods]
            if moe_only and not model.is_moe:
                raise PlanError(f"recompute module(s) {', '.join(moe_only)} re-run MoE parts; {model.name} is dense")
            if "shared_experts" in mods and not model.shared_experts:
                raise PlanError(f"recompute module shared_experts: {model.name} has no shared experts")
        if self.cp > 1 and self.attention != "flash":
            raise PlanError(f"context parallelism (cp {self.cp}) runs ring attention, which merges its KV blocks "
                            f"with FlashAttention's log-sum-exp; no stack runs it with attention {self.attention}: "
                            f"use --attention flash or --cp 1")
        local = model.sliding_window or model.attention_chunk          # (at most one is set)
        if self.cp > 1 and local and local < self.seq:
            what, span = ("sliding-window", "window") if model.sliding_window else ("chunked", "chunk")
            raise PlanError(f"context parallelism (cp {self.cp}) with {what} attention of {local} tokens (as "
                            f"{model.name} runs here) is not modelled: its ring would skip the KV blocks outside "
                            f"the {span}; use --cp 1")
        if model.is_moe and model.experts % self.ep:
            raise PlanError(f"ep({self.ep}) must divide the {model.experts} experts of {model.name}")
        if model.is_moe and model.expert_ffn % self.expert_tp:
            raise PlanError(f"etp({self.expert_tp}) must divide the expert MLP width ({model.expert_ffn}) of "
                            f"{model.name}")

    def _validate_hybrid(self, model) -> None:
        """What a hybrid (Mamba-2) model's plan can be: Megatron-Core shards a Mamba mixer's heads and B/C groups
        over TP; the rest is not modelled."""
        t = self.tp
        if "M" in model.hybrid_pattern and (model.mamba_heads % t or model.mamba_groups % t):
            raise PlanError(f"tp({t}) must divide the {model.mamba_heads} Mamba heads and {model.mamba_groups} B/C "
                            f"groups of {model.name}")
        why = ("context parallelism" if self.cp > 1 else
               "--tp-comm-overlap" if self.tp_comm_overlap else
               f"attention {self.attention}" if self.attention != "flash" else
               "recompute op (torchtitan's per-op checkpointing)" if self.recompute == "op" else None)
        if why:
            raise PlanError(f"{why} with the hybrid (Mamba-2) model {model.name} is not modelled")

    def _check_stage_layers(self) -> None:
        sl = self.stage_layers
        if sl is not None:
            if not isinstance(sl, (tuple, list)) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1
                                                            for x in sl):
                raise PlanError(f"stage_layers must be a list of positive layer counts, got {sl!r}")
            if len(sl) not in (self.pp, self.pieces):
                raise PlanError(f"stage_layers has {len(sl)} entries; give one per pipeline stage ({self.pp}) or "
                                f"one per model piece ({self.pieces})")
            if self.first_stage_layers is not None or self.last_stage_layers is not None:
                raise PlanError("give either stage_layers or first/last stage layers, not both")
        for f in ("first_stage_layers", "last_stage_layers"):
            x = getattr(self, f)
            if x is not None and (not isinstance(x, int) or isinstance(x, bool) or x < 1):
                raise PlanError(f"{f} must be a positive number of layers, got {x!r}")

    # ------------------------------------------------------------------ layers
    def piece_layer_counts(self, model) -> list[int]:
        """Layers of each model piece (piece order). User counts (``stage_layers``, first/last) are checked
        against the model; the rest are balanced by estimated time (``balanced_layer_counts``). Cached per
        (plan, model): program generation asks once per stage and memory model."""
        try:
            return list(_piece_layer_counts(self, model))
        except TypeError:                       # unhashable fields (a stage_layers list): not cached
            return self._piece_layer_counts(model)

    def _piece_layer_counts(self, model) -> list[int]:
        n, k, p = model.layers, self.pieces, self.pp
        sl = self.stage_layers
        if sl is not None:
            sl = list(sl)
            if len(sl) == p and k != p:          # per stage: spread each stage's count over its chunks
                counts = [0] * k
                for s, x in enumerate(sl):
                    if x < self.chunks:
                        raise PlanError(f"stage {s} has {x} layers for {self.chunks} model chunks")
                    base, rem = divmod(x, self.chunks)
                    for c in range(self.chunks):
                        counts[self.piece(s, c)] = base + (1 if c < rem else 0)
            else:
                counts = sl
            if sum(counts) != n:
                raise PlanError(f"stage_layers add up to {sum(counts)} layers, but {model.name} has {n}")
            return counts
        fixed = {}
        if self.first_stage_layers is not None:
            fixed[0] = self.first_stage_layers
        if self.last_stage_layers is not None:
            fixed[k - 1] = self.last_stage_layers
        if k == 1 and fixed:
            raise PlanError("first/last stage layers need more than one pipeline stage")
        rest = n - sum(fixed.values())
        ends = 0 if n >= k else len({0, k - 1} - set(fixed))     # pieces that may stay empty
        if rest < k - len(fixed) - ends or (len(fixed) == k and rest):
            raise PlanError(f"first/last stage layers {sorted(fixed.values())} leave {rest} of {model.name}'s {n} "
                            f"layers for the other {k - len(fixed)} model pieces")
        if self.layer_split == "even":
            if n % k or fixed:
                raise PlanError(f"{n} layers are not divisible into {k} chunks")
            return [n // k] * k
        return list(balanced_layer_counts(n, self._stage_of_piece(), _extra_cost(model, self.seq),
                                          tuple(sorted(fixed.items()))))

    def _stage_of_piece(self) -> tuple[int, ...]:
        out = [0] * self.pieces
        for s in range(self.pp):
            for c in range(self.chunks):
                out[self.piece(s, c)] = s
        return tuple(out)

    def piece_layers(self, model) -> list[list[int]]:
        """Layer indices of each model piece, in piece order. The last piece also runs the model's
        multi-token-prediction modules' layers (indices ``layers`` .. ``layers + mtp_layers - 1``; Megatron-Core
        places them with the loss, on the last stage)."""
        out, start = [], 0
        for n in self.piece_layer_counts(model):
            out.append(list(range(start, start + n)))
            start += n
        mtp = getattr(model, "mtp_layers", 0)
        if mtp and out:
            out[-1] += list(range(start, start + mtp))
        return out

    # ------------------------------------------------------------------ mesh
    @cached_property
    def axes(self) -> tuple[str, ...]:
        """Mesh axes innermost first (names from tp, cp, ep, dp, pp)."""
        names = tuple(a.strip() for a in self.axis_order.replace(",", "-").split("-") if a.strip())
        req = {"tp", "cp", "dp", "pp"}
        if set(names) - set(AXES) or not req <= set(names) or len(set(names)) != len(names):
            raise PlanError(f"axis_order {self.axis_order!r} must be a permutation of tp, cp, dp, pp (optionally "
                            f"with ep), innermost first, e.g. 'tp-cp-ep-dp-pp'")
        if "ep" not in names:
            i = names.index("dp")
            names = names[:i] + ("ep",) + names[i:]
        return names

    @cached_property
    def axis_sizes(self) -> dict[str, int]:
        ep = 1 if self.folded else self.ep
        return {"tp": self.tp, "cp": self.cp, "ep": ep, "dp": self.dp // ep, "pp": self.pp}

    @cached_property
    def _strides(self) -> dict[str, int]:
        s, out = 1, {}
        for a in self.axes:
            out[a] = s
            s *= self.axis_sizes[a]
        return out

    def coords(self, rank: int) -> dict[str, int]:
        """Mesh coordinates of a rank; "dp" is the full data-parallel index (ep part inner)."""
        c = {a: (rank // self._strides[a]) % self.axis_sizes[a] for a in AXES}
        c["dpo"] = c["dp"]
        c["dp"] = c["ep"] + self.axis_sizes["ep"] * c["dpo"]
        return c

    def rank_of(self, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        """Global rank at these coordinates (dp is the full data-parallel index)."""
        e = self.axis_sizes["ep"]
        c = {"tp": tp, "cp": cp, "ep": dp % e, "dp": dp // e, "pp": pp}
        return sum(c[a] * self._strides[a] for a in AXES)

    def stage_of(self, rank: int) -> int:
        return (rank // self._strides["pp"]) % self.pp

    def peer(self, rank: int, axis: str, value: int) -> int:
        """The rank equal to ``rank`` except that mesh axis ``axis`` ("pp", "cp", "tp") is ``value``."""
        cur = (rank // self._strides[axis]) % self.axis_sizes[axis]
        return rank + (value - cur) * self._strides[axis]

    # mesh axes each family's groups vary along
    FAMILY_AXES = {"tp": ("tp",), "cp": ("cp",), "pp": ("pp",), "dp": ("ep", "dp"), "ep": ("ep",),
                   "edp": ("cp", "dp"), "dp_cp": ("cp", "ep", "dp")}

    def _stage_local(self, rank):
        """Index of ``rank`` (an int or an array) among its stage's ranks in rank order: the rank with its pp
        digit taken out (removing a digit keeps the order)."""
        S = self._strides["pp"]
        return rank % S + (rank // (S * self.pp)) * S

    def _stage_rank(self, local, stage: int):
        """Inverse of ``_stage_local``: the rank of stage ``stage`` at index ``local``."""
        S = self._strides["pp"]
        return local % S + stage * S + (local // S) * S * self.pp

    def _expert_grid(self, rank=None):
        """Folded experts: (etp index, ep index, edp index) of ``rank`` (default: every rank, as arrays) in its
        stage's expert grid (a stage's ranks in rank order: etp innermost, then ep, then edp)."""
        local = self._stage_local(np.arange(self.world_size, dtype=np.int64) if rank is None else rank)
        e = self.expert_tp
        return local % e, (local // e) % self.ep, local // (e * self.ep)

    def ep_index(self, rank: int) -> int:
        """The rank's position in its EP group (the expert shard it holds)."""
        if self.folded:
            return int(self._expert_grid(rank)[1])
        return self.coords(rank)["ep"]

    def ep_indices(self) -> np.ndarray:
        """``ep_index`` of every rank (an array)."""
        if self.folded:
            return self._expert_grid()[1]
        r = np.arange(self.world_size, dtype=np.int64)
        return (r // self._strides["ep"]) % self.axis_sizes["ep"]

    def ep_group(self, rank: int) -> tuple[int, ...]:
        """The EP group of ``rank``, members ordered as ``groups("ep")`` orders them."""
        if self.folded:
            t, _, d = self._expert_grid(rank)
            e = self.expert_tp
            base = t + d * e * self.ep
            return tuple(int(self._stage_rank(base + k * e, self.stage_of(rank))) for k in range(self.ep))
        return tuple(self.peer(rank, "ep", e) for e in range(self.ep))

    def _folded_groups(self, family: str) -> list[tuple[int, ...]]:
        """Groups of the expert grid: "etp" (same ep and edp index), "ep" (same etp and edp), "edp" (same
        etp and ep), within a stage; members in rank order."""
        t, e, d = self._expert_grid()
        stage = (np.arange(self.world_size) // self._strides["pp"]) % self.pp
        same = {"etp": (e, d), "ep": (t, d), "edp": (t, e)}[family]
        key = (stage * (self.world_size + 1) + same[0]) * (self.world_size + 1) + same[1]
        order = np.argsort(key, kind="stable")           # members of a group stay in rank order
        cut = np.flatnonzero(np.diff(key[order])) + 1
        return [tuple(g.tolist()) for g in np.split(order, cut)]

    def groups(self, family: str) -> list[tuple[int, ...]]:
        """All groups of a family, each a tuple of ranks ordered by the varying coordinates."""
        if family in ("ep", "edp", "etp") and self.folded:
            return self._folded_groups(family)
        if family == "etp":
            return self.groups("tp")
        if family == "mirror":      # DualPipe: stages s and pp-1-s hold the same two pieces
            if self.schedule != "dualpipe":
                return []
            return [(r, self.peer(r, "pp", self.pp - 1 - self.stage_of(r))) for r in range(self.world_size)
                    if self.stage_of(r) < self.pp // 2]
        if family == "embed":
            if self.pp < 2:
                return []
            out = []
            for r in range(self.world_size):
                if self.stage_of(r) == 0:
                    out.append((r, self.peer(r, "pp", self.pp - 1)))
            return out
        vary = self.FAMILY_AXES[family]
        size = 1
        for a in vary:
            size *= self.axis_sizes[a]
        # enumerate member offsets once, then shift by every base rank (all varying coordinates 0)
        offsets = [0]
        for a in sorted(vary, key=lambda a: self.axes.index(a)):
            offsets = [o + k * self._strides[a] for k in range(self.axis_sizes[a]) for o in offsets]
        offsets = sorted(offsets)
        base = np.arange(self.world_size)
        on = np.ones(self.world_size, dtype=bool)
        for a in vary:
            on &= (base // self._strides[a]) % self.axis_sizes[a] == 0
        return list(map(tuple, (base[on][:, None] + np.array(offsets, dtype=np.int64)[None, :]).tolist()))


def parse_stage_layers(value) -> tuple[int, ...] | None:
    """``--stage-layers 7,8,8,7`` (or a YAML list) -> (7, 8, 8, 7); None where none is given (an empty value is
    an error: it had crashed simulate and been ignored by plan)."""
    if value is None:
        return None
    if isinstance(value, str) and not value.strip():
        raise PlanError("stage layers: none given; give comma-separated layer counts like 7,8,8,7")
    items = value.split(",") if isinstance(value, str) else value
    try:
        out = tuple(int(str(x).strip()) for x in items)
    except (TypeError, ValueError):
        raise PlanError(f"stage layers must be comma-separated layer counts like 7,8,8,7, got {value!r}") from None
    if not out or min(out) < 1:
        raise PlanError(f"stage layers must be positive layer counts, got {value!r}")
    return out


def default_virtual_stages(schedule: str, pp: int, layers: int) -> int:
    """Virtual stages when none are given: 2 for interleaved 1F1B when every stage can hold two chunks of layers
    (the first and last chunk may hold only the embedding / LM head; interleaving with one chunk is plain
    1F1B), else 1."""
    return 2 if schedule == "interleaved" and pp > 1 and layers >= 2 * pp - 2 else 1


def plan_notes(plan: "ParallelPlan") -> list[str]:
    """Notes for parts of a valid plan that do nothing as given: sequence parallelism at tp 1, the interleaved
    schedule with one virtual stage, ZeRO / FSDP over a data-parallel group of one rank, DDP bucket options
    under FSDP / ZeRO-3, pipeline options without a pipeline."""
    notes = []
    if plan.sp and plan.tp == 1:
        notes.append("--sp does nothing at tp 1 (sequence parallelism splits the tensor-parallel group's activations; "
                     "Megatron-LM turns it off there)")
    if plan.schedule == "interleaved" and plan.virtual_stages == 1 and plan.pp > 1:
        notes.append("interleaved with one virtual stage is plain 1F1B; give --virtual-stages V > 1 to interleave")
    if plan.dp * plan.cp == 1 and (plan.zero or plan.fsdp):
        notes.append(f"{'--fsdp' if plan.fsdp else f'--zero {plan.zero}'} shards over the data-parallel group, which "
                     f"holds one rank here (dp·cp = 1): nothing is sharded")
    if plan.zero_stage >= 3 and (plan.bucket_bytes != ParallelPlan.bucket_bytes or not plan.overlap_grad_reduce):
        notes.append("FSDP / ZeRO-3 reduce-scatters each unit's gradients as its backward ends: --bucket-mb and "
                     "--no-overlap-grad-reduce (DDP / ZeRO-1/2 gradient buckets) do not apply")
    limited = plan.memory_limit is not None or plan.memory_limit_bytes is not None
    if plan.pp == 1 and (plan.schedule != "1f1b" or plan.stage_layers or plan.first_stage_layers
                         or plan.last_stage_layers or plan.layer_split != "balanced" or limited):
        notes.append("pp 1: there is no pipeline, so the pipeline options (--schedule, --stage-layers, "
                     "--first-stage-layers, --last-stage-layers, --layer-split, --memory-limit) change nothing")
    return notes


def parse_memory_limit(value, pp: int) -> dict:
    """zb-auto's ``--memory-limit``: micro-batches of a stage's activations ("16"), a multiple of pp ("2p" =
    ZB-2p) or activation bytes per rank with a unit ("40GB", "500MB", "64GiB": ``simulator.inputs.byte_size``,
    1 GB = 1e9 B). Returns the ParallelPlan fields ``memory_limit`` / ``memory_limit_bytes``."""
    from simulator.inputs import byte_size, reads_as_bits
    if value is None:
        return {}
    text = str(value).strip().lower().replace(" ", "")
    if not text:
        raise PlanError("--memory-limit is empty: give micro-batches of activations per stage (e.g. 16), a "
                        "multiple of pp (2p) or bytes with a unit (40GB), or leave the option out")
    usage = (f"--memory-limit is micro-batches of activations per stage (e.g. 16), a multiple of pp (1p = ZB-1p, "
             f"2p = ZB-2p) or bytes with a unit (40GB, 500MB, 64GiB), got {value!r}")
    if text.endswith("b"):
        try:            # (as given: "40Gb" is gigabits)
            return {"memory_limit_bytes": byte_size(str(value).strip().replace(" ", ""), "--memory-limit",
                                                    err=PlanError)}
        except PlanError as e:
            raise PlanError(str(e) if reads_as_bits(str(value)) else usage) from None
    try:
        lim = float(text[:-1]) * pp if text.endswith("p") else float(text)
    except ValueError:
        raise PlanError(usage) from None
    if not math.isfinite(lim) or lim < 1:
        raise PlanError(f"--memory-limit must be at least one micro-batch of activations, got {value!r}")
    return {"memory_limit": lim}


def recompute_flops(model, plan: "ParallelPlan", layer: int) -> float:
    """FLOPs one rank spends recomputing layer ``layer`` per micro-batch under recompute op (the GEMMs the
    policy does not save, ``schedules.kernels.recompute_kernels``)."""
    from schedules.kernels import recompute_kernels
    return recompute_kernels(model, plan, layer).flops


def _parse_names(value, where: str, known: tuple[str, ...], what: str) -> list[str]:
    """Names out of ``known`` from a comma-separated string or a list (YAML); ConfigError naming ``where``."""
    if isinstance(value, str):
        items = [x.strip() for x in value.split(",")]
    elif isinstance(value, (list, tuple)) and all(isinstance(x, str) for x in value):
        items = [x.strip() for x in value]
    else:
        raise ConfigError(f"{where}: expected {what} names (a comma-separated string or a list), got {brief(value)}")
    if not [x for x in items if x]:
        raise ConfigError(f"{where}: no {what} named; give at least one of {', '.join(known)}")
    bad = [x for x in items if x not in known]
    if bad:
        raise ConfigError(f"{where}: unknown {what}(s) {', '.join(map(repr, bad))}; choose from "
                          f"{', '.join(known)}")
    return items


def check_bucket_mb(mb: float, where: str = "--bucket-mb") -> None:
    """Refuse a gradient bucket (megabytes) of none, or beyond 1 PB (``MAX_BYTES``): no model's gradients fill it,
    and in bytes it may not even be finite."""
    if not mb > 0:              # (NaN too)
        raise ConfigError(f"{where}: a gradient bucket must hold a positive number of MB, got {mb:g}")
    if mb * 1e6 > MAX_BYTES:
        raise ConfigError(f"{where}: a gradient bucket of {mb:g} MB is beyond any model's gradients; at most "
                          f"{MAX_BYTES / 1e6:.0e} MB (1 PB)")


def parse_recompute_modules(value, where: str = "--recompute-modules") -> tuple[str, ...]:
    """Megatron-Core recompute module names from a comma-separated string or a list (YAML)."""
    return tuple(_parse_names(value, where, RECOMPUTE_MODULES, "recompute module"))


def lora_fields(rank: int, targets=None, style: str = "megatron") -> dict:
    """ParallelPlan's LoRA fields from the options (``targets`` a list or a comma-separated string, None: all
    four); {} without a rank, where targets or a style other than the default are a ConfigError (they would
    be ignored)."""
    if not rank:
        if targets is not None:
            raise ConfigError("--lora-targets names the linears of LoRA adapters: give --lora-rank R (> 0) too")
        if style != "megatron":
            raise ConfigError("--lora-style says how LoRA adapters run: give --lora-rank R (> 0) too")
        return {}
    return {"lora_rank": rank, "lora_targets": LORA_TARGETS if targets is None else parse_lora_targets(targets),
            "lora_style": style}


def parse_lora_targets(value, where: str = "--lora-targets") -> tuple[str, ...]:
    """LoRA target linears from a comma-separated string or a list (YAML), in LORA_TARGETS order."""
    items = _parse_names(value, where, LORA_TARGETS, "LoRA target")
    return tuple(t for t in LORA_TARGETS if t in items)


def selective_extra_flops(model, plan: "ParallelPlan", layer: int) -> float:
    """FLOPs one rank spends per micro-batch re-running the modules of ``plan.recompute_modules`` other than the
    attention core and the routed experts (``schedules.kernels.recompute_kernels``: the MLA up-projections, a
    dense MLP, the shared experts, the router); 0 for Megatron's default (core_attn only)."""
    if plan.layer_recompute(layer) != "selective" or plan.recompute_modules == DEFAULT_RECOMPUTE_MODULES:
        return 0.0
    from schedules.kernels import recompute_kernels
    from simulator.kernels import ATTENTION
    part = "attention" if model.is_moe_layer(layer) else "layer"
    return sum(k.flops for k in recompute_kernels(model, plan, layer, part).kernels if k.kind != ATTENTION)


def selective_recompute_flops(model, plan: "ParallelPlan", layer: int, lf=None) -> float:
    """FLOPs (whole layer, all tp·cp ranks) that selective recomputation of ``plan.recompute_modules`` re-runs
    in ``layer`` per micro-batch: the attention core under core_attn, the routed experts under moe, the rest
    (``selective_extra_flops``). ``lf``: the layer's ``LayerFlops`` when the caller has it."""
    lf = lf or model.layer_flops(layer, plan.seq, plan.micro_batch)
    mods = plan.recompute_modules
    core = lf.attn_core if "core_attn" in mods and model.layer_kind(layer) != "M" else 0.0   # (Mamba: its scan)
    return core + (lf.experts if "moe" in mods else 0.0) \
        + selective_extra_flops(model, plan, layer) * plan.tp * plan.cp


def pass_times(model, plan: "ParallelPlan") -> tuple[float, float, float]:
    """Relative times of a layer's forward (T_F), backward-input (T_B) and backward-weight (T_W) passes
    from their FLOPs (``LayerFlops``; recomputation adds a forward to B), mean over the layers, rounded so
    that plans of the same shape share a schedule."""
    f = b = w = 0.0
    for l in range(model.layers):
        lf = model.layer_flops(l, plan.seq, plan.micro_batch)
        f += lf.forward
        rc = plan.layer_recompute(l)
        b += lf.backward_input + (lf.forward if rc == "full" else
                                  selective_recompute_flops(model, plan, l, lf) if rc == "selective" else
                                  recompute_flops(model, plan, l) * plan.tp * plan.cp if rc == "op" else 0.0)
        w += lf.backward_weight
    return (1.0, round(b / f, 2), round(w / f, 2))


@functools.lru_cache(maxsize=256)
def _piece_layer_counts(plan: ParallelPlan, model) -> tuple[int, ...]:
    return tuple(plan._piece_layer_counts(model))


def _extra_cost(model, seq: int) -> tuple[float, float]:
    """(embedding, LM head + loss and the MTP modules) time relative to one transformer layer, from FLOPs
    (forward + both backward halves). The lookup has no FLOPs; it counts as a token-sized epsilon so that ties give the
    first piece fewer layers (Llama 3 405B takes one layer off the first and the last stage, Dubey et al.
    2024, sec. 3.3.2)."""
    if getattr(model, "params_only", False):
        return 0.0, 0.0
    layer = sum(model.layer_flops(l, seq, 1).total for l in range(model.layers)) / model.layers
    head = 3.0 * model.head_flops(seq, 1)
    mtp = getattr(model, "mtp_layers", 0)
    if mtp:     # the MTP modules run on the last piece: their layers, projections and head passes
        head += sum(model.layer_flops(model.layers + k, seq, 1).total for k in range(mtp)) \
            + 3.0 * model.mtp_extra_flops(seq, 1)
    return 1e-6, head / layer


@functools.lru_cache(maxsize=1024)
def balanced_layer_counts(layers: int, stage_of_piece: tuple[int, ...], extra: tuple[float, float],
                          fixed: tuple = ()) -> tuple[int, ...]:
    """Layer counts per model piece that minimise the slowest piece and then the slowest stage, with the
    embedding (``extra[0]`` layer-equivalents) on the first piece and the LM head (``extra[1]``) on the last.
    Layers are handed out one at a time to the piece that stays cheapest (piece time, then its stage's time,
    then piece order); pieces in ``fixed`` (piece -> count) keep their counts. Every piece gets a layer;
    with fewer layers than pieces the first and last pieces may hold only the embedding / LM head (as
    Megatron's custom pipeline layouts allow). Layer times are taken as equal (their mean)."""
    fixed = dict(fixed)
    k = len(stage_of_piece)
    cost = [0.0] * k
    cost[0] += extra[0]
    cost[-1] += extra[1]
    counts = [0] * k
    stage = [0.0] * (max(stage_of_piece) + 1)
    for i, c in enumerate(cost):
        stage[stage_of_piece[i]] += c
    for i, n in fixed.items():
        counts[i] = n
        stage[stage_of_piece[i]] += n
        cost[i] += n
    free = [i for i in range(k) if i not in fixed]
    left = layers - sum(fixed.values())
    for i in free:      # every piece holds a layer; with fewer layers than pieces the embedding's and the
        if layers >= k or i not in (0, k - 1):      # head's pieces may hold nothing else
            counts[i] += 1; cost[i] += 1; stage[stage_of_piece[i]] += 1; left -= 1
    heap = [(cost[i] + 1, stage[stage_of_piece[i]] + 1, i) for i in free]
    heapq.heapify(heap)
    while left > 0:
        c, st, i = heapq.heappop(heap)
        now = (cost[i] + 1, stage[stage_of_piece[i]] + 1, i)
        if (c, st) != now[:2]:                      # stale: its stage grew meanwhile
            heapq.heappush(heap, now)
            continue
        counts[i] += 1; cost[i] += 1; stage[stage_of_piece[i]] += 1; left -= 1
        heapq.heappush(heap, (cost[i] + 1, stage[stage_of_piece[i]] + 1, i))
    return tuple(counts)
