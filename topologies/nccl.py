"""NCCL's cost model: algorithm and protocol choice and time of a collective, as NCCL's tuner computes them.

A group of GPUs is seen as NCCL sees a communicator (``Comm``): ranks, nodes (scale-up domains: an NVLink
domain, also a multi-node NVLink rack, is one NCCL node), ranks per node, GPU architecture, intra-node link
(NVLink or PCI) and its bandwidth in NCCL's units, NICs per node and their line rate, NVLink SHARP.
``graphs`` reproduces what NCCL's topology search settles on for it (channels and per-channel speed of the
ring, tree and NVLS graphs: search.cc), ``table`` the latency and bandwidth of every (algorithm, protocol)
of ncclTopoTuneModel (tuning.cc), ``choose`` the tuner's pick (lowest estimated time) or a forced one.
The time we predict is NCCL's estimate ``latency + bytes / bandwidth`` with the bandwidth scaled by the
channels NCCL actually launches for that size (enqueue.cc: fewer channels below ``channels × threads ×
bytes-per-thread``), plus what that estimate leaves out where the kernel is a pipeline NCCL's model does not
see: one-node NVLS all-reduce's fill and drain (``pipeline_fill_s``; the tuner still ranks by NCCL's own
estimate). All constants: topologies.nccl_constants (NCCL source, cited there).

All-to-all is NCCL's grouped send/recv (every peer pair concurrently; inter-node bytes through the NICs,
with PXN every local GPU reaches every rail), point-to-point one send/recv (LL up to 16 KiB, Simple above).
Sizes follow nccl-tests: all-gather / reduce-scatter sizes are the full (gathered) buffer.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from functools import lru_cache

from topologies import nccl_constants as C

PROTO_INDEX = {p: i for i, p in enumerate(C.PROTOCOLS)}
# names accepted for --algorithm / --protocol (NCCL_ALGO / NCCL_PROTO spellings included)
ALGO_ALIASES = {"ring": "ring", "tree": "tree", "nvls": "nvls", "nvlstree": "nvls_tree", "nvls_tree": "nvls_tree",
                "pat": "pat", "collnetdirect": "collnet_direct", "collnet_direct": "collnet_direct",
                "collnetchain": "collnet_chain", "collnet_chain": "collnet_chain"}
PROTO_ALIASES = {"ll": "ll", "ll128": "ll128", "simple": "simple"}
NCCL_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")

# GPU architecture (NCCL's compute-capability index) and host CPU vendor of each accelerator's reference
# system: DGX A100 has 2x AMD EPYC 7742 (DGX A100 datasheet); DGX H100/H200/B200 Intel Xeon (8480C, 8570;
# DGX user guides); GB200 / GB300 NVL72 Grace (Arm); L40S (SM 8.9) counts as Ampere in NCCL's index (>= 80);
# Blackwell Ultra (SM 10.3) as Blackwell.
ARCH = {"A100-80GB": "ampere", "H100-SXM": "hopper", "H100-HBM2e": "hopper", "H200": "hopper", "B200": "blackwell",
        "GB200": "blackwell", "B300": "blackwell", "GB300": "blackwell", "L40S": "ampere"}
CPU = {"A100-80GB": "amd", "GB200": "arm", "GB300": "arm"}


@dataclass(frozen=True)
class Comm:
    """A communicator as NCCL's tuner sees it. Bandwidths in GB/s (NCCL units), per GPU / per NIC."""

    n_ranks: int
    n_nodes: int
    ppn: int                 # ranks per node (the largest node)
    arch: str
    cpu: str
    intra_hw: str            # "nvlink" or "pci"
    intra_bw: float          # NCCL's bandwidth of a GPU's scale-up link(s), GB/s
    nic_bw: float            # per NIC line rate, GB/s
    nics: int                # NICs the group's ranks on one node can use
    nvls: bool               # NVLink SHARP in the node's switch (Hopper+)
    collnet: bool = False    # in-network reduction in the scale-out fabric (SHARP)
    version: int = 0         # NCCL release whose tuning model applies (21805 = 2.18.5); 0 = the newest
    net_latency_us: float = 0.0   # latency the network plugin reports (ncclNetProperties.latency; 0 for IB)
    # Uneven groups (0: as the fullest node). Every ring and tree channel crosses every node and NCCL keeps
    # the fewest channels any node's search found (init.cc: the minimum over ranks), so the sparsest node's
    # NICs bound them; NVLS has one head per local rank of the sparsest node (nvls.nHeads = minLocalRanks)
    ppn_min: int = 0         # ranks on the sparsest node
    ring_nics: int = 0       # NICs of the sparsest node

    @property
    def channel_nics(self) -> int:
        return self.ring_nics or self.nics

    @property
    def ppn_sparsest(self) -> int:
        return self.ppn_min or self.ppn


