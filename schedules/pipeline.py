"""Pipeline schedules: the order in which each pipeline rank runs forward and backward passes.

A schedule maps (p stages, m micro-batches, v chunks per stage, stage s) to that stage's ordered list of
``Action(phase, microbatch, chunk)``. Phases: "F" forward, "B" fused backward, "Bi" backward-input, "W"
backward-weight. Which model piece (virtual stage) a chunk holds depends on the schedule's *layout*:

- loop  chunk c on stage s is piece c·p + s (Megatron's interleaving; v = 1 is plain pipelining)
- v     two chunks in a V: stage s holds pieces s and 2p - 1 - s (ZB-V, DualPipeV); the turn at the last
        stage stays on that rank
- dual  two chunks, one per direction (DualPipe): stage s holds piece s of the downward copy (chunk 0) and
        piece p - 1 - s of the upward copy (chunk 1); the first half of the micro-batches flows down, the
        second half up, so every piece's weights are held twice

Schedules (registry ``SCHEDULES``), written as their papers draw them — warm-up, steady state, cool-down:
- gpipe        all forwards, then all backwards (Huang et al. 2019)
- 1f1b         PipeDream-flush / Megatron 1F1B (Narayanan et al. 2021)
- interleaved  Megatron's interleaved 1F1B with v model chunks per rank and its micro-batch groups of p
               (``get_schedule_table``): any m, any v (Narayanan et al. 2021, sec. 2.2)
- zb-h1 (zb)   ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", fig. 3): B split into B and W;
               stage s defers s weight passes into the cool-down; 1F1B's peak activations
- zb-h2        ZB-H2 (same paper, fig. 3): 2(p-1-s)+1 warm-up forwards fill the bubble before the first
               B, W passes fill the tail; up to 2p - 1 micro-batches in flight; no gap on any stage
               between its first F and its last W when T_F = T_B = T_W
- zb-v         ZB-V (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory"): V layout, B/W split,
               greedy as the authors build it, activations capped at 1F1B's (2p chunk micro-batches)
- zb-auto      the zero-bubble automatic schedule (ZB-1p / ZB-2p) under a memory limit given in
               micro-batches of a stage's activations (``limit``; default p = ZB-1p)
- dualpipe     DualPipe (DeepSeek-V3 report, sec. 3.2.1; deepseek-ai/DualPipe): bidirectional, 8 steps,
               forward of one micro-batch overlapped with the backward of another (``overlapped_pairs``)
- dualpipev    DualPipeV ("cut-in-half" DualPipe): the same 8 steps on a V layout

``ideal_times`` executes the orders with fixed durations (free communication) — the reference for bubble
closed forms and a deadlock check independent of the engine.
"""
from __future__ import annotations

import functools
from collections import deque
from typing import Callable, NamedTuple

from simulator.errors import DeadlockError, PlanError


class Action(NamedTuple):
    phase: str        # "F", "B", "Bi", "W"
    mb: int
    chunk: int = 0


# ---------------------------------------------------------------------------------------------- layouts
LAYOUT = {"zb-v": "v", "dualpipev": "v", "dualpipe": "dual"}
SPLIT_BACKWARD = frozenset({"zb", "zb-h1", "zb-h2", "zb-v", "zb-auto", "dualpipe", "dualpipev"})


def layout(schedule: str) -> str:
    return LAYOUT.get(schedule, "loop")


def model_chunks(schedule: str, v: int) -> int:
    """Model chunks each stage holds."""
    return 2 if layout(schedule) != "loop" else v


def num_pieces(schedule: str, p: int, v: int) -> int:
    """Model pieces (virtual stages) the layers are split into."""
    return p if layout(schedule) == "dual" else p * model_chunks(schedule, v)


def piece(schedule: str, p: int, v: int, s: int, c: int) -> int:
    """Model piece held by chunk ``c`` of stage ``s``."""
    lay = layout(schedule)
    if lay == "loop":
        return c * p + s
    if lay == "v":
        return s if c == 0 else 2 * p - 1 - s
    return s if c == 0 else p - 1 - s


