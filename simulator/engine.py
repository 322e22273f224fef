"""The SimPy engine: executes per-rank programs against a cost model and records when every op ran.

SimPy's Environment is the clock; the event queue is a calendar (``Engine.calendar``): the events of one
instant wait in one list, in the order they were scheduled, and a heap holds the distinct instants, so the
events are processed in SimPy's order (time, priority, scheduling order) while ranks that run in lockstep
(thousands of data-parallel replicas at one time) share one heap entry. Each (rank, stream) is a callback
on the queue, not a SimPy process: when the event a stream waits for is processed (a dependency done, its
own op ended, its peers arrived), the stream runs its next ops until one must wait again. Ops of a stream
run in program order; an op first waits for its cross-stream ``deps``, then:

- compute: lasts ``op.duration_s`` or ``cost.compute_time_s(rank, op)``;
- collective: waits until every member of its group has reached its k-th collective on that group
  (a rendezvous), then all members start together and end together after the communication time;
- send/recv: the k-th send from s to d meets the k-th recv at d from s (rendezvous), both end together.

Communication time comes from ``cost.comm_time_s`` (analytical) or, for contention-aware cost models, from
a ``FlowNetwork`` the engine drives: it is told when communications start and asked when the next ends.
A communication that no other can ever meet on a link (its group's or pair's stream issues them one at a time
and no other channel loads those links) is timed in closed form without the network (``_find_fixed``).

Communication kernels hold compute units: when the cost model says which share f of a GPU's SMs a
communication holds (``comm_sm_fraction``; NCCL: one SM per channel), a compute op of that rank that
overlaps it for o seconds takes f·o longer (the work the held SMs would have done runs after). A compute op
starting during a communication is lengthened at its start; the overlap of a communication that starts
while a compute op already runs is added to the rank's next compute op. A communication that starts at the
instant a compute op starts counts as starting after it, whichever the queue reaches first: the order of
events within one instant never changes a time.

A stream runs the collectives it meets alone at a known time (symmetric mode: every member of the group is
represented by its rank; the time is analytical, or the closed form of a communication alone on its links)
right after the op before them, without an event each (``chain_comms``): a layer's TP all-reduces follow its
compute op, and the stream wakes once at the last one's end.

Symmetric mode (``Programs.classes`` set): only representatives are simulated; a group whose members are
all represented by one rank synchronises with that rank alone, and the images of each communication
(the same collective run by the other ranks of the class at the same instant) are passed to the flow
network so it loads their links too. Results are fanned out to every rank of the class.

When no event remains while ops are unfinished the engine raises ``DeadlockError`` naming every
blocked rank, the op it is stuck in, and whom it waits for. Units: seconds.
"""
from __future__ import annotations

import math
import time
from array import array
from heapq import heappop, heappush
from itertools import chain
from typing import Callable, Sequence

import numpy as np
import simpy
from simpy.core import NORMAL

from simulator.costs import CommRequest, CostModel
from simulator.errors import ClusterSimError, DeadlockError, DeviceFailureError
from simulator.program import (COLLECTIVE, COMPUTE, KERNEL_PRICED_SM_STREAMS, RECV, SEND, Programs, SyncTable, no_gc,
                               validate)
from simulator.symmetry import rank_group_table, ranks_table

_LAST = NORMAL + 1      # SimPy priority that runs after every other event of the same instant
_KEY_BITS = 32          # a rendezvous key is id << _KEY_BITS | k (Engine._rendezvous_keys)
_KEY_MASK = (1 << _KEY_BITS) - 1


class _NoTimes:
    """What ``follow`` reads for a rank without chain times (``Engine._chain_times``): NaN at every index."""
    __slots__ = ()

    def __getitem__(self, i: int) -> float:
        return math.nan


class SimResult:
    """What one simulated step produced. Times are seconds from the step's start.

    start_s / end_s / ready_s: rank -> list indexed like that rank's program (ready = when the op was
    reached on its stream, its dependencies done; for communication, start - ready is the wait for peers).
    """

    def __init__(self, programs: Programs, cost_model: CostModel, start_s, end_s, ready_s, events, wall_s):
        self.programs = programs
        self.cost_model = cost_model
        self.start_s: dict[int, list[float]] = start_s
        self.end_s: dict[int, list[float]] = end_s
        self.ready_s: dict[int, list[float]] = ready_s
        self.events_simulated = events
        self.wall_time_s = wall_s
        self._timeline = None

    @property
    def mode(self) -> str:
        return "symmetric" if self.programs.symmetric else "full"

    @property
    def rank_end_s(self) -> dict[int, float]:
        """Every rank of the job -> end of its last op (fanned out from representatives)."""
        out = {}
        rep = self.programs.representative_of()
        ends = {r: max(e) if e else 0.0 for r, e in self.end_s.items()}
        for m, r in rep.items():
            out[m] = ends[r]
        return out

    @property
    def step_time_s(self) -> float:
        """Step time: when the last op of any rank ends."""
        return max((max(e) if e else 0.0) for e in self.end_s.values()) if self.end_s else 0.0

    @property
    def timeline(self):
        """The timeline as a pandas DataFrame (one row per simulated op); see simulator.timeline."""
        if self._timeline is None:
            from simulator.timeline import build_timeline
            self._timeline = build_timeline(self)
        return self._timeline


class _Signal:
    """A bare event for the queue: what ``Environment.step`` reads (``callbacks``, ``_ok``) and a value.
    Streams wait on these (dependency done, own op ended) instead of simpy Events and Timeouts."""
    __slots__ = ("callbacks", "_ok", "_value")

    def __init__(self, callbacks=None):
        self.callbacks = [] if callbacks is None else callbacks
        self._ok = True
        self._value = None


class _Rendezvous:
    """One collective or p2p meeting; also the event its participants wait on (value: the start time)."""
    __slots__ = ("needed", "arrived", "hold", "duration", "op", "rank", "start_s", "key", "callbacks", "_ok", "_value")

    def __init__(self, needed: int, key):
        self.needed = needed          # how many simulated participants must arrive
        self.arrived: list[int] = []   # the simulated ranks that arrived, in order
        self.hold: list[int] = []      # those whose SMs it holds against compute it can overlap (_overlaps_compute)
        self.duration = None          # max of members' fixed durations
        self.op = None
        self.rank = None
        self.start_s = 0.0            # when the communication started (all participants arrived)
        self.key = key
        self.callbacks: list = []     # the participants' streams, resumed in arrival order at the end
        self._ok = True
        self._value = None


