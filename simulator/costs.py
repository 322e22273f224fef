"""The pluggable cost-model interface the engine calls, and two simple implementations.

The engine knows nothing about hardware. It asks a ``CostModel``:

- ``compute_time_s(rank, op)``     seconds a compute op takes on that rank's device;
- ``comm_time_s(request)``        seconds a collective / transfer takes without contention;
- ``network()``                   for contention-aware models, a fresh ``FlowNetwork`` (see below);
- ``device_key(rank)``            hashable identity of a rank's hardware (symmetry needs it);
- ``peak_flops(rank)``, ``memory_capacity_bytes(rank)``  for MFU and "fits in memory";
- optionally ``comm_sm_fraction(request)``: the share of a member GPU's compute units the communication's
  kernels hold while it runs (NCCL's channels); compute that overlaps it is slowed by that share of the
  overlap (see simulator.engine). Models without it (the simple ones here) have no such interference.

A ``FlowNetwork`` is an event-driven fluid model the engine drives: it starts a communication (``start``),
tells when the next one finishes (``next_completion``), and forgets finished ones (``finish``); rates are
recomputed whenever a communication starts or ends. ``topologies`` implements it with max-min fair
sharing over routed paths.

Topology-aware implementations live in ``topologies.cost``; ``IdealCostModel`` and ``SimpleCostModel``
here serve tests and hand-built programs. Units: seconds, bytes, FLOPs, bytes per second.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Protocol

from simulator.program import Op


@dataclass(frozen=True, slots=True)
class CommRequest:
    """One collective or point-to-point transfer as the network sees it.

    kind        a collective kind (``all_reduce`` ...) or ``p2p``
    ranks       the group's global ranks; for ``p2p`` (source, destination)
    size_bytes  nccl-tests convention (see simulator.program)
    images      symmetric mode: other rank tuples that by symmetry run the same communication at the
                same instant (the contention model must load their links too); empty in full mode
    """

    kind: str
    ranks: tuple[int, ...]
    size_bytes: float
    images: tuple[tuple[int, ...], ...] = ()


class FlowNetwork(Protocol):
    def start(self, now_s: float, key: Hashable, request: CommRequest) -> None: ...
    def next_completion(self) -> tuple[float, Hashable] | None: ...
    def finish(self, now_s: float, key: Hashable) -> None: ...


class CostModel(Protocol):
    contention_aware: bool

    def compute_time_s(self, rank: int, op: Op) -> float: ...
    def comm_time_s(self, request: CommRequest) -> float: ...
    def network(self) -> FlowNetwork: ...
    def device_key(self, rank: int) -> Hashable: ...
    def peak_flops(self, rank: int) -> float: ...
    def memory_capacity_bytes(self, rank: int) -> float: ...


class SimpleCostModel:
    """Uniform devices and a flat alpha-beta network; collectives cost as the ring algorithm.

    flops_per_s       achieved FLOP/s of every device (also reported as its peak)
    mem_bytes_per_s   HBM bytes/s (roofline: time = max(flops/rate, mem_bytes/bw))
    link_bytes_per_s  per-direction bandwidth every rank sees
    alpha_s           per-step latency
    """

    contention_aware = False

    def __init__(self, flops_per_s: float = 1e12, mem_bytes_per_s: float = 1e12, link_bytes_per_s: float = 1e10,
                 alpha_s: float = 0.0, memory_bytes: float = 80e9):
        self.flops_per_s = flops_per_s
        self.mem_bytes_per_s = mem_bytes_per_s
        self.link_bytes_per_s = link_bytes_per_s
        self.alpha_s = alpha_s
        self.memory_bytes = memory_bytes

    def compute_time_s(self, rank: int, op: Op) -> float:
        return max(op.flops / self.flops_per_s, op.mem_bytes / self.mem_bytes_per_s)

    def comm_time_s(self, request: CommRequest) -> float:
        n = len(request.ranks)
        s, bw, a = request.size_bytes, self.link_bytes_per_s, self.alpha_s
        if request.kind == "p2p":
            return a + s / bw
        if n <= 1:
            return 0.0
        if request.kind == "all_reduce":
            return 2 * (n - 1) * a + 2 * (n - 1) / n * s / bw
        if request.kind in ("all_gather", "reduce_scatter", "all_to_all"):
            return (n - 1) * a + (n - 1) / n * s / bw
        if request.kind in ("broadcast", "reduce"):
            return (n - 1) * a + s / bw
        if request.kind == "barrier":
            return 2 * (n - 1) * a
        raise ValueError(f"unknown communication kind {request.kind!r}")

    def network(self) -> FlowNetwork:
        raise NotImplementedError("SimpleCostModel has no contention model")

    def device_key(self, rank: int) -> Hashable:
        return "uniform"

    def peak_flops(self, rank: int) -> float:
        return self.flops_per_s

    def memory_capacity_bytes(self, rank: int) -> float:
        return self.memory_bytes


class IdealCostModel(SimpleCostModel):
    """Free communication: only compute costs time (to see pure compute and bubble)."""

    def comm_time_s(self, request: CommRequest) -> float:
        return 0.0


class ScaledCostModel:
    """Wrap a cost model, scaling compute and/or communication times (what-if and fault injection).

    compute_scale(rank) -> factor on compute time; comm_scale -> factor on communication time.
    """

    def __init__(self, base: CostModel, compute_scale: float | dict[int, float] = 1.0, comm_scale: float = 1.0):
        self.base = base
        self._compute_scale = compute_scale
        self.comm_scale = comm_scale
        self.contention_aware = getattr(base, "contention_aware", False) and comm_scale == 1.0

    def _cscale(self, rank: int) -> float:
        if isinstance(self._compute_scale, dict):
            return self._compute_scale.get(rank, 1.0)
        return self._compute_scale

    def compute_time_s(self, rank: int, op: Op) -> float:
        return self.base.compute_time_s(rank, op) * self._cscale(rank)

    def comm_time_s(self, request: CommRequest) -> float:
        return self.base.comm_time_s(request) * self.comm_scale

    def network(self) -> FlowNetwork:
        return self.base.network()

    def comm_sm_fraction(self, request: CommRequest) -> float:
        f = getattr(self.base, "comm_sm_fraction", None)
        return f(request) if f is not None else 0.0

    def device_key(self, rank: int) -> Hashable:
        return (self.base.device_key(rank), self._cscale(rank))

    def peak_flops(self, rank: int) -> float:
        return self.base.peak_flops(rank)

    def memory_capacity_bytes(self, rank: int) -> float:
        return self.base.memory_capacity_bytes(rank)
