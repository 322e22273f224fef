"""Resource guards: refuse a simulation that would exceed the memory or event budget, before it starts.

Cost per simulated op, measured on this code base (``clustersim simulate`` of Llama-3-8B, TP8 PP2, 1,024
H100s, full mode, 432k ops; resident-set growth over the run, CPython 3, 2026-11):

- engine + programs + metrics: 140-150 B/op (analytical and flow networks); 320 B/op under tracemalloc
  at 256 GPUs, where fixed costs weigh more -> ``ENGINE_BYTES_PER_OP = 400`` (headroom for Python builds);
- the timeline DataFrame (report folders, Perfetto, plots): another ~730 B/op -> ``TIMELINE_BYTES_PER_OP = 800``;
- time (the whole command, re-measured 2026-12-02 after issue 15's engine work; the 2-core development
  machine runs 1.5-2.5x slower than this on loaded days): the same plan with global batch 512 (846k ops)
  5.6 us/op analytical, 6.1 us/op with the flow network; the 16k-GPU Llama-3-405B flagship in full mode (flow,
  14.7 M ops) 10.7 us/op and 155 B/op -> ``SECONDS_PER_OP`` (6 / 11 us: the flow network's figure from the
  larger, more contended run). The memory figure above is a budget (it refuses runs), so the announcement
  says "up to" for memory and "about" for time.

The budget defaults to 70 % of the memory available now (``/proc/meminfo`` MemAvailable) and
``DEFAULT_MAX_OPS`` events. A full-mode run whose symmetric twin would fit is told to use symmetric mode.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from simulator.errors import ConfigError, ResourceLimitError

ENGINE_BYTES_PER_OP = 400.0
TIMELINE_BYTES_PER_OP = 800.0
SECONDS_PER_OP = {"ideal": 6e-6, "analytical": 6e-6, "flow": 11e-6}
DEFAULT_MAX_OPS = 50_000_000          # ~5 min analytical, ~9 min with the flow network (this machine, unloaded)
MEMORY_FRACTION = 0.7
ANNOUNCE_ABOVE_OPS = 1_000_000       # full-mode runs above this many ops say first what they will cost
FALLBACK_MEMORY_BYTES = 8e9           # when the available memory cannot be read


@dataclass(frozen=True)
class BudgetEstimate:
    """What a run is expected to cost: simulated ops, bytes of memory, seconds of wall time."""

    ops: int
    memory_bytes: float
    seconds: float
    max_ops: int
    max_memory_bytes: float


def available_memory_bytes() -> float:
    """Memory available to a new allocation now (MemAvailable on Linux), else a conservative default."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024.0
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return FALLBACK_MEMORY_BYTES


def estimate(ops: int, *, timeline: bool = False, network: str = "analytical") -> tuple[float, float]:
    """(memory bytes, seconds) of simulating ``ops`` ops."""
    per_op = ENGINE_BYTES_PER_OP + (TIMELINE_BYTES_PER_OP if timeline else 0.0)
    return ops * per_op, ops * SECONDS_PER_OP.get(network, SECONDS_PER_OP["flow"])


