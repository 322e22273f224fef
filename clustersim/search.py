"""``clustersim search``: find the best parallel plans for a model on a cluster.

1. Enumerate plans: tp, pp, cp, ep (MoE), dp = GPUs / (tp·pp·cp), ZeRO stage or FSDP, micro-batch size,
   schedule and virtual stages, recomputation; sequence parallelism whenever tp > 1.
2. Prune: invalid plans (ParallelPlan.validate), plans that do not fit in HBM (schedules.memory, no
   simulation needed), then by a cheap lower bound on the step time: the FLOPs each GPU must execute at
   the device's best achievable rate, stretched by the schedule's ideal bubble (m+p-1)/m (1F1B, GPipe),
   (m+(p-1)/v)/m (interleaved), 1 (zero bubble). Candidates are simulated in increasing order of that bound
   and the search stops once the next bound exceeds the k-th best simulated step time: the pruned plans
   cannot make the top k.
3. Simulate the survivors in parallel: a local process pool (default) or a Dask distributed cluster
   (``--scheduler tcp://HOST:PORT``). Every result is cached by plan (a JSON-lines file keyed by a hash of
   the experiment and of the simulator's code), so re-running a search is instant and a new version of
   clustersim never reuses an old result.
4. Print the top k and write a Pareto plot (throughput vs peak memory).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import itertools
import json
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import click

from clustersim.paths import NonEmptyPath
from simulator.errors import ClusterSimError, ConfigError
from clustersim.experiment import Experiment, resolve_model, resolve_plan
from schedules.kernels import DTYPES, STACKS
from schedules.plan import ATTENTION, ATTENTION_KERNELS, DEFAULT_RECOMPUTE_MODULES

CACHE_VERSION = 2


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """Hash of the code and presets that determine a simulated result (schedules, simulator, topologies):
    a cached result from another version of clustersim is never reused."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for pkg in ("schedules", "simulator", "topologies"):
        for f in sorted((root / pkg).rglob("*")):
            if f.suffix in (".py", ".yaml", ".csv", ".json") and f.is_file():
                h.update(str(f.relative_to(root)).encode())
                h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _pow2_divisors(n: int, limit: int) -> list[int]:
    return [d for d in _divisors(n) if d <= limit and (d & (d - 1)) == 0]


@dataclasses.dataclass
class SearchSpace:
    """What the search enumerates (each a list of allowed values)."""

    micro_batches: tuple = (1, 2, 4)
    schedules: tuple = ("1f1b", "interleaved", "zb", "gpipe")
    virtual_stages: tuple = (2, 4)
    recompute: tuple = ("none", "selective", "full")   # "op" (torchtitan per-op checkpointing) on request;
    #                                     "selective:m1+m2" names Megatron recompute modules (split_recompute)
    zero: tuple = (0, 1, 2, 3)          # 3 = FSDP
    cp: tuple = (1, 2)
    ep: tuple | None = None             # None: every EP degree that divides the experts and dp (or, folded,
    #                                     tp·cp·dp)
    fold: bool = True                   # also MoE parallel folding with etp 1 where tp > 1 (schedules.plan)
    max_tp: int = 64
    max_pp: int = 16
    tp: tuple | None = None             # fixed tensor-parallel degrees (None: powers of two up to max_tp)
    pp: tuple | None = None             # fixed pipeline degrees (None: divisors up to max_pp)


def split_recompute(value: str) -> tuple[str, tuple[str, ...] | None]:
    """A search recompute option: (mode, Megatron recompute modules or None). "selective:mla_up_proj+moe_act"
    is selective recomputation of those modules; the other values are ``--recompute`` modes."""
    mode, sep, mods = value.partition(":")
    if not sep:
        return mode, None
    from schedules.plan import parse_recompute_modules
    if mode != "selective":
        raise ConfigError(f"--recompute {value!r}: recompute modules go with selective only (selective:m1+m2)")
    return mode, parse_recompute_modules(mods.replace("+", ","), f"--recompute {value}")


