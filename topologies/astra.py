"""ASTRA-sim input configurations: the analytical network YAML and the system JSON.

Network YAML (astra-sim ``examples/network/analytical``): per dimension ``topology`` (Ring | Switch |
FullyConnected), ``npus_count``, ``bandwidth`` in GB/s where ASTRA-sim's GB is 2^30 bytes
(astra-network-analytical ``bw_GBps_to_Bpns``), ``latency`` in ns per link hop.
System JSON (astra-sim ``Sys::initialize_sys``): per-dimension collective implementations, chunking
(``preferred-dataset-splits``), ``active-chunks-per-dimension``, ``scheduling-policy``, ``endpoint-delay``
(ns, the NPU<->memory-agent hand-off per message), ``local-mem-bw`` (GB/s of 1e9 bytes: reduction reads and
writes), ``roofline-enabled`` with ``peak-perf`` (TFLOP/s) for compute nodes priced from FLOPs.
Defaults are ASTRA-sim's (Sys constructor): endpoint delay 10 ns, one active chunk, ascending dimensions.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from simulator.errors import ConfigError
from simulator.yamlio import load_yaml
from topologies.builders import MAX_LINK_BPS, MIN_LINK_BPS

GIB = float(1 << 30)           # ASTRA-sim's "GB" in bandwidths (bytes)
TOPOLOGY_KINDS = ("Ring", "Switch", "FullyConnected")
ALGORITHMS = ("ring", "direct", "halvingDoubling", "doubleBinaryTree")
# ASTRA-sim's spellings (CollectiveImplLookup) -> ours
_ALGO_ALIASES = {"ring": "ring", "oneRing": "ring", "direct": "direct", "oneDirect": "direct",
                 "halvingDoubling": "halvingDoubling", "oneHalvingDoubling": "halvingDoubling",
                 "doubleBinaryTree": "doubleBinaryTree"}
COLLECTIVE_KEYS = {"all_reduce": "all-reduce-implementation", "all_gather": "all-gather-implementation",
                   "reduce_scatter": "reduce-scatter-implementation", "all_to_all": "all-to-all-implementation"}


@dataclass(frozen=True)
class Dimension:
    """One network dimension: its building block, NPUs, per-link bandwidth (bytes/s) and latency (s)."""

    topology: str
    npus: int
    bandwidth_Bps: float
    latency_s: float

    def hops(self, src: int, dst: int) -> int:
        """Link hops between local ids (astra-network-analytical congestion_unaware)."""
        if self.topology == "Switch":
            return 2
        if self.topology == "FullyConnected":
            return 1
        cw = (dst - src) % self.npus          # bidirectional ring: the shorter way
        return min(cw, self.npus - cw)


@dataclass(frozen=True)
class AstraNetwork:
    dims: tuple[Dimension, ...]

    @property
    def world_size(self) -> int:
        n = 1
        for d in self.dims:
            n *= d.npus
        return n

    def address(self, rank: int) -> tuple[int, ...]:
        """Per-dimension coordinates, dimension 0 fastest (MultiDimTopology::translate_address)."""
        out = []
        for d in self.dims:
            out.append(rank % d.npus)
            rank //= d.npus
        return tuple(out)

    def to_yaml(self) -> str:
        fmt = lambda xs: "[ " + ", ".join(xs) + " ]"  # noqa: E731
        return (f"topology: {fmt(d.topology for d in self.dims)}\n"
                f"npus_count: {fmt(str(d.npus) for d in self.dims)}\n"
                f"bandwidth: {fmt(repr(d.bandwidth_Bps / GIB) for d in self.dims)}  # GB/s (2^30 B/s)\n"
                f"latency: {fmt(repr(d.latency_s * 1e9) for d in self.dims)}  # ns\n")


@dataclass
class AstraSystem:
    """The system-layer settings that change analytical results (names as in the JSON)."""

    implementations: dict[str, tuple[str, ...]] = field(default_factory=dict)   # our kind -> per dim
    preferred_dataset_splits: int = 1
    active_chunks_per_dimension: int = 1
    scheduling_policy: str = "LIFO"
    collective_optimization: str = "baseline"
    endpoint_delay_ns: int = 10
    local_mem_bw_Bps: float = 0.0
    roofline_enabled: bool = False
    peak_perf_flops: float = 0.0
    queues_per_dim: int = 1        # astra-sim --num-queues-per-dim (default 1)

    def algorithm(self, kind: str, dim: int) -> str:
        impls = self.implementations.get(kind) or self.implementations.get("all_reduce") or ("ring",)
        return impls[dim] if dim < len(impls) else impls[-1]

    def to_json(self, ndims: int) -> str:
        d = {
            "scheduling-policy": self.scheduling_policy, "endpoint-delay": self.endpoint_delay_ns,
            "active-chunks-per-dimension": self.active_chunks_per_dimension,
            "preferred-dataset-splits": self.preferred_dataset_splits,
            **{COLLECTIVE_KEYS[k]: [self.algorithm(k, i) for i in range(ndims)] for k in COLLECTIVE_KEYS},
            "collective-optimization": self.collective_optimization,
            "local-mem-bw": self.local_mem_bw_Bps / 1e9, "boost-mode": 0,
            "roofline-enabled": int(self.roofline_enabled), "peak-perf": self.peak_perf_flops / 1e12,
        }
        return json.dumps(d, indent=4) + "\n"


def load_network(path: str | Path) -> AstraNetwork:
    """Parse an ASTRA-sim analytical network YAML; bad input is a ConfigError naming the file."""
    data = load_yaml(path, "network file")
    where = str(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping with topology, npus_count, bandwidth, latency")
    cols = []
    for key in ("topology", "npus_count", "bandwidth", "latency"):
        v = data.get(key)
        if not isinstance(v, list) or not v:
            raise ConfigError(f"{where}: {key} must be a non-empty list (one entry per dimension)")
        cols.append(v)
    if len({len(c) for c in cols}) != 1:
        raise ConfigError(f"{where}: topology, npus_count, bandwidth and latency need one entry per dimension "
                          f"(got {', '.join(str(len(c)) for c in cols)})")
    dims = []
    for i, (topo, n, bw, lat) in enumerate(zip(*cols)):
        if topo not in TOPOLOGY_KINDS:
            raise ConfigError(f"{where}: dimension {i}: topology {topo!r} is not one of {', '.join(TOPOLOGY_KINDS)}")
        if not isinstance(n, int) or isinstance(n, bool) or n < 2:
            raise ConfigError(f"{where}: dimension {i}: npus_count must be an integer >= 2, got {n!r}")
        if not _number(bw) or not MIN_BANDWIDTH_GBPS <= bw <= MAX_BANDWIDTH_GBPS:
            raise ConfigError(f"{where}: dimension {i}: bandwidth must be a number of GB/s from "
                              f"{MIN_BANDWIDTH_GBPS:g} to {MAX_BANDWIDTH_GBPS:g}, got {bw!r}")
        if not _number(lat) or not 0 <= lat <= MAX_DELAY_NS:
            raise ConfigError(f"{where}: dimension {i}: latency must be a number of ns from 0 to {MAX_DELAY_NS:g}, "
                              f"got {lat!r}")
        dims.append(Dimension(topo, n, float(bw) * GIB, float(lat) * 1e-9))
    return AstraNetwork(tuple(dims))


#: physical ranges of the configs' values (beyond them a file is a typo, and times overflow or splits never end):
#: link bandwidth 1 MB/s to 1 PB/s, delays up to 1,000 s, splits and active chunks up to 4,096, local memory
#: bandwidth and peak compute from 1 MB/s and 1 GFLOP/s (when given) to 1 PB/s and 1 EFLOP/s
MIN_BANDWIDTH_GBPS, MAX_BANDWIDTH_GBPS = MIN_LINK_BPS / 1e9, MAX_LINK_BPS / 1e9      # a cluster's link range
MAX_DELAY_NS = 1e12
MAX_SPLITS = 4096


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def load_system(path: str | Path | None) -> AstraSystem:
    """Parse an ASTRA-sim system JSON (None -> ASTRA-sim's defaults with ring everywhere)."""
    sysc = AstraSystem(implementations={k: ("ring",) for k in COLLECTIVE_KEYS})
    if path is None:
        return sysc
    where = str(path)
    from simulator.inputs import load_json
    data = load_json(path, "system file")         # bounded read, deep nesting, huge numbers
    if not isinstance(data, dict):
        raise ConfigError(f"system file {where}: expected a JSON object")
    for kind, key in COLLECTIVE_KEYS.items():
        if key in data:
            impl = data[key]
            if not isinstance(impl, list) or not impl or not all(isinstance(a, str) for a in impl):
                raise ConfigError(f"{where}: {key} must be a list of algorithm names, one per dimension")
            bad = [a for a in impl if a not in _ALGO_ALIASES]
            if bad:
                raise ConfigError(f"{where}: {key}: unknown algorithm {bad[0]!r}; known: {', '.join(ALGORITHMS)}")
            sysc.implementations[kind] = tuple(_ALGO_ALIASES[a] for a in impl)

    def integer(key, minimum, maximum):
        v = data[key]
        if not isinstance(v, int) or isinstance(v, bool) or not minimum <= v <= maximum:
            raise ConfigError(f"{where}: {key} must be an integer from {minimum} to {maximum}, got {v!r}")
        return v

    def number(key, maximum, smallest_positive=0.0):
        v = data[key]
        if not _number(v) or not 0 <= v <= maximum or 0 < v < smallest_positive:
            low = f"0 or {smallest_positive:g}" if smallest_positive else "0"
            raise ConfigError(f"{where}: {key} must be a number from {low} to {maximum:g}, got {v!r}")
        return float(v)

    if "preferred-dataset-splits" in data:
        sysc.preferred_dataset_splits = integer("preferred-dataset-splits", 1, MAX_SPLITS)
    if "active-chunks-per-dimension" in data:
        sysc.active_chunks_per_dimension = integer("active-chunks-per-dimension", 1, MAX_SPLITS)
    if "endpoint-delay" in data:
        sysc.endpoint_delay_ns = int(number("endpoint-delay", MAX_DELAY_NS))
    if "scheduling-policy" in data:
        if data["scheduling-policy"] not in ("LIFO", "FIFO"):
            raise ConfigError(f"{where}: scheduling-policy must be LIFO or FIFO, got {data['scheduling-policy']!r}")
        sysc.scheduling_policy = data["scheduling-policy"]
    if "collective-optimization" in data:
        if data["collective-optimization"] not in ("baseline", "localBWAware"):
            raise ConfigError(f"{where}: collective-optimization must be baseline or localBWAware")
        sysc.collective_optimization = data["collective-optimization"]
    if "local-mem-bw" in data:
        sysc.local_mem_bw_Bps = number("local-mem-bw", MAX_BANDWIDTH_GBPS, MIN_BANDWIDTH_GBPS) * 1e9   # GB/sec * 1e9
    if "peak-perf" in data:
        sysc.peak_perf_flops = number("peak-perf", 1e6, 1e-3) * 1e12          # Sys.cc: TFLOPS * 1e12
    if "roofline-enabled" in data:
        flag = data["roofline-enabled"]
        if flag not in (0, 1) or isinstance(flag, float):          # (true / false and 0 / 1, as ASTRA-sim reads it)
            raise ConfigError(f"{where}: roofline-enabled must be 0 or 1 (or true / false), got {flag!r}")
        sysc.roofline_enabled = bool(flag)
        if sysc.roofline_enabled and (sysc.peak_perf_flops <= 0 or sysc.local_mem_bw_Bps <= 0):
            raise ConfigError(f"{where}: roofline-enabled needs positive peak-perf and local-mem-bw")
    return sysc
