"""The program model: the contract between workload generators and the engine.

A *program* is the ordered list of ops one rank executes in one training step. Ops live on named
*streams* (``compute``, ``comm``, ``dp_comm``, ``pp_send`` ...): ops of one stream run in program order,
streams of one rank run concurrently, and an op may depend on earlier ops of any stream of its rank
(``deps`` are indices into the same rank's program).

Op kinds
    compute     ``flops`` (FLOPs) and ``mem_bytes`` (HBM bytes moved) -> the cost model's roofline time.
    collective  ``collective`` in COLLECTIVE_KINDS over process group ``group`` with ``size_bytes``.
    send/recv   point-to-point with ``peer`` (global rank), ``size_bytes``; matched in order per (src, dst).
                Rendezvous semantics (as NCCL): a send and its recv both start when both are posted and
                end together when the transfer ends.

Any op may carry ``duration_s`` (a measured duration, for trace replay) instead of cost inputs.

Collective sizes follow nccl-tests' convention for "size": all_reduce, broadcast, reduce: the buffer;
all_gather: the gathered output (total over ranks); reduce_scatter: the input (total over ranks);
all_to_all: the bytes one rank sends in total (its whole send buffer); barrier: 0.

Memory: ``alloc`` (category, bytes) pairs are allocated when the op starts and ``free`` pairs are released
when it ends; ``Programs.static_memory`` holds what is resident all step (parameters, optimizer state).
Categories: parameters, gradients, optimizer, activations, buffers.

Units: seconds, bytes, FLOPs.
"""
from __future__ import annotations

import gc
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterable

from simulator.errors import ProgramError

COMPUTE = "compute"
COLLECTIVE = "collective"
SEND = "send"
RECV = "recv"
OP_KINDS = (COMPUTE, COLLECTIVE, SEND, RECV)

COLLECTIVE_KINDS = (
    "all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce", "barrier",
)

# Phases used as labels (plots colour by them).
FORWARD = "forward"
BACKWARD_INPUT = "backward_input"
BACKWARD_WEIGHT = "backward_weight"
BACKWARD = "backward"          # input and weight gradients fused in one op
OPTIMIZER = "optimizer"
PHASES = (FORWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, BACKWARD, OPTIMIZER)

MEMORY_CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "buffers")


_new_op = object.__new__
_KEEP = object()        # Op.copy: keep this field


#: streams whose communication holds no SMs in the engine's interference model: the compute it overlaps is
#: priced on the SMs the communication leaves (Transformer Engine's userbuffers TP overlap: ``tp_overlap``,
#: its GEMMs chunked and with an SM margin, schedules.kernels.UB_OVERLAP)
KERNEL_PRICED_SM_STREAMS = frozenset({"tp_overlap"})


class Op:
    """One operation of one rank's program. Plain slotted class: millions of them must be cheap."""

    __slots__ = (
        "kind", "name", "stream", "deps", "flops", "mem_bytes", "size_bytes", "collective",
        "group", "peer", "duration_s", "alloc", "free", "layer", "microbatch", "phase", "strategy", "kernels",
    )

    def __init__(
        self,
        kind: str,
        name: str,
        stream: str = "compute",
        deps: tuple[int, ...] = (),
        *,
        flops: float = 0.0,
        mem_bytes: float = 0.0,
        size_bytes: float = 0.0,
        collective: str | None = None,
        group: int | None = None,
        peer: int | None = None,
        duration_s: float | None = None,
        alloc: tuple[tuple[str, float], ...] = (),
        free: tuple[tuple[str, float], ...] = (),
        layer: int | None = None,
        microbatch: int | None = None,
        phase: str | None = None,
        strategy: str | None = None,
        kernels=None,
    ):
        self.kind = kind
        self.name = name
        self.stream = stream
        self.deps = tuple(deps)
        self.flops = flops
        self.mem_bytes = mem_bytes
        self.size_bytes = size_bytes
        self.collective = collective
        self.group = group
        self.peer = peer
        self.duration_s = duration_s
        self.alloc = alloc
        self.free = free
        self.layer = layer
        self.microbatch = microbatch
        self.phase = phase
        self.strategy = strategy
        self.kernels = kernels      # simulator.kernels.KernelList: the kernels a compute op launches, or None

    def __repr__(self) -> str:  # short, for error messages
        extra = ""
        if self.kind == COLLECTIVE:
            extra = f" {self.collective} group={self.group} {self.size_bytes:.0f}B"
        elif self.kind in (SEND, RECV):
            extra = f" peer={self.peer} {self.size_bytes:.0f}B"
        return f"<{self.kind} {self.name!r} stream={self.stream}{extra}>"

    def copy(self, group=_KEEP, peer=_KEEP, **changes) -> "Op":
        """A new op with the same fields except ``changes`` (e.g. ``group=``, ``peer=``)."""
        new = self.regrouped(self.group if group is _KEEP else group, self.peer if peer is _KEEP else peer)
        for k, v in changes.items():
            setattr(new, k, v)
        return new

    def regrouped(self, group, peer) -> "Op":
        """A new op with the same fields but ``group`` and ``peer``. Fields are copied slot by slot, without
        ``__init__`` or keyword handling: class refinement and program instantiation make millions of these."""
        new = _new_op(Op)
        new.kind, new.name, new.stream, new.deps = self.kind, self.name, self.stream, self.deps
        new.flops, new.mem_bytes, new.size_bytes = self.flops, self.mem_bytes, self.size_bytes
        new.collective, new.duration_s, new.group, new.peer = self.collective, self.duration_s, group, peer
        new.alloc, new.free, new.layer, new.microbatch = self.alloc, self.free, self.layer, self.microbatch
        new.phase, new.strategy, new.kernels = self.phase, self.strategy, self.kernels
        return new

    def signature(self) -> tuple:
        """Everything that determines this op's behaviour except the identities of other ranks."""
        return (self.kind, self.name, self.stream, self.deps, self.flops, self.mem_bytes, self.size_bytes,
                self.collective, self.duration_s, self.alloc, self.free, self.phase)


