"""Is symmetric mode valid? Ranks a representative stands for must sit on identical hardware and see
identical communication costs; otherwise the fanned-out result would differ from a full simulation.

The check compares, for every class: the device of each member (``cost.device_key``), and for each process
group a representative uses, the contention-free time of a probe collective on every image group of the
same family (sampled evenly when a family has very many groups, at most ``max_images`` per group).
"""
from __future__ import annotations

from simulator.costs import CommRequest
from simulator.program import COLLECTIVE, RECV, SEND, Programs

PROBE_BYTES = (4096.0, 64e6)


def symmetry_problem(programs: Programs, cost, max_images: int = 256) -> str | None:
    """None if symmetric mode is valid for ``programs`` on ``cost``'s hardware, else why not."""
    if programs.classes is None:
        return None
    for rep, members in programs.classes.items():
        key = cost.device_key(rep)
        for m in _sample(members, max_images * 4):
            if cost.device_key(m) != key:
                return f"rank {m} runs on different hardware than rank {rep}, which stands for it"
    checked: set[int] = set()
    for rep, prog in programs.ops.items():
        for op in prog:
            gid = op.group
            if gid is None or gid in checked:
                continue
            checked.add(gid)
            g = programs.groups[gid]
            kind = op.collective if op.kind == COLLECTIVE else None
            images = {programs.group_of(m, g.family) for m in _sample(programs.classes[rep], max_images)}
            images.discard(None)
            if op.kind in (SEND, RECV):
                i_self, i_peer = g.ranks.index(rep), g.ranks.index(op.peer) if op.peer in g.ranks else None
                if i_peer is None:
                    continue
                for size in PROBE_BYTES:
                    ref = cost.comm_time_s(CommRequest("p2p", (rep, op.peer), size))
                    for og in images:
                        r = programs.groups[og].ranks
                        t = cost.comm_time_s(CommRequest("p2p", (r[i_self], r[i_peer]), size))
                        if not _close(t, ref):
                            return (f"point-to-point {rep}->{op.peer} costs {ref:.3g}s but its image "
                                    f"{r[i_self]}->{r[i_peer]} costs {t:.3g}s")
                continue
            if kind is None:
                continue
            for size in PROBE_BYTES:
                ref = cost.comm_time_s(CommRequest(kind, g.ranks, size))
                for og in images:
                    t = cost.comm_time_s(CommRequest(kind, programs.groups[og].ranks, size))
                    if not _close(t, ref):
                        return (f"{kind} on {g.family} group {list(g.ranks[:8])} costs {ref:.3g}s but the same on "
                                f"{list(programs.groups[og].ranks[:8])} costs {t:.3g}s (placement differs)")
    return None


def _sample(seq, k: int):
    seq = list(seq)
    if len(seq) <= k:
        return seq
    step = len(seq) / k
    return [seq[int(i * step)] for i in range(k)]


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-30)