def next_hop(schedule: str, p: int, v: int, s: int, c: int) -> tuple[int, int] | None:
    """(stage, chunk) a forward goes to after chunk ``c`` of stage ``s``; None at the end of the model."""
    lay = layout(schedule)
    if lay == "loop":
        return None if c * p + s == p * v - 1 else ((s + 1) % p, c + (s == p - 1))
    if lay == "v":
        if c == 0:
            return (s + 1, 0) if s < p - 1 else (s, 1)
        return None if s == 0 else (s - 1, 1)
    if c == 0:
        return None if s == p - 1 else (s + 1, 0)
    return None if s == 0 else (s - 1, 1)


def prev_hop(schedule: str, p: int, v: int, s: int, c: int) -> tuple[int, int] | None:
    """(stage, chunk) a forward comes from into chunk ``c`` of stage ``s``; None at the model's start."""
    lay = layout(schedule)
    if lay == "loop":
        return None if c == 0 and s == 0 else ((s - 1) % p, c - (s == 0))
    if lay == "v":
        if c == 1:
            return (s + 1, 1) if s < p - 1 else (s, 0)
        return None if s == 0 else (s - 1, 0)
    if c == 0:
        return None if s == 0 else (s - 1, 0)
    return None if s == p - 1 else (s + 1, 1)


# ---------------------------------------------------------------------------------------------- classic
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


def interleaved_table(m: int, v: int, group: int) -> list[tuple[int, int]]:
    """Megatron's schedule table: (micro-batch, chunk) of the k-th forward; micro-batches run in groups of
    ``group``, each group through chunk 0, then chunk 1, ...; the last group takes whatever is left."""
    table = []
    for lo in range(0, m, group):
        hi = m if lo + group >= m else lo + group
        table += [(i, c) for c in range(v) for i in range(lo, hi)]
    return table


def _interleaved_order(p: int, m: int, v: int, s: int, extra: int) -> list[Action]:
    table = interleaved_table(m, v, p)
    total = len(table)
    if m == p:
        warmup = total      # Megatron: with m == p every forward runs first
    else:
        warmup = min((p - s - 1) * 2 + (v - 1) * p + extra, total)
    fwd = [Action("F", i, c) for i, c in table]
    bwd = [Action("B", i, v - 1 - c) for i, c in table]
    order = fwd[:warmup]
    for k in range(total - warmup):
        order += [fwd[k + warmup], bwd[k]]
    order += bwd[total - warmup:]
    return order


@functools.lru_cache(maxsize=256)
def _interleaved_orders(p: int, m: int, v: int) -> tuple[tuple[Action, ...], ...]:
    """Megatron's warm-up 2(p-1-s) + (v-1)·p; when the last micro-batch group is shorter than p that many
    forwards cannot reach the first backward, and every stage warms up by the fewest extra forwards that
    let the orders complete (checked with ``ideal_times``)."""
    for extra in range(0, m * v + 1):
        orders = [_interleaved_order(p, m, v, s, extra) for s in range(p)]
        try:
            ideal_times(orders, lambda s, a: 1.0, v, "interleaved")
        except DeadlockError:
            continue
        return tuple(tuple(o) for o in orders)
    raise PlanError(f"no interleaved 1F1B order for pp {p}, {m} micro-batches, {v} chunks")  # pragma: no cover


def interleaved(p: int, m: int, v: int, s: int) -> list[Action]:
    """Megatron-LM's interleaved 1F1B (forward_backward_pipelining_with_interleaving) with micro-batch
    groups of p: warm-up 2(p-1-s) + (v-1)·p forwards (all of them when m == p), then 1F1B pairs."""
    if v == 1:
        return one_f_one_b(p, m, v, s)
    return list(_interleaved_orders(p, m, v)[s])


# ---------------------------------------------------------------------------------------------- zero bubble
def zb_h1(p: int, m: int, v: int, s: int) -> list[Action]:
    """ZB-H1 with exact B/W semantics (the zero-bubble authors' reference schedule)."""
    if v != 1:
        raise PlanError("zb-h1 has no virtual stages")
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


def zb_h2(p: int, m: int, v: int, s: int, w_frac: float | None = None, costs: tuple | None = None
          ) -> list[Action]:
    """ZB-H2: the zero-bubble schedule with up to 2p - 1 micro-batches in flight. Warm-up: 2(p-1-s)+1
    forwards reach the first B without a gap; steady state: B, W, F; the tail defers W passes so that every
    stage runs without a gap from its first F to its last W (the paper's parallelogram). Built by the
    zero-bubble list scheduler at that activation limit."""
    if v != 1:
        raise PlanError("zb-h2 has no virtual stages")
    return list(_zb_auto_orders(p, m, float(2 * p - 1), _wf(w_frac), _costs(costs))[s])