def compute(name: str, flops: float = 0.0, mem_bytes: float = 0.0, stream: str = "compute", deps=(), **kw) -> Op:
    return Op(COMPUTE, name, stream, deps, flops=flops, mem_bytes=mem_bytes, **kw)


def collective(name: str, kind: str, group: int, size_bytes: float, stream: str = "comm", deps=(), **kw) -> Op:
    return Op(COLLECTIVE, name, stream, deps, collective=kind, group=group, size_bytes=size_bytes, **kw)


def send(name: str, peer: int, size_bytes: float, stream: str = "comm", deps=(), **kw) -> Op:
    return Op(SEND, name, stream, deps, peer=peer, size_bytes=size_bytes, **kw)


def recv(name: str, peer: int, size_bytes: float, stream: str = "comm", deps=(), **kw) -> Op:
    return Op(RECV, name, stream, deps, peer=peer, size_bytes=size_bytes, **kw)


@dataclass(frozen=True)
class ProcessGroup:
    """A set of global ranks that run collectives together. ``family`` names the parallel axis
    ("tp", "dp", "pp", "ep", "cp", "world", ...): each rank belongs to at most one group per family."""

    ranks: tuple[int, ...]
    family: str = "custom"

    @property
    def size(self) -> int:
        return len(self.ranks)