def parse_version(text: str | None) -> int:
    """NCCL release code of a version string ("2.18.5", "2.27.7 (stated ...)" -> 21805, 22707); 0 (the newest
    model) when none is given or it cannot be read."""
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not m:
        return 0
    major, minor, patch = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
    return major * 10000 + minor * 100 + patch if major == 2 else 0


def _older(comm: "Comm", release: int) -> bool:
    """Whether ``comm`` runs an NCCL release before ``release`` (an unstated version is the newest)."""
    return 0 < comm.version < release


@dataclass(frozen=True)
class Graph:
    channels: int
    bw_intra: float
    bw_inter: float


@dataclass(frozen=True)
class Choice:
    """One (algorithm, protocol) of a collective: NCCL's estimate and the predicted time (seconds)."""

    algorithm: str
    protocol: str
    latency_s: float
    bandwidth_Bps: float     # algorithm bandwidth NCCL's model gives (bytes/s)
    channels: int            # channels launched at this size
    estimate_s: float        # NCCL's own estimate (what the tuner ranks by)
    time_s: float            # predicted time

    @property
    def name(self) -> str:
        return f"{self.algorithm}/{self.protocol}"


def supports(cluster) -> bool:
    """Whether NCCL runs on ``cluster`` (NVIDIA GPUs on NVSwitch / NVL72 / PCIe domains)."""
    return cluster.accelerator.name in ARCH and cluster.domain_spec.kind in ("nvswitch", "nvl72", "pcie")


#: algorithms priced on the cluster's routes (its links and hop latencies) by topologies.cost, not by this model
ROUTE_LEVEL_ALGORITHMS = ("rings", "hierarchical", "direct", "torus")


def latency_setting_note(cluster, algorithm: str | None = None) -> str | None:
    """A note when a cluster sets its own hop latency (``domain.latency``, ``fabric.latency``) where NCCL prices
    the collectives (``algorithm``: the one forced, if any): NCCL's tuning model (tuning.cc) carries its own
    measured latencies, so the setting reaches point-to-point transfers and route-level algorithms only."""
    if not supports(cluster) or algorithm in ROUTE_LEVEL_ALGORITHMS:
        return None
    dom, fab = cluster.domain_spec, cluster.fabric_spec
    given = [f"{name}.latency {lat:.3g} s" for name, lat in
             (("domain", dom.latency), ("fabric", getattr(fab, "latency", None))) if lat is not None]
    if not given:
        return None
    return (f"{' and '.join(given)} per hop price point-to-point transfers and the route-level collective "
            f"algorithms (--algorithm {', '.join(ROUTE_LEVEL_ALGORITHMS)}); NCCL-modelled collectives keep the "
            f"latencies of NCCL's own tuning model (measured on clusters with the default hop latency)")


def group_shape(cluster, gpus) -> tuple[int, int, int, int]:
    """(ranks, nodes, ranks on the fullest node, ranks on the sparsest node) of ``gpus``: all of a group
    NCCL's model depends on."""
    ds = cluster.domain_size
    if len(gpus) == 2:
        same = gpus[0] // ds == gpus[1] // ds
        return (2, 1, 2, 2) if same else (2, 2, 1, 1)
    per_node: dict[int, int] = {}
    for g in gpus:
        d = g // ds
        per_node[d] = per_node.get(d, 0) + 1
    counts = per_node.values()
    return len(gpus), len(per_node), max(counts), min(counts)


def comm_of(cluster, gpus) -> Comm | None:
    """NCCL's view of ``gpus`` on ``cluster``; None where NCCL does not run (TPU ICI, Ascend UB, optical)."""
    return comm_for_shape(cluster, *group_shape(cluster, gpus))