def _wf(w_frac: float | None) -> float:
    """The share of a micro-batch's activations that W still needs (B frees the rest); None counts all of
    it until W (the zero-bubble runtime's default F-to-W accounting)."""
    return 1.0 if w_frac is None else round(float(w_frac), 4)


def _costs(costs: tuple | None) -> tuple[float, float, float]:
    """(T_F, T_B, T_W) relative pass times; None: equal (the papers' T_F = T_B = T_W setting)."""
    if costs is None:
        return (1.0, 1.0, 1.0)
    tf, tb, tw = (float(x) for x in costs)
    if min(tf, tb, tw) <= 0:
        raise PlanError(f"pass times must be positive, got {costs!r}")
    return (round(tf / tf, 4), round(tb / tf, 4), round(tw / tf, 4))


def _greedy_zb(p: int, m: int, lay: str, limit: float, costs=(1.0, 1.0, 1.0), w_frac: float = 1.0
               ) -> list[list[Action]]:
    """Zero-bubble list scheduling (Qi et al. 2024, sec. 3.2 heuristic, our implementation): every stage
    runs what is ready in the order B, F (within the activation limit), and fills any gap it would
    otherwise wait in with a pending W; activations count from F to W, in micro-batches of one chunk.
    ``lay`` is "loop" (one chunk) or "v" (two chunks). The result is feasible by construction."""
    sched = "zb-v" if lay == "v" else "zb-h1"
    nch = 2 if lay == "v" else 1
    tf, tb, tw = costs
    end: dict[tuple[int, Action], float] = {}
    clock = [0.0] * p
    orders: list[list[Action]] = [[] for _ in range(p)]
    nf = [[0] * nch for _ in range(p)]
    nb = [[0] * nch for _ in range(p)]
    pend: list[deque] = [deque() for _ in range(p)]
    held = [0.0] * p
    left = [3 * m * nch] * p

    def ready_at(s: int, a: Action) -> float | None:
        t = 0.0
        for d in action_deps(a, s, p, nch, sched):
            e = end.get(d)
            if e is None:
                return None
            t = max(t, e)
        return t

    def place(s: int, a: Action, start: float, dur: float) -> None:
        end[(s, a)] = start + dur
        clock[s] = start + dur
        orders[s].append(a)
        left[s] -= 1

    blocked: set[int] = set()                                    # waiting for another stage at this instant
    while any(left):
        live = [x for x in range(p) if left[x] and x not in blocked]
        if not live:
            raise PlanError(f"zero-bubble schedule cannot progress with an activation limit of {limit:g} "
                            f"micro-batches")
        s = min(live, key=lambda x: clock[x])
        now = clock[s]
        cands = []
        for c in reversed(range(nch)):                           # backward: later chunk first
            if nb[s][c] < nf[s][c]:
                a = Action("Bi", nb[s][c], c)
                t = ready_at(s, a)
                if t is not None:
                    cands.append((max(t, now), 0, a))
        for c in reversed(range(nch)):                           # forward: later chunk first (drain the V)
            if nf[s][c] < m and held[s] + 1 <= limit + 1e-9:
                a = Action("F", nf[s][c], c)
                t = ready_at(s, a)
                if t is not None:
                    cands.append((max(t, now), 1, a))
        cands.sort(key=lambda x: (x[0], x[1]))
        if cands and cands[0][0] <= now:
            _, _, a = cands[0]
            if a.phase == "Bi":
                nb[s][a.chunk] += 1
                held[s] -= 1.0 - w_frac
                pend[s].append(Action("W", a.mb, a.chunk))
                place(s, a, now, tb)
            else:
                nf[s][a.chunk] += 1
                held[s] += 1
                place(s, a, now, tf)
            blocked.clear()
            continue
        if pend[s]:                                              # a gap (or the memory cap): a weight pass
            held[s] -= w_frac
            place(s, pend[s].popleft(), now, tw)
            blocked.clear()
            continue
        later = [t for t, _, _ in cands] + [e for e in end.values() if e > now]
        if later:
            clock[s] = min(later)
        else:
            blocked.add(s)
    return orders