@dataclass
class Programs:
    """Per-rank programs of one training step plus everything the engine and metrics need.

    ops            rank -> program, for the ranks that are simulated. In full mode every rank.
    groups         process groups; ``Op.group`` indexes this list.
    classes        symmetric mode: representative rank -> all ranks it stands for (itself included).
                   None means full mode: every rank of ``range(world_size)`` has a program.
    static_memory  rank -> {category: bytes} resident for the whole step (parameters, optimizer ...).
    tokens_per_step, model_flops_per_step: for tokens/s and MFU (whole job, model FLOPs without
                   recomputation).
    templates      optional rank -> template key, a promise of whoever built the programs: ranks with one key
                   have programs alike op by op in every field but their groups and peers (each group of the
                   same family; a rank holds one group per family), which stand in the same relation to each
                   rank. The engine and the metrics then work out once per template what does not depend on
                   groups and peers (schedules.build_programs fills it, class refinement keeps it; None: no
                   promise).
    """

    world_size: int
    ops: dict[int, list[Op]]
    groups: list[ProcessGroup] = field(default_factory=list)
    classes: dict[int, tuple[int, ...]] | None = None
    static_memory: dict[int, dict[str, float]] = field(default_factory=dict)
    tokens_per_step: float = 0.0
    model_flops_per_step: float = 0.0
    meta: dict = field(default_factory=dict)
    templates: dict[int, object] | None = None

    # ------------------------------------------------------------------ groups
    def add_group(self, ranks: Iterable[int], family: str = "custom") -> int:
        """Register a process group (deduplicated by (ranks, family)) and return its id."""
        key = (tuple(ranks), family)
        index = self.__dict__.setdefault("_group_index", {})
        if key in index:
            return index[key]
        self.groups.append(ProcessGroup(key[0], family))
        index[key] = len(self.groups) - 1
        return index[key]

    def group_of(self, rank: int, family: str) -> int | None:
        """Id of the group of ``family`` that holds ``rank`` (None if none; the first such group)."""
        hit = self.__dict__.get("_family_rank")  # (group count, family -> rank -> group id): built once
        if hit is None or hit[0] != len(self.groups):
            tables: dict = {}
            for gid, g in enumerate(self.groups):
                t = tables.get(g.family)
                if t is None:
                    t = tables[g.family] = {}
                for r in g.ranks:
                    t.setdefault(r, gid)
            hit = self.__dict__["_family_rank"] = (len(self.groups), tables)
        tables = hit[1]
        t = tables.get(family)
        return None if t is None else t.get(rank)

    # ------------------------------------------------------------------ symmetry
    @property
    def symmetric(self) -> bool:
        return self.classes is not None

    def representative_of(self) -> dict[int, int]:
        """rank -> the simulated rank that stands for it (identity in full mode)."""
        if self.classes is None:
            return {r: r for r in self.ops}
        rep = {}
        for r, members in self.classes.items():
            for m in members:
                rep[m] = r
        return rep

    def members(self, rank: int) -> tuple[int, ...]:
        """The ranks a simulated rank stands for (itself alone in full mode)."""
        return (rank,) if self.classes is None else self.classes[rank]

    def multiplicity(self, rank: int) -> int:
        """How many ranks a simulated rank stands for."""
        return 1 if self.classes is None else len(self.classes[rank])

    @property
    def op_count(self) -> int:
        """Ops in the simulated programs."""
        return sum(len(p) for p in self.ops.values())

    @property
    def represented_op_count(self) -> int:
        """Ops of the whole job (simulated ops times the ranks they stand for)."""
        return sum(len(p) * self.multiplicity(r) for r, p in self.ops.items())


