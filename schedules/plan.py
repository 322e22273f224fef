"""ParallelPlan: how a model is split over GPUs, its rank mesh, process groups and validation.

Degrees: world size = dp · tp · pp · cp. Expert parallelism (ep) is carved out of data parallelism as in
Megatron-LM: ep must divide dp, an EP group holds ranks that differ only in the inner ``ep`` part of their
dp coordinate, and expert weights are replicated only dp·cp/ep times (the "edp" group).

Rank mesh: ``axis_order`` lists the axes from innermost (fastest-varying rank) to outermost. Megatron's
default "tp-cp-ep-dp-pp" keeps a TP group on consecutive ranks (inside one NVLink domain). When "ep" is in
the order, the "dp" axis stands for the outer dp/ep part of data parallelism.

Process-group families: tp, cp, dp, pp, ep, plus "dp_cp" (dense gradient reduction when cp > 1: CP ranks
hold the same weights), "edp" (expert gradient reduction when ep > 1) and "embed" (first and last stage,
tied embeddings). Units: bytes, tokens.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cached_property

from simulator.errors import PlanError

SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved", "zb")
RECOMPUTE = ("none", "selective", "full")
AXES = ("tp", "cp", "ep", "dp", "pp")


@dataclass(frozen=True)
class ParallelPlan:
    """A parallel training plan (all sizes are per step unless noted).

    dp, tp, pp, ep, cp   data, tensor, pipeline, expert and context parallel degrees
    sp                   sequence parallelism with TP (norms/dropout sharded over the sequence)
    zero                 ZeRO stage 0-3 (0 = plain DDP); ``fsdp=True`` is ZeRO-3 with FSDP's per-layer units
    micro_batch          sequences per micro-batch per DP replica
    global_batch         sequences per step over the whole job (default micro_batch · dp · m with
                         m = 4·pp micro-batches under PP, 1 without)
    schedule             pipeline schedule: gpipe | 1f1b | interleaved | zb (ZB-H1)
    virtual_stages       model chunks per pipeline rank (interleaved 1F1B)
    bucket_bytes         gradient bucket size (PyTorch DDP's default 25 MB)
    recompute            activation recomputation: none | selective (attention core) | full (whole layer)
    seq                  sequence length (tokens)
    overlap_grad_reduce  launch gradient reductions during backward (else after it)
    overlap_param_gather ZeRO-1/2: gather updated parameters on the comm stream (else blocking the step end)
    fsdp_prefetch        ZeRO-3/FSDP: how many layers ahead parameters are all-gathered
    axis_order           rank mesh order, innermost first
    skew                 MoE routing skew: EP rank e gets (1 + skew·(1 - 2e/(ep-1))) times the uniform
                         expert load (busiest +skew, least busy -skew); 0 = uniform routing
    layer_split          "balanced" (layers not divisible by pp·v: first and last chunks get fewer, as
                         Llama 3 405B on 16 stages) or "even" (require divisibility)
    grad_bytes_per_param, optimizer_bytes_per_param: mixed-precision Adam stores 2-byte gradients and
                         12 bytes of optimizer state (fp32 master weights, momentum, variance) per
                         parameter: 16 bytes with the 2-byte weights (Rajbhandari et al. 2020, sec. 3.1)
    dtype                GEMM precision: bf16 | fp8 (FP8 transformer-block GEMMs, schedules.kernels)
    stack                training stack whose kernels are priced: megatron | torchtitan (schedules.kernels)
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
    seq: int = 2048
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    fsdp_prefetch: int = 1
    axis_order: str = "tp-cp-ep-dp-pp"
    skew: float = 0.0
    layer_split: str = "balanced"
    grad_bytes_per_param: float = 2.0
    optimizer_bytes_per_param: float = 12.0
    dtype: str = "bf16"
    stack: str = "megatron"

    # ------------------------------------------------------------------ derived
    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

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
    def splits_backward(self) -> bool:
        """Whether backward is split into B (input) and W (weight) ops."""
        return self.schedule == "zb"

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(world_size=self.world_size, num_microbatches=self.num_microbatches,
                 global_batch=self.effective_global_batch, zero_stage=self.zero_stage)
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
        if self.layer_split not in ("balanced", "even"):
            raise PlanError(f"layer_split must be 'balanced' or 'even', got {self.layer_split!r}")
        if not 0.0 <= self.skew <= 1.0:
            raise PlanError(f"skew must be in [0, 1] (relative extra load on the busiest EP rank), got {self.skew}")
        if self.skew and self.ep == 1:
            raise PlanError("routing skew needs expert parallelism: set --ep > 1 or skew 0")
        from schedules.kernels import check_choice
        check_choice(self.stack, self.dtype)
        self.axes  # parses axis_order
        if self.global_batch is not None:
            per = self.micro_batch * self.dp
            if self.global_batch < per or self.global_batch % per:
                raise PlanError(f"global batch {self.global_batch} is not a multiple of micro_batch({self.micro_batch})"
                                f" × dp({self.dp}) = {per}; use e.g. --global-batch {per * max(1, self.global_batch // per)}")
        m, p, v = self.num_microbatches, self.pp, self.virtual_stages
        if v > 1 and self.schedule != "interleaved":
            raise PlanError(f"virtual_stages={v} needs --schedule interleaved (schedule is {self.schedule})")
        if self.schedule == "interleaved":
            if p < 2:
                raise PlanError("the interleaved schedule needs pp >= 2; use --schedule 1f1b or raise --pp")
            if m % p:
                raise PlanError(f"interleaved 1F1B needs the number of micro-batches ({m}) to be a multiple of "
                                f"pp ({p}); set --global-batch to a multiple of micro_batch·dp·pp = "
                                f"{self.micro_batch * self.dp * p}")
        if self.ep > 1 and self.dp % self.ep:
            raise PlanError(f"ep({self.ep}) must divide dp({self.dp}): expert parallelism is carved out of data "
                            f"parallelism; use --dp a multiple of {self.ep}")
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

        for f in ("dp", "tp", "pp", "ep", "cp", "micro_batch", "virtual_stages", "seq"):
            v = getattr(self, f)
            if not is_int(v) or v < 1:
                raise PlanError(f"{f} must be a positive integer, got {v!r}")
        for f in ("zero", "fsdp_prefetch"):
            v = getattr(self, f)
            if not is_int(v) or v < 0:
                raise PlanError(f"{f} must be a non-negative integer, got {v!r}")
        if self.global_batch is not None and (not is_int(self.global_batch) or self.global_batch < 1):
            raise PlanError(f"global_batch must be a positive integer (sequences per step), got {self.global_batch!r}")
        for f in ("sp", "fsdp", "overlap_grad_reduce", "overlap_param_gather"):
            v = getattr(self, f)
            if not isinstance(v, bool):
                raise PlanError(f"{f} must be true or false, got {v!r}")
        for f, lo, strict in (("bucket_bytes", 0.0, True), ("grad_bytes_per_param", 0.0, True),
                              ("optimizer_bytes_per_param", 0.0, False), ("skew", 0.0, False)):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) \
                    or (v <= lo if strict else v < lo):
                raise PlanError(f"{f} must be a finite number {'>' if strict else '>='} {lo:g}, got {v!r}")
        for f in ("schedule", "recompute", "axis_order", "layer_split"):
            v = getattr(self, f)
            if not isinstance(v, str):
                raise PlanError(f"{f} must be a string, got {v!r}")

    def _validate_model(self, model) -> None:
        if model.params_only:
            if self.pp > 1 or self.ep > 1:
                raise PlanError(f"model {model.name} is given only by its parameter count; pp and ep need its "
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
        chunks = self.pp * self.virtual_stages
        if model.layers < chunks:
            raise PlanError(f"{model.name} has {model.layers} layers, fewer than pp×virtual_stages = {chunks} "
                            f"model chunks; lower --pp or --virtual-stages")
        if self.layer_split == "even" and model.layers % chunks:
            raise PlanError(f"{model.name} has {model.layers} layers, not divisible by pp×virtual_stages = "
                            f"{self.pp}×{self.virtual_stages} = {chunks}; choose a divisor of {model.layers} or "
                            f"use layer_split='balanced'")
        if self.ep > 1 and not model.is_moe:
            raise PlanError(f"ep({self.ep}) > 1 but {model.name} is a dense model (no experts); use --ep 1")
        if model.is_moe and model.experts % self.ep:
            raise PlanError(f"ep({self.ep}) must divide the {model.experts} experts of {model.name}")

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
        ep = self.ep if self.dp % self.ep == 0 else 1
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

    def groups(self, family: str) -> list[tuple[int, ...]]:
        """All groups of a family, each a tuple of ranks ordered by the varying coordinates."""
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
        out = []
        for r in range(self.world_size):
            if all((r // self._strides[a]) % self.axis_sizes[a] == 0 for a in vary):
                out.append(tuple(sorted(r + o for o in offsets)))
        return out


def distribute_layers(layers: int, chunks: int, split: str = "balanced") -> list[list[int]]:
    """Layer indices of each model chunk (virtual stage), in order.

    Divisible: equal chunks. Otherwise ("balanced") the remainder goes to the middle chunks first and the
    first and last chunks (which also hold the embedding and the LM head) keep fewer layers."""
    if chunks < 1 or layers < chunks:
        raise PlanError(f"cannot split {layers} layers into {chunks} non-empty model chunks")
    if split == "even" and layers % chunks:
        raise PlanError(f"{layers} layers are not divisible into {chunks} chunks")
    base, rem = divmod(layers, chunks)
    priority = list(range(1, chunks - 1)) + ([chunks - 1, 0] if chunks > 1 else [0])
    extra = set(priority[:rem])
    out, start = [], 0
    for c in range(chunks):
        n = base + (1 if c in extra else 0)
        out.append(list(range(start, start + n)))
        start += n
    return out