class Engine:
    """Runs one step of ``programs`` against ``cost_model``. Use ``run()`` unless you need the object."""

    calendar = True         # the event queue: one list per instant and a heap of instants (else SimPy's heap)
    inline_ends = True      # communications that end at a network wake-up run at once when nothing is queued before them
    closed_ends = True      # a communication whose rate is known at its start ends by its own event (_communicate)
    fixed_channels = True   # communications no other can ever meet on their links skip the network (_find_fixed)
    chain_comms = True      # collectives a stream meets alone at a known time follow the op before them (follow)
    # wall seconds between two calls of ``progress(ops done, ops)`` while it runs (the calendar's loop; on
    # SimPy's heap, calendar off, only the final call comes)
    progress_every_s = 0.25

    def __init__(self, programs: Programs, cost_model: CostModel, *, progress: Callable[[int, int], None] | None = None,
                 until_s: float | None = None, failures: dict[int, float] | None = None):
        # The cyclic garbage collector is paused while the engine sets up and runs (program.no_gc): each full
        # collection would walk the programs' millions of ops and the streams' closures again, for nothing (the
        # engine makes no cyclic garbage; what it frees, reference counting frees).
        with no_gc():
            self._setup(programs, cost_model, progress, until_s, failures)

    def _setup(self, programs, cost_model, progress, until_s, failures) -> None:
        self.p = programs
        self.cost = cost_model
        self.env = simpy.Environment()
        # the calendar (see the module doc): instant -> its events at NORMAL priority, in scheduling order; a
        # heap of those instants; _LAST events (one network settle per instant) in a heap of their own
        self._cal: dict[float, list] = {}
        self._times: list[float] = []
        self._late: list[tuple] = []
        self._bucket = None         # the list being processed (the events of now), and the next one's index
        self._next = 0
        if not self.calendar:
            self._push = self._heap_push
            self._push_last = self._heap_push_last
            self._pending_now = self._heap_pending_now
        self.progress = progress
        self.until_s = until_s
        self.rep = programs.representative_of()
        self.total_ops = programs.op_count
        n = {r: len(prog) for r, prog in programs.ops.items()}
        nan = array("d", [math.nan])
        self.start = {r: nan * k for r, k in n.items()}      # float64 arrays: lean at 16k ranks
        self.end = {r: nan * k for r, k in n.items()}
        self.ready = {r: nan * k for r, k in n.items()}
        self.finished = {r: bytearray(k) for r, k in n.items()}
        self.targeted: dict[int, bytearray] = {}   # rank -> 1 where another op depends on it (_rendezvous_keys)
        self._plain: dict[int, bytearray] = {}     # rank -> 1 at a recv without deps or duration (_rendezvous_keys)
        self._kinds: dict[int, list] = {}          # rank -> each op's kind (shared per template; _rendezvous_keys)
        self._deps_of: dict[int, list] = {}        # rank -> each op's deps (shared per template; _rendezvous_keys)
        self._dep_durations: dict[int, array] = {}     # rank -> seconds of its compute ops with deps (_durations)
        self._streams: dict[int, dict[str, Sequence[int]]] = {}   # rank -> stream -> op indices (_rendezvous_keys)
        self.waiters: dict[int, dict[int, _Signal]] = {r: {} for r in programs.ops}
        self.stream_ops: dict[tuple[int, str], Sequence[int]] = {}
        self.rendezvous: dict[tuple, _Rendezvous] = {}
        self.sync = SyncTable(programs, self.rep)     # collectives: integer rendezvous ids
        self.p2p_pairs: list[tuple[int, int]] = []    # p2p rendezvous id -1-j: (source, destination)
        self.needed: list[int] = []                   # sync id -> simulated ranks that meet there
        self._images: dict[tuple, tuple] = {}
        self._families: dict[str, tuple] = {}         # family -> (rank -> group id, ranks table, group -> row)
        self._class_arrays: dict[int, np.ndarray] = {}    # representative -> its class's ranks
        self.contention = bool(getattr(cost_model, "contention_aware", False))
        self.net = cost_model.network() if self.contention else None
        self._net_events: dict[int, _Rendezvous] = {}
        self._net_gen = 0
        self._settle_due = False
        self._net_settle = getattr(self.net, "settle", None)
        self._wake_t = None                 # time of the pending network wake-up (None: none pending)
        self._wake_callbacks = [self._on_network_wake]     # shared by every wake-up event (never changed)
        self._closed_callbacks = [self._on_closed_end]     # shared by every closed-form end event
        self._closed = self.closed_ends and hasattr(self.net, "finish_closed")
        self._req_specs: dict[int, object] = {}         # id(request) -> its bundle (closed ends)
        self._closed_at: dict[float, list] = {}         # closed-form end time -> keys of the communications ending then
        self._net_key = 0
        self.fail_at = self._failures_by_representative(dict(failures or {}))     # simulated rank -> seconds
        # communications of one serial channel alone on their links, timed without the network (_find_fixed)
        self._scan = self.fixed_channels and self._closed and hasattr(self.net, "solo_time_s") and not self.fail_at
        self._channels: dict = {}         # (set-up) distinct communication -> the streams that issue it
        self._compute_streams: dict[int, set] = {}    # rank -> its streams with compute ops (_rendezvous_keys)
        self.rv_keys = self._rendezvous_keys()
        self._comm_cache: dict = {}
        self._requests: dict = {}         # flow network: one CommRequest per distinct communication
        self.fixed: dict = {}             # (group, kind, size) -> (seconds, SM-hold seconds, SM share)
        self._fixed_req: dict = {}        # id(request) -> seconds, for the same communications met at a rendezvous
        self._launch: dict = {}           # (id(request), stream) -> what starting it needs (_launch_info)
        self._pair_reqs: dict = {}        # (p2p pair id, real peer, group, size) -> its request (_complete)
        self.failed: set[int] = set()
        # communication kernels holding SMs (see the module doc); None: the cost model has no such notion
        self.sm_share = getattr(cost_model, "comm_sm_fraction", None)
        if self.sm_share is not None:
            # (end, share, start) of each communication holding the rank's SMs; those not yet charged as debt
            self.comm_busy: dict[int, list[tuple[float, float, float]]] = {r: [] for r in programs.ops}
            self._fresh: dict[int, list[tuple[float, float, float]]] = {r: [] for r in programs.ops}
            self.compute_end = dict.fromkeys(programs.ops, 0.0)   # latest end of the rank's compute ops so far
            self._share_cache: dict = {}
        if self._scan:
            self._find_fixed()
        # some group is met by one simulated rank alone (symmetric mode: a class holds the group); else no
        # collective is tried for the paths that need no rendezvous
        self._alone = 1 in self.needed
        self._chains = self.chain_comms and self._alone
        self._durations()

    def _durations(self) -> None:
        """Write the duration of each compute op without deps into its ``end`` slot, where the streams read it
        (an op's end is written only when it ends; ``_run`` puts NaN back in the slots of ops that never end),
        and that of each compute op with deps into ``_dep_durations`` (NaN elsewhere), in set-up, in program
        order: the run then reaches those ops without reading their objects (their deps and kinds are in the
        template's ``_deps_of`` and ``_kinds``) or asking the cost model. Ranks of one template
        (``Programs.templates``) on one kind of device (``cost.device_key``: ranks that compute alike) share one
        array of them, worked out once."""
        compute_time = self.cost.compute_time_s
        templates = self.p.templates or {}
        device_key = getattr(self.cost, "device_key", None)
        made: dict = {}
        seen: set[int] = set()          # first compute ops of the programs without a template, written
        for rank, prog in self.p.ops.items():
            tkey = templates.get(rank)
            key = (tkey, device_key(rank), len(prog)) if tkey is not None and device_key is not None else None
            if key is None:
                # ranks instantiated from ops another rank already holds (shared objects: in cache during the
                # run) are left to the run, as are programs without compute ops
                first = next((op for op in prog if op.kind == COMPUTE), None)
                if first is None or id(first) in seen:
                    continue
                seen.add(id(first))
            hit = made.get(key)
            if hit is None:
                durations = self.end[rank]
                waited = array("d", [math.nan]) * len(prog)
                for i, op in enumerate(prog):
                    if op.kind == COMPUTE:
                        d = op.duration_s
                        if d is None:
                            d = compute_time(rank, op)
                        if op.deps:
                            waited[i] = d
                        else:
                            durations[i] = d
                self._dep_durations[rank] = waited
                if key is not None:
                    made[key] = (array("d", durations), waited)     # the template's own copy; shared
            else:
                self.end[rank] = array("d", hit[0])
                self._dep_durations[rank] = hit[1]

    # ------------------------------------------------------------------ helpers
    def _rendezvous_keys(self) -> dict[int, array]:
        """rank -> per op the key of the rendezvous it joins (an int64 array; 0 at compute ops, never read).

        The k-th collective of a rank on a group is the k-th in *program order* (as the order in which a
        framework issues them), whatever stream it sits on; likewise the k-th send s->d meets the k-th
        recv at d from s. A key stands for (id, k): id >= 0 a collective's sync id (``SyncTable``), id < 0 the
        p2p pair ``p2p_pairs[-1 - id]``, packed in one integer ``id * 2**32 + k`` (``rendezvous_key``
        decodes it): nothing per op hashes a group's ranks or holds an object, and 16k-rank programs
        stay lean. It also fills ``targeted``, ``_streams`` and ``_compute_streams``.

        Ranks of one template (``Programs.templates``) share those three, and their keys follow the first such
        rank's: each of its rendezvous *slots* (the ops of one group or pair, found by the first op on it) holds
        the same op indices, k = 0, 1, ... in order, on every rank of the template; only the slot's id differs,
        read from the rank's own op at the slot's first index."""
        self._pair_id: dict[tuple[int, int], int] = {}
        self._sid_of: dict[int, int] = {}
        templates = self.p.templates or {}
        plans: dict = {}        # template key -> what its ranks share (_template_keys)
        self.templated: set[int] = set()      # the ranks set up from their template's plan
        out = {}
        for rank, prog in self.p.ops.items():
            tkey = templates.get(rank)
            plan = plans.get(tkey) if tkey is not None else None
            if plan is not None:
                keys = self._template_keys(rank, prog, plan)
                if keys is not None:
                    out[rank] = keys
                    self.templated.add(rank)
                    continue
            keys, plan = self._rank_keys(rank, prog)
            out[rank] = keys
            if tkey is not None and tkey not in plans:
                plans[tkey] = plan
        self.needed = [len(m) for m in self.sync.members]
        return out

    def _ck(self, rank: int, op) -> tuple[int, object]:
        """(sync id, counter key) of communication ``op`` of ``rank``: a collective counts per group, a send per
        (source, destination) pair, a recv per pair too but apart from sends (a rank may send to itself)."""
        kind = op.kind
        if kind == COLLECTIVE:
            g = op.group
            sid = self._sid_of.get(g)
            if sid is None:
                sid = self._sid_of[g] = self.sync.id_of(g)
            return sid, sid
        rep = self.rep
        pair = (rank, rep[op.peer]) if kind == SEND else (rep[op.peer], rank)
        sid = self._pair_id.get(pair)
        if sid is None:
            sid = self._pair_id[pair] = -1 - len(self.p2p_pairs)
            self.p2p_pairs.append(pair)
        return sid, (sid if kind == SEND else (sid,))

    def rendezvous_key(self, rank: int, i: int) -> tuple[int, int] | None:
        """(id, k) of the rendezvous op ``i`` of ``rank`` joins (see ``_rendezvous_keys``); None for a compute op."""
        if self.p.ops[rank][i].kind == COMPUTE:
            return None
        key = self.rv_keys[rank][i]
        return key >> _KEY_BITS, key & _KEY_MASK

    def _rank_keys(self, rank: int, prog) -> tuple[array, tuple]:
        """Rank ``rank``'s keys, op by op; also its targeted ops, streams and compute streams, and what ranks of
        its template share: (targeted, streams, compute streams, slots (first index, op indices, counts, indices
        as an array), channels, plain recvs, kinds, deps)."""
        n = len(prog)
        keys = array("q", bytes(8 * n))
        kinds = self._kinds[rank] = [op.kind for op in prog]
        deps_of = self._deps_of[rank] = [op.deps for op in prog]
        # targeted: 1 at every index some op's deps name (one numpy store, not a Python loop per op)
        deps = list(chain.from_iterable(deps_of))
        if deps:
            mark = np.zeros(n, dtype=np.uint8)
            mark[np.array(deps, dtype=np.intp)] = 1
            targeted = bytearray(mark.tobytes())
        else:
            targeted = bytearray(n)
        self.targeted[rank] = targeted
        # streams in order of first appearance, each its op indices (compact: no int object per op index to
        # chase at run time; a rank with one stream gets a range)
        names = [op.stream for op in prog]
        streams = self._streams[rank] = dict.fromkeys(names)
        comm_idx = [i for i, k in enumerate(kinds) if k != COMPUTE]
        if len(streams) == 1:
            streams[names[0]] = range(n)
            compute = {names[0]} if len(comm_idx) < n else set()
        elif streams:
            code = {name: c for c, name in enumerate(streams)}
            codes = np.fromiter(map(code.__getitem__, names), dtype=np.intp, count=n)
            for name, c in code.items():
                idxs = array("l")
                idxs.frombytes(np.flatnonzero(codes == c).astype(np.int_).tobytes())
                streams[name] = idxs
            # a stream computes where it holds a compute op (more ops than communications)
            ops_on = np.bincount(codes, minlength=len(code))
            comm_on = np.bincount(codes[np.array(comm_idx, dtype=np.intp)], minlength=len(code))
            compute = {name for name, c in code.items() if ops_on[c] > comm_on[c]}
        else:
            compute = set()
        self._compute_streams[rank] = compute
        first: dict = {}            # counter key -> index of its first op (the slot)
        slots: dict[int, list[int]] = {}
        scan = self._scan
        mine: dict = {}             # this rank's channel -> (stream or None, op index)
        plain = self._plain[rank] = bytearray(n)    # 1: a recv without deps or a duration of its own
        for i in comm_idx:
            op = prog[i]
            kind = kinds[i]
            if kind != COLLECTIVE and kind != SEND and kind != RECV:
                continue
            if kind == RECV and not op.deps and op.duration_s is None:
                plain[i] = 1
            sid, ck = self._ck(rank, op)
            f = first.get(ck)
            if f is None:
                f = first[ck] = i
                slots[f] = []
            at = slots[f]
            keys[i] = (sid << _KEY_BITS) + len(at)
            at.append(i)
            if scan and kind != RECV:
                # what _complete will ask the network for, and the stream that issues it (a send's request is
                # built from the send side)
                ch = self._channel(rank, op)
                seen = mine.get(ch)
                if seen is None:
                    mine[ch] = [op.stream, i, i]
                else:
                    seen[2] = i
                    if seen[0] != op.stream:
                        seen[0] = None
        for ch, (stream, i, last) in mine.items():
            self._add_channel(ch, stream, rank, prog[i], prog[last])
        plan = (targeted, streams, compute, [(f, at, np.arange(len(at), dtype=np.int64), np.array(at, dtype=np.intp))
                                             for f, at in slots.items()], list(mine.values()), plain, kinds, deps_of)
        return keys, plan

    @staticmethod
    def _channel(rank: int, op) -> tuple:
        """What ``_complete`` asks the network for when ``rank`` issues ``op`` (a collective, or a send: a
        transfer's request is built from the send side): (group, kind, size) or ((source, peer), group, size)."""
        if op.kind == COLLECTIVE:
            return op.group, op.collective, op.size_bytes
        return (rank, op.peer), op.group, op.size_bytes

    def _add_channel(self, ch, stream, rank: int, first, last) -> None:
        """Channel ``ch`` issued by ``rank`` from ``stream`` (None: from more than one; ``first`` and ``last``: its
        first and last op there): a channel issued from two streams, by one rank or by two, has no single
        stream (see _find_fixed); it keeps its first (stream, rank, op), or (None, rank, op) of its last op."""
        seen = self._channels.get(ch)
        if seen is None:
            self._channels[ch] = (stream, rank, first) if stream is not None else (None, rank, last)
        elif stream is None or seen[0] != stream:
            self._channels[ch] = (None, rank, last)

    def _template_keys(self, rank: int, prog, plan) -> array | None:
        """Rank ``rank``'s keys from its template's ``plan`` (``_rank_keys``); None where its slots do not map to
        distinct groups and pairs as the template's did (then it takes the op-by-op path)."""
        targeted, streams, compute, slots, chans, plain, kinds, deps_of = plan
        if len(prog) != len(targeted):
            return None
        keys = np.zeros(len(prog), dtype=np.int64)
        cks = set()
        for f, at, ks, idx in slots:
            sid, ck = self._ck(rank, prog[f])
            if ck in cks or self._ck(rank, prog[at[-1]])[1] != ck:
                return None
            cks.add(ck)
            keys[idx] = ks + (sid << _KEY_BITS)
        self.targeted[rank] = targeted
        self._plain[rank] = plain
        self._kinds[rank] = kinds
        self._deps_of[rank] = deps_of
        self._streams[rank] = streams
        self._compute_streams[rank] = compute
        if self._scan:
            for stream, i, last in chans:
                op = prog[i]
                self._add_channel(self._channel(rank, op), stream, rank, op, prog[last])
        out = array("q")
        out.frombytes(keys.tobytes())
        return out

    def _failures_by_representative(self, failures: dict[int, float]) -> dict[int, float]:
        """Device failures keyed by the simulated ranks. In symmetric mode a failing rank's class must fail with
        it, at the same time (class refinement gives it a class of its own when the cost model's device key
        carries failure times, as topologies.faults.FaultyCostModel's does); the representative then fails."""
        classes = self.p.classes
        if classes is None or not failures:
            return failures
        out = {}
        for rank, t in failures.items():
            rep = self.rep.get(rank)
            if rep is None:
                out[rank] = t               # not in the job: _run names it
                continue
            odd = [m for m in classes[rep] if failures.get(m) != t]
            if odd:
                raise ClusterSimError(f"failure injected on rank {rank} at t={t:.6g}s, but rank(s) {odd[:8]} of "
                                      f"its class (represented by rank {rep}) do not fail then: give the cost "
                                      f"model failure times in its device keys, or use full mode")
            out[rep] = t
        return out

    def _find_fixed(self) -> None:
        """Communications that can never meet another on a link run alone at their solo rate whenever they run:
        time them in closed form without the flow network (``fixed``: by (group, kind, size) for collectives a
        rank meets alone, ``_fixed_req``: by request for those met at a rendezvous).

        A *channel* is a process group with the stream its collectives are issued on (or a send's (source,
        destination) pair with its stream): its communications run one after another, since a stream waits
        for each to end. Every distinct communication the programs can start is listed (``_rendezvous_keys``
        gathered them) with the links its request loads, images included; a communication is fixed when every
        one of its links is loaded by its own channel only. Such a communication is then always a component
        of its own in the max-min network, so its end is ``now + T / solo rate``: the float the network's
        closed-form end gives (``FlowNetwork.solo_time_s``), and the network, which never sees it, solves the
        same components for the others."""
        channels, self._channels = self._channels, {}
        net = self.net
        found = []
        owner: dict[int, object] = {}
        conflict = object()
        for ch, (stream, rank, op) in channels.items():
            if op.kind == COLLECTIVE:
                req = self._collective_request(op)
                chan = None if stream is None else ("c", op.group, stream)
            else:
                req = self._p2p_request(ch[0], rank, op, op.size_bytes)
                chan = None if stream is None else ("p", ch[0], stream)
            spec = self._spec(req)
            links = spec.link_list if hasattr(spec, "link_list") else list(spec[1])
            for l in links:
                o = owner.get(l, owner)
                if o is owner:
                    owner[l] = chan if chan is not None else conflict
                elif o != chan:
                    owner[l] = conflict
            found.append((ch, op, req, spec, chan, links))
        for ch, op, req, spec, chan, links in found:
            if chan is None or any(owner[l] != chan for l in links):
                continue
            dur = net.solo_time_s(spec)
            if dur is None:
                continue
            self._fixed_req[id(req)] = dur
            if op.kind == COLLECTIVE:
                hold = (self._solo_time(op), self._share(op)) if self.sm_share is not None else (0.0, 0.0)
                self.fixed[ch] = (dur, hold[0], hold[1])

    def _spec(self, request):
        """The network's bundle for ``request`` (kept per request: requests live as long as the engine)."""
        spec = self._req_specs.get(id(request))
        if spec is None:
            spec = self._req_specs[id(request)] = self.net.spec_of(request)
        return spec

    def _collective_request(self, op) -> CommRequest:
        """The flow network's request for collective ``op`` (one per (group, kind, size), images included)."""
        rkey = (op.group, op.collective, op.size_bytes)
        req = self._requests.get(rkey)
        if req is None:
            g = self.p.groups[op.group]
            imgs = self._group_images(op.group) if self.p.classes is not None else ()
            req = self._requests[rkey] = CommRequest(op.collective, g.ranks, op.size_bytes, imgs)
        return req

    def _p2p_request(self, real: tuple[int, int], srank: int, sop, size: int) -> CommRequest:
        """The flow network's request for the transfer ``real`` = (source, destination) that ``sop`` (the send
        side's op, on ``srank``) takes part in (one per (pair, group, size), images included)."""
        rkey = (real, sop.group, size)
        req = self._requests.get(rkey)
        if req is None:
            imgs = self._p2p_images(srank, sop) if self.p.classes is not None else ()
            req = self._requests[rkey] = CommRequest("p2p", real, size, imgs)
        return req

    def _trigger_in(self, event, delay: float, value=None) -> None:
        """Succeed ``event`` ``delay`` seconds from now (what simpy.Timeout does, without a second event)."""
        event._ok = True
        event._value = value
        self._push(self.env._now + delay, event)

    # ------------------------------------------------------------------ the event queue
    def _push(self, t: float, event) -> None:
        """Queue ``event`` at time ``t`` (>= now), NORMAL priority: behind every event already queued then."""
        bucket = self._cal.get(t)
        if bucket is None:
            self._cal[t] = [event]
            heappush(self._times, t)
        else:
            bucket.append(event)

    def _push_last(self, event) -> None:
        """Queue ``event`` now, after every NORMAL event of this instant (those queued later included)."""
        heappush(self._late, (self.env._now, next(self.env._eid), event))

    def _pending_now(self) -> bool:
        """Whether a NORMAL event is queued for now (it runs before anything scheduled from here on)."""
        bucket = self._cal.get(self.env._now)
        return bucket is not None and (bucket is not self._bucket or len(bucket) > self._next)

    def _heap_push(self, t: float, event) -> None:          # calendar off: SimPy's queue
        heappush(self.env._queue, (t, NORMAL, next(self.env._eid), event))

    def _heap_push_last(self, event) -> None:
        self.env.schedule(event, _LAST, 0)

    def _heap_pending_now(self) -> bool:
        queue = self.env._queue
        return bool(queue) and queue[0][0] == self.env._now and queue[0][1] <= NORMAL

    def _family_table(self, family: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(``symmetry.rank_group_table``, and the ``symmetry.ranks_table`` rows and group -> row) of ``family``,
        built once per family: symmetric mode looks up the images of a class's communications with them."""
        hit = self._families.get(family)
        if hit is None:
            rows, row = ranks_table(self.p, family)
            hit = self._families[family] = (rank_group_table(self.p, family, rows, row), rows, row)
        return hit

    def _members(self, rep: int) -> np.ndarray:
        """The ranks represented by ``rep`` (its class, in the class's order) as an array, kept per class."""
        m = self._class_arrays.get(rep)
        if m is None:
            m = self._class_arrays[rep] = np.asarray(self.p.classes[rep], dtype=np.int64)
        return m

    def _group_images(self, gid: int) -> tuple[tuple[int, ...], ...]:
        """Symmetric mode: the other groups of the same family that run this collective concurrently."""
        key = ("g", gid)
        if key not in self._images:
            g = self.p.groups[gid]
            of = self._family_table(g.family)[0]
            reps = sorted(set(self.rep[m] for m in g.ranks))
            members = np.concatenate([of[self._members(r)] for r in reps])
            og = np.unique(members, return_index=True)[0]     # (an index output: numpy.ma stays unimported)
            imgs = og[(og >= 0) & (og != gid)].tolist()
            self._images[key] = tuple(self.p.groups[o].ranks for o in imgs)
        return self._images[key]

    def _p2p_images(self, rank: int, op) -> tuple[tuple[int, ...], ...]:
        """Symmetric mode: the (source, destination) pairs of the class's other members that run this
        transfer concurrently, in the class's order: each member's group of the op's family, at the
        positions of ``rank`` and the peer in the op's group."""
        key = ("p", rank, op.peer, op.group)
        if key not in self._images:
            imgs = ()
            if op.group is not None:
                g = self.p.groups[op.group]
                if op.peer in g.ranks and rank in g.ranks:
                    i_self, i_peer = g.ranks.index(rank), g.ranks.index(op.peer)
                    of, rows, row = self._family_table(g.family)
                    members = self._members(rank)
                    og = of[members[members != rank]]
                    og = og[og >= 0]
                    a = rows[row[og], i_self]
                    b = rows[row[og], i_peer]
                    if (a < 0).any() or (b < 0).any():      # an image group shorter than the op's group
                        raise IndexError(f"an image of group {op.group} ({g.family}) is shorter than it")
                    src, dst = (a, b) if op.kind == SEND else (b, a)
                    imgs = tuple(zip(src.tolist(), dst.tolist()))
            self._images[key] = imgs
        return self._images[key]

    # ------------------------------------------------------------------ SMs held by communication
    def _share(self, op, real: tuple[int, int] | None = None) -> float:
        """Share of SMs the communication of ``op`` holds (cached per group or pair, kind and size); none
        on a stream whose SMs the overlapped compute's kernels are already priced without
        (``KERNEL_PRICED_SM_STREAMS``)."""
        if op.stream in KERNEL_PRICED_SM_STREAMS:
            return 0.0
        if op.kind == COLLECTIVE:
            key = (op.group, op.collective, op.size_bytes)
        else:
            key = (real, op.size_bytes)
        f = self._share_cache.get(key)
        if f is None:
            req = (CommRequest(op.collective, self.p.groups[op.group].ranks, op.size_bytes) if op.kind == COLLECTIVE
                   else CommRequest("p2p", real, op.size_bytes))
            f = self._share_cache[key] = float(self.sm_share(req))
        return f

    def _comm_started(self, ranks, now: float, dur: float, share: float) -> None:
        """Communication on ``ranks`` holds ``share`` of their SMs over [now, now + dur]. Its overlap with a
        compute op already running is charged to the rank's next compute op (``_slowdown``), once every compute
        op of this instant has started: the order of events within one instant never matters."""
        if share <= 0.0 or dur <= 0.0:
            return
        entry = (now + dur, share, now)
        for r in ranks:
            self.comm_busy[r].append(entry)
            self._fresh[r].append(entry)

    def _slowdown(self, rank: int, t: float, dur: float) -> float:
        """Extra seconds of a compute op of ``rank`` starting at ``t`` (>= now) for ``dur`` seconds.

        Communications that started at an earlier instant: their overlap with this op, plus (once, as debt)
        their overlap with the compute ops that already ran when they started. Those that started at this
        instant count as started after every compute op of the instant: they run beside this one, but its
        time was fixed at its start (see the module doc)."""
        now = self.env._now
        extra = 0.0
        ce = self.compute_end[rank]
        fresh = self._fresh[rank]
        if fresh:                           # the debt of the communications not yet charged
            for end, f, s in fresh:
                if s < now and ce > s:
                    extra += f * ((ce if ce < end else end) - s)
            self._fresh[rank] = [x for x in fresh if x[2] >= now]     # those of this instant wait
        busy = self.comm_busy[rank]
        if busy:
            stop, ended = t + dur, False
            for end, f, s in busy:
                if end > t:
                    if s < now:
                        extra += f * ((end if end < stop else stop) - t)
                else:
                    ended = True
            if ended:                       # forget finished communications (rare: no list per op)
                self.comm_busy[rank] = [x for x in busy if x[0] > t]
        e = t + dur + extra
        if e > ce:
            self.compute_end[rank] = e
        return extra

    # ------------------------------------------------------------------ communication
    def _solo_time(self, op) -> float:
        """Contention-free time of a collective, cached per (group, kind, size): the analytical cost of a
        communication does not depend on when it runs."""
        key = (op.group, op.collective, op.size_bytes)
        t = self._comm_cache.get(key)
        if t is None:
            g = self.p.groups[op.group]
            t = self._comm_cache[key] = self.cost.comm_time_s(CommRequest(op.collective, g.ranks, op.size_bytes))
        return t

    def _communicate(self, rv: _Rendezvous, request: CommRequest | None) -> None:
        """All participants arrived: start the communication; rv fires at its end (value: its start)."""
        now = self.env._now
        if rv.duration is not None:
            dur = rv.duration
        elif not self.contention:
            dur = self.cost.comm_time_s(request)
        else:
            op = rv.op
            info = self._launch.get((id(request), op.stream))
            if info is None:
                info = self._launch_info(rv, request)
            spec, dur, hold_s, share = info
            if self.sm_share is not None:       # the contention-free time stands in for the SMs' hold
                self._comm_started(rv.hold, now, hold_s, share)
            if dur is not None:                 # alone on its links whenever it runs (_find_fixed)
                rv._ok = True
                rv._value = now
                self._closed_end_at(now + dur, rv)
                return
            key = self._net_key = self._net_key + 1
            rv.start_s = now
            self._net_events[key] = rv
            if self._closed:
                # Alone on its links (or with room to spare on all of them), it runs at a rate known now until it
                # ends or a neighbour changes it: the network gives its end now and keeps it off its heap (no
                # wake-up, no re-scheduling), and it ends by an event queued now for that time (one per distinct
                # end time). If its rate changes first, the network takes it back (re-solved from then) and that
                # event passes it over (_on_closed_end).
                t = self.net.start(now, key, request, True, spec)
                if t is not None:
                    if t < math.inf:
                        self._closed_end_at(t, key)
                    return
            else:
                self.net.start(now, key, request)
            self._network_changed()
            return
        if self.sm_share is not None:
            self._hold_sms(rv, now, dur)
        self._trigger_in(rv, dur if dur > 0 else 0, now)

    def _launch_info(self, rv: _Rendezvous, request: CommRequest) -> tuple:
        """What starting ``request`` (contention-aware) needs, kept per (request, stream of ``rv.op``): its bundle
        spec, its fixed seconds (``_fixed_req``, or None), and the seconds and share of SMs it holds."""
        op = rv.op
        hold_s = share = 0.0
        if self.sm_share is not None:
            if op.kind == COLLECTIVE:           # both cached per (group, kind, size)
                hold_s, share = self._solo_time(op), self._share(op)
            else:
                real = (rv.rank, op.peer) if op.kind == SEND else (op.peer, rv.rank)
                hold_s, share = self.cost.comm_time_s(request), self._share(op, real)
        spec = self._spec(request) if self._closed else None     # (a network with closed-form ends)
        info = self._launch[(id(request), op.stream)] = (spec, self._fixed_req.get(id(request)), hold_s, share)
        return info

    def _closed_end_at(self, t: float, item) -> None:
        """End ``item`` at ``t`` by a closed-form end event (_on_closed_end), one per distinct end time: the
        ends of one instant together. ``item``: the network key of a communication whose rate was known at its
        start (alone on its links, or with room on all of them: ``FlowNetwork.start(..., closed=True)``), or the
        event (a rendezvous, a stream's wake-up) of a fixed one (_find_fixed), its value set."""
        at = self._closed_at.get(t)
        if at is None:
            self._closed_at[t] = [item]
            ev = _Signal(self._closed_callbacks)
            ev._value = t
            self._push(t, ev)
        else:
            at.append(item)

    def _hold_sms(self, rv: _Rendezvous, now: float, dur: float) -> None:
        op = rv.op
        real = None
        if op.kind != COLLECTIVE:
            real = (rv.rank, op.peer) if op.kind == SEND else (op.peer, rv.rank)
        self._comm_started(rv.hold, now, dur, self._share(op, real))

    def _network_changed(self, nxt=False) -> None:
        """A communication started or ended now: once every other event of this instant has run (so
        every start and end at one instant costs one rate update), ask the network when the next ends.
        When the network has no rates to update (the communication started or ended alone on its links),
        its next completion is known now: keep the pending wake-up if it is still the right one.
        ``nxt``: the settled network's ``next_completion()`` when the caller has just asked it."""
        if self._settle_due:
            return
        if self._net_settle is not None and self.net.settled:
            if nxt is False:
                nxt = self.net.next_completion()
            if nxt is not None and self._wake_t is not None and max(nxt[0], self.env._now) == self._wake_t:
                return
            self._wake_at(nxt)
        else:
            self._settle_due = True
            self._push_last(_Signal([self._settle_network]))

    def _settle_network(self, _event=None) -> None:
        """Last event of an instant with starts or ends: settle the network, wake up at its next end."""
        self._settle_due = False
        if self._net_settle is not None:
            self._net_settle()
        self._wake_at(self.net.next_completion())

    def _wake_at(self, nxt) -> None:
        """Wake up when ``nxt`` = (time, key) from ``next_completion`` is due; earlier wake-ups go stale."""
        self._net_gen += 1
        self._wake_t = None
        if nxt is None:
            return
        env = self.env
        now = env._now
        t = max(nxt[0], now)
        if not math.isfinite(t):
            return
        self._wake_t = t
        wake = _Signal(self._wake_callbacks)
        wake._value = self._net_gen
        self._push(now + (t - now), wake)       # (env.schedule's now + delay)

    def _on_network_wake(self, event) -> None:
        if event._value != self._net_gen:
            return          # superseded by a later start/finish
        self._wake_t = None
        env = self.env
        now = env._now
        net = self.net
        due = now + 1e-15 * max(1.0, now)
        ended = []
        while True:
            nxt = net.next_completion()
            if nxt is None or nxt[0] > due:
                break
            key = nxt[1]
            net.finish(now, key)
            ended.append(self._net_ended(key))
        # a settled network's last answer is what _network_changed would ask again
        self._network_changed(nxt if self._net_settle is not None and net.settled else False)
        if ended:
            self._fire(ended)

    def _net_ended(self, key) -> _Rendezvous:
        """The rendezvous of network communication ``key``, which the network has just finished: its event
        succeeds with the communication's start as value."""
        rv = self._net_events.pop(key)
        rv._ok = True
        rv._value = rv.start_s
        return rv

    def _fire(self, ended) -> None:
        """The communications ``ended`` end now (self._trigger_in(rv, 0, rv.start_s)): queued at (now, NORMAL),
        behind every event already queued for this instant. When none is, they are the next events processed,
        in this order: run them here instead (what they schedule still queues behind the last of them).
        The network's wake-up (_network_changed) is queued first either way: its events are older than
        anything their callbacks make."""
        if not self.inline_ends or self._pending_now():
            now = self.env._now
            for rv in ended:
                self._push(now + 0, rv)
            return
        for rv in ended:
            callbacks, rv.callbacks = rv.callbacks, None
            for callback in callbacks:
                callback(rv)

    def _on_closed_end(self, event) -> None:
        """The closed-form ends at this instant of communications whose rate was known at their start
        (``_communicate``): those the network did not take back meanwhile (a later start or end changed their
        rate) end now, together, and their participants resume as at a wake-up (``_fire``: the engine learns of
        these ends only now)."""
        env = self.env
        now = env._now
        net = self.net
        ended = []
        events = self._net_events
        for key in self._closed_at.pop(event._value):
            if key.__class__ is not int:        # a fixed communication's event: the network never saw it
                ended.append(key)
            elif net.finish_closed(now, key):
                rv = events.pop(key)            # (_net_ended)
                rv._ok = True
                rv._value = rv.start_s
                ended.append(rv)
        if not net.settled:         # a neighbour that started at this instant: settle as before
            self._network_changed()
        if ended:
            self._fire(ended)

    # ------------------------------------------------------------------ streams
    def _stream_maker(self) -> Callable:
        """``maker(rank)(idxs, stream)``: the stream (rank, ``idxs``) as a callback: ``resume(event)`` runs its ops
        in program order until one must wait (for a dependency, its own end, or peers), registers itself on
        that event and returns; the queue calls it again when the event is processed. This is the engine's
        hot loop.

        It performs the steps of a SimPy process yielding those events (the engine before issue 15's second
        round), in the same order and scheduling the same events at the same times and priorities, without
        a generator, a Process or a Timeout object per op. What every stream reads is bound once per engine,
        what a rank's streams share once per rank (one closure cell each, not one per stream: at 16k ranks a
        cell is a cache line the streams of one instant need not fetch again)."""
        env = self.env
        push = self._push                       # env.schedule(ev, NORMAL, d) is push(now + d, ev)
        compute_time = self.cost.compute_time_s
        fixed = self.fixed          # (group, kind, size) -> (seconds, SM-hold seconds, share): see _find_fixed
        comm_started = self._comm_started
        closed_end_at = self._closed_end_at
        needed = self.needed
        held = self.sm_share is not None
        slowdown = self._slowdown
        rendezvous = self.rendezvous
        complete = self._complete
        solo_time = self._solo_time
        contention = self.contention
        chains = self._chains
        alone = self._alone
        fixed_alone = alone and bool(fixed)
        chain_times = self._chain_times() if chains else {}
        no_times = _NoTimes()

        def for_rank(rank: int) -> Callable:
            prog = self.p.ops[rank]
            start, end, ready, finished = self.start[rank], self.end[rank], self.ready[rank], self.finished[rank]
            waiters = self.waiters[rank]
            rv_keys = self.rv_keys[rank]
            targeted = self.targeted[rank]
            plain = self._plain[rank]
            kinds = self._kinds[rank]
            deps_of = self._deps_of[rank]
            waited = self._dep_durations.get(rank, no_times)
            timed = chain_times.get(rank, no_times)
            is_finished = finished.__getitem__
            fail_t = self.fail_at.get(rank, math.inf)
            coalesce = fail_t == math.inf
            solo_ok = coalesce and not contention and alone

            def for_stream(idxs: Sequence[int], stream: str) -> Callable:
                hold = held and self._overlaps_compute(rank, stream)     # this stream's communications hold SMs
                n = len(idxs)
                pos = 0             # next op of the stream to reach
                cur = -1            # op whose end (or start, for communication) the stream waits for; -1: none
                joined = False      # cur is a communication: the event's value is its start time
                own = []            # the one callback of ``wake`` (filled below)
                wake = _Signal(own)  # the end of the stream's own compute op / solo collective (reused)
                # collectives this stream meets alone at a known time follow the op before them without an event
                # each: every member of the group is represented here, and the time is the analytical one (no
                # contention) or the closed form of a communication alone on its links (_find_fixed); not where
                # they hold SMs
                chain = chains and coalesce and not hold and (solo_ok or fixed_alone)

                def follow(i: int, t: float) -> tuple[int, float]:
                    """Op i (not waited for by another op) ends at t: run the collectives that follow it back to back
                    while each is met alone at a known time, its deps done, and the one before it not waited for.
                    Returns the last op run and its end (i and t when none follows)."""
                    nonlocal pos
                    while pos < n and not targeted[i]:
                        j = idxs[pos]
                        if end[j] == end[j]:            # a compute op's duration (_durations)
                            break
                        d = timed[j]                    # a collective without deps met alone (_chain_times)
                        if d != d:
                            op = prog[j]
                            if op.kind != COLLECTIVE or needed[rv_keys[j] >> _KEY_BITS] != 1:
                                break
                            nd = op.deps
                            if nd and not all(map(is_finished, nd)):
                                break
                            if solo_ok:
                                d = op.duration_s
                                if d is None:
                                    d = solo_time(op)
                            elif op.duration_s is None and (fx := fixed.get((op.group, op.collective, op.size_bytes))) \
                                    is not None:
                                d = fx[0]
                            else:
                                break
                        end[i] = t
                        finished[i] = 1
                        i = j
                        pos += 1
                        ready[i] = start[i] = t
                        t = t + d
                    return i, t

                def resume(event) -> None:
                    nonlocal pos, cur, joined
                    i = cur
                    while True:
                        if i >= 0:                      # op i ends now
                            if joined:
                                start[i] = event._value
                                joined = False
                            end[i] = env._now
                            finished[i] = 1
                            if targeted[i]:             # only ops another op depends on can have waiters
                                w = waiters.pop(i, None)
                                if w is not None:
                                    push(env._now + 0, w)
                            cur = -1
                        if pos >= n:
                            return
                        i = idxs[pos]
                        dur = end[i]            # a compute op without deps: its duration until it ends (_durations)
                        if dur != dur:
                            if plain[i] and env._now < fail_t:
                                # a recv without deps or duration: it arrives at its rendezvous without the op
                                # being read (the send's op stands for the transfer; a recv completing it is read)
                                pos += 1
                                ready[i] = env._now
                                key = rv_keys[i]
                                rv = rendezvous.get(key)
                                if rv is None:
                                    rv = _Rendezvous(2, key)
                                    rendezvous[key] = rv
                                arrived = rv.arrived
                                arrived.append(rank)
                                if hold:
                                    rv.hold.append(rank)
                                if rv.op is None:
                                    rv.rank = rank
                                if len(arrived) == 2:
                                    complete(rv, prog[i])
                                rv.callbacks.append(resume)
                                cur, joined = i, True
                                return
                            kind = kinds[i]
                            if kind == COMPUTE:         # its deps from the template's table, the op not read
                                deps = deps_of[i]
                            else:
                                op = prog[i]
                                deps = op.deps
                            if deps:
                                for d in deps:
                                    if not finished[d]:
                                        ev = waiters.get(d)
                                        if ev is None:
                                            ev = waiters[d] = _Signal()
                                        ev.callbacks.append(resume)
                                        return
                            if kind == COMPUTE:
                                dur = waited[i]         # a compute op with deps (_durations)
                                if dur != dur:
                                    op = prog[i]
                                    dur = op.duration_s
                                    if dur is None:
                                        dur = compute_time(rank, op)
                        else:
                            kind = COMPUTE
                        pos += 1
                        now = env._now
                        if now >= fail_t:
                            pos = n
                            return
                        ready[i] = now
                        if kind == COMPUTE:
                            if held:
                                dur += slowdown(rank, now, dur)
                            start[i] = now
                            t = now + dur
                            # Coalesce the following compute ops of this stream into one wait when nobody else
                            # depends on the ops in between and their own deps are done: same times, fewer events.
                            while pos < n and coalesce and not targeted[i]:
                                j = idxs[pos]
                                d2 = end[j]
                                if d2 != d2:
                                    if kinds[j] != COMPUTE:
                                        break
                                    nd = deps_of[j]
                                    if nd and not all(map(is_finished, nd)):
                                        break
                                    d2 = waited[j]
                                    if d2 != d2:
                                        nxt = prog[j]
                                        d2 = nxt.duration_s
                                        if d2 is None:
                                            d2 = compute_time(rank, nxt)
                                end[i] = t
                                finished[i] = 1
                                i = j
                                pos += 1
                                ready[i] = start[i] = t
                                if held:
                                    d2 += slowdown(rank, t, d2)
                                t += d2
                            if chain and pos < n:
                                # the stream would wake at now + (t - now) and start the collectives that follow then
                                j, t2 = follow(i, now + (t - now))
                                if j != i:
                                    wake.callbacks = own
                                    cur = j
                                    push(t2, wake)
                                    return
                            if t > now:
                                wake.callbacks = own
                                if t > fail_t:          # the device dies before the op ends: the stream stops
                                    pos = n
                                    push(now + (fail_t - now), wake)
                                    return
                                cur = i
                                push(now + (t - now), wake)
                                return
                        elif solo_ok and kind == COLLECTIVE and needed[rv_keys[i] >> _KEY_BITS] == 1:
                            # nobody to wait for (every member is represented by this rank): no rendezvous needed
                            dur = op.duration_s
                            if dur is None:
                                dur = solo_time(op)
                            start[i] = now
                            if hold:
                                comm_started((rank,), now, dur, self._share(op))
                            if dur > 0:
                                t = now + dur
                                if chain:
                                    i, t = follow(i, t)
                                wake.callbacks = own
                                cur = i
                                push(t, wake)
                                return
                        elif fixed_alone and kind == COLLECTIVE and needed[rv_keys[i] >> _KEY_BITS] == 1 \
                                and op.duration_s is None \
                                and (fx := fixed.get((op.group, op.collective, op.size_bytes))) is not None:
                            # alone in its group and on its links whenever it runs: its closed-form end, no network
                            dur = fx[0]
                            start[i] = now
                            if hold:
                                comm_started((rank,), now, fx[1], fx[2])
                            wake.callbacks = own
                            if chain:
                                j, t = follow(i, now + dur)
                                if j != i:
                                    cur = j
                                    push(t, wake)
                                    return
                            cur = i
                            closed_end_at(now + dur, wake)      # ends as the network's closed-form end would
                            return
                        else:
                            # arrive at the rendezvous; the last to arrive starts the communication
                            key = rv_keys[i]
                            rv = rendezvous.get(key)
                            if rv is None:              # a new one (one of a single rank completes at once: not kept)
                                sid = key >> _KEY_BITS
                                k = needed[sid] if sid >= 0 else 2
                                rv = _Rendezvous(k, key)
                                if k > 1:
                                    rendezvous[key] = rv
                            arrived = rv.arrived
                            arrived.append(rank)
                            if hold:
                                rv.hold.append(rank)
                            if op.duration_s is not None:
                                rv.duration = op.duration_s if rv.duration is None else max(rv.duration, op.duration_s)
                            if rv.op is None or kind == SEND:
                                rv.op, rv.rank = op, rank
                            if len(arrived) == rv.needed:
                                complete(rv, op)
                            rv.callbacks.append(resume)
                            cur, joined = i, True
                            return
                        # op i took no time: it ends now (top of the loop)

                own.append(resume)
                return resume

            return for_stream

        return for_rank

    def _chain_times(self) -> dict[int, array]:
        """rank -> per op index, the seconds of each collective without deps that the rank meets alone (every
        member of its group represented by it) at a time known before it runs: its own duration or the
        analytical time (no contention), or its closed form (``fixed``: alone on its links); NaN elsewhere.
        ``follow`` reads these instead of the ops. Ranks of one template (their rendezvous keys set up from
        it, ``templated``) share its shape, found once: the ops of each (group, kind, size, duration); ranks of
        one template with the same times share one array."""
        templates = self.p.templates or {}
        contention, fixed, needed, rv_keys = self.contention, self.fixed, self.needed, self.rv_keys
        shapes: dict = {}
        kept: list = []
        made: dict = {}
        out = {}
        for rank, prog in self.p.ops.items():
            tkey = templates.get(rank)
            shape = shapes.get(tkey) if tkey is not None else None
            if shape is None or shape[0] != len(prog) or (rank not in self.templated and shape[1] != rank):
                shape = self._chain_shape(rank, prog)
                kept.append(shape)          # (alive while ``made`` is keyed by its id)
                if tkey is not None:
                    shapes.setdefault(tkey, shape)
            times = []
            for f, idx in shape[2]:
                op = prog[f]
                if needed[rv_keys[rank][f] >> _KEY_BITS] != 1:
                    continue
                d = op.duration_s
                if contention:
                    fx = fixed.get((op.group, op.collective, op.size_bytes)) if d is None else None
                    if fx is None:
                        continue
                    d = fx[0]
                elif d is None:
                    d = self._solo_time(op)
                times.append((f, d))
            key = (id(shape), tuple(times))
            arr = made.get(key)
            if arr is None:
                a = np.full(shape[0], np.nan)
                spots = dict(shape[2])
                for f, d in times:
                    a[spots[f]] = d
                arr = made[key] = array("d", a.tobytes())
            out[rank] = arr
        return out

    @staticmethod
    def _chain_shape(rank: int, prog) -> tuple:
        """(length, rank, [(first index, indices)]): ``prog``'s collectives without deps by (group, kind, size,
        duration), each named by its first op's index (for ``_chain_times``)."""
        by: dict = {}
        for i, op in enumerate(prog):
            if op.kind == COLLECTIVE and not op.deps:
                k = (op.group, op.collective, op.size_bytes, op.duration_s)
                at = by.get(k)
                if at is None:
                    by[k] = [i]
                else:
                    at.append(i)
        return len(prog), rank, [(at[0], np.array(at, dtype=np.intp)) for at in by.values()]

    def _overlaps_compute(self, rank: int, stream: str) -> bool:
        """Whether communications on ``stream`` can overlap compute ops of ``rank``: a stream waits for each op
        to end, so a communication on the only stream with compute ops never runs beside one (its SM hold
        would slow nothing) and is not registered; a rank without compute ops has nothing to slow down."""
        streams = self._compute_streams[rank]
        return bool(streams) and streams != {stream}

    def _complete(self, rv: _Rendezvous, op) -> None:
        """Every participant of ``rv`` arrived (``op``: the last one's): start the communication, unless a
        member died (then it hangs, as a real one would)."""
        if rv.needed > 1:
            if self.failed and any(r in self.failed for r in rv.arrived):
                return
            del self.rendezvous[rv.key]
        req = None
        if op.kind == COLLECTIVE:
            if rv.duration is None and not self.contention:
                rv.duration = self._solo_time(op)      # cached per (group, kind, size)
            elif rv.duration is None:
                req = self._collective_request(op)
        elif rv.duration is None:
            sop, srank = rv.op, rv.rank     # the send side (real ranks)
            if self.contention:             # kept per (pair id, real peer, group, size): flat, quick to hash
                pkey = (rv.key >> _KEY_BITS, sop.peer, sop.group, op.size_bytes)
                req = self._pair_reqs.get(pkey)
                if req is None:
                    real = (srank, sop.peer) if sop.kind == SEND else (sop.peer, srank)
                    req = self._pair_reqs[pkey] = self._p2p_request(real, srank, sop, op.size_bytes)
                self._communicate(rv, req)
                return
            real = (srank, sop.peer) if sop.kind == SEND else (sop.peer, srank)
            pkey = (real, op.size_bytes)    # analytical: cached per (pair, size), as collectives are
            t = self._comm_cache.get(pkey)
            if t is None:
                t = self._comm_cache[pkey] = self.cost.comm_time_s(CommRequest("p2p", real, op.size_bytes))
            rv.duration = t
        self._communicate(rv, req)

    def run(self) -> SimResult:
        with no_gc():
            return self._run()

    def _run(self) -> SimResult:
        t_wall = time.perf_counter()
        for rank, t in self.fail_at.items():
            if rank not in self.p.ops:
                raise ClusterSimError(f"failure injected on rank {rank}, which is not simulated "
                                      f"(ranks 0..{self.p.world_size - 1}; use full mode for per-rank faults)")
            if not t >= 0:
                raise ClusterSimError(f"failure time of rank {rank} must be >= 0 s, got {t}")
            self._push(self.env._now + t, _Signal([lambda _e, rank=rank: self.failed.add(rank)]))
        # every stream takes its first steps now, in order (SimPy would run its processes' starts first too)
        maker = self._stream_maker()
        for rank in self.p.ops:
            streams_of_rank = maker(rank)
            for stream, idxs in self._streams[rank].items():
                self.stream_ops[(rank, stream)] = idxs
                streams_of_rank(idxs, stream)(None)
        self._loop(self.until_s)
        blocked = self._blocked()
        if blocked and self.failed:
            raise self._failure_report(blocked)
        if blocked and self.until_s is None:
            raise self._deadlock(blocked)
        if self.progress is not None:
            self.progress(self.total_ops, self.total_ops)
        for rank, fin in self.finished.items():
            if 0 in fin:                # ops that never ended: no end time (their slot may hold a duration)
                e = self.end[rank]
                for i in np.flatnonzero(np.frombuffer(fin, dtype=np.uint8) == 0).tolist():
                    e[i] = math.nan
        events = self.ops_done()
        return SimResult(self.p, self.cost, self.start, self.end, self.ready, events,
                         time.perf_counter() - t_wall)

    def _loop(self, until: float | None = None) -> None:
        """``env.run(until)`` on the calendar: take the earliest instant, set the clock, run the callbacks of
        its events in the order they were queued (those queued for now meanwhile included), then that
        instant's _LAST events, one at a time (a NORMAL event queued now by one of them runs before the next).
        Every event the engine schedules succeeds, so SimPy's failure check has nothing to do. With ``until``,
        events at or after it are left, and the clock ends there (what SimPy's run(until) does)."""
        env = self.env
        if not self.calendar:       # the events are on SimPy's heap (_heap_push): its own loop runs them
            env.run(until=until)
            return
        if until is not None and not until > env._now:
            raise ValueError(f"until ({until}) must be greater than the current simulation time")
        stop = math.inf if until is None else until
        cal, times, late = self._cal, self._times, self._late
        progress = self.progress
        tick, shown = 0, time.perf_counter()
        while True:
            if times and (not late or times[0] <= late[0][0]):
                t = times[0]
                if t >= stop:
                    break
                env._now = t
                bucket = self._bucket = cal[t]
                i = 0
                while i < len(bucket):
                    event = bucket[i]
                    i += 1
                    self._next = i
                    callbacks, event.callbacks = event.callbacks, None
                    for callback in callbacks:
                        callback(event)
                self._bucket = None
                del cal[t]
                heappop(times)
                if progress is not None:        # every progress_every_s (looked at every 1024 instants)
                    tick += 1
                    if tick >= 1024:
                        tick = 0
                        if time.perf_counter() - shown >= self.progress_every_s:
                            progress(self.ops_done(), self.total_ops)
                            shown = time.perf_counter()
            elif late and late[0][0] < stop:
                env._now, _, event = heappop(late)
                callbacks, event.callbacks = event.callbacks, None
                for callback in callbacks:
                    callback(event)
            else:
                break
        if until is not None:
            env._now = until

    def ops_done(self) -> int:
        """How many of the simulated ops have ended so far."""
        return sum(f.count(1) for f in self.finished.values())

    def _blocked(self) -> list[tuple[tuple[int, str], tuple]]:
        """Each (rank, stream) with unfinished ops and what its first unfinished op waits for."""
        out = []
        for (rank, stream), idxs in self.stream_ops.items():
            fin = self.finished[rank]
            if fin[idxs[-1]]:
                continue
            i = next(j for j in idxs if not fin[j])
            op = self.p.ops[rank][i]
            if rank in self.failed:
                st = ("failed", i)
            elif any(not fin[d] for d in op.deps):
                st = ("dep", i, next(d for d in op.deps if not fin[d]))
            elif op.kind == COMPUTE:
                st = ("compute", i)
            else:
                rv = self.rendezvous.get(self.rv_keys[rank][i])
                if rv is None:
                    st = ("in_flight", i)
                elif op.kind == COLLECTIVE:
                    st = ("collective", i, rv)
                else:
                    src, dst = self.p2p_pairs[-1 - (self.rv_keys[rank][i] >> _KEY_BITS)]
                    st = ("p2p", i, rv, src, dst)
            out.append(((rank, stream), st))
        return out

    # ------------------------------------------------------------------ deadlock report
    def describe_blocked(self, blocked) -> list[dict]:
        """One dict per blocked (rank, stream): the op it is stuck in and whom it waits for. In symmetric mode
        every member of a blocked representative's class is listed as a full run lists it: its own group,
        peer and op (the member's copy of the representative's), and the ranks of its own group that have
        not arrived."""
        rows = sorted(((m, stream, rank, st) for (rank, stream), st in blocked for m in self.p.members(rank)),
                      key=lambda x: (x[0], x[1]))
        out = []
        for m, stream, rank, st in rows:
            prog = self.p.ops[rank]
            info = {"rank": m, "stream": stream, "state": st[0]}
            if st[0] == "dep":
                _, i, d = st
                info.update(op=i, op_repr=repr(self._member_op(rank, m, prog[i])), waits_for_op=d, waits_for=[m],
                            reason=f"waits for its own op {d} {self._member_op(rank, m, prog[d])!r} on stream "
                                   f"{prog[d].stream!r}")
            elif st[0] == "collective":
                _, i, rv = st
                op = self._member_op(rank, m, prog[i])
                g = self.p.groups[op.group]
                waiting = set(self.sync.members[rv.key >> _KEY_BITS]) - set(rv.arrived)     # simulated ranks not there
                missing = sorted(x for x in g.ranks if self.rep.get(x) in waiting)
                info.update(op=i, op_repr=repr(op), waits_for=missing,
                            reason=f"in collective #{rv.key & _KEY_MASK} on group {g.family}{list(g.ranks[:16])}, waiting "
                                   f"for rank(s) {missing[:16]} to reach it")
            elif st[0] == "p2p":
                _, i, rv, _, _ = st
                op = self._member_op(rank, m, prog[i])
                src, dst = (m, op.peer) if op.kind == SEND else (op.peer, m)
                info.update(op=i, op_repr=repr(op), waits_for=[op.peer],
                            reason=f"in {op.kind} #{rv.key & _KEY_MASK} {src}->{dst}, waiting for rank {op.peer} "
                                   f"to post the matching {'recv' if op.kind == SEND else 'send'}")
            elif st[0] == "failed":
                _, i = st
                info.update(op=i, op_repr=repr(self._member_op(rank, m, prog[i])) if i is not None else "",
                            waits_for=[], reason=f"device failed at t={self.fail_at[rank]:.6g}s")
            elif st[0] == "in_flight":
                _, i = st
                info.update(op=i, op_repr=repr(self._member_op(rank, m, prog[i])), waits_for=[],
                            reason="its communication started but never ends (a link on its path has no usable "
                                   "bandwidth: failed, or degraded to a vanishing share)")
            elif st[0] == "compute":
                _, i = st
                info.update(op=i, op_repr=repr(self._member_op(rank, m, prog[i])), waits_for=[],
                            reason="its compute op never ends (an infinite or unrepresentable duration: a device "
                                   "or calibration with vanishing throughput)")
            else:
                info.update(op=None, op_repr="", waits_for=[], reason=st[0])
            out.append(info)
        return out

    def _member_op(self, rank: int, m: int, op):
        """Representative ``rank``'s ``op`` as member ``m`` of its class runs it: its own group and peer."""
        if m == rank or op.group is None:
            return op
        groups = self.p.groups
        g = groups[op.group]
        gid = self.p.group_of(m, g.family)
        if gid is None:
            return op
        if op.kind == COLLECTIVE:
            return op.copy(group=gid)
        pos = g.ranks.index(op.peer) if op.peer in g.ranks else None
        return op.copy(group=gid, peer=groups[gid].ranks[pos]) if pos is not None else op

    def _failure_report(self, blocked) -> DeviceFailureError:
        infos = self.describe_blocked(blocked)
        dead = sorted(m for r in self.failed for m in self.p.members(r))
        hung = [b for b in infos if b["state"] != "failed"]
        lines = [f"rank {b['rank']} stream {b['stream']!r} op {b['op']} {b['op_repr']}: {b['reason']}"
                 for b in hung[:20]]
        more = f"\n  ... and {len(hung) - 20} more" if len(hung) > 20 else ""
        msg = (f"device failure: rank(s) {dead[:16]} failed at t="
               f"{', '.join(f'{self.fail_at[self.rep[r]]:.6g}s' for r in dead[:4])}; the step cannot finish. Watchdog view: "
               f"{len({b['rank'] for b in hung})} rank(s) hang:\n  " + "\n  ".join(lines) + more)
        return DeviceFailureError(msg, blocked=infos)

    def _deadlock(self, blocked) -> DeadlockError:
        infos = self.describe_blocked(blocked)
        lines = [f"rank {b['rank']} stream {b['stream']!r} op {b['op']} {b['op_repr']}: {b['reason']}"
                 for b in infos[:20]]
        more = f"\n  ... and {len(infos) - 20} more blocked streams" if len(infos) > 20 else ""
        ranks = sorted({b["rank"] for b in infos})
        endless = sum(b["state"] in ("in_flight", "compute") for b in infos)
        why = (f"; {endless} of them in an op that never ends (not a wait between ranks)" if endless else "")
        msg = (f"deadlock at t={self.env.now:.6g}s: {len(infos)} stream(s) of {len(ranks)} rank(s) can never "
               f"progress{why}:\n  " + "\n  ".join(lines) + more)
        return DeadlockError(msg, blocked=infos)


def run(programs: Programs, cost_model: CostModel, *, check: bool = True,
        progress: Callable[[int, int], None] | None = None, until_s: float | None = None,
        failures: dict[int, float] | None = None) -> SimResult:
    """Validate (unless ``check=False``) and simulate one step; return a ``SimResult``.

    Raises ProgramError for invalid programs and DeadlockError when the programs cannot finish.
    ``until_s`` stops the simulation at that time (ops still running stay unfinished: NaN end times).
    ``failures`` {rank: time_s}: that device dies then; if the step cannot finish, DeviceFailureError names
    the ranks that hang and the collective / transfer they wait in (a watchdog's view).
    """
    if not isinstance(programs, Programs):
        raise ClusterSimError(f"run() needs a Programs object, got {type(programs).__name__}")
    if check:
        validate(programs)
    return Engine(programs, cost_model, progress=progress, until_s=until_s, failures=failures).run()