@contextmanager
def no_gc():
    """Pause the cyclic garbage collector while millions of ops (no reference cycles) are made: it would
    only rescan them over and over (each full collection walks every object alive)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# ---------------------------------------------------------------------------------------------- validation
def validate(programs: Programs) -> None:
    """Static checks (see ``_validate``); malformed input of any type becomes a ProgramError."""
    if not isinstance(programs, Programs):
        raise ProgramError(f"expected a Programs object, got {type(programs).__name__}")
    try:
        with no_gc():
            _validate(programs)
    except ProgramError:
        raise
    except (TypeError, AttributeError, ValueError, KeyError, IndexError) as e:
        raise ProgramError(f"malformed programs: {type(e).__name__}: {e}") from None


def _validate(programs: Programs) -> None:
    """Static checks before simulating; raise ProgramError naming ranks and ops.

    - every rank of the job is simulated or represented; ops are well-formed;
    - deps point at existing ops of the same rank and the (stream order + deps) graph is acyclic;
    - the members of a group agree on the kind and size of their k-th collective on it, and on how
      many collectives they run on it;
    - every send has a matching recv (count and size, in order, per (source, destination)).
    """
    n = programs.world_size
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise ProgramError(f"world_size must be positive, got {n}")
    rep = programs.representative_of()
    if programs.classes is None:
        missing = [r for r in range(n) if r not in programs.ops]
        if missing:
            raise ProgramError(f"no program for rank(s) {_short(missing)} of world size {n}")
    else:
        unplaced = [r for r in range(n) if r not in rep]
        if unplaced:
            raise ProgramError(f"symmetric programs: rank(s) {_short(unplaced)} belong to no class")
    ngroups = len(programs.groups)
    for gid, g in enumerate(programs.groups):
        bad = [r for r in g.ranks if not (0 <= r < n)]
        if bad or len(set(g.ranks)) != len(g.ranks) or not g.ranks:
            raise ProgramError(f"process group {gid} ({g.family}) has invalid ranks {g.ranks[:16]}")

    sync = SyncTable(programs, rep)
    coll_seq: dict[tuple[int, int], list[Op]] = {}          # (sync id, rank) -> its ops on it, in order
    p2p: dict[tuple[int, int, str], list[Op]] = defaultdict(list)    # (src, dst, kind) -> ops, in order
    if not isinstance(programs.ops, dict) or (programs.classes is not None and not isinstance(programs.classes, dict)):
        raise ProgramError("Programs.ops and Programs.classes must be dicts keyed by rank")
    member_sets: dict[int, frozenset] = {}      # group id -> its ranks as a set (built once per group)
    # ops are shared between programs (a template's ops): an op that is the very object at the same index of
    # a program checked before (found by its last op or its length) passed already; no set of every op
    seen_last: dict[int, list] = {}
    seen_len: dict[int, list] = {}
    seen_tpl: dict = {}          # template key -> the last program of it checked (shares the template's ops)
    checked_pairs: set[int] = set()     # ids of alloc / free tuples checked (copies of an op share them)
    templates = programs.templates if isinstance(programs.templates, dict) else {}
    graph_of: dict = {}         # template key -> length of the program whose deps and streams passed
    for rank, prog in programs.ops.items():
        if not isinstance(prog, list):
            raise ProgramError(f"rank {rank}: a program must be a list of Op objects")
        tkey = templates.get(rank)
        if tkey is None or graph_of.get(tkey) != len(prog):
            _check_rank_graph(rank, prog)       # (ranks of one template share their deps and streams)
            if tkey is not None:
                graph_of.setdefault(tkey, len(prog))
        n_ops = len(prog)
        before = seen_tpl.get(tkey) if tkey is not None else None
        if before is None or len(before) != n_ops:
            before = (seen_last.get(id(prog[-1])) or seen_len.get(n_ops)) if n_ops else None
        if before is not None and len(before) != n_ops:
            before = seen_len.get(n_ops)
        sid_of: dict[int, int] = {}             # this rank's groups (membership checked) -> sync id
        mine: dict[int, list] = {}               # sync id -> this rank's ops on it
        for i, op in enumerate(prog):
            if before is None or before[i] is not op:
                # fast path for the usual op (plain numbers, no measured duration, no memory events but those
                # of an op checked before: an op's copies share its alloc and free tuples)
                if not (type(op) is Op and op.duration_s is None
                        and (not op.alloc or id(op.alloc) in checked_pairs)
                        and (not op.free or id(op.free) in checked_pairs)
                        and type(op.stream) is str
                        and type(op.flops) in _NUM and type(op.mem_bytes) in _NUM and type(op.size_bytes) in _NUM
                        and 0.0 <= op.flops < _INF and 0.0 <= op.mem_bytes < _INF and 0.0 <= op.size_bytes < _INF
                        and (op.kind in _SIMPLE_KINDS or (op.kind == COLLECTIVE and op.collective in _COLLECTIVE_SET))):
                    _check_op(rank, i, op)
                    if op.alloc:
                        checked_pairs.add(id(op.alloc))
                    if op.free:
                        checked_pairs.add(id(op.free))
            kind = op.kind
            if kind == COLLECTIVE:
                gid = op.group
                sid = sid_of.get(gid) if type(gid) is int else None
                if sid is None:
                    if not isinstance(gid, int) or isinstance(gid, bool) or not (0 <= gid < ngroups):
                        raise ProgramError(f"rank {rank} op {i} {op!r}: group {gid} is not a registered group")
                    ms = member_sets.get(gid)
                    if ms is None:
                        ms = member_sets[gid] = frozenset(programs.groups[gid].ranks)
                    if rank not in ms:
                        raise ProgramError(f"rank {rank} op {i} {op!r}: rank is not a member of group {gid} "
                                           f"{programs.groups[gid].ranks[:16]}")
                    sid = sid_of[gid] = sync.id_of(gid)
                seq = mine.get(sid)
                if seq is None:
                    seq = mine[sid] = []
                seq.append(op)
            elif kind == SEND or kind == RECV:
                peer = op.peer
                if type(peer) is not int or not (0 <= peer < n) or peer == rank:
                    if not isinstance(peer, int) or isinstance(peer, bool) or not (0 <= peer < n) or peer == rank:
                        raise ProgramError(f"rank {rank} op {i} {op!r}: invalid peer {op.peer}")
                p2p[(rank, rep[peer], SEND) if kind == SEND else (rep[peer], rank, RECV)].append(op)
        if n_ops:
            seen_last[id(prog[-1])] = seen_len[n_ops] = prog
            if tkey is not None:
                seen_tpl[tkey] = prog
        for sid, seq in mine.items():
            coll_seq[(sid, rank)] = seq

    def at(rank: int, op: Op) -> int:
        """The index of ``op`` in ``rank``'s program (for messages)."""
        return next(i for i, x in enumerate(programs.ops[rank]) if x is op)

    # collectives: members agree on k-th kind/size and count (compared against one reference sequence)
    by_key: dict[int, list[int]] = defaultdict(list)
    for (sid, rank) in coll_seq:
        by_key[sid].append(rank)
    for sid, ranks in by_key.items():
        members = sync.members[sid]
        if len(ranks) != len(members):
            present = set(ranks)
            absent = [m for m in members if m not in present]
            r0 = ranks[0]
            op = coll_seq[(sid, r0)][0]
            raise ProgramError(
                f"group {_short(members)}: rank {r0} runs {len(coll_seq[(sid, r0)])} collective(s) on it "
                f"(first: op {at(r0, op)} {op!r}) but rank(s) {_short(absent)} run none")
        ref_rank = ranks[0]
        ref = coll_seq[(sid, ref_rank)]
        for r in ranks[1:]:
            seq = coll_seq[(sid, r)]
            if len(seq) == len(ref) and all(b is a for a, b in zip(ref, seq)):
                continue                     # the same shared op objects: nothing to compare
            for k, (a, b) in enumerate(zip(ref, seq)):
                if a is not b and (b.collective != a.collective or (
                        b.size_bytes != a.size_bytes and not _close(a.size_bytes, b.size_bytes))):
                    raise ProgramError(
                        f"group {_short(members)}: collective #{k} disagrees: rank {ref_rank} op {at(ref_rank, a)} "
                        f"{a!r} vs rank {r} op {at(r, b)} {b!r}")
            if len(seq) != len(ref):
                longer, shorter = (ref_rank, r) if len(ref) > len(seq) else (r, ref_rank)
                k = min(len(seq), len(ref))
                op = coll_seq[(sid, longer)][k]
                raise ProgramError(
                    f"group {_short(members)}: rank {longer} runs {max(len(seq), len(ref))} collectives on it but "
                    f"rank {shorter} runs {k}; rank {shorter} misses collective #{k} (rank {longer} op "
                    f"{at(longer, op)} {op!r})")

    # point-to-point: matched in order per (src, dst)
    for (src, dst, kind), sends in list(p2p.items()):
        if kind != SEND:
            continue
        recvs = p2p.get((src, dst, RECV), [])
        for k, (s, r) in enumerate(zip(sends, recvs)):
            if s.size_bytes != r.size_bytes and not _close(s.size_bytes, r.size_bytes):
                raise ProgramError(f"send #{k} {src}->{dst} (rank {src} op {at(src, s)} {s!r}) does not match the "
                                   f"size of recv #{k} (rank {dst} op {at(dst, r)} {r!r})")
        if len(recvs) != len(sends):
            raise ProgramError(f"rank {src} sends {len(sends)} message(s) to rank {dst} but rank {dst} posts "
                               f"{len(recvs)} matching recv(s)")
    for (src, dst, kind), recvs in p2p.items():
        if kind == RECV and (src, dst, SEND) not in p2p:
            op = recvs[0]
            raise ProgramError(f"rank {dst} op {at(dst, op)} {op!r} waits for a message from rank {src}, "
                               f"which sends none to it")