def enumerate_candidates(base: Experiment, model, world: int, space: SearchSpace,
                         refusals: collections.Counter | None = None) -> list[Experiment]:
    """Every plan in the space that passes ParallelPlan.validate (ZeRO stage 3 is expressed as FSDP);
    ``refusals`` counts the validation errors of the others, by message."""
    cands = []
    gb = base.global_batch
    experts = getattr(model, "experts", 0) or 0
    tps = [t for t in space.tp if world % t == 0] if space.tp is not None else _pow2_divisors(world, space.max_tp)
    for tp in tps:
        for cp in space.cp:
            for pp in _divisors(world // tp):
                if (space.pp is not None and pp not in space.pp) or (space.pp is None and pp > space.max_pp):
                    continue
                if (world // tp) % (pp * cp):
                    if refusals is not None:
                        refusals[f"tp·pp·cp does not divide the {world} GPUs"] += 1
                    continue
                dp = world // (tp * pp * cp)
                # (ep, etp): carved out of dp with the dense TP, or folded over tp·cp·dp with etp 1
                eps = [(e, None) for e in _divisors(dp) if experts % e == 0] if experts else [(1, None)]
                if experts and space.fold and tp > 1:
                    eps += [(e, 1) for e in _divisors(tp * cp * dp) if e > 1 and experts % e == 0]
                if space.ep is not None:
                    eps = [(e, f) for e, f in eps if e in space.ep]
                for (ep, etp), mb, zero, rc_opt in itertools.product(eps, space.micro_batches, space.zero,
                                                                     space.recompute):
                    rc, rc_mods = split_recompute(rc_opt)
                    if gb is not None and gb % (dp * mb):
                        if refusals is not None:
                            refusals[f"global batch {gb} is not divisible by dp · micro-batch"] += 1
                        continue
                    if pp > 1 and zero >= 2:
                        continue        # ZeRO-2/3 re-shard gradients/params per micro-batch: not used with PP
                    scheds = [("1f1b", 1)] if pp == 1 else \
                        [(s, v) for s in space.schedules for v in ((1,) if s != "interleaved" else space.virtual_stages)]
                    for sched, v in scheds:
                        exp = dataclasses.replace(
                            base, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, sp=tp > 1, micro_batch=mb,
                            tp_comm_overlap=base.tp_comm_overlap and tp > 1,
                            zero=0 if zero == 3 else zero, fsdp=zero == 3, recompute=rc, schedule=sched,
                            recompute_modules=rc_mods, virtual_stages=v, name=None)
                        try:
                            resolve_plan(dataclasses.replace(exp), model, world)
                        except ClusterSimError as e:
                            if refusals is not None:
                                refusals[str(e)] += 1
                            continue
                        cands.append(exp)
    return cands


def plan_key(exp: Experiment) -> str:
    """Cache key: a hash of everything that determines the result."""
    d = exp.to_dict()
    d.pop("name", None)
    d["_v"] = CACHE_VERSION
    d["_code"] = code_fingerprint()
    cal = d.get("calibration")
    if cal:              # the file's content, not its name: a re-calibrated file must not hit old results
        try:
            d["_calibration"] = hashlib.sha256(Path(cal).read_bytes()).hexdigest()[:16]
        except OSError:
            pass         # the run reports the unreadable file
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:24]


def stage_chunk_flops(model, plan) -> list[list[float]]:
    """FLOPs one rank of each pipeline stage executes per micro-batch, per model chunk: forward, both
    backward halves and recomputation of its layers, split over tp·cp, plus the LM head (and the MTP modules'
    projections and head passes) on the last stage."""
    from schedules.memory import holds_head, stage_chunks
    from schedules.plan import recompute_flops, selective_recompute_flops
    split = plan.tp * plan.cp
    frozen = bool(plan.lora_rank)       # LoRA: no weight gradients (the adapters' few FLOPs left out: a bound)
    out = []
    for s in range(plan.pp):
        chunks = []
        for c, layers in enumerate(stage_chunks(model, plan, s)):
            f = 0.0
            for layer in layers:
                lf = model.layer_flops(layer, plan.seq, plan.micro_batch)
                f += lf.total - (lf.backward_weight if frozen else 0.0)
                rc = plan.layer_recompute(layer)
                if rc == "full":
                    f += lf.forward
                elif rc == "selective":     # Megatron's recompute modules (the attention core by default)
                    f += selective_recompute_flops(model, plan, layer, lf)
                elif rc == "op":        # torchtitan's per-op checkpointing: the GEMMs it does not save
                    f += recompute_flops(model, plan, layer) * split
            if c == plan.virtual_stages - 1 and holds_head(model, plan, s):
                f += (2.0 if frozen else 3.0) * model.head_flops(plan.seq, plan.micro_batch)
            if any(map(model.is_mtp_layer, layers)):      # the MTP modules' projections and head passes
                f += (2.0 if frozen else 3.0) * model.mtp_extra_flops(plan.seq, plan.micro_batch)
            chunks.append(f / split)
        out.append(chunks)
    return out


def lower_bound_s(exp: Experiment, model, plan, cost, world: int) -> float:
    """A step time the simulated plan cannot beat, from compute alone (communication only adds):

    - every rank executes its stage's FLOPs for m micro-batches: m·T_s for each stage s, plus the
      tensor- and expert-parallel collectives that serialise with them on the compute stream;
    - under GPipe / 1F1B / interleaved stage s works only after micro-batch 0's forward has passed the first
      chunk of every stage before it, and its last backward must pass them again: m·T_s + Σ_{q<s} c_{q,0}
      (for a balanced pipeline the ideal bubble, (p-1)/v of a stage); zero-bubble schedules get no such term.
    With ``tp_comm_overlap`` the TP collectives are left out (they may hide behind the GEMMs; the GEMMs'
    chunking and SM margin only add time).
    Times use the cost model's FLOP/s for an op as large as three forward passes of the biggest chunk,
    larger than any op the plan really runs (achieved FLOP/s only grows with op size)."""
    flops = stage_chunk_flops(model, plan)
    biggest = max(max(ch) for ch in flops)
    rate = best_flops_per_s(cost, biggest, plan.dtype)
    # with the userbuffers TP overlap the TP collectives run beside the GEMMs (tp_overlap stream): no term
    tp_s = 0.0 if plan.tp_comm_overlap else tp_critical_comm_s(model, plan, cost)
    ep_s = ep_critical_comm_s(model, plan, cost)
    kern = kernel_chunk_times(model, plan, cost)
    # folded experts on fewer TP ranks (etp < tp) without shared ones: an MoE layer's only TP collectives are
    # its attention block's (half); with etp = tp (Megatron-Core's grid with cp > 1) the experts' etp gathers
    # run on the same group with topk times the tokens, no cheaper than the dense layer's
    tp_moe = tp_s / 2 if plan.folded and plan.expert_tp < plan.tp and not model.shared_experts else tp_s
    if model.is_hybrid:     # one block per layer, one TP collective pair: half a transformer layer's
        tp_s /= 2
        tp_moe = 0.0 if plan.folded and not model.shared_experts else tp_s
    chunk_t = [[max(f / rate, k) + tp_s * (n - n_moe) + (tp_moe + ep_s[s]) * n_moe
                for f, k, (n, n_moe) in zip(ch, kch, counts)]
               for s, (ch, kch, counts) in enumerate(zip(flops, kern, _chunk_layer_counts(model, plan)))]
    m = plan.num_microbatches
    stage_t = [sum(ch) for ch in chunk_t]
    bound = m * max(stage_t)
    if plan.pp > 1 and plan.schedule != "zb":
        # stage s starts nothing before micro-batch 0's forward has passed the first chunk of every earlier
        # stage, and its last op (the last micro-batch's backward of its first chunk) leaves that backward to
        # pass them again: m·T_s + Σ_{q<s} chunk_t[q][0] for every s ((p-1)·c more than m·T for a balanced
        # pipeline, the ideal bubble; the first stage's own idle time is not bounded by (p-1)·c_min when it is
        # the heaviest, as a frozen LoRA head can leave it, nor under interleaving)
        before = 0.0
        for s in range(plan.pp):
            bound = max(bound, m * stage_t[s] + before)
            before += chunk_t[s][0]
    return bound


def kernel_chunk_times(model, plan, cost) -> list[list[float]]:
    """Compute-stream seconds one rank of each stage spends per micro-batch and chunk under the kernel-level
    model: the same kernel lists the programs carry (schedules.kernels), priced by the cost model. Compute
    ops serialise on the compute stream, so this is a lower bound on the chunk's share of the step (zeros
    where the kernel model does not price layers: flat roofline or a calibration's layer fits)."""
    from schedules.kernels import phase_kernels
    from schedules.memory import holds_head, stage_chunks
    chunks = [stage_chunks(model, plan, s) for s in range(plan.pp)]
    pricer = getattr(cost, "kernels", None)
    if pricer is None or getattr(cost, "_layer_fits", None):
        return [[0.0] * len(ch) for ch in chunks]
    phases = ("forward", "backward_input", "backward_weight") if plan.splits_backward else ("forward", "backward")
    overhead = cost._compute_fit.op_overhead_s if getattr(cost, "_compute_fit", None) is not None else 0.0
    pace = getattr(cost, "slowest_gpu_factor", 1.0)      # the job's slowest GPU (topologies.variation)

    def layer_s(layer: int) -> float:
        t = 0.0
        for ph in phases:
            parts = ("attention", "experts") if model.is_moe_layer(layer) else ("layer",)
            for part in parts:
                t += pricer.time_s(phase_kernels(model, plan, layer, ph, part=part)) * pace + overhead
            if plan.cp > 1 and ph != "backward_weight":
                t += (plan.cp - 1) * pricer.time_s(phase_kernels(model, plan, layer, ph, part="ring")) * pace
        return t

    per_kind: dict[tuple, float] = {}      # by layer kind: MoE or dense, local attention, hybrid block
    out = []
    for s, stage in enumerate(chunks):
        row = []
        for c, layers in enumerate(stage):
            t = 0.0
            for layer in layers:
                kind = (model.is_moe_layer(layer), model.local_attention(layer), model.layer_kind(layer))
                if kind not in per_kind:
                    per_kind[kind] = layer_s(layer)
                t += per_kind[kind]
            if c == plan.virtual_stages - 1 and holds_head(model, plan, s):
                t += sum(pricer.time_s(phase_kernels(model, plan, None, ph, part="head")) for ph in phases)
            row.append(t)
        out.append(row)
    return out


def _chunk_layer_counts(model, plan) -> list[list[tuple[int, int]]]:
    """Per stage and chunk: (layers, of which MoE layers)."""
    from schedules.memory import stage_chunks
    return [[(len(ls), sum(1 for l in ls if model.is_moe_layer(l))) for ls in stage_chunks(model, plan, s)]
            for s in range(plan.pp)]


def ep_critical_comm_s(model, plan, cost) -> list[float]:
    """Per pipeline stage: contention-free seconds of the expert-parallel all-to-alls one MoE layer issues
    per micro-batch on the compute stream, where they serialise with compute (schedules.generate: dispatch
    and combine in the forward and in the backward, of micro-batch·seq/cp/tp·top_k·hidden activations),
    priced on the EP group of the stage's first rank: that rank's own serial work bounds the step. Zeros
    without expert parallelism."""
    from schedules.generate import ep_destinations, ep_dispatch_bytes
    from simulator.costs import CommRequest
    if not model.is_moe or plan.ep == 1:
        return [0.0] * plan.pp
    cluster = getattr(cost, "cluster", None)
    size = ep_dispatch_bytes(model, plan, ep_destinations(model, plan, getattr(cluster, "domain_size", None)))
    out = []
    for s in range(plan.pp):
        first = plan.rank_of(pp=s)
        group = plan.ep_group(first)
        out.append(4 * cost.comm_time_s(CommRequest("all_to_all", group, size)))
    return out


def tp_critical_comm_s(model, plan, cost) -> float:
    """Contention-free time of the tensor-parallel collectives one layer issues per micro-batch (forward
    and backward) on the compute stream, where they serialise with compute (schedules.generate puts them
    there): with SP 4 all-gathers and 4 reduce-scatters, else 4 all-reduces, of micro-batch·seq/cp·hidden
    bf16 activations. Zero when tp = 1 or the mesh does not keep TP innermost (then no bound is claimed)."""
    from simulator.costs import CommRequest
    if plan.tp == 1 or not plan.axis_order.startswith("tp"):
        return 0.0
    size = plan.micro_batch * plan.seq / plan.cp * model.hidden * 2.0
    ranks = tuple(range(plan.tp))
    if plan.sp:
        return 4 * (cost.comm_time_s(CommRequest("all_gather", ranks, size))
                    + cost.comm_time_s(CommRequest("reduce_scatter", ranks, size)))
    return 4 * cost.comm_time_s(CommRequest("all_reduce", ranks, size))


def best_flops_per_s(cost, op_flops: float = 1e18, dtype: str = "bf16") -> float:
    """The highest FLOP/s the cost model grants a compute op of ``op_flops`` FLOPs (no memory traffic): a
    plain op, or a transformer layer's forward or backward op (a calibration may price those with its
    layer fits)."""
    from simulator.program import BACKWARD, FORWARD, Op
    best = 0.0
    for layer, phase in ((None, FORWARD), (0, FORWARD), (0, BACKWARD)):
        t = cost.compute_time_s(0, Op("compute", "probe", flops=op_flops, layer=layer, phase=phase))
        best = max(best, op_flops / t if t > 0 else math.inf)
    # the kernel-level model prices each kernel at no more than its curve's sustained peak (FP8 above BF16)
    kernel_best = getattr(cost, "best_kernel_flops_per_s", lambda dtype: 0.0)(dtype)
    return min(max(cost.peak_flops(0), kernel_best), max(best, kernel_best))


def fits(model, plan, world: int, capacity: float) -> tuple[bool, float]:
    from schedules.memory import memory_per_rank
    mem = memory_per_rank(model, plan, world_size=world)
    peak = max(d["total"] for d in mem.values())
    return peak <= capacity, peak


def evaluate(exp_dict: dict) -> dict:
    """Simulate one candidate (runs in a worker process); returns the --json summary or an error."""
    from clustersim.experiment import experiment_from_dict, run_experiment
    exp = experiment_from_dict(exp_dict)
    try:
        out = run_experiment(exp, check_budget=False, validate=False)
    except ClusterSimError as e:
        return {"error": str(e), "experiment": exp_dict}
    except MemoryError:
        return {"error": "out of memory while simulating this plan (more memory than a search worker may use)",
                "experiment": exp_dict}
    s = out.summary()
    s["experiment"] = exp_dict
    return s


def evaluate_json(exp_dict: dict) -> str:
    """``evaluate`` as JSON text: what a Dask worker sends back (plain data, parsed and validated by the
    client, never unpickled)."""
    return json.dumps(evaluate(exp_dict), sort_keys=True, default=str)


_RESULT_NUMBERS = ("step_time_s", "tokens_per_s", "peak_memory_bytes", "mfu", "bubble_fraction",
                   "exposed_comm_fraction")


def checked_result(res, where: str) -> dict:
    """``res`` if it is a plausible search result (an error record, or a summary whose step time is a finite
    positive number and whose other fields have their types); else ClusterSimError naming ``where``."""
    from simulator.inputs import brief
    if not isinstance(res, dict):
        raise ClusterSimError(f"{where}: a search result must be a mapping, got {brief(res)}")
    if "error" in res:
        if not isinstance(res["error"], str):
            raise ClusterSimError(f"{where}: error record without a message: {brief(res)}")
        return res
    for k in _RESULT_NUMBERS:
        v = res.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ClusterSimError(f"{where}: field {k!r} must be a finite number >= 0, got {brief(v)}")
    if not res["step_time_s"] > 0:
        raise ClusterSimError(f"{where}: step_time_s must be > 0, got {res['step_time_s']}")
    if not isinstance(res.get("fits_in_memory"), bool) or not isinstance(res.get("plan"), dict):
        raise ClusterSimError(f"{where}: fits_in_memory (true/false) and plan (mapping) are required")
    return res


class Cache:
    """Results by plan key in a JSON-lines file (append-only; last valid entry wins).

    Safe for concurrent searches: appends take an exclusive ``fcntl`` lock and first end a torn last line
    (a run killed mid-write) so it cannot swallow the new record; reads take a shared lock, skip torn or
    invalid lines (``{}``, NaN step times) and ``refresh()`` picks up what other searches appended since."""

    def __init__(self, path: Path | None):
        self.path = path
        self.data: dict[str, dict] = {}
        self._offset = 0
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ConfigError(f"cannot create the search cache folder {path.parent}: {e.strerror}") from None
            self.refresh()

    def refresh(self) -> None:
        """Read the records appended since the last read."""
        import fcntl
        if self.path is None or not self.path.exists():
            return
        try:
            with self.path.open("rb") as f:
                fcntl.flock(f, fcntl.LOCK_SH)
                f.seek(self._offset)
                chunk = f.read()
        except OSError as e:
            raise ConfigError(f"cannot read the search cache {self.path}: {e.strerror}") from None
        end = chunk.rfind(b"\n") + 1               # a torn tail stays unread until it is completed
        self._offset += end
        for line in chunk[:end].splitlines():
            try:
                rec = json.loads(line, parse_constant=_no_constant)
                self.data[rec["key"]] = checked_result(rec["result"], "cache")
            except (ValueError, KeyError, TypeError, RecursionError, ClusterSimError):
                continue        # torn, foreign or invalid record: simulate that plan again

    def get(self, key: str):
        return self.data.get(key)

    def put(self, key: str, result: dict) -> None:
        import fcntl
        self.data[key] = result
        if self.path is None:
            return
        from simulator.inputs import json_safe
        line = json.dumps(json_safe({"key": key, "result": result}), sort_keys=True, default=str,
                          allow_nan=False) + "\n"
        try:
            with self.path.open("ab+") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                f.seek(0, os.SEEK_END)
                if f.tell() > 0:
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":
                        f.write(b"\n")           # end a torn line left by a killed search
                f.write(line.encode())
        except OSError as e:
            raise ConfigError(f"cannot write the search cache {self.path}: {e.strerror}") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number")


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "clustersim"


def _exp_dict(exp: Experiment) -> dict:
    d = exp.to_dict()
    if isinstance(exp.model, str):
        d["model"] = exp.model
    return d


def run_search(base: Experiment, *, top_k: int = 5, space: SearchSpace | None = None, workers: int | None = None,
               scheduler: str | None = None, cache_path: Path | None = None, progress=None,
               max_simulations: int | None = None, max_memory_fraction: float | None = None) -> dict:
    """Enumerate, prune and simulate; return {'top': [...], 'evaluated': [...], 'stats': {...}}.
    A plan is offered only if its peak memory stays within ``max_memory_fraction`` of the device's (default
    experiment.TIGHT_MEMORY_FRACTION, where `simulate` notes a plan as at risk): the model counts tensors,
    and the caching allocator's reserved peak runs above that count (torchtitan's published peaks, `validate`
    rows 400-404: 8-15% above ours)."""
    from clustersim.experiment import (TIGHT_MEMORY_FRACTION, build_cost_model, check_device_dtype,
                                       load_cluster_for, stack_for)
    t0 = time.perf_counter()
    space = space or SearchSpace()
    cluster = load_cluster_for(base)
    check_device_dtype(base.dtype, cluster.accelerator, base.fp8_recipe)
    world = cluster.world_size
    model = resolve_model(base)
    if base.global_batch is None:
        raise ConfigError("search needs --global-batch (sequences per step)")
    if base.tp_comm_overlap and stack_for(base, cluster) != "megatron":
        raise ConfigError(f"--tp-comm-overlap is Transformer Engine's userbuffers overlap: it needs the "
                          f"megatron stack (stack is {stack_for(base, cluster)})")
    cost = build_cost_model(base, cluster)
    fraction = TIGHT_MEMORY_FRACTION if max_memory_fraction is None else max_memory_fraction
    if not 0.0 < fraction <= 1.0:
        raise ConfigError(f"--max-memory-fraction must be in (0, 1], got {fraction}")
    capacity = cost.memory_capacity_bytes(0)
    limit = capacity * fraction
    refusals: collections.Counter = collections.Counter()
    cands = enumerate_candidates(base, model, world, space, refusals)
    if not cands and refusals:
        # every plan of the space is invalid: say why, commonest reasons first
        why = "; ".join(f"{n} × {reason}" for reason, n in refusals.most_common(3))
        more = len(refusals) - 3
        raise ConfigError(f"no plan for {base.model} on {world} GPUs: every candidate plan of the search space is "
                          f"invalid ({sum(refusals.values())} plans: {why}"
                          + (f"; {more} other reason{'s' if more > 1 else ''}" if more > 0 else "") + ")")
    stats = {"candidates": len(cands), "pruned_memory": 0, "pruned_bound": 0, "simulated": 0, "cached": 0,
             "failed": 0}
    scored = []
    for exp in cands:
        plan = resolve_plan(dataclasses.replace(exp), model, world)
        ok, peak = fits(model, plan, world, limit)
        if not ok:
            stats["pruned_memory"] += 1
            continue
        scored.append((lower_bound_s(exp, model, plan, cost, world), plan_key(exp), exp))
    scored.sort(key=lambda t: (t[0], t[1]))
    cache = Cache(cache_path)
    results: list[dict] = []
    best: list[float] = []

    def kth_best() -> float:
        return sorted(best)[top_k - 1] if len(best) >= top_k else float("inf")

    def fits_sim(res) -> bool:
        return bool(res["fits_in_memory"]) and res["peak_memory_bytes"] <= limit

    def record(key, res):
        res = dict(res)
        res["lower_bound_s"] = bound_of[key]
        results.append(res)
        if "error" in res:
            stats["failed"] += 1
        elif fits_sim(res):             # the engine's memory timeline is the final word on fitting
            best.append(res["step_time_s"])

    bound_of = {k: b for b, k, _ in scored}
    pending = []
    for b, key, exp in scored:
        hit = cache.get(key)
        if hit is not None:
            stats["cached"] += 1
            record(key, hit)
        else:
            pending.append((b, key, exp))
    # simulate in waves in bound order; stop when the next bound cannot reach the top k
    wave = max(2 * (workers or os.cpu_count() or 1), 4)
    executor = _Executor(workers, scheduler)
    try:
        i = 0
        while i < len(pending):
            if max_simulations is not None and stats["simulated"] >= max_simulations:
                stats["pruned_bound"] += len(pending) - i
                break
            if pending[i][0] >= kth_best():
                stats["pruned_bound"] += len(pending) - i
                break
            cache.refresh()              # results another search appended meanwhile
            batch = []
            for p in pending[i:i + wave]:
                hit = cache.get(p[1])
                if hit is not None:
                    stats["cached"] += 1
                    record(p[1], hit)
                elif p[0] < kth_best():
                    batch.append(p)
                else:
                    stats["pruned_bound"] += 1
            i += min(wave, len(pending) - i)
            for key, res in executor.map([(k, _exp_dict(e)) for _, k, e in batch]):
                try:
                    res = checked_result(res, "simulated plan")
                except ClusterSimError as e:       # e.g. a NaN step time: that plan failed, not the search
                    res = {"error": str(e), "experiment": res.get("experiment") if isinstance(res, dict) else None}
                cache.put(key, res)
                stats["simulated"] += 1
                record(key, res)
                if progress:
                    progress(stats["simulated"] + stats["cached"], len(scored))
    finally:
        executor.close()
    if progress:
        progress(len(scored), len(scored))     # the plans the bound pruned are decided too
    ok = sorted((r for r in results if "error" not in r), key=lambda r: r["step_time_s"])
    fitting = [r for r in ok if fits_sim(r)]
    stats["simulated_not_fitting"] = len(ok) - len(fitting)
    if not fitting:
        raise ConfigError(
            f"no plan for {base.model} on {world} GPUs with global batch {base.global_batch}: "
            f"{stats['candidates']} valid candidate plans, {stats['pruned_memory']} do not fit in "
            f"{limit / 1e9:.3g} GB ({fraction:.3g} of the device's memory), {stats['simulated_not_fitting']} "
            f"exceed it when simulated, {stats['failed']} failed; try more GPUs, a smaller model or sequence, "
            f"or a global batch divisible by more data-parallel sizes")
    stats["wall_time_s"] = time.perf_counter() - t0
    stats["world_size"] = world
    from clustersim.evidence import evidence_for
    evidence = evidence_for(cluster.accelerator.name, base.dtype, bool(getattr(model, "is_moe", False)),
                            stack_for(base, cluster), gpus=world, model=getattr(model, "name", None))
    return {"top": fitting[:top_k], "evaluated": ok, "failed": [r for r in results if "error" in r],
            "stats": stats, "memory_capacity_bytes": capacity, "memory_limit_bytes": limit, "evidence": evidence}


DESER = ["msgpack"]               # what the client may deserialise from the cluster: plain data only
DASK_CONNECT_TIMEOUT_S = 10.0
DASK_WORKER_WAIT_S = 30.0          # a scheduler without workers: fail after this instead of waiting forever


class _Executor:
    """A local process pool, or a Dask distributed client when a scheduler address is given.

    A Dask scheduler and its workers are trusted to run our code, but their answers are not trusted as
    objects: workers return JSON text (``evaluate_json``), the client accepts only msgpack-encoded plain
    data (``deserializers=["msgpack"]``: nothing is unpickled in this process), then parses and validates
    each result (``checked_result``)."""

    def __init__(self, workers: int | None, scheduler: str | None, fn=None,
                 worker_wait_s: float = DASK_WORKER_WAIT_S):
        self.scheduler = scheduler
        self.client = None
        self.pool = None
        self.fn = fn
        if scheduler:
            try:
                from distributed import Client
            except ImportError:
                raise ConfigError("--scheduler needs dask.distributed: pip install 'clustersim[sweep]'") from None
            import logging
            logging.getLogger("distributed").setLevel(logging.CRITICAL)   # we report failures ourselves, in one line
            try:
                self.client = Client(scheduler, timeout=f"{DASK_CONNECT_TIMEOUT_S}s", serializers=["msgpack", "pickle"],
                                     deserializers=DESER)
            except Exception as e:          # bad address scheme, refused connection, timeout, TLS ...
                raise ConfigError(f"cannot reach the Dask scheduler at {scheduler!r}: "
                                  f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
            try:
                self.client.wait_for_workers(1, timeout=worker_wait_s)
            except Exception:
                self.close()
                raise ConfigError(f"the Dask scheduler at {scheduler} has no workers (waited {worker_wait_s:g} s); "
                                  f"start some with `dask worker {scheduler}`") from None
        else:
            n = self.workers = workers or os.cpu_count() or 1
            self.pool = self._new_pool(n) if n > 1 else None

    @staticmethod
    def _new_pool(n: int) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=n)

    def _pool_map(self, items: list[tuple[str, dict]]):
        """Results of a local process pool as they complete. A worker the OS kills (out of memory) breaks the
        pool: the plans still unanswered are run again one at a time in a fresh pool, so the one that kills
        its worker again comes back as a failed plan, not as the search's crash."""
        futs = {self.pool.submit(evaluate, d): (k, d) for k, d in items}
        left = dict(futs.values())
        try:
            for f in as_completed(futs):
                k = futs[f][0]
                res = f.result()
                del left[k]
                yield k, res
            return
        except BrokenProcessPool:
            self.pool.shutdown(wait=False, cancel_futures=True)
        for k, d in left.items():
            self.pool = self._new_pool(1)
            try:
                res = self.pool.submit(evaluate, d).result()
            except BrokenProcessPool:
                res = {"error": "the worker simulating this plan was killed (by the operating system, most likely "
                                "for running out of memory)", "experiment": d}
            finally:
                self.pool.shutdown(wait=False, cancel_futures=True)
            yield k, res
        self.pool = self._new_pool(self.workers)

    def map(self, items: list[tuple[str, dict]]):
        if self.client is not None:
            fn = self.fn or evaluate_json
            futs = self.client.map(fn, [d for _, d in items], pure=False)
            keys = {f.key: k for f, (k, _) in zip(futs, items)}
            from distributed import as_completed as das_completed
            for f in das_completed(futs):
                yield keys[f.key], self._from_worker(f)
        elif self.pool is not None:
            yield from self._pool_map(items)
        else:
            for k, d in items:
                yield k, evaluate(d)

    def _from_worker(self, fut) -> dict:
        from simulator.inputs import brief, parse_json
        where = f"Dask worker result from {self.scheduler}"
        try:
            text = fut.result()
        except Exception as e:                 # undeserialisable (not plain data) or a failed task
            raise ClusterSimError(f"{where}: rejected ({type(e).__name__}: "
                                  f"{brief(str(e).splitlines()[0] if str(e) else '', 120)})") from None
        if not isinstance(text, str):
            raise ClusterSimError(f"{where}: expected JSON text, got {type(text).__name__}")
        return checked_result(parse_json(text, where, err=ClusterSimError), where)

    def close(self):
        if self.client is not None:
            self.client.close()
        if self.pool is not None:
            self.pool.shutdown()


def top_kernels_label(res: dict, n: int = 3) -> str:
    """The kernels with the largest share of a plan's compute time, e.g. "mlp fc1 (gate+up) 31% · ..."."""
    return " · ".join(f"{k['kernel']} {k['share']:.0%}" for k in (res.get("top_kernels") or [])[:n])


def describe(res: dict) -> str:
    p = res["plan"]
    s = f"tp{p['tp']} pp{p['pp']} dp{p['dp']}"
    if p.get("ep", 1) > 1:
        s += f" ep{p['ep']}"
        if p.get("expert_tp", p["tp"]) != p["tp"]:
            s += f" etp{p['expert_tp']}"
    if p.get("cp", 1) > 1:
        s += f" cp{p['cp']}"
    if p.get("fsdp"):
        s += " fsdp"
    elif p.get("zero"):
        s += f" zero{p['zero']}"
    if p["pp"] > 1:
        s += f" {p['schedule']}" + (f"/v{p['virtual_stages']}" if p['schedule'] == "interleaved" else "")
    s += f" mb{p['micro_batch']} rc:{p['recompute']}"
    mods = tuple(p.get("recompute_modules") or DEFAULT_RECOMPUTE_MODULES)
    if p["recompute"] == "selective" and mods != DEFAULT_RECOMPUTE_MODULES:
        s += f"({'+'.join(mods)})"
    if p.get("tp_comm_overlap"):
        s += " tp-overlap"
    if p.get("lora_rank"):
        s += f" lora{p['lora_rank']}"
    return s


def pareto_plot(evaluated: list[dict], path: Path, title: str = "", capacity_bytes: float | None = None,
                limit_bytes: float | None = None) -> Path:
    """Throughput (tokens/s) against peak memory for every simulated plan; the Pareto front (of the plans
    that fit) joined; plans over the HBM capacity (or the search's memory limit, dotted) in grey."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    limit = limit_bytes or capacity_bytes or float("inf")
    fit, over = [], []
    for r in evaluated:
        (fit if r["fits_in_memory"] and r["peak_memory_bytes"] <= limit else over).append(r)
    ax.scatter([r["peak_memory_bytes"] / 1e9 for r in fit], [r["tokens_per_s"] for r in fit], s=14, alpha=0.6,
               color="#4c72b0", label="simulated plans")
    if over:
        ax.scatter([r["peak_memory_bytes"] / 1e9 for r in over], [r["tokens_per_s"] for r in over], s=14,
                   alpha=0.6, color="#999999", label="over the memory limit")
    if capacity_bytes:
        ax.axvline(capacity_bytes / 1e9, color="#555555", ls="--", lw=1, label="HBM capacity")
    if limit_bytes and limit_bytes != capacity_bytes:
        ax.axvline(limit_bytes / 1e9, color="#555555", ls=":", lw=1, label="memory limit of the search")
    front, best_y = [], -1.0
    for r in sorted(fit, key=lambda r: (r["peak_memory_bytes"], -r["tokens_per_s"])):
        if r["tokens_per_s"] > best_y:
            front.append(r)
            best_y = r["tokens_per_s"]
    ax.plot([r["peak_memory_bytes"] / 1e9 for r in front], [r["tokens_per_s"] for r in front], "-o",
            color="#c44e52", ms=5, label="Pareto front")
    for j, r in enumerate(front[-2:][::-1]):
        ax.annotate(describe(r), (r["peak_memory_bytes"] / 1e9, r["tokens_per_s"]), fontsize=7,
                    xytext=(6, -12 - 12 * j), textcoords="offset points")
    ax.set_xlabel("peak memory per GPU (GB)")
    ax.set_ylabel("throughput (tokens/s)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    from simulator.atomic import write_with
    write_with(path, lambda tmp: fig.savefig(tmp, dpi=120, format=path.suffix.lstrip(".").lower() or "png"))
    plt.close(fig)
    return path


def _check_plot_path(path: Path) -> None:
    """A plot path matplotlib can write, in an existing folder (checked before a long search)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.backend_bases import FigureCanvasBase
    fmts = FigureCanvasBase.get_supported_filetypes()
    ext = path.suffix.lstrip(".").lower()
    if ext not in fmts:
        raise ConfigError(f"--pareto {path}: unknown image type {path.suffix or '(none)'!r}; use one of "
                          f"{', '.join('.' + f for f in sorted(fmts))}")
    if not path.parent.is_dir():
        raise ConfigError(f"--pareto {path}: folder {path.parent} does not exist")


@click.command("search")
@click.option("--cluster", default="dgx-h100", show_default=True, help="Cluster preset.")
@click.option("--gpus", type=int, required=True, help="Number of GPUs.")
@click.option("--model", "-m", required=True, help="Model preset.")
@click.option("--global-batch", type=int, required=True, help="Sequences per step.")
@click.option("--seq", type=int, default=4096, show_default=True, help="Sequence length (tokens).")
@click.option("--network", type=click.Choice(["ideal", "analytical", "flow"]), default="analytical",
              show_default=True)
@click.option("--calibration", type=NonEmptyPath(dir_okay=False))
@click.option("--dtype", type=click.Choice(DTYPES), default="bf16", show_default=True,
              help="GEMM precision (fp8: Transformer Engine FP8 GEMMs).")
@click.option("--stack", type=click.Choice(STACKS),
              help="Training stack whose kernels are priced (default: megatron on NVIDIA, else torchtitan); "
                   "the choices of `simulate --stack`.")
@click.option("--attention", type=click.Choice(ATTENTION), default="flash", show_default=True,
              help="Attention kernel of every plan: flash, or eager (pre-FlashAttention stacks: the s×s scores "
                   "priced through HBM and kept for backward; as `simulate --attention`).")
@click.option("--attention-kernel", type=click.Choice(ATTENTION_KERNELS), default="auto", show_default=True,
              help="FlashAttention kernel priced with --attention flash (as `simulate --attention-kernel`).")
@click.option("--top-k", type=int, default=5, show_default=True)
@click.option("--micro-batches", default="1,2,4", show_default=True, help="Micro-batch sizes to try.")
@click.option("--schedules", default="1f1b,interleaved,zb,gpipe", show_default=True)
@click.option("--recompute", "recompute_opts", default="none,selective,full", show_default=True,
              help="Recomputation settings to try; selective:m1+m2 is selective recomputation of Megatron's "
                   "recompute modules (e.g. selective:mla_up_proj+moe_act+layernorm).")
@click.option("--zero", "zero_opts", default="0,1,2,3", show_default=True, help="ZeRO stages (3 = FSDP).")
@click.option("--cp", "cp_opts", default="1,2", show_default=True, help="Context-parallel degrees.")
@click.option("--tp", "tp_opts", help="Fixed tensor-parallel degree(s), e.g. 8 or 4,8 (default: powers of two).")
@click.option("--pp", "pp_opts", help="Fixed pipeline-parallel degree(s), e.g. 16 (default: divisors up to 16).")
@click.option("--ep", "ep_opts", help="Fixed expert-parallel degree(s) (default: every one that fits).")
@click.option("--fold/--no-fold", default=True, show_default=True,
              help="MoE: also try folded expert parallelism (etp 1, ep up to tp·cp·dp) where tp > 1.")
@click.option("--max-memory-fraction", type=float, default=None,
              help="Offer only plans whose peak memory stays within this fraction of the device's "
                   "(default 0.95: the model counts tensors, not the allocator's fragmentation or the CUDA "
                   "context).")
@click.option("--tp-comm-overlap", is_flag=True,
              help="Plans with tp > 1 run Transformer Engine's TP communication overlap (as `simulate "
                   "--tp-comm-overlap`; megatron stack; split-backward schedules are then not tried).")
@click.option("--lora-rank", type=int, default=0, show_default=True,
              help="Search plans for LoRA fine-tuning with adapters of this rank (as `simulate --lora-rank`).")
@click.option("--lora-targets", default=None, help="With --lora-rank: the linears with adapters (qkv,proj,fc1,fc2).")
@click.option("--packed-doc-tokens", type=int, default=0, show_default=True,
              help="Sequences packed from documents of N tokens (as `simulate --packed-doc-tokens`).")
@click.option("--workers", type=int, help="Local worker processes (default: CPU count).")
@click.option("--scheduler", help="Dask scheduler address tcp://HOST:PORT (else a local process pool).")
@click.option("--cache-dir", type=NonEmptyPath(file_okay=False), help="Result cache (default ~/.cache/clustersim).")
@click.option("--no-cache", is_flag=True, help="Neither read nor write the cache.")
@click.option("--pareto", type=NonEmptyPath(dir_okay=False), help="Write the Pareto plot (PNG).")
@click.option("--json", "as_json", is_flag=True)
def search(cluster, gpus, model, global_batch, seq, network, calibration, dtype, stack, attention, attention_kernel,
           top_k, micro_batches, schedules, recompute_opts, zero_opts, cp_opts, tp_opts, pp_opts, ep_opts, fold,
           max_memory_fraction, tp_comm_overlap, lora_rank, lora_targets, packed_doc_tokens, workers, scheduler,
           cache_dir, no_cache, pareto, as_json):
    """Search parallel plans for MODEL on GPUS of CLUSTER; print the top k and a Pareto plot."""
    from simulator.inputs import brief

    def ints(s, what, lo, hi):
        try:
            v = tuple(int(x) for x in s.split(",") if x.strip())
        except ValueError:
            raise ConfigError(f"--{what}: expected comma-separated integers, got {brief(s)}") from None
        if not v or min(v) < lo or max(v) > hi:
            raise ConfigError(f"--{what}: expected integers from {lo} to {hi}, got {brief(s)}")
        return tuple(dict.fromkeys(v))      # each once (a repeat had listed every plan of it twice)
    if top_k < 1:
        raise ConfigError("--top-k must be >= 1")
    if attention_kernel != "auto" and attention != "flash":
        raise ConfigError(f"--attention-kernel {attention_kernel} chooses a FlashAttention kernel; with --attention "
                          f"{attention} no FlashAttention runs")
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    if gpus < 1 or global_batch < 1 or seq < 1:
        raise ConfigError("--gpus, --global-batch and --seq must be >= 1")
    if pareto:
        _check_plot_path(Path(pareto))          # before the search, not after it
    def names(s, what):
        v = tuple(x.strip() for x in s.split(",") if x.strip())
        if not v:
            raise ConfigError(f"--{what}: no value given (got {brief(s)}); name at least one")
        return tuple(dict.fromkeys(v))
    space = SearchSpace(micro_batches=ints(micro_batches, "micro-batches", 1, 1 << 20),
                        schedules=names(schedules, "schedules"), recompute=names(recompute_opts, "recompute"),
                        zero=ints(zero_opts, "zero", 0, 3), cp=ints(cp_opts, "cp", 1, 1 << 20),
                        tp=ints(tp_opts, "tp", 1, 1 << 20) if tp_opts is not None else None,
                        pp=ints(pp_opts, "pp", 1, 1 << 20) if pp_opts is not None else None,
                        ep=ints(ep_opts, "ep", 1, 1 << 20) if ep_opts is not None else None, fold=fold)
    for what, vals in (("tp", space.tp), ("pp", space.pp), ("ep", space.ep)):
        if vals is not None and (min(vals) < 1 or (gpus and any(gpus % v for v in vals))):
            raise ConfigError(f"--{what}: every degree must be >= 1 and divide the {gpus} GPUs, got "
                              f"{','.join(map(str, vals))}")
    if gpus and all(gpus % c for c in space.cp):       # (a list may hold degrees some GPU counts cannot take)
        raise ConfigError(f"--cp: no degree of {','.join(map(str, space.cp))} divides the {gpus} GPUs")
    for s in space.schedules:
        if s not in ("gpipe", "1f1b", "interleaved", "zb"):
            raise ConfigError(f"--schedules: the search tries gpipe, 1f1b, interleaved and zb, not {s!r} (simulate "
                              f"or compare one plan under any schedule)")
    for r in space.recompute:
        if split_recompute(r)[0] not in ("none", "selective", "full", "op"):
            raise ConfigError(f"--recompute: unknown value {r!r}; choose from none, selective, full, op, "
                              f"selective:MODULE+MODULE (Megatron recompute modules)")
    if cache_dir and no_cache:
        raise ConfigError("--cache-dir names the result cache that --no-cache turns off: give one or the other")
    if tp_comm_overlap and space.tp is not None and max(space.tp) == 1:
        raise ConfigError("--tp-comm-overlap overlaps tensor-parallel collectives, and --tp 1 has none: drop one")
    given_fold = click.get_current_context().get_parameter_source("fold") == click.core.ParameterSource.COMMANDLINE
    if given_fold and not getattr(resolve_model(Experiment(model=model)), "experts", 0):     # either spelling
        raise ConfigError(f"--{'' if fold else 'no-'}fold {'turns on' if fold else 'turns off'} MoE parallel folding, "
                          f"and {model} is a dense model: drop it")
    if lora_rank < 0 or packed_doc_tokens < 0:
        raise ConfigError("--lora-rank and --packed-doc-tokens must be >= 0")
    from schedules.plan import lora_fields
    lora = lora_fields(lora_rank, lora_targets)
    base = Experiment(cluster=cluster, gpus=gpus, model=model, global_batch=global_batch, seq=seq,
                      network=network, calibration=calibration, mode="symmetric", dtype=dtype, stack=stack,
                      tp_comm_overlap=tp_comm_overlap, attention=attention, attention_kernel=attention_kernel,
                      lora_rank=lora_rank, packed_doc_tokens=packed_doc_tokens,
                      lora_targets=lora.get("lora_targets"))
    if space.ep is not None and max(space.ep) > 1 and not getattr(resolve_model(base), "experts", 0):
        raise ConfigError(f"--ep {','.join(map(str, space.ep))}: {base.model} is a dense model (no experts to "
                          f"place); leave --ep out, or search an MoE model")
    cache_path = None if no_cache else Path(cache_dir or default_cache_dir()) / "search.jsonl"
    from clustersim.simulate import DelayedProgress
    import sys
    bar = DelayedProgress("searching", delay_s=0.5, enabled=sys.stderr.isatty(), unit="plans")
    try:
        out = run_search(base, top_k=top_k, space=space, workers=workers, scheduler=scheduler,
                         cache_path=cache_path, progress=bar, max_memory_fraction=max_memory_fraction)
    finally:
        bar.close()
    from clustersim.experiment import sequence_notes
    out["notes"] = sequence_notes(packed_doc_tokens, resolve_model(base), seq)
    if pareto and out["evaluated"]:
        pareto_plot(out["evaluated"], Path(pareto), f"{model} on {gpus} GPUs ({cluster})",
                    out["memory_capacity_bytes"], out["memory_limit_bytes"])
    if as_json:
        click.echo(json.dumps({"top": out["top"], "stats": out["stats"], "evidence": out["evidence"],
                               "notes": out["notes"]}, sort_keys=True, default=str))
        return
    from rich.console import Console
    from rich.table import Table
    st = out["stats"]
    from clustersim.simulate import param_str
    t = Table(title=f"top {min(top_k, len(out['top']))} plans · {model} ({param_str(resolve_model(base))} parameters) "
                    f"on {gpus} × {cluster} "
                    f"· global batch {global_batch} · seq {seq}")
    for c in ("#", "plan", "step s", "tokens/s", "MFU", "bubble", "exposed comm", "peak mem GB", "top kernels"):
        t.add_column(c, justify="right" if c not in ("plan", "top kernels") else "left")
    for i, r in enumerate(out["top"], 1):
        t.add_row(str(i), describe(r), f"{r['step_time_s']:.3f}", f"{r['tokens_per_s']:,.0f}", f"{r['mfu']:.1%}",
                  f"{r['bubble_fraction']:.1%}", f"{r['exposed_comm_fraction']:.1%}",
                  f"{r['peak_memory_bytes'] / 1e9:.1f}", top_kernels_label(r))
    console = Console()
    console.width = max(console.width, 180)     # keep rows on one line when piped
    console.print(t)
    click.echo(f"{st['candidates']} candidate plans: {st['pruned_memory']} do not fit in memory, "
               f"{st['pruned_bound']} pruned by the step-time bound, {st['simulated']} simulated, "
               f"{st['cached']} from cache, {st['failed']} failed; {st['wall_time_s']:.1f} s")
    from clustersim.evidence import evidence_line, mfu_against_published
    click.echo(f"evidence (clustersim validate): {evidence_line(out['evidence'])}")
    # (LoRA's MFU counts a frozen model's step: published pre-training runs are not its measure)
    against = None if lora_rank else mfu_against_published(out["evidence"], out["top"][0]["mfu"])
    if against:
        click.echo(f"best plan: {against} (same FLOP count and peak)")
    for note in out["notes"]:
        click.echo(f"note: {note}")
    if pareto:
        click.echo(f"wrote {pareto}")
