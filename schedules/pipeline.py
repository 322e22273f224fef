"""Pipeline schedules: the order in which each pipeline rank runs forward and backward passes.

A schedule maps (p stages, m micro-batches, v chunks per stage, stage s) to that stage's ordered list of
``Action(phase, microbatch, chunk)``. ``chunk`` c on stage s is virtual stage ``c·p + s`` (Megatron's
interleaving). Phases: "F" forward, "B" fused backward, "Bi" backward-input, "W" backward-weight.

Schedules (registry ``SCHEDULES``), written as people read them — warm-up, steady state, cool-down:
- gpipe        all forwards, then all backwards (Huang et al. 2019)
- 1f1b         PipeDream-flush / Megatron 1F1B (Narayanan et al. 2021)
- interleaved  Megatron's interleaved 1F1B with v model chunks per rank (Narayanan et al. 2021, sec. 2.2)
- zb           ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism"): backward split into B and W; stage s
               defers s weight passes into the cool-down, same peak activation memory as 1F1B

``ideal_times`` executes the orders with fixed durations (free communication) — the reference for bubble
closed forms and a deadlock check independent of the engine.
"""
from __future__ import annotations

import functools

from typing import Callable, NamedTuple

from simulator.errors import DeadlockError, PlanError


class Action(NamedTuple):
    phase: str        # "F", "B", "Bi", "W"
    mb: int
    chunk: int = 0


def gpipe(p: int, m: int, v: int, s: int) -> list[Action]:
    if v != 1:
        raise PlanError("gpipe has no virtual stages")
    return [Action("F", i) for i in range(m)] + [Action("B", i) for i in reversed(range(m))]


def one_f_one_b(p: int, m: int, v: int, s: int) -> list[Action]:
    if v != 1:
        raise PlanError("1f1b has no virtual stages; use interleaved")
    warmup = min(p - s - 1, m)
    order = [Action("F", i) for i in range(warmup)]            # warm-up
    for i in range(m - warmup):                                  # steady state: one forward, one backward
        order += [Action("F", warmup + i), Action("B", i)]
    order += [Action("B", i) for i in range(m - warmup, m)]      # cool-down
    return order


def interleaved(p: int, m: int, v: int, s: int) -> list[Action]:
    """Megatron-LM's interleaved 1F1B (forward_backward_pipelining_with_interleaving)."""
    if m % p:
        raise PlanError(f"interleaved 1F1B needs micro-batches ({m}) divisible by pp ({p})")
    total = m * v

    def fwd(k):
        return Action("F", (k // (p * v)) * p + k % p, (k // p) % v)

    def bwd(k):
        return Action("B", (k // (p * v)) * p + k % p, v - 1 - (k // p) % v)

    if m == p:
        warmup = total      # Megatron: with m == p every forward runs first
    else:
        warmup = min((p - s - 1) * 2 + (v - 1) * p, total)
    order = [fwd(k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [fwd(k + warmup), bwd(k)]
    order += [bwd(k) for k in range(total - warmup, total)]
    return order


def zb_h1(p: int, m: int, v: int, s: int) -> list[Action]:
    """ZB-H1 with exact B/W semantics (the zero-bubble authors' reference schedule)."""
    if v != 1:
        raise PlanError("zb (ZB-H1) has no virtual stages")
    order: list[Action] = []
    f = b = w = 0
    for _ in range(min(p - s - 1, m)):                           # warm-up forwards, as 1F1B
        order.append(Action("F", f)); f += 1
    for _ in range(s):                                           # F + B, weight passes deferred
        if f == m:
            break
        order += [Action("F", f), Action("Bi", b)]; f += 1; b += 1
    while f < m:                                                 # steady state: F, B, W
        order += [Action("F", f), Action("Bi", b), Action("W", w)]; f += 1; b += 1; w += 1
    while b < m:                                                 # cool-down: B, W
        order += [Action("Bi", b), Action("W", w)]; b += 1; w += 1
    while w < m:                                                 # the deferred weight passes
        order.append(Action("W", w)); w += 1
    return order


SCHEDULES: dict[str, Callable[[int, int, int, int], list[Action]]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved": interleaved,
    "zb": zb_h1,
}


@functools.lru_cache(maxsize=4096)
def stage_order(schedule: str, p: int, m: int, v: int, s: int) -> tuple[Action, ...]:
    """Stage ``s``'s action order (cached: memory checks over many plans ask for it again and again)."""
    try:
        fn = SCHEDULES[schedule]
    except KeyError:
        raise PlanError(f"unknown pipeline schedule {schedule!r}; known: {', '.join(SCHEDULES)}") from None
    return tuple(fn(p, m, v, s))


def stage_orders(schedule: str, p: int, m: int, v: int = 1) -> list[list[Action]]:
    """Every stage's action order."""
    try:
        fn = SCHEDULES[schedule]
    except KeyError:
        raise PlanError(f"unknown pipeline schedule {schedule!r}; known: {', '.join(SCHEDULES)}") from None
    return [fn(p, m, v, s) for s in range(p)]


def action_deps(a: Action, s: int, p: int, v: int) -> list[tuple[int, Action]]:
    """(stage, action) pairs that must finish before action ``a`` of stage ``s`` can start (cross-stage
    data dependencies plus F-before-B and B-before-W of the same micro-batch and chunk)."""
    vs = a.chunk * p + s
    last = p * v - 1
    if a.phase == "F":
        if vs == 0:
            return []
        pv = vs - 1
        return [(pv % p, Action("F", a.mb, pv // p))]
    if a.phase in ("B", "Bi"):
        deps = [(s, Action("F", a.mb, a.chunk))]
        if vs < last:
            nv = vs + 1
            deps.append((nv % p, Action("B" if _fused(a) else "Bi", a.mb, nv // p)))
        return deps
    return [(s, Action("Bi", a.mb, a.chunk))]


def _fused(a: Action) -> bool:
    return a.phase == "B"


def ideal_times(orders: list[list[Action]], durations: Callable[[int, Action], float], v: int = 1
                ) -> dict[tuple[int, Action], tuple[float, float]]:
    """Start and end time of every action when each stage runs its order back to back, waiting only for
    data dependencies (communication free). Raises DeadlockError if the orders cannot complete."""
    p = len(orders)
    times: dict[tuple[int, Action], tuple[float, float]] = {}
    pos = [0] * p
    clock = [0.0] * p
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(p):
            while pos[s] < len(orders[s]):
                a = orders[s][pos[s]]
                deps = action_deps(a, s, p, v)
                if any(d not in times for d in deps):
                    break
                start = max([clock[s]] + [times[d][1] for d in deps])
                end = start + durations(s, a)
                times[(s, a)] = (start, end)
                clock[s] = end
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {s: orders[s][pos[s]] for s in range(p) if pos[s] < len(orders[s])}
            raise DeadlockError(f"pipeline orders deadlock; stages stuck at {stuck}")
    return times


def peak_in_flight(order: list[Action], weights: dict[int, float] | None = None, w_fraction: float = 0.0) -> float:
    """Peak activations held by one stage walking its order: +weight(chunk) at F, -(1-w_fraction) of it at
    B/Bi, -w_fraction at W (fused B frees all). With unit weights: peak micro-batches in flight."""
    cur = peak = 0.0
    for a in order:
        wt = 1.0 if weights is None else weights[a.chunk]
        if a.phase == "F":
            cur += wt
            peak = max(peak, cur)
        elif a.phase == "B":
            cur -= wt
        elif a.phase == "Bi":
            cur -= wt * (1.0 - w_fraction)
        else:
            cur -= wt * w_fraction
    return peak