def comm_for_shape(cluster, n_ranks: int, n_nodes: int, ppn: int, ppn_min: int | None = None) -> Comm | None:
    """NCCL's view of a group of ``n_ranks`` over ``n_nodes`` nodes, at most ``ppn`` and at least ``ppn_min``
    (default ``ppn``) on one (see comm_of)."""
    if not supports(cluster):
        return None
    acc = cluster.accelerator
    arch = ARCH[acc.name]
    dom = cluster.domain_spec
    if dom.kind == "pcie":
        intra_hw, intra_bw = "pci", dom.bandwidth / 1e9 * C.PCI_FRACTION
    else:
        intra_hw = "nvlink"
        intra_bw = dom.bandwidth / 1e9 * C.NVLINK_BW_PER_LINK[arch] / C.NVLINK_RAW_PER_LINK[arch]
    fab = cluster.fabric_spec
    if fab is not None:
        nic_bw = fab.bandwidth / 1e9
        # one NIC per GPU (rail; also every GPU of a GB200 NVL72 rack, whose NVLink domain spans 18 trays of
        # 4 GPUs and 4 NICs): the group's GPUs' own NICs. Fewer NICs than GPUs (topologies.cluster allows it
        # only where the node is the domain): the node's NICs, shared by all its GPUs
        rail = fab.nics_per_node >= cluster.gpus_per_node
        nics = ppn if rail else fab.nics_per_node
    else:
        nic_bw, nics, rail = 0.0, 0, False
    uneven = bool(ppn_min) and ppn_min < ppn
    nvls = (bool(dom.sharp) and dom.kind != "pcie" and arch in ("hopper", "blackwell")
            and (ppn_min if uneven else ppn) >= 2)
    return Comm(n_ranks, n_nodes, ppn, arch, CPU.get(acc.name, "intel"), intra_hw, intra_bw, nic_bw,
                max(nics, 1), nvls, collnet=bool(getattr(fab, "sharp", False)),
                ppn_min=ppn_min if uneven else 0, ring_nics=ppn_min if uneven and rail else 0)


# ------------------------------------------------------------------------------------------ graph search
def _speeds(comm: Comm) -> tuple:
    table = C.SPEEDS_INTRA if comm.n_nodes == 1 else C.SPEEDS_INTER
    return table.get(comm.arch, table["default"])


