"""Symmetry by cost signature: which ranks can one representative stand for?

A generator's classes (``Programs.classes``) group ranks that run the same program *template*. One
representative per class gives a full simulation's result only if the members are also interchangeable on
the hardware: the same device, and the same cost for every communication they take part in. Placement
breaks that (a data-parallel group that crosses a leaf switch costs more than its neighbour that does not),
so ``refine_classes`` splits classes until every member of a class has the same *signature*:

    (template class, device, and for every process-group family the class uses: the contention-free time of
     each (collective kind, size) the template runs on it, and the set of classes its group's members are in;
     for every point-to-point transfer: its time at each size and the class of the peer)

iterated to a fixed point (colour refinement: a class is split when its members' groups reach different
classes). In the result, members of a class start and end every op at the same instants in a full run, by
induction over the run: they are ready together, their rendezvous wait for the same classes and their
communications last as long. So one representative per class reproduces the full simulation, and a plan
whose placement makes some groups cost more costs a few more classes instead of every rank.

The flow network still loads every member's links: the engine passes the other groups of a class as
``images`` of each communication. Units: seconds.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from simulator.costs import CommRequest
from simulator.errors import ProgramError
from simulator.program import COLLECTIVE, RECV, SEND, Op, Programs, no_gc

_PROPAGATED = "members reach groups whose members differ in turn"
_FAULTY = "fault"          # reasons that start with it name a straggler or a failing device
SIG_DIGITS = 12          # costs equal to 12 significant digits are equal (float sums in another order)


def ranks_table(programs: Programs, family: str) -> tuple[np.ndarray, np.ndarray]:
    """(the ranks of each group of ``family`` as rows padded with -1, group id -> its row)."""
    groups = programs.groups
    gids = [i for i, g in enumerate(groups) if g.family == family]
    width = max((len(groups[i].ranks) for i in gids), default=0)
    rows = np.full((max(len(gids), 1), max(width, 1)), -1, dtype=np.int64)
    row = np.zeros(len(groups), dtype=np.int64)
    for k, i in enumerate(gids):
        rk = groups[i].ranks
        rows[k, :len(rk)] = rk
        row[i] = k
    return rows, row


def rank_group_table(programs: Programs, family: str, rows: np.ndarray, row: np.ndarray) -> np.ndarray:
    """Each rank's group id of ``family`` (-1: none), as ``Programs.group_of`` finds it (the first group holding
    the rank); ``rows``, ``row``: the family's ``ranks_table``."""
    table = np.full(programs.world_size, -1, dtype=np.int64)
    gids = np.flatnonzero([g.family == family for g in programs.groups])
    if not len(gids):
        return table
    R = rows[row[gids]]
    on = R >= 0
    members = R[on]
    ordered = np.sort(members)
    if not (ordered[1:] == ordered[:-1]).any():     # each rank in one group of the family
        table[members] = np.broadcast_to(gids[:, None], R.shape)[on]
    else:                                           # the first group holding a rank, as group_of
        for gid in gids[::-1].tolist():
            table[list(programs.groups[gid].ranks)] = gid
    return table


class Refinement:
    """What ``refine_classes`` found: ``programs`` (one representative per refined class), ``splits``
    (coarse representative -> number of classes it became), ``reasons`` (coarse representative -> why its
    members differ, first cause found), ``rounds`` of refinement."""

    def __init__(self, programs: Programs, splits: dict[int, int], reasons: dict[int, str], rounds: int):
        self.programs, self.splits, self.reasons, self.rounds = programs, splits, reasons, rounds

    @property
    def classes(self) -> int:
        return len(self.programs.ops)

    def causes(self) -> list[str]:
        """Why classes split: direct causes (hardware, costs) first, then classes split only because
        the groups their members reach split."""
        why = [self.reasons[r] for r, n in self.splits.items() if n > 1]
        return sorted(why, key=lambda w: w.startswith(_PROPAGATED))

    @property
    def fault_split(self) -> bool:
        """Whether a straggler or a failing device split some class (see ``note``)."""
        return any(w.startswith(_FAULTY) for w in self.causes())

    def note(self) -> str | None:
        """One line for ``notes`` when classes were split, else None."""
        split = {r: n for r, n in self.splits.items() if n > 1}
        if not split:
            return None
        coarse = len(self.splits)
        why = "; ".join(self.causes()[:2])
        if self.fault_split:
            head, cause = "faults make ranks differ", "straggler factor, failure time and communication cost"
        else:
            head, cause = "placement is uneven", "communication cost"
        return (f"{head}: {coarse} rank classes split into {self.classes} by {cause} "
                f"({len(split)} split; e.g. {why}); simulated one representative per class")