def sync_key(programs: Programs, gid: int, rep: dict[int, int]) -> tuple:
    """The rendezvous identity of group ``gid``: (family, simulated ranks standing for its members).

    In full mode that is the group itself; in symmetric mode a group whose members are all
    represented by one rank synchronises with nobody but that rank."""
    g = programs.groups[gid]
    if programs.classes is None:
        return (g.family, g.ranks, gid)
    return (g.family, tuple(sorted({rep[m] for m in g.ranks})))


class SyncTable:
    """Integer rendezvous ids for process groups, so nothing per op hashes or scans a group's ranks.

    ``id_of(gid)``: the sync id of group ``gid`` (full mode: one per group; symmetric mode: groups whose
    members are represented by the same simulated ranks, in the same family, share one id).
    ``members[sid]``: the simulated ranks that meet at it (sorted tuple); ``family[sid]``; ``group[sid]``:
    one group id with that sync id (for messages). Each group's ranks are read once, when first asked."""

    __slots__ = ("programs", "rep", "members", "family", "group", "_of_gid", "_of_key")

    def __init__(self, programs: Programs, rep: dict[int, int]):
        self.programs, self.rep = programs, rep
        self.members: list[tuple[int, ...]] = []
        self.family: list[str] = []
        self.group: list[int] = []
        self._of_gid: dict[int, int] = {}
        self._of_key: dict[tuple, int] = {}

    def id_of(self, gid: int) -> int:
        sid = self._of_gid.get(gid)
        if sid is not None:
            return sid
        g = self.programs.groups[gid]
        if self.programs.classes is None:
            sid, ranks = len(self.members), g.ranks
        else:
            rep = self.rep
            ranks = tuple(sorted({rep[m] for m in g.ranks}))
            key = (g.family, ranks)
            sid = self._of_key.get(key)
            if sid is None:
                sid = self._of_key[key] = len(self.members)
            else:
                self._of_gid[gid] = sid
                return sid
        self.members.append(ranks)
        self.family.append(g.family)
        self.group.append(gid)
        self._of_gid[gid] = sid
        return sid


