"""Graph builders: scale-up domains and scale-out fabrics as ``networkx`` graphs.

Nodes: GPUs are integers (global device index); switches are tuples (``("nvswitch", i)``,
``("leaf", i)``, ``("spine", pod, j)``, ``("core", plane, k)`` ...). Every node has a ``kind``
attribute (``gpu``, ``nvswitch``, ``pcie``, ``ub``, ``leaf``, ``spine``, ``core``); switches that can
reduce in the switch (NVLink SHARP) carry ``sharp=True``. Every edge carries ``bandwidth`` (bytes/s per
direction), ``latency`` (s) and ``type`` (``nvlink``, ``pcie``, ``ib``, ``ethernet``, ``ici``, ``ub``).

Each builder takes an optional ``graph`` to add into (large clusters are built in place) and returns it.
Structural metadata routing needs is kept in ``graph.graph`` (e.g. ``graph.graph["fat_tree"]``).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from simulator.errors import TopologyError

if TYPE_CHECKING:
    import networkx as nx

# Per-hop link latencies (s). Order-of-magnitude wire+switch figures: NVSwitch and InfiniBand switch
# port-to-port latencies are a few hundred ns (NVIDIA quotes < 1 us for both); commodity Ethernet
# switches ~1 us; TPU ICI and Huawei UB hops are taken as NVLink-like. The per-step software latency
# of the collective library (topologies.collectives) dominates these; calibrate for precise figures.
HOP_LATENCY_S = {"nvlink": 0.3e-6, "pcie": 0.5e-6, "ib": 0.3e-6, "ethernet": 1.0e-6, "ici": 0.5e-6, "ub": 0.3e-6}


#: link bandwidths a cluster may have (bytes/s): 1 MB/s to 1 PB/s; outside them a value is a typo (1e-300 B/s
#: made a 9e305 s step and printed inf), not a link
MIN_LINK_BPS, MAX_LINK_BPS = 1e6, 1e15


def _check_bw(what: str, bw: float) -> float:
    if not (isinstance(bw, (int, float)) and not isinstance(bw, bool) and bw > 0 and math.isfinite(bw)):
        raise TopologyError(f"{what}: bandwidth must be a positive number of bytes/s, got {bw!r}")
    if not MIN_LINK_BPS <= bw <= MAX_LINK_BPS:
        raise TopologyError(f"{what}: bandwidth {bw:g} B/s is outside {MIN_LINK_BPS:g}-{MAX_LINK_BPS:g} B/s "
                            f"(1 MB/s to 1 PB/s; bandwidths are bytes per second, e.g. 50e9 for 400 Gb/s)")
    return float(bw)


def _graph(graph):
    if graph is None:
        import networkx as nx
        return nx.Graph()
    return graph


def _add_gpu(g: nx.Graph, gpu: int, **attrs) -> None:
    g.add_node(gpu, kind="gpu", **attrs)


def star_domain(gpus: int, bandwidth: float, *, switch_kind: str, link_type: str, index: int = 0,
                first_gpu: int = 0, sharp: bool = False, latency: float | None = None, graph=None) -> nx.Graph:
    """GPUs ``first_gpu..first_gpu+gpus-1`` each linked to one logical switch (non-blocking crossbar)."""
    g = _graph(graph)
    bw = _check_bw(f"{switch_kind} domain", bandwidth)
    lat = HOP_LATENCY_S[link_type] if latency is None else latency
    sw = (switch_kind, index)
    g.add_node(sw, kind=switch_kind, sharp=bool(sharp))
    for i in range(first_gpu, first_gpu + gpus):
        _add_gpu(g, i)
        g.add_edge(i, sw, bandwidth=bw, latency=lat, type=link_type)
    return g


def nvswitch_node(gpus: int = 8, bandwidth: float = 450e9, *, index: int = 0, first_gpu: int = 0,
                  sharp: bool = True, latency: float | None = None, graph=None) -> nx.Graph:
    """DGX/HGX H100/H200 baseboard: 8 GPUs on NVLink 4 through NVSwitch (4 chips drawn as one logical
    switch), 450 GB/s per direction per GPU; third-generation NVSwitch does in-switch reduction
    (NVLink SHARP). A100 (NVLink 3, 300 GB/s, no SHARP): ``bandwidth=300e9, sharp=False``."""
    return star_domain(gpus, bandwidth, switch_kind="nvswitch", link_type="nvlink", index=index,
                       first_gpu=first_gpu, sharp=sharp, latency=latency, graph=graph)


def nvl72(gpus: int = 72, bandwidth: float = 900e9, *, index: int = 0, first_gpu: int = 0,
          latency: float | None = None, graph=None) -> nx.Graph:
    """GB200 NVL72 rack: 72 Blackwell GPUs all-to-all over NVLink 5 through 18 NVSwitch chips (one logical
    switch here), 900 GB/s per direction per GPU, NVLink SHARP in the switches."""
    return star_domain(gpus, bandwidth, switch_kind="nvswitch", link_type="nvlink", index=index,
                       first_gpu=first_gpu, sharp=True, latency=latency, graph=graph)


def pcie_node(gpus: int = 4, bandwidth: float = 32e9, *, index: int = 0, first_gpu: int = 0,
              latency: float | None = None, graph=None) -> nx.Graph:
    """A commodity box: GPUs behind one PCIe switch / root complex (Gen4 x16: 32 GB/s per direction)."""
    return star_domain(gpus, bandwidth, switch_kind="pcie", link_type="pcie", index=index,
                       first_gpu=first_gpu, latency=latency, graph=graph)


def torus(dims: tuple[int, ...], link_bandwidth: float, *, wrap: bool = True, first_gpu: int = 0,
          latency: float | None = None, link_type: str = "ici", graph=None) -> nx.Graph:
    """2D/3D torus (TPU v4/v5p style): chip at coordinate c links to c±1 along every dimension, with
    wrap-around when ``wrap`` (dimensions of size <= 2 get no extra wrap link). Chips are numbered
    row-major (last dimension fastest) from ``first_gpu``; each has a ``coord`` attribute."""
    g = _graph(graph)
    dims = tuple(int(d) for d in dims)
    if len(dims) not in (2, 3) or any(d < 1 for d in dims):
        raise TopologyError(f"torus: dims must be 2 or 3 positive sizes, got {dims}")
    bw = _check_bw("torus link", link_bandwidth)
    lat = HOP_LATENCY_S[link_type] if latency is None else latency
    strides = [math.prod(dims[i + 1:]) for i in range(len(dims))]
    for coord in itertools.product(*(range(d) for d in dims)):
        gid = first_gpu + sum(c * s for c, s in zip(coord, strides))
        _add_gpu(g, gid, coord=coord)
    for coord in itertools.product(*(range(d) for d in dims)):
        gid = first_gpu + sum(c * s for c, s in zip(coord, strides))
        for k, d in enumerate(dims):
            if d == 1:
                continue
            nxt = coord[k] + 1
            if nxt == d:
                if not wrap or d <= 2:
                    continue
                nxt = 0
            other = gid + (nxt - coord[k]) * strides[k]
            g.add_edge(gid, other, bandwidth=bw, latency=lat, type=link_type)
    g.graph.setdefault("tori", []).append({"dims": dims, "wrap": wrap, "first_gpu": first_gpu})
    return g


def optical_mesh(chips: int, chip_bandwidth: float, *, direct: bool = False, slice_size: int | None = None,
                 first_gpu: int = 0, index: int = 0, link_type: str = "ub", latency: float | None = None,
                 graph=None) -> nx.Graph:
    """All-to-all among ``chips``, cut into OCS-style slices of ``slice_size`` (default: one slice).

    ``direct=False`` (CloudMatrix-384 style): each slice is a non-blocking switched fabric (Huawei's two
    UB switch tiers drawn as one logical switch per slice); every chip gets ``chip_bandwidth`` to it.
    ``direct=True``: a full mesh of point-to-point circuits inside each slice, each of
    ``chip_bandwidth / (slice_size - 1)`` (the chip's optical ports split evenly among its peers)."""
    g = _graph(graph)
    bw = _check_bw("optical mesh", chip_bandwidth)
    size = chips if slice_size is None else int(slice_size)
    if size < 1 or chips % size:
        raise TopologyError(f"optical_mesh: {chips} chips do not split into slices of {size}")
    lat = HOP_LATENCY_S[link_type] if latency is None else latency
    for s in range(chips // size):
        lo = first_gpu + s * size
        if not direct:
            star_domain(size, bw, switch_kind=link_type, link_type=link_type, index=index + s, first_gpu=lo,
                        latency=lat, graph=g)
            continue
        for i in range(lo, lo + size):
            _add_gpu(g, i)
        if size > 1:
            per = bw / (size - 1)
            for i in range(lo, lo + size):
                for j in range(i + 1, lo + size):
                    g.add_edge(i, j, bandwidth=per, latency=lat, type=link_type)
    return g


@dataclass
class FatTreeInfo:
    """What routing needs to know about a fat tree beyond the graph.

    leaf_of     endpoint node -> leaf index;  pod_of_leaf  leaf -> pod;  uplinks  spines per pod
    cores_per_plane  cores each spine links to (0 when there is one pod and no core tier).
    """

    leaf_of: dict
    pod_of_leaf: list
    uplinks: int
    cores_per_plane: int
    link_type: str
    bandwidth: float
    latency: float
    rail_optimised: bool
    oversubscription: float
    tiers: int
    leaf_down: int
    endpoints: list = field(default_factory=list)

    @property
    def n_leaves(self) -> int:
        return len(self.pod_of_leaf)

    @property
    def n_pods(self) -> int:
        return max(self.pod_of_leaf) + 1 if self.pod_of_leaf else 0


def fat_tree(endpoints, nic_bandwidth: float = 50e9, *, tiers: int = 2, leaf_down: int = 32,
             oversubscription: float = 1.0, rail_optimised: bool = False, link_type: str = "ib",
             latency: float | None = None, graph=None) -> nx.Graph:
    """A 2- or 3-tier Clos fabric over ``endpoints``: an int (that many hosts, one NIC each, named
    ``("host", i)``) or a list of ``(node, rail)`` pairs (the node that owns the NIC and its rail).

    Leaves have ``leaf_down`` host ports and ``leaf_down / oversubscription`` uplinks, one to each spine of
    their pod (oversubscription is applied at the leaf tier only). Rail-optimised (the NVIDIA DGX SuperPOD
    reference architecture, RA-11126 for DGX A100 and RA-11333 for DGX H100): a scalable unit is
    ``leaf_down`` consecutive hosts, and its rail-i leaf holds NIC i of each of them ("each group of 32
    nodes is rail-aligned", RA-11333 compute fabric); the spine tier is split into one spine group per rail
    (RA-11126: 8 spine groups above 7 scalable units, cores above them), so a pod holds leaves of one rail
    only, ``leaf_down`` of them at most, and every rail has the same structure. Otherwise NICs fill leaves
    in host order and pods are ``leaf_down`` consecutive leaves. 2 tiers, or leaves that fit under one
    pod's spines: one pod (all leaves under the same spines, at most 2·leaf_down leaves). 3 tiers: spine j
    of every pod links to the ``leaf_down`` cores of plane j (non-blocking above the leaves). Links are
    400 Gb/s by default."""
    g = _graph(graph)
    if isinstance(endpoints, int):
        for n in range(endpoints):
            g.add_node(("host", n), kind="host")
    info, order = fat_tree_layout(endpoints, nic_bandwidth, tiers=tiers, leaf_down=leaf_down,
                                  oversubscription=oversubscription, rail_optimised=rail_optimised,
                                  link_type=link_type, latency=latency)
    leaf_of, pod_of_leaf, n_leaves = info.leaf_of, info.pod_of_leaf, info.n_leaves
    bw, lat, uplinks, cores = info.bandwidth, info.latency, info.uplinks, info.cores_per_plane
    for leaf in range(n_leaves):
        g.add_node(("leaf", leaf), kind="leaf", pod=pod_of_leaf[leaf])
    for n, _ in order:
        g.add_edge(n, ("leaf", leaf_of[n]), bandwidth=bw, latency=lat, type=link_type)
    n_pods = (max(pod_of_leaf) + 1) if pod_of_leaf else 0
    if n_leaves > 1:
        for leaf in range(n_leaves):
            p = pod_of_leaf[leaf]
            for j in range(uplinks):
                g.add_node(("spine", p, j), kind="spine", pod=p)
                g.add_edge(("leaf", leaf), ("spine", p, j), bandwidth=bw, latency=lat, type=link_type)
        for p in range(n_pods if cores else 0):
            for j in range(uplinks):
                for c in range(cores):
                    g.add_node(("core", j, c), kind="core")
                    g.add_edge(("spine", p, j), ("core", j, c), bandwidth=bw, latency=lat, type=link_type)
    g.graph["fat_tree"] = info
    return g


def fat_tree_layout(endpoints, nic_bandwidth: float = 50e9, *, tiers: int = 2, leaf_down: int = 32,
                    oversubscription: float = 1.0, rail_optimised: bool = False, link_type: str = "ib",
                    latency: float | None = None) -> tuple[FatTreeInfo, list]:
    """What ``fat_tree`` builds, without a graph: (its FatTreeInfo, the endpoints in the order their leaf
    links are added). Raises the same errors."""
    bw = _check_bw("fat tree link", nic_bandwidth)
    lat = HOP_LATENCY_S[link_type] if latency is None else latency
    if isinstance(endpoints, int):
        eps = [(("host", i), 0) for i in range(endpoints)]
    else:
        eps = list(endpoints)
    if tiers not in (2, 3):
        raise TopologyError(f"fat_tree: tiers must be 2 or 3, got {tiers}")
    if leaf_down < 1:
        raise TopologyError(f"fat_tree: leaf_down must be >= 1, got {leaf_down}")
    if not oversubscription >= 1:
        raise TopologyError(f"fat_tree: oversubscription must be >= 1 (down:up), got {oversubscription}")
    uplinks = leaf_down / oversubscription
    if abs(uplinks - round(uplinks)) > 1e-9 or round(uplinks) < 1:
        raise TopologyError(f"fat_tree: leaf_down={leaf_down} / oversubscription={oversubscription} must be a "
                            f"whole number of uplinks >= 1")
    uplinks = int(round(uplinks))
    # assign endpoints to leaves
    if rail_optimised:
        by_rail: dict = {}
        for e in eps:
            by_rail.setdefault(e[1], []).append(e)
        rails = sorted(by_rail)
        order = [e for r in rails for e in by_rail[r]]
        leaf_of, n_leaves, rail_pods = {}, 0, []
        for r in rails:
            members = [n for n, _ in by_rail[r]]
            for k, n in enumerate(members):
                leaf_of[n] = n_leaves + k // leaf_down
            count = -(-len(members) // leaf_down)
            rail_pods += [(r, k // leaf_down) for k in range(count)]   # (rail, pod within the rail) per leaf
            n_leaves += count
    else:
        order = eps
        leaf_of = {n: k // leaf_down for k, (n, _) in enumerate(eps)}
        n_leaves = -(-len(eps) // leaf_down)
        rail_pods = [(0, leaf // leaf_down) for leaf in range(n_leaves)]
    radix = 2 * leaf_down
    if tiers == 2 or n_leaves <= leaf_down:
        if n_leaves > radix:
            raise TopologyError(f"fat_tree: {len(eps)} NICs need {n_leaves} leaves, more than a 2-tier tree of "
                                f"radix-{radix} spines holds ({radix} leaves); use tiers: 3")
        pod_of_leaf = [0] * n_leaves
        cores = 0
    else:
        pod_of_leaf, base = [], 0          # number the pods: a new one where the (rail, chunk) changes
        for leaf, p in enumerate(rail_pods):
            if leaf and p != rail_pods[leaf - 1]:
                base += 1
            pod_of_leaf.append(base)
        n_pods = base + 1
        if n_pods > radix:
            raise TopologyError(f"fat_tree: {len(eps)} NICs need {n_pods} pods, more than a 3-tier tree of "
                                f"radix-{radix} switches holds ({radix} pods = {radix * leaf_down * leaf_down} NICs)")
        cores = leaf_down
    n_pods = (max(pod_of_leaf) + 1) if pod_of_leaf else 0
    info = FatTreeInfo(leaf_of, pod_of_leaf, uplinks if n_leaves > 1 else 0, cores if n_pods > 1 else 0,
                       link_type, bw, lat, bool(rail_optimised), float(oversubscription), tiers, leaf_down,
                       [n for n, _ in eps])
    return info, order


def validate_graph(g: nx.Graph, where: str = "topology") -> None:
    """Every edge has a positive bandwidth and non-negative latency; the graph is connected."""
    import networkx as nx
    for u, v, d in g.edges(data=True):
        bw = d.get("bandwidth")
        if not (isinstance(bw, (int, float)) and bw > 0 and math.isfinite(bw)):
            raise TopologyError(f"{where}: link {u}-{v} has non-positive or missing bandwidth {bw!r} "
                                f"(bytes/s per direction)")
        if not d.get("latency", 0) >= 0:
            raise TopologyError(f"{where}: link {u}-{v} has negative latency {d.get('latency')!r}")
    if g.number_of_nodes() and not nx.is_connected(g):
        comps = sorted(nx.connected_components(g), key=len)
        small = sorted(comps[0], key=str)[:5]
        raise TopologyError(f"{where}: graph is disconnected ({len(comps)} components; e.g. {small} cannot reach "
                            f"the rest); connect every domain to the fabric")