def symmetry_problem(programs: Programs, cost) -> str | None:
    """None if every class of ``programs`` is interchangeable on ``cost``'s hardware, else why not."""
    if programs.classes is None:
        return None
    ref = refine_classes(programs, cost)
    why = ref.causes()
    return why[0] if why else None


def refine_classes(programs: Programs, cost, max_rounds: int = 64) -> Refinement:
    """Split ``programs``' classes by cost signature (see the module docstring) and return the Programs with
    one representative per refined class (the same object when nothing splits).

    Raises ProgramError when a class cannot be re-instantiated for a new representative (a template op whose
    group family a member lacks, or a point-to-point op without a group to find the member's peer in)."""
    if programs.classes is None:
        return Refinement(programs, {}, {}, 0)
    sig = _Signatures(programs, cost)
    colour, rounds = sig.refine(max_rounds)
    by_colour: dict[int, list[int]] = defaultdict(list)
    for m in range(programs.world_size):
        by_colour[colour[m]].append(m)
    coarse_of = sig.coarse
    splits: dict[int, int] = {r: 0 for r in programs.classes}
    for members in by_colour.values():
        splits[coarse_of[members[0]]] += 1
    if all(n == 1 for n in splits.values()):
        return Refinement(programs, splits, {}, rounds)
    reasons = {r: sig.reason(r, colour) for r, n in splits.items() if n > 1}
    new = Programs(world_size=programs.world_size, ops={}, groups=programs.groups, classes={},
                   tokens_per_step=programs.tokens_per_step, model_flops_per_step=programs.model_flops_per_step,
                   meta=dict(programs.meta), templates=None if programs.templates is None else {})
    if "_group_index" in programs.__dict__:
        new.__dict__["_group_index"] = programs.__dict__["_group_index"]
    clones: dict = {}
    with no_gc():           # millions of new ops, no cycles
        for members in sorted(by_colour.values()):
            old = coarse_of[members[0]]
            rep = old if old in members else members[0]
            new.ops[rep] = programs.ops[old] if rep == old else sig.reinstantiate(old, rep, clones)
            if programs.templates is not None and old in programs.templates:
                new.templates[rep] = programs.templates[old]    # groups and peers resolved alike for rep
            new.classes[rep] = tuple(members)
            if old in programs.static_memory:
                new.static_memory[rep] = dict(programs.static_memory[old])
    new.meta["classes_from"] = len(programs.classes)
    return Refinement(new, splits, reasons, rounds)