def _ring_channels(comm: Comm, s: float) -> int:
    """Rings at speed s that fit: each ring crosses every GPU's scale-up link once and, across nodes, one
    NIC of every node (a NIC holds floor(nic / s) rings)."""
    n = C.MAX_RING_CHANNELS
    if comm.ppn > 1:
        n = min(n, int(comm.intra_bw // s))
    if comm.n_nodes > 1:
        n = min(n, comm.channel_nics * int(comm.nic_bw // s))
    return n


def _search(comm: Comm, fits) -> tuple[int, float]:
    """NCCL's speed search: from the fastest speed down, keep the best channels x speed; stop once the next
    speed is below 0.49 of the best found (search.cc)."""
    best, best_s = 0, 0.0
    for s in _speeds(comm):
        if best and s / best_s <= C.SEARCH_STEP_RATIO:
            break
        n = fits(s)
        if n >= 1 and n * s > best * best_s:
            best, best_s = n, s
    return best, best_s


def _dup(comm: Comm, n: int, s: float) -> tuple[int, float]:
    """ncclTopoDupChannels: fast channels are split in two (not on Hopper+ below 50 GB/s with > 4)."""
    if s < 25.0 or (comm.arch in ("hopper", "blackwell") and s < 50.0 and n > 4):
        return n, s
    d = min(2 * n, C.MAX_RING_CHANNELS)
    return d, s / math.ceil(d / n)


@lru_cache(maxsize=4096)
def graphs(comm: Comm) -> dict[str, Graph]:
    """Ring, tree and NVLS graphs NCCL's search finds for ``comm`` (cached; do not mutate the result)."""
    n, s = _search(comm, lambda s: _ring_channels(comm, s))
    if n == 0:                      # nothing fits: NCCL falls back to a slow single channel
        n, s = 1, min(_speeds(comm)[-1], comm.intra_bw)
    n, s = _dup(comm, n, s)
    while True:                     # pass 2: raise the speed while the channels still fit
        faster = [x for x in _speeds(comm) if x > s and _ring_channels(comm, x) >= n]
        if not faster:
            break
        s = min(faster)
    out = {"ring": Graph(n, s, s)}
    # tree: as many channels as the ring; with <= 2 nodes the intra-node speed may rise to twice the
    # inter-node one where the scale-up links hold it (search.cc pass 2)
    intra = s
    if comm.n_nodes > 1 and comm.ppn > 1:
        ok = [x for x in _speeds(comm) if x <= 2 * s and n * x <= comm.intra_bw]
        intra = max([s] + ok)
    out["tree"] = Graph(n, intra, s)
    if comm.collnet and comm.n_nodes > 1:
        # CollNet direct: one channel per head GPU with its NIC (at most NCCL_MAX_DIRECT_ARITY + 1 = 8),
        # intra-node speed up to twice the inter-node one where the scale-up links hold it (as trees)
        heads = min(comm.ppn_sparsest, comm.channel_nics, C.COLLNET_MAX_HEADS)
        inter = max([x for x in _speeds(comm) if x <= comm.nic_bw] or [_speeds(comm)[-1]])
        ok = [x for x in _speeds(comm) if x <= 2 * inter and heads * x <= comm.intra_bw]
        out["collnet"] = Graph(heads, max([inter] + ok) if comm.ppn > 1 else inter, inter)
    if comm.nvls:
        # NVLS: one channel per local GPU (head); a head moves 2x its speed on its link, the others 1x
        heads = min(comm.ppn_sparsest, C.NVLS_MAX_ARITY)
        ok = [x for x in _speeds(comm) if (heads + 1) * x <= comm.intra_bw]
        if ok and heads >= 2:
            bw_inter = max([x for x in _speeds(comm) if x <= comm.nic_bw] or [0.0]) if comm.n_nodes > 1 else max(ok)
            nh = min(heads, comm.channel_nics) if comm.n_nodes > 1 else heads
            out["nvls"] = Graph(nh, max(ok), bw_inter)
    return out


def comm_channels(comm: Comm, g: dict[str, Graph]) -> int:
    """Channels of the communicator (connect.cc: doubled on Hopper+ across nodes when rings are > 45 GB/s)."""
    n = g["ring"].channels
    if comm.arch in ("hopper", "blackwell") and comm.n_nodes > 1 and g["ring"].bw_intra > 45.0 and n < 16:
        n *= 2
    return n


# ------------------------------------------------------------------------------------------ tuning model
def _idx2(comm: Comm) -> int:
    return min(comm.n_nodes, 3) - 1


def _log2i(x: int) -> int:
    return max(int(x).bit_length() - 1, 0)


def _nsteps(kind: str, n: int) -> int:
    return 2 * (n - 1) if kind == "all_reduce" else n - 1 if kind in ("all_gather", "reduce_scatter") else n


def _enabled(comm: Comm, kind: str, algo: str, proto: str, g: dict) -> bool:
    if kind in ("broadcast", "reduce") and algo != "ring":
        return False
    if kind in ("all_gather", "reduce_scatter") and algo not in ("pat", "ring", "nvls", "collnet_direct"):
        return False
    if kind in ("all_gather", "reduce_scatter") and algo == "nvls" and _older(comm, C.VERSION_NVLS_AG_RS):
        return False
    if kind == "all_reduce" and algo == "pat":
        return False
    if algo in ("nvls", "nvls_tree") and (proto != "simple" or "nvls" not in g or g["nvls"].channels < 2):
        return False
    if algo == "nvls_tree" and comm.n_nodes == 1:
        return False
    if algo == "nvls" and comm.n_nodes > 1 and (not comm.collnet or kind != "all_reduce"):
        return False
    if algo == "pat" and (proto != "simple" or comm.n_nodes != comm.n_ranks):
        return False
    if algo in ("collnet_direct", "collnet_chain") and (not comm.collnet or proto != "simple" or "collnet" not in g
                                                        or kind != "all_reduce"):
        return False
    if algo == "tree" and comm.n_ranks < 2:
        return False
    # LL128 needs NVLink inside the node (tuning.cc: typeIntra <= PATH_NVB)
    if proto == "ll128" and comm.intra_hw != "nvlink" and comm.ppn > 1:
        return False
    return True


_CAPS = {"ring_ll128": C.PER_CH_MAX_RING_LL128_BW, "tree_ll128": C.PER_CH_MAX_TREE_LL128_BW,
         "tree": C.PER_CH_MAX_TREE_BW}


def _cap(comm: Comm, table: str, i2: int) -> float:
    """Per-channel bandwidth cap (GB/s) of ``table`` in the release ``comm`` runs (tuning.cc perChMax*Bws)."""
    if comm.arch == "blackwell" and _older(comm, C.VERSION_NVLS_EFFICIENCY):
        return C.LEGACY_BLACKWELL_CAPS_BEFORE_2_28[table][i2]
    return _CAPS[table][comm.arch][i2]


def _bandwidth(comm: Comm, kind: str, algo: str, proto: str, g: dict) -> float:
    """NCCL's algorithm bandwidth (GB/s) of (algo, proto) for ``kind`` (tuning.cc ncclTopoTuneModel)."""
    arch, i2 = comm.arch, _idx2(comm)
    graph = g["nvls" if algo in ("nvls", "nvls_tree") else "collnet" if algo == "collnet_direct"
              else "tree" if algo in ("tree", "collnet_chain") else "ring"]
    collnet = algo.startswith("collnet")
    bw = graph.bw_intra if comm.n_nodes <= 2 or collnet else graph.bw_inter
    if algo in ("nvls", "nvls_tree") and _older(comm, C.VERSION_NVLS_EFFICIENCY):
        if algo == "nvls_tree":
            bw = min(graph.bw_intra, graph.bw_inter if comm.n_nodes <= 2 else graph.bw_inter / 2)
        elif kind == "all_reduce":
            bw = min(graph.bw_intra, graph.bw_inter)
        else:
            bw = min(graph.bw_intra * (comm.ppn - 1) / comm.ppn, graph.bw_inter * 0.9)
    elif algo in ("nvls", "nvls_tree"):
        intra = graph.bw_intra * C.NVLS_EFFICIENCY[arch] * (graph.channels - 1) / graph.channels
        intra *= 2.0 if kind == "all_reduce" else (comm.ppn - 1) / comm.ppn
        inter = graph.bw_inter * (2 if comm.n_nodes <= 2 and algo == "nvls_tree" else 1) if comm.n_nodes > 1 \
            else float("inf")
        cap = C.PER_CH_MAX_NVLS_TREE_BW[arch][i2] if algo == "nvls_tree" else float("inf")
        bw = min(intra, inter, cap)
    bus = graph.channels * bw
    ll_row = arch if comm.n_nodes == 1 else C.LL_MAX_BW_CPU_ROW[comm.cpu]
    ll_max = C.LL_MAX_BW[ll_row][i2]
    old_ll = _older(comm, C.VERSION_LL_HALF)
    if old_ll and ll_row == "hopper":
        ll_max = C.LEGACY_LL_MAX_BW_HOPPER_BEFORE_2_21[i2]
    if algo == "ring" and proto == "ll":
        f = C.LL_BW_FACTOR
        if old_ll:
            ar = comm.n_nodes > 1 or kind in ("all_reduce", "reduce")
            f = C.LEGACY_RING_LL_FACTOR_BEFORE_2_21[0 if ar else 1]
        bus = min(ll_max, bus * f)
    if algo == "ring" and proto == "ll128":
        f = C.LL128_BW_FACTOR
        if _older(comm, C.VERSION_LL128_PPN1) and comm.ppn < 2:
            f = C.LEGACY_RING_LL128_PPN1_FACTOR_BEFORE_2_23
        bus = min(bus * f, graph.channels * _cap(comm, "ring_ll128", i2))
    if algo == "tree" and kind == "all_reduce":
        bus = min(bus * C.TREE_BW_FACTOR, graph.channels * _cap(comm, "tree", i2))
    if algo == "tree" and proto == "ll":
        bus = min(bus * C.TREE_LL_BW_FACTOR, ll_max)
    if algo == "tree" and proto == "ll128":
        f = C.TREE_LL128_FACTOR_1NODE if comm.n_nodes == 1 else C.TREE_LL128_FACTOR_MULTI
        bus = min(bus * f, graph.channels * _cap(comm, "tree_ll128", i2))
    if algo == "pat":
        bus *= C.PAT_BW_FACTOR
    if algo == "collnet_direct":
        if kind in ("all_gather", "reduce_scatter"):
            bus = comm.ppn * min(graph.bw_intra, graph.bw_inter * 0.9)
        else:
            factor = comm.ppn / graph.channels
            bus /= factor - (factor - 1) / 2
            if arch in ("hopper", "blackwell"):
                bus *= C.COLLNET_HOPPER_FACTOR
    if not (algo != "ring" and kind in ("all_gather", "reduce_scatter")):
        if algo in ("nvls", "nvls_tree") and _older(comm, C.VERSION_NVLS_EFFICIENCY):
            bus *= C.LEGACY_NVLS_RATIO_BEFORE_2_28
        elif algo in ("ring", "nvls", "nvls_tree"):
            bus *= comm.n_ranks / _nsteps(kind, comm.n_ranks)
        else:
            bus *= 0.5
    return bus


def _legacy_tree_simple(comm: Comm):
    """(base, {hw: latency}) of tree Simple in the release ``comm`` runs, None where the newest applies."""
    for before, base, hw in C.LEGACY_TREE_SIMPLE_LAT_US:
        if _older(comm, before):
            return base, hw
    return None


def _base_lat_us(comm: Comm, algo: str, proto: str) -> float:
    """tuning.cc baseLat of (algo, proto) in the release ``comm`` runs."""
    old = _legacy_tree_simple(comm) if (algo, proto) == ("tree", "simple") else None
    return old[0] if old else C.BASE_LAT_US[algo][PROTO_INDEX[proto]]


def _hw_lat_us(comm: Comm, hw: str, algo: str, proto: str) -> float:
    """tuning.cc hwLat[hw] of (algo, proto) in the release ``comm`` runs."""
    old = _legacy_tree_simple(comm) if (algo, proto) == ("tree", "simple") else None
    return old[1][hw] if old else C.HW_LAT_US[hw][algo][PROTO_INDEX[proto]]


def _latency_us(comm: Comm, kind: str, algo: str, proto: str) -> float:
    """NCCL's latency (us) of (algo, proto) for ``kind`` (tuning.cc)."""
    pi = PROTO_INDEX[proto]
    n, nodes = comm.n_ranks, comm.n_nodes
    hw_intra = comm.intra_hw
    lat, intra = _base_lat_us(comm, algo, proto), _hw_lat_us(comm, hw_intra, algo, proto)
    ppn1 = comm.ppn == 1 and not _older(comm, C.VERSION_PPN1_TREE_NET_LAT)
    inter = _hw_lat_us(comm, "net", "tree" if ppn1 else algo, proto)
    if algo in ("nvls", "nvls_tree") and _older(comm, C.VERSION_LL_HALF):
        intra = C.LEGACY_NVLS_LAT_US_BEFORE_2_21
    if algo == "nvls_tree" and comm.ppn > 1 and _older(comm, C.VERSION_NVLS_EFFICIENCY):
        inter = C.LEGACY_NET_NVLS_TREE_LAT_US_BEFORE_2_28
    # the network plugin's own latency (graph latencyInter), once more for Simple's flush (tuning.cc)
    inter += comm.net_latency_us * (C.NET_LATENCY_SIMPLE_FACTOR if proto == "simple" else 1.0)
    if algo == "ring":
        if kind in ("broadcast", "reduce"):
            return lat + C.HW_LAT_US[hw_intra if nodes == 1 else "net"]["ring"][pi]
        if nodes > 1:
            over = C.NET_OVERHEAD_US[comm.cpu] * (C.NET_OVERHEAD_SIMPLE_FACTOR if proto == "simple" else 1.0)
            intra = max(intra, over)
        steps = _nsteps(kind, n)
        inter_steps = 0 if nodes == 1 else 2 * (nodes - 1) if kind == "all_reduce" else nodes - 1
        return lat + (steps - inter_steps) * intra + inter_steps * inter
    if algo == "tree":
        return lat + 2 * ((n // nodes - 1) * intra + _log2i(nodes) * inter)
    if algo == "collnet_direct":
        return lat + 2 * (min(1, n // nodes - 1) * intra + (n // nodes - 1) * C.COLLNET_ARITY_LAT_US) + inter
    if algo == "collnet_chain":
        return lat + 2 * (n // nodes - 1) * intra + inter
    if algo == "nvls":
        return intra + (inter if nodes > 1 else 0.0)
    if algo == "nvls_tree":
        return lat + intra + 2 * _log2i(nodes) * inter
    if algo == "pat":
        return lat + _log2i(nodes) * (inter / C.PAT_LOG_LAT_DIVISOR) + n * C.PAT_LINEAR_LAT_US
    raise ValueError(algo)


def _launched_channels(comm: Comm, algo: str, proto: str, size: float, nc: int, g: dict) -> int:
    """Channels NCCL launches for ``size`` bytes (enqueue.cc topoGetAlgoInfo): NVLS a fixed count, ring
    and tree drop channels while size < channels x threads x bytes-per-thread."""
    if algo in ("nvls", "nvls_tree"):
        return g["nvls"].channels
    thr = C.THREAD_THRESHOLD[proto] * (comm.n_ranks if algo == "ring" and proto == "ll" else 1)
    per = C.MAX_THREADS[proto] * thr
    while nc >= 2 and size < nc * per:
        nc -= 1
    return nc


def nvls_chunk_bytes(comm: Comm, size: float, heads: int) -> int:
    """NVLS chunk NCCL uses for ``size`` bytes (enqueue.cc): 128 KiB, cut to 64 / 32 / 16 KiB below 64 / 8 / 2
    x concurrentOps x chunk, concurrentOps = launched NVLS channels x heads."""
    ops = C.NVLS_CHANNELS[comm.arch] * heads
    chunk = C.NVLS_CHUNK_BYTES
    for factor, smaller in C.NVLS_CHUNK_SHRINK:
        if size < factor * ops * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def pipeline_fill_s(comm: Comm, kind: str, algo: str, size: float, bw_Bps: float, g: dict) -> float:
    """Time NCCL's ``latency + size / bandwidth`` leaves out: the pipeline's fill and drain. One-node NVLS
    all-reduce runs its iterations (launched channels x heads x chunk bytes) through three stages at once
    (scatter, multimem reduce, gather; all_reduce.h), each moving an iteration at the algorithm rate: a flow
    shop of equal stages takes sum(items) + (stages - 1) x largest item, so (stages - 1) x min(iteration,
    size) / bandwidth on top of size / bandwidth. 0 elsewhere: ring ranks all start on their own data (no fill);
    the tree's mid-size loss is already in NCCL's estimate (tuning.cc treeCorrectionFactor), so a fill there
    would count it twice; NVLS reduce-scatter / all-gather and multi-node NVLS are not modelled (no published
    sweep to check them against)."""
    if algo != "nvls" or kind != "all_reduce" or comm.n_nodes != 1 or "nvls" not in g:
        return 0.0
    heads = g["nvls"].channels
    iteration = C.NVLS_CHANNELS[comm.arch] * heads * nvls_chunk_bytes(comm, size, heads)
    return (C.NVLS_PIPELINE_STAGES - 1) * min(iteration, size) / bw_Bps


def table(comm: Comm, kind: str, size: float) -> list[Choice]:
    """Every enabled (algorithm, protocol) for ``kind`` of ``size`` bytes, in NCCL's order."""
    g = graphs(comm)
    nc_full = comm_channels(comm, g)
    out = []
    for algo in C.ALGORITHMS:
        for proto in C.PROTOCOLS:
            if not _enabled(comm, kind, algo, proto, g):
                continue
            bw = _bandwidth(comm, kind, algo, proto, g)
            if bw <= 0:
                continue
            lat = _latency_us(comm, kind, algo, proto)
            log_size = _log2i(int(size) >> 6) if size >= 64 else -1
            if algo == "tree" and kind == "all_reduce" and 0 <= log_size < 23:
                bw *= C.TREE_CORRECTION[proto][log_size]
            # NCCL >= 2.28 applies the tree correction to NVLS-tree on Blackwell with x86 hosts (tuning.cc
            # ncclTopoGetAlgoTime)
            if (algo == "nvls_tree" and kind == "all_reduce" and 0 <= log_size < 24 and comm.arch == "blackwell"
                    and comm.cpu in ("intel", "amd") and not _older(comm, C.VERSION_NVLS_EFFICIENCY)):
                bw *= C.TREE_CORRECTION[proto][log_size]
            if (algo == "ring" and proto == "simple" and comm.n_nodes > 1 and kind == "all_reduce"
                    and size / (nc_full * comm.n_ranks) >= 64):
                lat *= C.RING_PLATEAU_LAT_FACTOR
            est = lat * 1e-6 + size / (bw * 1e9)
            # channels launched: ring/tree bandwidth scales with the share of the communicator's channels
            nc = _launched_channels(comm, algo, proto, size, nc_full, g)
            share = 1.0 if algo in ("nvls", "nvls_tree", "pat", "collnet_direct") else nc / nc_full
            t = lat * 1e-6 + size / (bw * 1e9 * share) + pipeline_fill_s(comm, kind, algo, size, bw * 1e9, g)
            out.append(Choice(algo, proto, lat * 1e-6, bw * 1e9, nc, est, t))
    return out


@lru_cache(maxsize=65536)
def choose(comm: Comm, kind: str, size: float, algorithm: str | None = None,
           protocol: str | None = None) -> Choice | None:
    """NCCL's pick for ``kind`` of ``size`` bytes: the lowest estimate among the enabled (algorithm,
    protocol) pairs, restricted to ``algorithm`` / ``protocol`` when forced (as NCCL_ALGO / NCCL_PROTO do;
    each a name or a tuple of names, as in ``NCCL_ALGO=Ring,Tree``).
    With ``comm.version`` set, that release's tuning model makes the pick and the newest model prices it.
    None when nothing is left (e.g. NVLS forced where the switch cannot reduce)."""
    rows = table(comm, kind, size)
    if algorithm is not None:
        allowed = (algorithm,) if isinstance(algorithm, str) else tuple(algorithm)
        rows = [r for r in rows if r.algorithm in allowed]
    if protocol is not None:
        allowed = (protocol,) if isinstance(protocol, str) else tuple(protocol)
        rows = [r for r in rows if r.protocol in allowed]
    if not rows:
        return None
    pick = min(rows, key=lambda r: r.estimate_s)
    if comm.version:
        # an older release's tuner decides what NCCL ran; the newest model (NVIDIA's latest figures for the
        # same hardware) prices it
        newest = {(r.algorithm, r.protocol): r for r in table(replace(comm, version=0), kind, size)}
        pick = newest.get((pick.algorithm, pick.protocol), pick)
    return pick


# ------------------------------------------------------------------------------------------ all-to-all, p2p
def p2p_time_s(comm: Comm, size: float, inter_node: bool) -> float:
    """One send/recv of ``size`` bytes: LL up to NCCL_P2P_LL_THRESHOLD, Simple above; NCCL's ring latency
    terms for one step and the path bandwidth (scale-up link or NIC, NCCL units)."""
    proto = "ll" if size <= C.P2P_LL_THRESHOLD_BYTES else "simple"
    pi = PROTO_INDEX[proto]
    hw = "net" if inter_node else comm.intra_hw
    bw = (comm.nic_bw if inter_node else comm.intra_bw) * (C.LL_BW_FACTOR if proto == "ll" else 1.0)
    return (C.BASE_LAT_US["ring"][pi] + C.HW_LAT_US[hw]["ring"][pi]) * 1e-6 + size / (bw * 1e9)


def all_to_all_time_s(comm: Comm, size: float) -> float:
    """NCCL all-to-all of ``size`` bytes per rank (S/n to every peer), all pairs at once: intra-node bytes
    over each GPU's scale-up link, inter-node bytes over the node's NICs (PXN lets every GPU use every
    rail), plus one point-to-point latency per peer stage (grouped: the slowest peer's latency). In an uneven
    group the sparsest node's GPUs send the most across nodes (over their own NICs where each has one)."""
    n, ppn = comm.n_ranks, comm.ppn
    chunk = size / n
    intra_bytes = chunk * (ppn - 1)
    t_intra = intra_bytes / (comm.intra_bw * 1e9) if intra_bytes else 0.0
    t_inter = 0.0
    for q, nics in {(ppn, comm.nics), (comm.ppn_sparsest, comm.channel_nics)}:     # fullest, sparsest node
        inter_bytes = chunk * (n - q)
        if inter_bytes:
            t_inter = max(t_inter, inter_bytes * q / (nics * comm.nic_bw * 1e9))
    lat = p2p_time_s(comm, 0.0, inter_node=comm.n_nodes > 1)
    return lat + max(t_intra, t_inter)


def moe_time_s(comm: Comm, tokens: int, token_bytes: float, topk: int, experts: int, inter_node: bool) -> tuple:
    """DeepEP-style expert-parallel dispatch (or combine, the mirror) of ``tokens`` per rank, each to
    ``topk`` of ``experts`` experts spread evenly over the ranks: (seconds, bytes on the bottleneck link).
    Intra-node: a token goes once to every other local GPU holding one of its experts, over the scale-up
    link. Across nodes: once to every other node holding one (RDMA, deduplicated per node, NVLink
    forwarding inside), over the GPU's NIC. Uniform routing gives the expected distinct destinations."""
    ppn = comm.ppn
    def distinct(groups: int) -> float:       # expected groups that hold >= 1 of the token's experts
        per = experts / groups
        miss = math.comb(int(experts - per), topk) / math.comb(experts, topk)
        return groups * (1.0 - miss)
    if inter_node and comm.n_nodes > 1:
        nodes = comm.n_nodes
        dest = distinct(nodes) * (nodes - 1) / nodes
        nbytes = tokens * dest * token_bytes
        bw = comm.nic_bw * 1e9
    else:
        dest = distinct(ppn) * (ppn - 1) / ppn
        nbytes = tokens * dest * token_bytes
        bw = comm.intra_bw * 1e9
    return p2p_time_s(comm, 0.0, inter_node) + nbytes / bw, nbytes


# ------------------------------------------------------------------------------------------ benchmark harness
def harness_time_s(t_s: float, gpus_per_thread: int = 1, blocking: bool = False,
                   host_s: float | None = None) -> float:
    """Time per iteration a benchmark reports for a collective NCCL runs in ``t_s`` seconds, when one host
    thread launches it on ``gpus_per_thread`` GPUs (nccl-tests -g N) at ``C.HOST_LAUNCH_PER_GPU_S`` each, or
    spends ``host_s`` seconds per call where given (a framework's per-call cost, e.g.
    ``C.TORCH_CALL_OVERHEAD_S`` for torch.distributed). Back-to-back iterations (nccl-tests' default): the
    slower of the GPUs and the launching thread, max(t, host). ``blocking`` (nccl-tests -z, or a benchmark that
    times one call between CUDA events and synchronises after it, as ml-engineering's all_reduce_bench.py did):
    the host's part comes first, t + host."""
    host = host_s if host_s is not None else max(int(gpus_per_thread), 1) * C.HOST_LAUNCH_PER_GPU_S
    return t_s + host if blocking else max(t_s, host)
