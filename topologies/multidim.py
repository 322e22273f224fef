"""Multi-dimensional networks with a collective algorithm per dimension, priced as ASTRA-sim's analytical
(congestion-unaware) backend prices them.

Semantics (read from astra-sim @518bd513 ``astra-sim/system`` and astra-network-analytical
``congestion_unaware``), all in integer nanoseconds as ASTRA-sim ticks:

- a message of ``m`` bytes between two NPUs differing first in dimension ``d`` takes
  ``int(hops·latency_d + m / bandwidth_d)`` (Ring: shorter way round, Switch: 2 hops, FullyConnected: 1);
- a collective of ``size`` bytes is cut into chunks of ``size // preferred-dataset-splits`` bytes (at least
  the number of NPUs, except all-gather: ``Sys::determine_chunk_size``); every chunk runs one *phase* per
  involved dimension: all-reduce with ``localBWAware`` = reduce-scatter up the dimensions, all-reduce on the
  last one, all-gather back down; ``baseline`` = all-reduce on every dimension; all-gather walks the
  dimensions in reverse; each phase's output size feeds the next;
- each dimension's queue runs at most ``active-chunks-per-dimension`` chunk phases at once; waiting chunks
  start in LIFO (newest first) or FIFO order (``Sys::insert_stream``);
- a ring phase on ``n`` NPUs: an endpoint delay, then per step one message (``size/n`` bytes; all-gather:
  the whole input) plus an endpoint delay plus, on reduction steps, three local-memory passes of the
  message (``PacketBundle``: ``3·int(m / local-mem-bw)``). Steps: all-reduce 2(n-1) (the first n-1 reduce),
  reduce-scatter n-1 (all reduce), all-gather n-1, all-to-all n(n-1)/2 (``Ring.cc``);
- halving-doubling: log2(n) steps of halving messages to partners 2^i apart (then doubling back for
  all-reduce); direct: all peers at once per round (window = n-1); double binary tree (all-reduce only):
  reduce up and broadcast down a tree of depth ceil(log2 n) with whole-chunk messages. Only the ring is
  checked against ASTRA-sim output (``tests/test_chakra_astra.py``); the other three follow the step
  structure of their source files.

``MultiDimCostModel`` implements the engine's ``CostModel`` protocol with these times.
"""
from __future__ import annotations

import heapq
import math
from functools import lru_cache

import numpy as np

from simulator.costs import CommRequest
from simulator.errors import ConfigError
from topologies.astra import AstraNetwork, AstraSystem, Dimension

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


def message_ns(dim: Dimension, hops: int, size_bytes: int) -> int:
    """One message's delay in ASTRA-sim ticks (BasicTopology::compute_communication_delay)."""
    bw_Bpns = dim.bandwidth_Bps / 1e9
    return int(hops * dim.latency_s * 1e9 + size_bytes / bw_Bpns)


def _reduce_ns(system: AstraSystem, msg: int) -> int:
    """Local reduction of a received message: one write and two reads at local-mem-bw (PacketBundle::call)."""
    if system.local_mem_bw_Bps <= 0:
        return 0
    return 3 * int(msg / system.local_mem_bw_Bps * 1e9)