class _Signatures:
    """The per-rank signature tables of one Programs on one cost model (see ``refine_classes``)."""

    def __init__(self, programs: Programs, cost):
        self.p, self.cost = programs, cost
        n = programs.world_size
        self.coarse = [0] * n                      # rank -> its generator class's representative
        for r, members in programs.classes.items():
            for m in members:
                self.coarse[m] = r
        # per representative: (family, ((kind, size), ...)) for collectives and p2p uses
        self.coll_uses: dict[int, list[tuple[str, tuple]]] = {}
        self.p2p_uses: dict[int, list[tuple[str, int, int, str, tuple]]] = {}
        for r, prog in programs.ops.items():
            fams: dict[str, set] = defaultdict(set)
            p2p: dict[tuple, set] = defaultdict(set)
            for op in prog:
                if op.kind == COLLECTIVE:
                    fams[programs.groups[op.group].family].add((op.collective, float(op.size_bytes)))
                elif op.kind in (SEND, RECV) and op.group is not None:
                    g = programs.groups[op.group]
                    pos = self._positions(op.group)
                    if r in pos and op.peer in pos:     # (without a group the images are unknown)
                        p2p[(g.family, pos[r], pos[op.peer], op.kind)].add(float(op.size_bytes))
            self.coll_uses[r] = sorted((f, tuple(sorted(u))) for f, u in fams.items())
            self.p2p_uses[r] = sorted(((f, a, b, k, tuple(sorted(u))) for (f, a, b, k), u in p2p.items()),
                                      key=lambda x: (str(x[0]), x[1], x[2], x[3]))
        self._gcost: dict = {}
        self._pcost: dict = {}
        self._intern: dict = {}

    # ------------------------------------------------------------------ tables
    def _positions(self, gid: int) -> dict[int, int]:
        cache = self.__dict__.setdefault("_pos", {})
        pos = cache.get(gid)
        if pos is None:
            pos = cache[gid] = {m: i for i, m in enumerate(self.p.groups[gid].ranks)}
        return pos

    def _id(self, value) -> int:
        i = self._intern.get(value)
        if i is None:
            i = self._intern[value] = len(self._intern)
        return i

    def group_cost(self, gid: int | None, uses: tuple) -> int:
        """Interned contention-free times of ``uses`` ((kind, size), ...) on group ``gid``."""
        key = (gid, uses)
        c = self._gcost.get(key)
        if c is None:
            if gid is None:
                c = self._id(("no group",))
            else:
                ranks = self.p.groups[gid].ranks
                c = self._id(tuple(_round(self.cost.comm_time_s(CommRequest(k, ranks, s))) for k, s in uses))
            self._gcost[key] = c
        return c

    def _group_ids(self, family: str, gids: list[int], uses: tuple) -> np.ndarray:
        """``group_cost`` of many groups of ``family`` (-1: none), priced in one call per use where the cost
        model has ``comm_times_s`` and the groups are of one size."""
        batch = getattr(self.cost, "comm_times_s", None)
        todo = [g for g in gids if g >= 0 and (g, uses) not in self._gcost]
        if batch is not None and len(todo) > 1 and uses:
            rows, row = self._ranks_table(family)
            R = rows[row[np.asarray(todo, dtype=np.int64)]]
            if (R >= 0).all():
                cols = []
                for kind, size in uses:
                    t = np.asarray(batch(kind, R, size), dtype=float)
                    u, inv = np.unique(t, return_inverse=True)
                    cols.append(np.array([_round(x) for x in u.tolist()])[inv.reshape(-1)])
                for g, times in zip(todo, np.stack(cols, axis=1).tolist()):
                    self._gcost[(g, uses)] = self._id(tuple(times))
        return np.array([self.group_cost(None if g < 0 else g, uses) for g in gids], dtype=np.int64)

    def p2p_cost(self, a: int, b: int, kind: str, sizes: tuple) -> int:
        src, dst = (a, b) if kind == SEND else (b, a)
        key = (src, dst, sizes)
        c = self._pcost.get(key)
        if c is None:
            c = self._pcost[key] = self._id(tuple(
                _round(self.cost.comm_time_s(CommRequest("p2p", (src, dst), s))) for s in sizes))
        return c

    def _p2p_ids(self, src: np.ndarray, dst: np.ndarray, sizes: tuple) -> np.ndarray:
        """``p2p_cost`` of the transfers src[i] -> dst[i] at ``sizes``, priced in one call per size where
        the cost model can (an optional ``comm_times_s(kind, groups, size)``: what ``comm_time_s`` gives,
        for many groups at once)."""
        batch = getattr(self.cost, "comm_times_s", None)
        if batch is None or not len(src):
            return np.array([self.p2p_cost(a, b, SEND, sizes) for a, b in zip(src.tolist(), dst.tolist())],
                            dtype=np.int64)
        pairs = np.stack((src, dst), axis=1)
        cols = []
        for size in sizes:
            t = np.asarray(batch("p2p", pairs, size), dtype=float)
            u, inv = np.unique(t, return_inverse=True)
            cols.append(np.array([_round(x) for x in u.tolist()])[inv.reshape(-1)])
        T = np.stack(cols, axis=1)
        rows = _row_ids(T.view(np.int64))           # rows of equal rounded times (bit patterns)
        _, first = np.unique(rows, return_index=True)
        ids = np.zeros(len(first), dtype=np.int64)
        for k, i in enumerate(first.tolist()):
            ids[k] = self._id(tuple(T[i].tolist()))
        return ids[rows]

    def _ranks_table(self, family: str) -> tuple[np.ndarray, np.ndarray]:
        """``ranks_table`` of ``family``, kept per refinement."""
        cache = self.__dict__.setdefault("_rank_rows", {})
        hit = cache.get(family)
        if hit is None:
            hit = cache[family] = ranks_table(self.p, family)
        return hit

    def _group_table(self, families) -> dict[str, np.ndarray]:
        """family -> ``rank_group_table`` of it."""
        table = {f: rank_group_table(self.p, f, *self._ranks_table(f)) for f in families}
        self._gof = table
        return table

    def peer_of(self, m: int, use) -> tuple[int | None, int | None]:
        """(the member's own rank in the use's group position, its peer) for p2p use of member m."""
        fam, a, b, _, _ = use
        gof = self.__dict__.get("_gof")
        g = self.p.group_of(m, fam) if gof is None or fam not in gof else int(gof[fam][m])
        if g is None or g < 0:
            return None, None
        ranks = self.p.groups[g].ranks
        if a >= len(ranks) or b >= len(ranks) or ranks[a] != m:
            return None, None
        return m, ranks[b]

    # ------------------------------------------------------------------ refinement
    def refine(self, max_rounds: int) -> tuple[list[int], int]:
        p, n = self.p, self.p.world_size
        # the cost model's device_keys (all ranks at once) where its own class has one: not one a wrapper
        # model reaches through attribute delegation past its own device_key
        many = getattr(type(self.cost), "device_keys", None)
        keys = many(self.cost, n) if many is not None else map(self.cost.device_key, range(n))
        devs: dict = {}
        device = np.fromiter((devs.setdefault(k, len(devs)) for k in keys), dtype=np.int64, count=n)
        colour = _row_ids(np.column_stack((np.asarray(self.coarse, dtype=np.int64), device)))  # (class, device)
        count = int(colour.max()) + 1 if n else 0
        fam_groups = {f for r in p.ops for f, _ in self.coll_uses[r]}
        gof = self._group_table(fam_groups | {u[0] for r in p.ops for u in self.p2p_uses[r]})
        # what no round changes, per member (whole classes at once): its groups (a column per family, -1:
        # none), the costs of what it runs on them (-2: a family its template does not use), its peers (a
        # column per transfer, -1: none) and their costs
        fams = sorted(fam_groups, key=str)
        col = {f: i for i, f in enumerate(fams)}
        width = max((len(u) for u in self.p2p_uses.values()), default=0)
        G = np.stack([gof[f] for f in fams], axis=1) if fams else np.zeros((n, 0), dtype=np.int64)
        CC = np.full((n, len(fams)), -2, dtype=np.int64)
        P = np.full((n, width), -1, dtype=np.int64)
        PC = np.full((n, width), -2, dtype=np.int64)
        for r, members in p.classes.items():
            mem = np.asarray(members, dtype=np.int64)
            for f, uses in self.coll_uses[r]:
                ug, inv = np.unique(gof[f][mem], return_inverse=True)
                ids = self._group_ids(f, ug.tolist(), uses)
                CC[mem, col[f]] = ids[inv.reshape(-1)]
            for j, (fam, a, b, kind, sizes) in enumerate(self.p2p_uses[r]):
                rows, row = self._ranks_table(fam)
                gids = gof[fam][mem]
                ok = gids >= 0
                peer = np.full(len(mem), -1, dtype=np.int64)
                if a < rows.shape[1] and b < rows.shape[1]:
                    rr = row[np.maximum(gids, 0)]
                    ok &= (rows[rr, a] == mem) & (rows[rr, b] >= 0)
                    peer[ok] = rows[rr[ok], b]
                else:
                    ok[:] = False
                P[mem, j] = peer
                PC[mem, j] = -1
                if ok.any():
                    src, dst = (mem[ok], peer[ok]) if kind == SEND else (peer[ok], mem[ok])
                    PC[mem[ok], j] = self._p2p_ids(src, dst, sizes)
        self._cc, self._pc, self._col = CC, PC, col      # for reason()
        static = _row_ids(np.column_stack((CC, PC)))
        used = CC != -2
        for rounds in range(1, max_rounds + 1):
            # the classes each group's members are in (a group's set of colours, interned), per family
            R = np.full_like(G, -1)
            for i in range(len(fams)):
                gids = G[:, i]
                on = gids >= 0
                if not on.any():
                    continue
                k = int(colour.max()) + 1
                both = np.sort(gids[on] * k + colour[on])
                both = both[np.r_[True, both[1:] != both[:-1]]]     # (group, colour) pairs, sorted, distinct
                g_of, c_of = both // k, both % k
                starts = np.flatnonzero(np.r_[True, g_of[1:] != g_of[:-1]])
                sets = np.split(c_of, starts[1:])
                ids = np.array([self._id(("reach", tuple(cs.tolist()))) for cs in sets], dtype=np.int64)
                R[on, i] = ids[np.searchsorted(g_of[starts], gids[on])]
            # a member's new colour: its colour, costs, the classes its groups reach and its peers' classes
            R[~used] = -1
            peers = np.where(P >= 0, colour[np.maximum(P, 0)], -1)
            key = np.column_stack((colour, static, R, peers))
            new = _row_ids(key)
            c = int(new.max()) + 1
            colour = new
            if c == count:
                return colour.tolist(), rounds
            count = c
        return colour.tolist(), max_rounds

    def reason(self, r: int, colour: list[int]) -> str:
        """Why the members of coarse class ``r`` differ (the first difference against the representative)."""
        p, dev = self.p, self.cost.device_key
        slow = getattr(self.cost, "factors", None) or {}     # a FaultyCostModel's straggler factors
        dies = getattr(self.cost, "fail_at", None) or {}      # and failure times
        for m in p.classes[r]:
            if dev(m) != dev(r):
                if slow.get(m, 1.0) != slow.get(r, 1.0):
                    return (f"{_FAULTY}: rank {m} is a straggler (compute x{slow.get(m, 1.0):g} against rank "
                            f"{r}'s x{slow.get(r, 1.0):g})")
                if dies.get(m) != dies.get(r):
                    return f"{_FAULTY}: rank {m}'s device fails {_when(dies, m)}, rank {r}'s {_when(dies, r)}"
                return f"rank {m} runs on different hardware than rank {r}"
        CC, PC = self._cc, self._pc                # per member, from refine
        for f, uses in self.coll_uses[r]:
            i = self._col[f]
            for m in p.classes[r]:
                if CC[m, i] != CC[r, i]:
                    g0, g = p.group_of(r, f), p.group_of(m, f)
                    k, s = uses[-1]
                    t0 = self.cost.comm_time_s(CommRequest(k, p.groups[g0].ranks, s))
                    t = self.cost.comm_time_s(CommRequest(k, p.groups[g].ranks, s)) if g is not None else 0.0
                    return (f"{k} on {f} group {list(p.groups[g0].ranks[:8])} costs {t0:.3g}s but the same on "
                            f"{list(p.groups[g].ranks[:8]) if g is not None else 'none'} costs {t:.3g}s")
        for j, use in enumerate(self.p2p_uses[r]):
            for m in p.classes[r]:
                if PC[m, j] == -1 or PC[m, j] != PC[r, j]:
                    (a0, b0), (a, b) = self.peer_of(r, use), self.peer_of(m, use)
                    return f"point-to-point {a0}<->{b0} and its image {a}<->{b} cost differently"
        return f"{_PROPAGATED} (rank {r}'s class)"

    # ------------------------------------------------------------------ new representatives
    def reinstantiate(self, old: int, rep: int, clones: dict) -> list[Op]:
        """Representative ``old``'s program as rank ``rep`` runs it: groups and peers resolved for ``rep``.
        The copies of a group's collectives are shared by the new representatives on one group (``clones``:
        (old group, new group, first op) -> (the ops copied, their copies))."""
        p = self.p
        prog = p.ops[old]
        coll, p2p, orphan = self._uses_of(old)
        groups = p.groups
        new_group = {gid: p.group_of(rep, groups[gid].family) for gid in list(coll) + [u[2] for u in p2p]}
        if orphan or None in new_group.values() or any(pos < 0 for _, _, _, pos in p2p):
            self._explain(old, rep)                 # raises the first problem in program order
        out = list(prog)
        for gid, idxs in coll.items():
            ng = new_group[gid]
            src = [prog[i] for i in idxs]
            key = (gid, ng, id(src[0]))
            hit = clones.get(key)
            if hit is None or len(hit[0]) != len(src) or any(a is not b for a, b in zip(hit[0], src)):
                hit = (src, [op.regrouped(ng, op.peer) for op in src])
                clones.setdefault(key, hit)
            for i, c in zip(idxs, hit[1]):
                out[i] = c
        for i, op, gid, pos in p2p:
            ng = new_group[gid]
            out[i] = op.regrouped(ng, groups[ng].ranks[pos])
        return out

    def _uses_of(self, old: int) -> tuple[dict[int, list[int]], list[tuple], bool]:
        """What a new representative of ``old``'s class re-resolves, found once per coarse class: (group ->
        indices of its collectives, (index, op, group, peer position or -1) of every other op naming a group,
        whether a point-to-point op names no group)."""
        cache = self.__dict__.setdefault("_uses", {})
        hit = cache.get(old)
        if hit is None:
            coll: dict[int, list[int]] = {}
            p2p, orphan = [], False
            for i, op in enumerate(self.p.ops[old]):
                gid = op.group
                if gid is None:
                    orphan = orphan or op.kind in (SEND, RECV)
                elif op.kind == COLLECTIVE:
                    coll.setdefault(gid, []).append(i)
                else:
                    p2p.append((i, op, gid, self._positions(gid).get(op.peer, -1)))
            hit = cache[old] = (coll, p2p, orphan)
        return hit

    def _explain(self, old: int, rep: int) -> None:
        """Raise the ProgramError of the first op of ``old``'s program that ``rep`` cannot re-resolve."""
        p = self.p
        for op in p.ops[old]:
            gid = op.group
            if gid is None:
                if op.kind in (SEND, RECV):
                    raise ProgramError(f"rank {old} op {op!r} names no group, so rank {rep} of its class "
                                       f"cannot find its peer")
                continue
            if p.group_of(rep, p.groups[gid].family) is None:
                raise ProgramError(f"rank {rep} has no {p.groups[gid].family} group for {op!r}")
            if op.kind != COLLECTIVE and op.peer not in self._positions(gid):
                raise ProgramError(f"rank {old} op {op!r}: peer {op.peer} is not in its group {gid}, so rank "
                                   f"{rep} of its class cannot find its peer")
        raise ProgramError(f"rank {rep} cannot run rank {old}'s program")


def _when(fail_at: dict, rank: int) -> str:
    """When ``rank``'s device fails ("never" if it does not), for reasons."""
    t = fail_at.get(rank)
    return "never" if t is None else f"at t={t:.6g}s"


def _row_ids(M: np.ndarray) -> np.ndarray:
    """Dense ids of the rows of an integer matrix: equal rows, equal ids (one column at a time)."""
    ids = np.zeros(len(M), dtype=np.int64)
    for column in M.T:
        _, c = np.unique(column, return_inverse=True)
        _, ids = np.unique(ids * (int(c.max()) + 1) + c.reshape(-1), return_inverse=True)
        ids = ids.reshape(-1)
    return ids


def _round(t: float) -> float:
    return float(f"{t:.{SIG_DIGITS}g}")