def zb_v(p: int, m: int, v: int, s: int, w_frac: float | None = None, costs: tuple | None = None
         ) -> list[Action]:
    """ZB-V: V layout, B/W split, activations capped at 1F1B's peak (p micro-batches = 2p chunk ones);
    ``w_frac``: the share of activations W still needs after B."""
    return list(_zb_v_orders(p, m, _wf(w_frac), _costs(costs))[s])


@functools.lru_cache(maxsize=256)
def _zb_v_orders(p: int, m: int, w_frac: float, costs: tuple) -> tuple[tuple[Action, ...], ...]:
    return tuple(tuple(o) for o in _greedy_zb(p, m, "v", 2 * p, costs, w_frac))


@functools.lru_cache(maxsize=256)
def _zb_auto_orders(p: int, m: int, limit: float, w_frac: float = 1.0, costs: tuple = (1.0, 1.0, 1.0)
                    ) -> tuple[tuple[Action, ...], ...]:
    if limit < 1:
        raise PlanError(f"zb-auto needs a memory limit of at least one micro-batch's activations, got {limit:g}")
    cands = [_greedy_zb(p, m, "loop", limit, costs, w_frac)]
    if limit >= p:                                   # ZB-H1 holds p micro-batches: the greedy must beat it
        cands.append([zb_h1(p, m, 1, s) for s in range(p)])
    return tuple(tuple(o) for o in min(cands, key=lambda o: _stage_bubble(o, costs)))


def _stage_bubble(orders: list[list[Action]], costs: tuple) -> tuple[float, float]:
    """(largest per-stage gap total, makespan) with pass times ``costs``: how the zero-bubble authors rank
    candidate schedules (a stage's time runs from its first F to its last W)."""
    dur = {"F": costs[0], "Bi": costs[1], "W": costs[2], "B": costs[1] + costs[2]}
    t = ideal_times(orders, lambda s, a: dur[a.phase], 1, "zb-h1")
    worst = 0.0
    for s, o in enumerate(orders):
        spans = [t[(s, a)] for a in o]
        worst = max(worst, max(e for _, e in spans) - min(b for b, _ in spans) - sum(dur[a.phase] for a in o))
    return worst, max(e for _, e in t.values())


def zb_auto(p: int, m: int, v: int, s: int, limit: float | None = None, w_frac: float | None = None,
            costs: tuple | None = None) -> list[Action]:
    """ZB-1p / ZB-2p: automatic zero-bubble schedule under ``limit`` micro-batches of activations per stage
    (default p: 1F1B's memory, ZB-1p; 2p: ZB-2p)."""
    if v != 1:
        raise PlanError("zb-auto has no virtual stages")
    return list(_zb_auto_orders(p, m, float(p if limit is None else limit), _wf(w_frac), _costs(costs))[s])