_INF = float("inf")
_NUM = (int, float)
_SIMPLE_KINDS = frozenset((COMPUTE, SEND, RECV))
_COLLECTIVE_SET = frozenset(COLLECTIVE_KINDS)


def _check_op(rank: int, i: int, op) -> None:
    """An op's own fields: kind, collective kind, cost inputs, duration, memory events."""
    if not isinstance(op, Op):
        raise ProgramError(f"rank {rank}: a program must be a list of Op objects")
    if op.kind not in OP_KINDS:
        raise ProgramError(f"rank {rank} op {i} {op!r}: unknown kind {op.kind!r}")
    if not isinstance(op.stream, str):
        raise ProgramError(f"rank {rank} op {i} {op!r}: stream must be a name (str), got {op.stream!r}")
    if op.kind == COLLECTIVE and op.collective not in COLLECTIVE_KINDS:
        raise ProgramError(f"rank {rank} op {i} {op!r}: unknown collective {op.collective!r}; "
                           f"known: {', '.join(COLLECTIVE_KINDS)}")
    for v in (op.flops, op.mem_bytes, op.size_bytes):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v >= 0.0) or v == _INF:
            raise ProgramError(f"rank {rank} op {i} {op!r}: cost inputs must be finite and >= 0")
    if op.duration_s is not None and not (0.0 <= op.duration_s < _INF):
        raise ProgramError(f"rank {rank} op {i} {op!r}: duration_s must be finite and >= 0")
    for pairs in (op.alloc, op.free):
        if not isinstance(pairs, tuple) or not all(
                isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str)
                and isinstance(x[1], (int, float)) and x[1] >= 0 for x in pairs):
            raise ProgramError(f"rank {rank} op {i} {op!r}: alloc/free must be ((category, bytes >= 0), ...)")


def _check_rank_graph(rank: int, prog: list[Op]) -> None:
    """Deps name other ops of the rank and stream order plus deps is acyclic. When every dep points to an
    earlier op (what generators write) the graph is acyclic by construction: a linear scan suffices."""
    n = len(prog)
    forward = True
    for i, op in enumerate(prog):
        if type(op) is not Op and not isinstance(op, Op):
            raise ProgramError(f"rank {rank}: a program must be a list of Op objects")
        for d in op.deps:
            if type(d) is not int or not (0 <= d < i):
                forward = False
                break
        if not forward:
            break
    if forward:
        return

    indeg = [0] * n
    succ: list[list[int]] = [[] for _ in range(n)]
    last_in_stream: dict[str, int] = {}
    for i, op in enumerate(prog):
        prev = last_in_stream.get(op.stream)
        if prev is not None:
            succ[prev].append(i)
            indeg[i] += 1
        last_in_stream[op.stream] = i
        for d in op.deps:
            if not isinstance(d, int) or not (0 <= d < n) or d == i:
                raise ProgramError(f"rank {rank} op {i} {op!r}: dependency {d!r} does not name another op of "
                                   f"this rank (0..{n - 1})")
            succ[d].append(i)
            indeg[i] += 1
    ready = [i for i in range(n) if indeg[i] == 0]
    seen = 0
    while ready:
        i = ready.pop()
        seen += 1
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    if seen != n:
        cyc = [i for i in range(n) if indeg[i] > 0][:5]
        raise ProgramError(f"rank {rank}: cyclic dependencies among ops {cyc} "
                           f"({', '.join(repr(prog[i]) for i in cyc[:3])}) (stream order plus deps)")


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def _short(ranks, limit: int = 12) -> str:
    ranks = list(ranks)
    s = ", ".join(str(r) for r in ranks[:limit])
    return f"[{s}{', ...' if len(ranks) > limit else ''}]"