def phase_ns(kind: str, algorithm: str, dim: Dimension, data: int, system: AstraSystem) -> tuple[int, int]:
    """(duration in ns, output bytes) of one chunk's phase of ``kind`` on one dimension."""
    n, ed = dim.npus, system.endpoint_delay_ns
    if algorithm == "ring":
        msg = data if kind == "all_gather" else data // n
        out = {"all_reduce": data, "all_gather": data * n, "reduce_scatter": data // n, "all_to_all": data}[kind]
        steps = {"all_reduce": 2 * (n - 1), "all_to_all": n * (n - 1) // 2}.get(kind, n - 1)
        reducing = {"all_reduce": n - 1, "reduce_scatter": n - 1}.get(kind, 0)
        step = message_ns(dim, dim.hops(0, 1), msg) + ed
        return ed + steps * step + reducing * _reduce_ns(system, msg), out
    if algorithm == "halvingDoubling":
        k = int(math.log2(n))
        if kind == "all_to_all":
            raise ConfigError("halvingDoubling has no all-to-all in ASTRA-sim; choose ring or direct")
        t = ed
        if kind in ("all_reduce", "reduce_scatter"):
            msg = data
            for i in range(k):
                msg //= 2
                t += message_ns(dim, dim.hops(0, 2 ** i), msg) + ed + _reduce_ns(system, msg)
            if kind == "all_reduce":
                for i in reversed(range(k)):
                    t += message_ns(dim, dim.hops(0, 2 ** i), msg) + ed
                    msg *= 2
                return t, data
            return t, data // n
        msg = data
        for i in reversed(range(k)):
            t += message_ns(dim, dim.hops(0, 2 ** i), msg) + ed
            msg *= 2
        return t, data * n
    if algorithm == "direct":
        msg = data if kind == "all_gather" else data // n
        worst = max(message_ns(dim, dim.hops(0, p), msg) for p in range(1, n))
        rounds = {"all_reduce": 2}.get(kind, 1)
        red = _reduce_ns(system, msg) if kind in ("all_reduce", "reduce_scatter") else 0
        out = {"all_reduce": data, "all_gather": data * n, "reduce_scatter": data // n, "all_to_all": data}[kind]
        return ed + rounds * (worst + ed) + red, out
    if algorithm == "doubleBinaryTree":
        if kind != "all_reduce":
            raise ConfigError(f"doubleBinaryTree implements only all-reduce in ASTRA-sim, not {kind}")
        depth = max(1, math.ceil(math.log2(n)))
        hop = message_ns(dim, dim.hops(0, 1), data)
        return ed + depth * (hop + ed + _reduce_ns(system, data)) + depth * (hop + ed), data
    raise ConfigError(f"unknown collective algorithm {algorithm!r}")


def phase_traffic(kind: str, algorithm: str, dim: Dimension, data: int) -> list[tuple[int, float]]:
    """(peer offset along the dimension, bytes) one NPU sends in one chunk's phase (for the flow model)."""
    n = dim.npus
    if algorithm == "ring":
        msg = data if kind == "all_gather" else data // n
        steps = {"all_reduce": 2 * (n - 1), "all_to_all": n * (n - 1) // 2}.get(kind, n - 1)
        return [(1, float(steps * msg))]
    if algorithm == "halvingDoubling":
        k = int(math.log2(n))
        if kind == "all_gather":
            return [(2 ** i, float(data * 2 ** (k - 1 - i))) for i in range(k)]
        out = [(2 ** i, float(data // 2 ** (i + 1))) for i in range(k)]
        return out + out if kind == "all_reduce" else out
    if algorithm == "direct":
        msg = data if kind == "all_gather" else data // n
        rounds = 2 if kind == "all_reduce" else 1
        return [(p, float(rounds * msg)) for p in range(1, n)]
    depth = max(1, math.ceil(math.log2(n)))               # double binary tree: parent/child exchanges
    return [(1, float(2 * depth * data))]


def chunk_phases(kind: str, dims: list[int], network: AstraNetwork, system: AstraSystem) -> list[tuple[int, str]]:
    """The (dimension, phase kind) sequence one chunk walks (Sys::generate_collective)."""
    dims = [d for d in dims if network.dims[d].npus > 1]
    if kind == "all_reduce" and system.collective_optimization == "localBWAware" and dims:
        return [(d, "reduce_scatter") for d in dims[:-1]] + [(dims[-1], "all_reduce")] + \
               [(d, "all_gather") for d in reversed(dims[:-1])]
    if kind == "all_gather":
        dims = list(reversed(dims))
    return [(d, kind) for d in dims]


def collective_ns(kind: str, size_bytes: int, dims: tuple[int, ...], network: AstraNetwork,
                  system: AstraSystem) -> int:
    """ASTRA-sim's analytical time (ns) of one collective of ``size_bytes`` (ASTRA-sim's size: all-gather
    counts one NPU's input) over the given dimensions, chunked and scheduled per dimension."""
    if kind not in KINDS:
        raise ConfigError(f"ASTRA-sim's analytical system layer has no {kind}; supported: {', '.join(KINDS)}")
    size = int(size_bytes)
    if size <= 0:
        return 0
    splits = system.preferred_dataset_splits
    chunk = size // splits
    if kind != "all_gather" and network.world_size > chunk:
        chunk = network.world_size
        size = splits * chunk
    chunk = max(chunk, 1)
    streams = -(-size // chunk)
    phases = chunk_phases(kind, list(dims), network, system)
    if not phases:
        return 0
    durations, data = [], chunk
    for d, pkind in phases:
        t, data = phase_ns(pkind, system.algorithm(pkind, d), network.dims[d], data, system)
        durations.append(t)
    return _schedule(durations, [d for d, _ in phases], streams, system)


def _schedule(durations: list[int], queue_of: list[int], streams: int, system: AstraSystem) -> int:
    """Makespan of ``streams`` identical chunks through per-dimension queues, each running at most
    ``active-chunks-per-dimension`` phases at once (Sys::SchedulerUnit, insert_stream)."""
    limit = max(1, math.ceil(system.active_chunks_per_dimension / system.queues_per_dim))
    lifo = system.scheduling_policy == "LIFO"
    waiting: dict[int, list[tuple[int, int]]] = {}      # queue -> heap of (-priority or priority, stream)
    running: dict[int, int] = {}
    phase_of = [0] * streams
    events: list[tuple[int, int, int]] = []
    seq = 0

    def admit(q: int, now: int) -> None:
        nonlocal seq
        heap = waiting.get(q, [])
        while heap and running.get(q, 0) < limit:
            _, s = heapq.heappop(heap)
            running[q] = running.get(q, 0) + 1
            seq += 1
            heapq.heappush(events, (now + durations[phase_of[s]], seq, s))

    def enqueue(s: int, now: int) -> None:
        q = queue_of[phase_of[s]]
        heapq.heappush(waiting.setdefault(q, []), (-s if lifo else s, s))
        admit(q, now)

    for s in range(streams):
        enqueue(s, 0)
    end = 0
    while events:
        now, _, s = heapq.heappop(events)
        end = max(end, now)
        q = queue_of[phase_of[s]]
        running[q] -= 1
        phase_of[s] += 1
        if phase_of[s] < len(durations):
            nq = queue_of[phase_of[s]]
            heapq.heappush(waiting.setdefault(nq, []), (-s if lifo else s, s))
            admit(q, now)
            admit(nq, now)
        else:
            admit(q, now)
    return end


class MultiDimCostModel:
    """The engine's CostModel on an ASTRA-sim network + system (analytical, congestion-unaware).

    Compute ops with ``duration_s`` run that long (the engine's rule); otherwise, with the roofline enabled,
    ``flops / min(peak-perf, local-mem-bw · flops / mem_bytes)`` (Workload::issue_comp; ops without bytes
    cost 0, as ASTRA-sim skips them); with it disabled, 1 ns (ASTRA-sim's replay of a node with no
    runtime). Memory-only ops move ``mem_bytes`` at local-mem-bw.
    """

    def __init__(self, network: AstraNetwork, system: AstraSystem, mode: str = "analytical"):
        if mode not in ("analytical", "flow"):
            raise ConfigError(f"network mode {mode!r}: expected analytical or flow")
        self.astra = network
        self.system = system
        self.mode = mode
        self.contention_aware = mode == "flow"
        self._coll = lru_cache(maxsize=65536)(self._collective_s)
        self._bundles: dict = {}
        self._links = _LinkTable(network)

    # ---------------------------------------------------------------- compute
    def compute_time_s(self, rank: int, op) -> float:
        s = self.system
        if op.flops > 0 and s.roofline_enabled:
            if op.mem_bytes <= 0:
                return 0.0
            perf = min(s.local_mem_bw_Bps * op.flops / op.mem_bytes, s.peak_perf_flops)
            return int(op.flops / perf * 1e9) * 1e-9
        if op.flops <= 0 and op.mem_bytes > 0 and s.local_mem_bw_Bps > 0:
            return int(op.mem_bytes / s.local_mem_bw_Bps * 1e9) * 1e-9
        return 1e-9

    # ---------------------------------------------------------------- communication
    def dims_of(self, ranks: tuple[int, ...]) -> tuple[int, ...] | None:
        """The dimensions a group spans, if it is exactly a sub-grid along them (else None)."""
        arr = np.asarray(ranks, dtype=np.int64)
        dims, stride = [], 1
        for d, dim in enumerate(self.astra.dims):
            coord = (arr // stride) % dim.npus
            if coord.min() != coord.max():
                dims.append(d)
            stride *= dim.npus
        dims = tuple(dims)
        expected = 1
        for d in dims:
            expected *= self.astra.dims[d].npus
        return dims if expected == len(set(ranks)) else None

    def _collective_s(self, kind: str, ranks: tuple[int, ...], size_bytes: float) -> float:
        n = len(ranks)
        if n <= 1 or size_bytes <= 0:
            return 0.0
        astra_kind, astra_size = kind, size_bytes
        if kind == "all_gather":
            astra_size = size_bytes / n       # ours: the gathered output; ASTRA-sim: one NPU's input
        elif kind in ("broadcast", "reduce"):
            astra_kind = "all_reduce"         # no analytical broadcast/reduce in ASTRA-sim; priced as all-reduce
        elif kind == "barrier":
            astra_kind, astra_size = "all_reduce", n
        dims = self.dims_of(ranks)
        if dims is None:
            return self._irregular_s(astra_kind, ranks, int(astra_size))
        return collective_ns(astra_kind, int(round(astra_size)), dims, self.astra, self.system) * 1e-9

    def _irregular_s(self, kind: str, ranks: tuple[int, ...], size: int) -> float:
        """A group that is not a sub-grid: one logical ring over its members on the slowest dimension it
        spans (ASTRA-sim builds a single-dimension plan for such communicator groups)."""
        addrs = [self.astra.address(r) for r in ranks]
        spanned = [d for d in range(len(self.astra.dims)) if len({a[d] for a in addrs}) > 1]
        slow = min(spanned, key=lambda d: self.astra.dims[d].bandwidth_Bps)
        base = self.astra.dims[slow]
        dim = Dimension("Ring", len(ranks), base.bandwidth_Bps, base.latency_s)
        net = AstraNetwork((dim,))
        return collective_ns(kind, size, (0,), net, self.system) * 1e-9

    def comm_time_s(self, request: CommRequest) -> float:
        if request.kind == "p2p":
            src, dst = request.ranks
            if src == dst or request.size_bytes <= 0:
                return 0.0
            a, b = self.astra.address(src), self.astra.address(dst)
            d = next(i for i in range(len(a)) if a[i] != b[i])
            dim = self.astra.dims[d]
            return message_ns(dim, dim.hops(a[d], b[d]), int(request.size_bytes)) * 1e-9
        return self._coll(request.kind, tuple(request.ranks), float(request.size_bytes))

    def network(self):
        """Flow mode: a max-min fair FlowNetwork over the dimensions' links (each communication alone takes
        its analytical time; concurrent ones sharing links slow each other down)."""
        if self.mode != "flow":
            raise NotImplementedError("the ASTRA-sim analytical model is congestion-unaware")
        from topologies.flow import FlowNetwork
        return FlowNetwork(self._links.capacity, self.bundle)

    def bundle(self, request: CommRequest):
        """BundleSpec of a request: its analytical time and the bytes it moves on each directed link.
        Images (other groups of the same family) lie on disjoint lines of the grid and load their own
        mirror links, so they add nothing here (the premise of symmetric mode)."""
        from topologies.flow import BundleSpec
        key = (request.kind, request.ranks, request.size_bytes)
        hit = self._bundles.get(key)
        if hit is not None:
            return hit
        T = self.comm_time_s(request)
        load: dict[int, float] = {}
        if request.kind == "p2p":
            src, dst = request.ranks
            if src != dst:
                for l in self._links.route(src, dst):
                    load[l] = load.get(l, 0.0) + request.size_bytes
        elif len(request.ranks) > 1 and request.size_bytes > 0:
            self._collective_load(request, load)
        links = np.fromiter(load.keys(), dtype=np.int64, count=len(load))
        nbytes = np.fromiter(load.values(), dtype=float, count=len(load))
        if T > 0 and len(links):
            over = float(np.max(nbytes / T / self._links.capacity[links]))
            if over > 1.0:      # concurrent chunks of the congestion-unaware model outrun a link: cap to it
                nbytes = nbytes / over
        spec = BundleSpec(T, links, nbytes, float(nbytes.max()) if len(nbytes) else 0.0)
        if len(self._bundles) > 100_000:
            self._bundles.clear()
        self._bundles[key] = spec
        return spec

    def _collective_load(self, request: CommRequest, load: dict) -> None:
        ranks = tuple(request.ranks)
        dims = self.dims_of(ranks)
        if dims is None:
            return                  # irregular group: priced, not routed
        kind, size, n = request.kind, request.size_bytes, len(ranks)
        if kind == "all_gather":
            size = size / n
        elif kind in ("broadcast", "reduce", "barrier"):
            kind = "all_reduce"
        splits = self.system.preferred_dataset_splits
        size = int(round(size))
        chunk = size // splits
        if kind != "all_gather" and self.astra.world_size > chunk:
            chunk = self.astra.world_size
            size = splits * chunk
        chunk = max(chunk, 1)
        streams = -(-size // chunk)
        data = chunk
        parts_l: list = []
        parts_b: list = []
        for d, pkind in chunk_phases(kind, list(dims), self.astra, self.system):
            dim = self.astra.dims[d]
            algo = self.system.algorithm(pkind, d)
            pattern = phase_traffic(pkind, algo, dim, data)
            _, data = phase_ns(pkind, algo, dim, data, self.system)
            src = np.asarray(ranks, dtype=np.int64)
            for off, nbytes in pattern:
                for ids in self._links.hops_along(d, src, off):
                    parts_l.append(ids)
                    parts_b.append(np.full(len(ids), nbytes * streams))
        if parts_l:
            links = np.concatenate(parts_l)
            uniq, inv = np.unique(links, return_inverse=True)
            sums = np.bincount(inv, weights=np.concatenate(parts_b), minlength=len(uniq))
            for l, b in zip(uniq.tolist(), sums.tolist()):
                load[l] = load.get(l, 0.0) + b

    def device_key(self, rank: int):
        return "npu"

    def peak_flops(self, rank: int) -> float:
        return self.system.peak_perf_flops or 1.0

    def memory_capacity_bytes(self, rank: int) -> float:
        return float("inf")


def network_of_cluster(cluster) -> AstraNetwork:
    """A multi-dimensional network approximating a cluster, for ASTRA-sim export and ``--network astra``:
    a torus scale-up domain gives one Ring dimension per torus axis (x fastest, as the torus builder numbers
    chips), any other domain one Switch dimension; the fabric between domains one Switch dimension. Each
    dimension takes the bottleneck bandwidth of the path between two neighbours along it, and its latency
    per hop (the path's latency over its hop count in that building block)."""
    dims: list[Dimension] = []
    stride = 1

    def add(kind: str, n: int, step: int, hops: int) -> None:
        links = cluster.route_ranks(0, step)
        dims.append(Dimension(kind, n, cluster.bottleneck_bytes_per_s(0, step),
                              cluster.path_latency_s(links) / hops))

    torus = getattr(cluster, "_torus", None)
    d0 = cluster.domain_size
    if torus is not None and d0 > 1:
        for n in torus[0]:
            if n > 1:
                add("Ring", n, stride, 1)
            stride *= n
    elif d0 > 1:
        add("Switch", d0, 1, 2)
        stride = d0
    if cluster.world_size > d0:
        add("Switch", cluster.world_size // d0, d0, 2)
    if not dims:
        raise ConfigError(f"cluster {cluster.name!r}: a single device has no network dimensions")
    return AstraNetwork(tuple(dims))


class ClusterMultiDimCostModel:
    """Any cluster priced as ASTRA-sim's analytical model would price it: compute (and everything else)
    from the cluster's own cost model, communication from ``MultiDimCostModel`` on
    ``network_of_cluster(cluster)`` with the system's per-dimension algorithms and chunking. Ranks map to
    NPUs through the cluster's placement."""

    contention_aware = False

    def __init__(self, base, cluster, system: AstraSystem):
        self.base = base
        self.cluster = cluster
        self.multidim = MultiDimCostModel(network_of_cluster(cluster), system)
        if self.multidim.astra.world_size != cluster.n_gpus:
            raise ConfigError(f"cluster {cluster.name!r}: {cluster.n_gpus} GPUs do not fill a grid of "
                              f"{' x '.join(str(d.npus) for d in self.multidim.astra.dims)}")

    def compute_time_s(self, rank: int, op) -> float:
        return self.base.compute_time_s(rank, op)

    def comm_time_s(self, request: CommRequest) -> float:
        gpus = tuple(self.cluster.gpu_of(r) for r in request.ranks)
        return self.multidim.comm_time_s(CommRequest(request.kind, gpus, request.size_bytes))

    def network(self):
        raise NotImplementedError("the ASTRA-sim analytical model is congestion-unaware")

    def device_key(self, rank: int):
        return self.base.device_key(rank)

    def peak_flops(self, rank: int) -> float:
        return self.base.peak_flops(rank)

    def memory_capacity_bytes(self, rank: int) -> float:
        return self.base.memory_capacity_bytes(rank)


class _LinkTable:
    """Directed links of a multi-dimensional network, numbered per dimension and line (the NPUs that
    differ only in that dimension): Ring 2n links (both directions), Switch n up- and n down-links,
    FullyConnected n·n. Capacity: the dimension's bandwidth (bytes/s)."""

    def __init__(self, network: AstraNetwork):
        self.network = network
        self.stride, self.base, self.per_line = [], [], []
        stride, base, caps = 1, 0, []
        world = network.world_size
        for d in network.dims:
            n = d.npus
            per_line = n * n if d.topology == "FullyConnected" else 2 * n
            self.stride.append(stride)
            self.base.append(base)
            self.per_line.append(per_line)
            count = world // n * per_line
            caps.append(np.full(count, d.bandwidth_Bps))
            base += count
            stride *= n
        self.capacity = np.concatenate(caps) if caps else np.zeros(0)

    def hops_along(self, d: int, src: np.ndarray, offset: int) -> list[np.ndarray]:
        """For NPUs ``src`` each sending to the NPU ``offset`` further along dimension ``d`` (modulo its
        size): one array of link ids per hop (the same route shape for all, vectorised ``route``)."""
        dim, stride = self.network.dims[d], self.stride[d]
        n = dim.npus
        a = (src // stride) % n
        line_base = src - a * stride
        first = self.base[d] + ((line_base % stride) + (line_base // (stride * n)) * stride) * self.per_line[d]
        b = (a + offset) % n
        if dim.topology == "Switch":
            return [first + a, first + n + b]
        if dim.topology == "FullyConnected":
            return [first + a * n + b]
        cw = offset % n
        if cw == 0:
            return []
        if cw <= n - cw:
            return [first + (a + k) % n for k in range(cw)]
        return [first + n + (a - k - 1) % n for k in range(n - cw)]

    def route(self, src: int, dst: int) -> list[int]:
        """Link ids from src to dst within the first dimension they differ in (as the analytical backend)."""
        net = self.network
        for d, dim in enumerate(net.dims):
            stride, n = self.stride[d], dim.npus
            a, b = (src // stride) % n, (dst // stride) % n
            if a != b:
                break
        else:
            return []
        line_base = src - a * stride
        line_no = (line_base % stride) + (line_base // (stride * n)) * stride
        first = self.base[d] + line_no * self.per_line[d]
        if dim.topology == "Switch":
            return [first + a, first + n + b]
        if dim.topology == "FullyConnected":
            return [first + a * n + b]
        cw = (b - a) % n
        if cw <= n - cw:
            return [first + (a + k) % n for k in range(cw)]
        return [first + n + (a - k - 1) % n for k in range(n - cw)]
