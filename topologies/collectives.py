"""Collective algorithms on a cluster graph: each one is a list of *phases* of point-to-point flows.

An algorithm turns (group of GPUs, kind, size S) into phases; a phase is a set of flows
(src node, dst node, bytes per byte of S) that run concurrently plus the number of latency steps it
takes. Flows are routed (``Cluster.route``) and their bytes summed per directed link, so a phase of size S
costs

    steps · alpha  +  S · max over links (coefficient_l / effective capacity_l)

and the algorithm costs ``call_overhead + sum over phases`` = ``A + S·K`` (linear in S, which is what lets
group costs be cached per group and reused for every size). ``alpha`` of a phase is the slowest of its
flows' paths: link latencies along the path plus the collective library's per-step latency for the
slowest link type on it. Effective capacity = link capacity × protocol efficiency of its type.

Registry ``ALGORITHMS``: name -> builder(ctx, gpus, kind) returning phases or None (not applicable).
Closed forms (n ranks, per-direction link bandwidth B, alpha a):
  ring all_reduce            2(n-1)·a + 2(n-1)/n · S/B
  ring all_gather/red_scat   (n-1)·a + (n-1)/n · S/B
  rings (k: sparsest domain) 2(n-1)·a + 2(n-1)/n · S / min(B_in, k·B_out)   (all_reduce; NCCL channels)
  hierarchical all_reduce    RS in each domain (k GPUs), k concurrent all-reduces of S/k across the m
                             domains, AG in each domain: 2(k-1)·a_in + 2(k-1)/k·S/B_in
                             + 2(m-1)·a_out + 2(m-1)/m·(S/k)/B_out
  torus all_reduce           per dimension of size L (bidirectional rings), reduce-scatter then all-gather:
                             sum_d 2·[(L_d-1)·a + (L_d-1)/L_d · S_d/(2B)],  S_d = S / prod of earlier L
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

# NCCL's "bus bandwidth" kinds
KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce", "barrier", "p2p")


@dataclass(frozen=True)
class Phase:
    """Concurrent flows (src node, dst node, bytes per byte of the collective's size) and latency steps."""

    flows: tuple
    steps: int


def _ring_flows(order, coef):
    n = len(order)
    return tuple((order[i], order[(i + 1) % n], coef) for i in range(n))


# ---------------------------------------------------------------------------------------------- algorithms
def ring(ctx, gpus, kind):
    """One ring in group order (NCCL ring; broadcast/reduce as a pipelined chain)."""
    n = len(gpus)
    if kind in ("all_reduce", "barrier"):
        return [Phase(_ring_flows(gpus, 2 * (n - 1) / n), 2 * (n - 1))]
    if kind in ("all_gather", "reduce_scatter"):
        return [Phase(_ring_flows(gpus, (n - 1) / n), n - 1)]
    if kind == "broadcast":
        return [Phase(tuple((gpus[i], gpus[i + 1], 1.0) for i in range(n - 1)), n - 1)]
    if kind == "reduce":
        return [Phase(tuple((gpus[i + 1], gpus[i], 1.0) for i in range(n - 1)), n - 1)]
    return None


def _heap_tree_edges(order):
    """(child, parent) pairs of the binary heap tree over ``order`` (parent of i is (i-1)//2)."""
    return [(order[i], order[(i - 1) // 2]) for i in range(1, len(order))]


def tree(ctx, gpus, kind):
    """NCCL double binary tree: two complementary binary trees (the second over the reversed order, so
    most leaves of one are inner nodes of the other), each reducing then broadcasting half the data."""
    n = len(gpus)
    if kind not in ("all_reduce", "barrier") or n < 3:
        return None
    flows = []
    for order in (list(gpus), list(reversed(gpus))):
        for c, p in _heap_tree_edges(order):
            flows.append((c, p, 0.5))
            flows.append((p, c, 0.5))
    depth = math.ceil(math.log2(n + 1)) - 1
    return [Phase(tuple(flows), 2 * max(depth, 1))]


def _by_domain(ctx, gpus):
    doms: dict[int, list] = {}
    for gpu in gpus:
        doms.setdefault(gpu // ctx.domain_size, []).append(gpu)
    return list(doms.values())


def _domains(ctx, gpus, kind):
    """The group's members by scale-up domain when a two-level algorithm applies to ``kind``: >= 2 domains
    with >= 2 members each (not necessarily as many: NCCL runs as many channels as the sparsest domain
    holds); else None."""
    if kind not in ("all_reduce", "all_gather", "reduce_scatter", "barrier"):
        return None
    doms = _by_domain(ctx, gpus)
    if len(doms) < 2 or min(map(len, doms)) < 2:
        return None
    return doms


def hierarchical(ctx, gpus, kind):
    """Reduce-scatter inside each scale-up domain, all-reduce across domains (one ring per local index of
    the sparsest domain's k, S/k each, all concurrent), all-gather inside. Needs >= 2 domains with >= 2
    members each."""
    doms = _domains(ctx, gpus, kind)
    if doms is None:
        return None
    m, k = len(doms), min(map(len, doms))
    steps = max(map(len, doms)) - 1
    intra_rs = Phase(tuple(f for d in doms for f in _ring_flows(d, (len(d) - 1) / len(d))), steps)
    intra_ag = intra_rs
    if kind in ("all_reduce", "barrier"):
        inter = Phase(tuple(f for j in range(k) for f in _ring_flows([d[j] for d in doms], 2 * (m - 1) / m / k)),
                      2 * (m - 1))
        return [intra_rs, inter, intra_ag]
    inter = Phase(tuple(f for j in range(k) for f in _ring_flows([d[j] for d in doms], (m - 1) / m / k)), m - 1)
    if kind == "all_gather":
        return [inter, intra_ag]
    return [intra_rs, inter]


def rings(ctx, gpus, kind):
    """NCCL's multi-node rings: one ring (channel) per local GPU of the sparsest domain (k members), each
    carrying 1/k of the data and leaving every domain through its own NIC rail. Ring c visits each domain's
    members starting at the c-th, and its last member hands the data over NVLink to the c-th (PXN) whose
    NIC sends it to the next domain's c-th member. Needs >= 2 domains with >= 2 members each."""
    doms = _domains(ctx, gpus, kind)
    if doms is None:
        return None
    m, k = len(doms), min(map(len, doms))
    n = len(gpus)
    coef = (2 * (n - 1) / n if kind in ("all_reduce", "barrier") else (n - 1) / n) / k
    flows = []
    for c in range(k):
        for i, d in enumerate(doms):
            order = d[c:] + d[:c]
            flows += [(order[j], order[j + 1], coef) for j in range(len(d) - 1)]
            flows.append((order[-1], d[c], coef))                       # PXN: over NVLink to the rail-c GPU
            flows.append((d[c], doms[(i + 1) % m][c], coef))            # rail c to the next domain
    steps = 2 * (n - 1) if kind in ("all_reduce", "barrier") else n - 1
    return [Phase(tuple(flows), steps)]


def nvls(ctx, gpus, kind):
    """In-switch reduction (NVLink SHARP / NVLS): every GPU sends its buffer to the switch once and
    receives the reduced (or multicast) result. Only inside one domain whose switch can reduce."""
    doms = {g // ctx.domain_size for g in gpus}
    n = len(gpus)
    if len(doms) != 1 or n < 2 or not ctx.has_sharp(next(iter(doms))):
        return None
    sw = ctx.domain_switch(next(iter(doms)))
    if kind in ("all_reduce", "barrier"):
        up, down = 1.0, 1.0
    elif kind == "all_gather":
        up, down = 1.0 / n, (n - 1) / n
    elif kind == "reduce_scatter":
        up, down = (n - 1) / n, 1.0 / n
    else:
        return None
    flows = tuple(f for g in gpus for f in ((g, sw, up), (sw, g, down)))
    return [Phase(flows, 2)]


def direct(ctx, gpus, kind):
    """Every rank exchanges directly with every other (all-to-all; or reduce-scatter / all-gather as one
    direct exchange each, which switched all-to-all fabrics and optical meshes favour)."""
    n = len(gpus)
    per = {"all_to_all": 1.0 / n, "all_gather": 1.0 / n, "reduce_scatter": 1.0 / n}.get(kind)
    if kind in ("all_reduce", "barrier"):
        flows = tuple((a, b, 1.0 / n) for a in gpus for b in gpus if a != b)
        return [Phase(flows, 1), Phase(flows, 1)]
    if per is None:
        return None
    return [Phase(tuple((a, b, per) for a in gpus for b in gpus if a != b), 1 if kind != "all_to_all" else n - 1)]


def torus_rings(ctx, gpus, kind):
    """Dimension-ordered bidirectional rings on a torus domain: reduce-scatter along each dimension in
    turn (half the data each way round), then all-gather back in reverse order. Needs the group to be a
    full Cartesian product of coordinates inside one torus domain."""
    if ctx.domain_spec.kind != "torus" or kind not in ("all_reduce", "all_gather", "reduce_scatter", "barrier"):
        return None
    if len({g // ctx.domain_size for g in gpus}) != 1:
        return None
    coords = {g: ctx.graph.nodes[g]["coord"] for g in gpus}
    ndim = len(next(iter(coords.values())))
    values = [sorted({c[d] for c in coords.values()}) for d in range(ndim)]
    if math.prod(len(v) for v in values) != len(gpus):
        return None
    at = {c: g for g, c in coords.items()}
    dims = [d for d in range(ndim) if len(values[d]) > 1]
    if not dims:
        return None

    def lines(d):
        others = [values[e] if e != d else [None] for e in range(ndim)]
        for base in itertools.product(*others):
            yield [at[tuple(v if e == d else base[e] for e in range(ndim))] for v in values[d]]

    def ring_phase(d, coef):
        L = len(values[d])
        fl = []
        for line in lines(d):
            if L == 2:
                fl += [(line[0], line[1], (L - 1) / L * coef), (line[1], line[0], (L - 1) / L * coef)]
                continue
            for i in range(L):
                fl.append((line[i], line[(i + 1) % L], (L - 1) / L * coef / 2))
                fl.append((line[(i + 1) % L], line[i], (L - 1) / L * coef / 2))
        return Phase(tuple(fl), L - 1)

    rs, size = [], 1.0
    for d in dims:                       # reduce-scatter: data shrinks by L per dimension
        rs.append(ring_phase(d, size))
        size /= len(values[d])
    if kind == "reduce_scatter":
        return rs
    ag = list(reversed(rs))              # all-gather mirrors it
    if kind == "all_gather":
        return ag
    return rs + ag


def p2p(ctx, gpus, kind):
    if kind != "p2p":
        return None
    return [Phase(((gpus[0], gpus[1], 1.0),), 1)]


ALGORITHMS = {"ring": ring, "rings": rings, "tree": tree, "hierarchical": hierarchical, "nvls": nvls,
              "direct": direct,
              "torus": torus_rings, "p2p": p2p}
# algorithms NCCL-like auto selection considers, per kind ("direct" all-gather/reduce-scatter only on
# switched all-to-all or optical domains, see topologies.cost)
AUTO = {
    "all_reduce": ("ring", "rings", "tree", "hierarchical", "nvls", "torus"),
    "barrier": ("ring", "tree", "nvls", "torus"),
    "all_gather": ("ring", "rings", "hierarchical", "nvls", "torus"),
    "reduce_scatter": ("ring", "rings", "hierarchical", "nvls", "torus"),
    "all_to_all": ("direct",),
    "broadcast": ("ring",),
    "reduce": ("ring",),
    "p2p": ("p2p",),
}