def minimum_ops(model, plan, world: int, symmetric: bool) -> int:
    """A lower bound on the ops ``schedules.build_programs`` generates, from the plan alone (no programs
    built): every layer runs at least one forward and one backward compute op per micro-batch on each rank
    that holds it; symmetric mode simulates one rank per pipeline stage (all layers once), full mode
    every rank (world / pp ranks per stage). Lets the guard refuse a huge run before building anything."""
    per_pass = 2 * max(int(plan.num_microbatches), 1) * max(int(model.layers), 1)
    return per_pass if symmetric else per_pass * max(world // max(plan.pp, 1), 1)


def estimate_line(est: BudgetEstimate, network: str = "analytical", timeline: bool = False) -> str:
    """One line announcing a long run: ops, wall time and memory, and the measured rates they come from."""
    per_op = ENGINE_BYTES_PER_OP + (TIMELINE_BYTES_PER_OP if timeline else 0.0)
    secs = est.seconds
    when = f"{secs:.0f} s" if secs < 120 else f"{secs / 60:.1f} min"
    return (f"simulating {est.ops:,} ops: about {when} and up to {_fmt_bytes(est.memory_bytes)} of memory "
            f"({SECONDS_PER_OP.get(network, SECONDS_PER_OP['flow']) * 1e6:.0f} us per op measured, {per_op:.0f} B "
            f"per op budgeted; see clustersim/guards.py)")


def _fmt_bytes(b: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if b >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} B"


def check_budget(programs_or_estimate, mode: str = "full", *, max_ops: int | None = None,
                 max_memory_bytes: float | None = None, timeline: bool = False, network: str = "analytical",
                 symmetric_ops: int | None = None) -> BudgetEstimate:
    """Raise ResourceLimitError if simulating would exceed ``max_ops`` events or ``max_memory_bytes``.

    programs_or_estimate  a ``Programs`` (its simulated op count is used) or an int op count (e.g. the
                          ``represented_op_count`` of symmetric programs, to check full mode before building it)
    mode                  "symmetric" or "full": what will be simulated (only shapes the advice)
    timeline              a timeline / Perfetto / report folder will be built (more memory per op)
    network               "ideal" | "analytical" | "flow" (time estimate)
    symmetric_ops         op count of the symmetric twin, if known (advice: would symmetric mode fit?)
    Returns the estimate when within budget."""
    if mode not in ("symmetric", "full"):
        raise ConfigError(f"check_budget: mode must be 'symmetric' or 'full', got {mode!r}")
    if isinstance(programs_or_estimate, bool):
        raise ConfigError("check_budget: expected Programs or an op count")
    if isinstance(programs_or_estimate, (int, float)):
        ops = programs_or_estimate
        if not (isinstance(ops, int) or (math.isfinite(ops) and ops == int(ops))) or ops < 0:
            raise ConfigError(f"check_budget: op count must be a whole number >= 0, got {ops!r}")
        ops = int(ops)
    else:
        try:
            ops = int(programs_or_estimate.op_count)
        except AttributeError:
            raise ConfigError(f"check_budget: expected Programs or an op count, got "
                              f"{type(programs_or_estimate).__name__}") from None
    max_ops = DEFAULT_MAX_OPS if max_ops is None else int(max_ops)
    if max_memory_bytes is None:
        max_memory_bytes = MEMORY_FRACTION * available_memory_bytes()
    mem, secs = estimate(ops, timeline=timeline, network=network)
    est = BudgetEstimate(ops, mem, secs, max_ops, float(max_memory_bytes))
    over = []
    if ops > max_ops:
        over.append(f"{ops:,} ops exceed the event budget of {max_ops:,} (~{secs / 60:.0f} min of simulation)")
    if mem > max_memory_bytes:
        over.append(f"~{_fmt_bytes(mem)} of memory exceeds the budget of {_fmt_bytes(max_memory_bytes)} "
                    f"({ENGINE_BYTES_PER_OP + (TIMELINE_BYTES_PER_OP if timeline else 0):.0f} B/op"
                    f"{' with the timeline' if timeline else ''})")
    if not over:
        return est
    advice = []
    if mode == "full":
        if symmetric_ops is not None:
            advice.append(f"symmetric mode (--mode symmetric) would simulate {symmetric_ops:,} ops")
        else:
            advice.append("use symmetric mode (--mode symmetric; only possible without per-rank faults)")
    advice.append("simulate a smaller horizon: fewer micro-batches (a smaller --global-batch) or fewer GPUs")
    if timeline:
        advice.append("skip the timeline and report folder (no --out)")
    raise ResourceLimitError(f"simulation too large ({mode} mode): " + "; ".join(over) + ". Try: "
                             + "; or ".join(advice) + ".")