# ---------------------------------------------------------------------------------------------- DualPipe
def _dualpipe(p: int, m: int, s: int, v_shape: bool) -> tuple[list[Action], frozenset[int]]:
    """DualPipe's 8 steps on rank ``s`` (deepseek-ai/DualPipe ``step``), as (order, indices i where order[i]
    (F) and order[i+1] (B) run overlapped). Local phase 0/1 is the rank's chunk 0/1 in the V layout; in the
    dual layout the second half of the ranks swap them (their phase 0 is the upward direction)."""
    if v_shape:
        n, r, half = p, s, m
        swap = 0
    else:
        n, r, half = p // 2, min(s, p - 1 - s), m // 2
        swap = int(s >= p // 2)
    middle = r == n - 1
    order: list[Action] = []
    pairs: set[int] = set()
    fcnt, bcnt = [0, 0], [0, 0]
    wq: deque = deque()

    def chunk(ph):
        return ph ^ swap

    def mb(c, k):
        return k if v_shape else c * half + k

    def fwd(ph):
        c = chunk(ph)
        order.append(Action("F", mb(c, fcnt[c]), c)); fcnt[c] += 1

    def bwd(ph, zb=False):
        c = chunk(ph)
        a = Action("Bi" if zb else "B", mb(c, bcnt[c]), c); bcnt[c] += 1
        order.append(a)
        if zb:
            wq.append(Action("W", a.mb, c))

    def weight():
        order.append(wq.popleft())

    def fb(ph0, ph1):
        pairs.add(len(order))
        fwd(ph0)
        bwd(ph1)

    for _ in range((n - r - 1) * 2):                             # 1: nF0
        fwd(0)
    for _ in range(r + 1):                                       # 2: nF0F1
        fwd(0)
        fwd(1)
    for _ in range(n - r - 1):                                   # 3: nB1W1F1 (zero bubble)
        bwd(1, True)
        weight()
        fwd(1)
    for i in range(half - 2 * n + r + 1):                        # 4: nF0B1F1B0 (main step)
        if i == 0 and middle:                                    # not overlapped, to shorten the bubble
            fwd(0)
            bwd(1)
        else:
            fb(0, 1)
        fb(1, 0)
    for _ in range(n - r - 1):                                   # 5: nB1F1B0
        bwd(1)
        fb(1, 0)
    zb = False
    for i in range(r + 1):                                       # 6: nB1B0, the second half zero-bubble
        if i == (r + 1) // 2 and r % 2 == 1:
            zb = True
        bwd(1, zb)
        if i == (r + 1) // 2 and r % 2 == 0:
            zb = True
        bwd(0, zb)
    for _ in range(n - r - 1):                                   # 7: nWB0
        weight()
        bwd(0, True)
    while wq:                                                    # 8: nW
        weight()
    return order, frozenset(pairs)


def _check_dualpipe(name: str, p: int, m: int, v: int) -> None:
    if v not in (1, 2):
        raise PlanError(f"{name} holds two chunks per stage by itself; leave --virtual-stages at 1 or 2")
    if p < 2:
        raise PlanError(f"{name} is a bidirectional pipeline: it needs pp >= 2 (with pp 1 use 1f1b)")
    if name == "dualpipe":
        if p % 2 or m % 2 or m < 2 * p:
            raise PlanError(f"dualpipe needs an even pp and an even number of micro-batches >= 2·pp "
                            f"(pp {p}, {m} micro-batches)")
    elif m < 2 * p:
        raise PlanError(f"dualpipev needs at least 2·pp = {2 * p} micro-batches, got {m}")


def dualpipe(p: int, m: int, v: int, s: int) -> list[Action]:
    _check_dualpipe("dualpipe", p, m, v)
    return _dualpipe(p, m, s, False)[0]


def dualpipev(p: int, m: int, v: int, s: int) -> list[Action]:
    _check_dualpipe("dualpipev", p, m, v)
    return _dualpipe(p, m, s, True)[0]


SCHEDULES: dict[str, Callable[..., list[Action]]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved": interleaved,
    "zb": zb_h1,
    "zb-h1": zb_h1,
    "zb-h2": zb_h2,
    "zb-v": zb_v,
    "zb-auto": zb_auto,
    "dualpipe": dualpipe,
    "dualpipev": dualpipev,
}


def _fn(schedule: str):
    try:
        return SCHEDULES[schedule]
    except KeyError:
        raise PlanError(f"unknown pipeline schedule {schedule!r}; known: {', '.join(SCHEDULES)}") from None


@functools.lru_cache(maxsize=4096)
def stage_order(schedule: str, p: int, m: int, v: int, s: int, limit: float | None = None,
                w_frac: float | None = None, costs: tuple | None = None) -> tuple[Action, ...]:
    """Stage ``s``'s action order (cached: memory checks over many plans ask for it again and again).
    ``limit``: zb-auto's activation limit in micro-batches; ``w_frac``: the share of a micro-batch's
    activations W still needs after B, and ``costs`` the relative pass times (T_F, T_B, T_W), for the
    schedules the zero-bubble list scheduler builds (zb-h2, zb-v, zb-auto); the other schedules ignore them."""
    fn = _fn(schedule)
    if schedule == "zb-auto":
        return tuple(fn(p, m, v, s, limit, w_frac, costs))
    if schedule in ("zb-h2", "zb-v"):
        return tuple(fn(p, m, v, s, w_frac, costs))
    return tuple(fn(p, m, v, s))


def stage_orders(schedule: str, p: int, m: int, v: int = 1, limit: float | None = None,
                 w_frac: float | None = None, costs: tuple | None = None) -> list[list[Action]]:
    """Every stage's action order."""
    return [list(stage_order(schedule, p, m, v, s, limit, w_frac, costs)) for s in range(p)]


def overlapped_pairs(schedule: str, p: int, m: int, v: int, s: int) -> frozenset[int]:
    """Indices i of stage ``s``'s order where order[i] (a forward) and order[i+1] (a backward of another
    micro-batch) run as one overlapped F&B chunk (DualPipe, DualPipeV); empty for other schedules."""
    if schedule not in ("dualpipe", "dualpipev"):
        return frozenset()
    _check_dualpipe(schedule, p, m, v)
    return _dualpipe(p, m, s, schedule == "dualpipev")[1]


def action_deps(a: Action, s: int, p: int, v: int, schedule: str = "interleaved") -> list[tuple[int, Action]]:
    """(stage, action) pairs that must finish before action ``a`` of stage ``s`` can start (cross-stage
    data dependencies plus F-before-B and B-before-W of the same micro-batch and chunk)."""
    if a.phase == "F":
        prev = prev_hop(schedule, p, v, s, a.chunk)
        return [] if prev is None else [(prev[0], Action("F", a.mb, prev[1]))]
    if a.phase in ("B", "Bi"):
        deps = [(s, Action("F", a.mb, a.chunk))]
        nxt = next_hop(schedule, p, v, s, a.chunk)
        if nxt is not None:
            deps.append((nxt[0], Action(_bwd_phase(schedule, p, v, nxt, a), a.mb, nxt[1])))
        return deps
    return [(s, Action("Bi", a.mb, a.chunk))]


def _bwd_phase(schedule: str, p: int, v: int, where: tuple[int, int], a: Action) -> str:
    """Nominal phase of a backward dependency: "Bi" for split-backward schedules, else "B" (DualPipe mixes
    both; ``ideal_times`` and the program generator look the actual one up)."""
    return "Bi" if schedule in SPLIT_BACKWARD else "B"


def ideal_times(orders: list[list[Action]], durations: Callable[[int, Action], float], v: int = 1,
                schedule: str = "interleaved", pairs: dict[int, frozenset[int]] | None = None,
                fb_duration: Callable[[int, Action, Action], float] | None = None
                ) -> dict[tuple[int, Action], tuple[float, float]]:
    """Start and end time of every action when each stage runs its order back to back, waiting only for
    data dependencies (communication free). ``pairs`` (stage -> indices) marks overlapped F&B chunks, which
    start when both inputs are there and take ``fb_duration`` (default F + B) together. Raises
    DeadlockError if the orders cannot complete."""
    p = len(orders)
    bphase = {(s, a.mb, a.chunk): a.phase for s, o in enumerate(orders) for a in o if a.phase in ("B", "Bi")}
    pairs = pairs or {}

    def deps_of(s, a):
        out = []
        for d in action_deps(a, s, p, v, schedule):
            ds, da = d
            if da.phase in ("B", "Bi"):
                da = Action(bphase.get((ds, da.mb, da.chunk), da.phase), da.mb, da.chunk)
            out.append((ds, da))
        return out

    times: dict[tuple[int, Action], tuple[float, float]] = {}
    pos = [0] * p
    clock = [0.0] * p
    remaining = sum(len(o) for o in orders)
    blocked: dict[int, tuple] = {}          # stage -> (position, group, deps) where it waits: not rebuilt per sweep
    while remaining:
        progressed = False
        for s in range(p):
            while pos[s] < len(orders[s]):
                i = pos[s]
                hit = blocked.get(s)
                if hit is not None and hit[0] == i:
                    _, group, deps = hit
                else:
                    a = orders[s][i]
                    group = [a, orders[s][i + 1]] if i in pairs.get(s, ()) else [a]
                    deps = [d for x in group for d in deps_of(s, x) if d[0] != s or d[1] not in group]
                a = group[0]
                if any(d not in times for d in deps):
                    blocked[s] = (i, group, deps)
                    break
                start = max([clock[s]] + [times[d][1] for d in deps])
                if len(group) == 2:
                    dur = fb_duration(s, *group) if fb_duration else durations(s, group[0]) + durations(s, group[1])
                else:
                    dur = durations(s, a)
                for x in group:
                    times[(s, x)] = (start, start + dur)
                clock[s] = start + dur
                pos[s] += len(group)
                remaining -= len(group)
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
