"""Fault and variability injection: stragglers, compute jitter, failed or degraded links, failing devices.

A ``FaultSpec`` says what is wrong; ``apply_faults`` turns it into what the engine consumes:

- stragglers (slowdown factor per rank, or drawn per rank with a seed) and jitter (a per-op random factor
  with mean 1 and coefficient of variation ``jitter``) wrap the cost model's compute time
  (``FaultyCostModel``, like ``simulator.costs.ScaledCostModel``); ops with a measured ``duration_s``
  (trace replay) keep their duration;
- failed links are removed from a copy of the cluster graph and degraded links get their bandwidth
  scaled; traffic is re-routed over the remaining paths by building a fresh cluster and cost model on
  the modified graph (``TopologyError`` naming the cut if some ranks can no longer reach each other);
- device failures become the engine's ``failures={rank: t_s}``: a step that cannot finish raises
  ``DeviceFailureError`` naming the ranks that hang and the collective they wait in (a watchdog's view).

Random draws are counter-based (a hash of seed, purpose, rank and op index), so a rank's straggler factor
does not depend on the world size and a run is reproducible bit for bit.

Stragglers and device failures keep symmetric (class) mode: a rank's slowdown factor and failure time are
part of its device key (``FaultyCostModel.device_key``), so class refinement (simulator.symmetry) gives such
a rank, and every rank whose timing it changes, a class of its own, and one representative per class still
reproduces the full simulation (a failure's watchdog report is fanned out to every member). Jitter and link
faults break it: ``breaks_symmetry(spec)`` tells the simulate pipeline to build full per-rank programs.

CLI strings (``clustersim.faults.parse_fault_options``): ``--straggler 5:1.2`` (repeatable), ``--straggler-dist lognormal:0.05``
or ``fraction:0.01:1.3``, ``--jitter 0.02``, ``--fail-link leaf.0:spine.0.1`` (repeatable; nodes are
written as their name parts joined by dots, a GPU by its integer id), ``--degrade-link A:B:0.5``,
``--fail-device 17@0.25`` (rank 17 dies 0.25 s into the step), ``--seed 1``.
YAML (``faults_from_dict``)::

    faults:
      stragglers: {5: 1.2}
      straggler_distribution: [lognormal, 0.05]     # or [fraction, 0.01, 1.3]
      jitter: 0.02
      link_failures: [["leaf.0", "spine.0.1"]]       # or "leaf.0:spine.0.1"
      link_degradation: {"leaf.0:spine.0.0": 0.5}
      device_failures: {17: 0.25}
      seed: 1

Units: seconds; factors are dimensionless (a straggler factor multiplies compute time, a degradation factor
multiplies link bandwidth).
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable

import numpy as np

from simulator.costs import CommRequest, CostModel
from simulator.errors import ConfigError, ResourceLimitError, TopologyError
from simulator.program import Op
from topologies.cluster import Cluster
from topologies.cost import ClusterCostModel

DISTRIBUTIONS = ("lognormal", "fraction")
MAX_FACTOR = 1e6      # a slowdown beyond this is a failed device, not a straggler: use device_failures
MAX_DRAWN_RANKS = 1 << 24   # per-rank draws are numpy arrays: ~16.8M ranks is ~1 GB of temporaries

# purposes of counter-based draws
_STRAGGLER = 1
_FRACTION = 2
_JITTER = 3
_JITTER_BY_CONTENT = 4


# ---------------------------------------------------------------------------------------------- random draws
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser (Steele et al. 2014) on uint64 arrays: a well-mixed hash of a counter."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & _M64
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _M64
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _M64
        return x ^ (x >> np.uint64(31))


def uniform_draws(seed: int, purpose: int, rank: int | np.ndarray, index: np.ndarray | int = 0) -> np.ndarray:
    """Uniform (0, 1) numbers, a pure function of (seed, purpose, rank, index) (vectorised over arrays)."""
    r = np.asarray(rank, dtype=np.uint64)
    i = np.asarray(index, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = _splitmix64(np.uint64(seed & 0xFFFFFFFFFFFFFFFF) ^ (np.uint64(purpose) << np.uint64(56)))
        h = _splitmix64(h ^ r)
        h = _splitmix64(h ^ (i * np.uint64(0xD1B54A32D192ED03) & _M64))
    return ((h >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


def normal_draws(seed: int, purpose: int, rank, index) -> np.ndarray:
    """Standard normal numbers from two counter-based uniforms (Box-Muller)."""
    i = np.asarray(index, dtype=np.int64) * 2
    u1 = uniform_draws(seed, purpose, rank, i)
    u2 = uniform_draws(seed, purpose, rank, i + 1)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def lognormal_mean_one(z: np.ndarray, cv: float) -> np.ndarray:
    """Lognormal factors with mean 1 and coefficient of variation ``cv`` from standard normals ``z``."""
    s2 = math.log1p(cv * cv)
    return np.exp(math.sqrt(s2) * z - s2 / 2.0)


# ---------------------------------------------------------------------------------------------- the spec
def _node(text: Any, where: str) -> Hashable:
    """A graph node from its written form: ``17`` -> 17 (a GPU), ``leaf.3`` -> ("leaf", 3),
    ``spine.0.5`` -> ("spine", 0, 5); lists/tuples (YAML) are taken part by part."""
    if isinstance(text, bool):
        raise ConfigError(f"{where}: {text!r} is not a node name")
    if isinstance(text, int):
        return text
    if isinstance(text, (list, tuple)) and text and all(isinstance(p, (str, int)) and not isinstance(p, bool)
                                                        for p in text):
        return tuple(text)
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{where}: {text!r} is not a node name (write a GPU as 17, a switch as leaf.3 or "
                          f"spine.0.5)")
    parts = text.strip().split(".")
    if len(parts) == 1:
        p = parts[0]
        return int(p) if p.lstrip("-").isdigit() else p
    if any(not p for p in parts):
        raise ConfigError(f"{where}: {text!r} is not a node name (empty part)")
    return tuple([parts[0]] + [int(p) if p.lstrip("-").isdigit() else p for p in parts[1:]])


def node_label(node: Hashable) -> str:
    """The written form of a node (inverse of the parser): ("spine", 0, 5) -> spine.0.5."""
    if isinstance(node, tuple):
        return ".".join(str(p) for p in node)
    return str(node)


def _link(value: Any, where: str) -> tuple[Hashable, Hashable]:
    if isinstance(value, str):
        parts = value.split(":")
        if len(parts) != 2:
            raise ConfigError(f"{where}: link {value!r} must be written NODE_A:NODE_B (e.g. leaf.0:spine.0.1)")
        value = parts
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ConfigError(f"{where}: link {value!r} must be a pair of nodes [A, B] or 'A:B'")
    a, b = _node(value[0], where), _node(value[1], where)
    if a == b:
        raise ConfigError(f"{where}: link {value!r} joins a node to itself")
    return (a, b)


def _once(link: tuple, field: str, seen: dict) -> None:
    """Refuse a link named a second time (A:B and B:A are one link) among a fault spec's failures and
    degradations: one of the two would silently win."""
    key = frozenset(link)
    if key in seen:
        name = f"{node_label(link[0])}:{node_label(link[1])}"
        where = f"twice in {field}" if seen[key] == field else f"in both {seen[key]} and {field}"
        raise ConfigError(f"faults: link {name} is named {where} (A:B and B:A are one link); name each link once")
    seen[key] = field


def parse_rank(value: Any, where: str) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ConfigError(f"{where}: rank must be an integer >= 0, got {value!r}")
    if value > 10**9:
        raise ConfigError(f"{where}: rank {value} is unreasonably large")
    return int(value)


def _rank_map(mapping, where: str, what: str, **number_kw) -> dict[int, float]:
    """Validate a {rank: number} mapping (ranks unique, numbers checked by ``_number``), sorted by rank."""
    if not isinstance(mapping, dict):
        raise ConfigError(f"{where}: expected a mapping rank -> {what}")
    out: dict[int, float] = {}
    for r, v in mapping.items():
        rank = parse_rank(r, where)
        if rank in out:
            raise ConfigError(f"{where}: rank {rank} given twice")
        out[rank] = _number(v, f"{where}[{rank}]", **number_kw)
    return dict(sorted(out.items()))


def _number(value: Any, where: str, *, lo: float = 0.0, lo_open: bool = True, hi: float = math.inf,
            hi_open: bool = False) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{where}: expected a number, got {value!r}") from None
    ok = math.isfinite(v) and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    if not ok:
        lo_s = f"{'>' if lo_open else '>='} {lo:g}"
        hi_s = "" if hi == math.inf else f" and {'<' if hi_open else '<='} {hi:g}"
        raise ConfigError(f"{where}: expected a finite number {lo_s}{hi_s}, got {value!r}")
    return v


@dataclass(frozen=True)
class FaultSpec:
    """What is wrong with the cluster during the simulated step.

    stragglers              rank -> compute slowdown factor (1.2: every compute op takes 20% longer)
    straggler_distribution  per-rank factors drawn with ``seed``: ("lognormal", sigma) -> exp(sigma·Z)
                            (median 1: device-to-device speed variation) or ("fraction", p, factor) ->
                            each rank is a straggler with probability p. Explicit ``stragglers`` win.
    jitter                  coefficient of variation of every compute op's time (mean-one lognormal factor
                            drawn per (rank, op), seeded)
    link_failures           (node, node) links that are down; traffic re-routes over the rest
    link_degradation        (node, node) -> bandwidth factor in (0, 1] (0.5: half bandwidth)
    device_failures         rank -> time (s, from the step's start) the device dies
    seed                    seed of every random draw
    """

    stragglers: dict = field(default_factory=dict)
    straggler_distribution: tuple | None = None
    jitter: float = 0.0
    link_failures: tuple = ()
    link_degradation: dict = field(default_factory=dict)
    device_failures: dict = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self):
        w = "faults"
        object.__setattr__(self, "stragglers", _rank_map(self.stragglers, f"{w}.stragglers", "slowdown factor",
                                                          hi=MAX_FACTOR))
        object.__setattr__(self, "straggler_distribution", _check_distribution(self.straggler_distribution))
        object.__setattr__(self, "jitter", _number(self.jitter, f"{w}.jitter", lo_open=False, hi=10.0))
        lf = self.link_failures
        if isinstance(lf, (str, dict)) or not isinstance(lf, Iterable):
            raise ConfigError(f"{w}.link_failures: expected a list of links [A, B] or 'A:B'")
        links = tuple(_link(x, f"{w}.link_failures") for x in lf)
        seen: dict[frozenset, str] = {}         # each link once, whichever way round and whatever befalls it
        for link in links:
            _once(link, "faults.link_failures", seen)
        object.__setattr__(self, "link_failures", links)
        if not isinstance(self.link_degradation, dict):
            raise ConfigError(f"{w}.link_degradation: expected a mapping link -> bandwidth factor")
        deg = {}
        for k, f in self.link_degradation.items():
            link = _link(k, f"{w}.link_degradation")
            _once(link, "faults.link_degradation", seen)
            deg[link] = _number(f, f"{w}.link_degradation[{node_label(link[0])}:{node_label(link[1])}]", hi=1.0)
        object.__setattr__(self, "link_degradation", deg)
        object.__setattr__(self, "device_failures", _rank_map(self.device_failures, f"{w}.device_failures",
                                                               "failure time (s)", lo_open=False))
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or not 0 <= self.seed < 2**63:
            raise ConfigError(f"{w}.seed: expected an integer in [0, 2^63), got {self.seed!r}")

    @property
    def empty(self) -> bool:
        return not (self.stragglers or self.straggler_distribution or self.jitter or self.link_failures
                    or self.link_degradation or self.device_failures)

    def to_dict(self) -> dict:
        """The YAML form (what ``faults_from_dict`` reads back)."""
        d: dict = {}
        if self.stragglers:
            d["stragglers"] = dict(self.stragglers)
        if self.straggler_distribution:
            d["straggler_distribution"] = list(self.straggler_distribution)
        if self.jitter:
            d["jitter"] = self.jitter
        if self.link_failures:
            d["link_failures"] = [f"{node_label(a)}:{node_label(b)}" for a, b in self.link_failures]
        if self.link_degradation:
            d["link_degradation"] = {f"{node_label(a)}:{node_label(b)}": f for (a, b), f in
                                     self.link_degradation.items()}
        if self.device_failures:
            d["device_failures"] = dict(self.device_failures)
        d["seed"] = self.seed
        return d

    def compute_factors(self, world_size: int) -> dict[int, float]:
        """rank -> compute slowdown factor (only ranks whose factor is not 1)."""
        out: dict[int, float] = {}
        dist = self.straggler_distribution
        if dist:
            if world_size > MAX_DRAWN_RANKS:
                raise ResourceLimitError(f"faults.straggler_distribution: drawing factors for {world_size:,} ranks "
                                         f"exceeds {MAX_DRAWN_RANKS:,}; list the stragglers explicitly")
            ranks = np.arange(world_size)
            if dist[0] == "lognormal":
                f = np.exp(dist[1] * normal_draws(self.seed, _STRAGGLER, ranks, 0))
            else:
                hit = uniform_draws(self.seed, _FRACTION, ranks, 0) < dist[1]
                f = np.where(hit, dist[2], 1.0)
            out = {int(r): float(x) for r, x in zip(ranks, f) if x != 1.0}
        for r, x in self.stragglers.items():
            if x == 1.0:
                out.pop(r, None)
            else:
                out[r] = x
        return out


def _check_distribution(dist) -> tuple | None:
    w = "faults.straggler_distribution"
    if dist is None or dist == () or dist == []:
        return None
    if isinstance(dist, str):
        dist = dist.split(":")
    if not isinstance(dist, (list, tuple)) or not dist or not isinstance(dist[0], str):
        raise ConfigError(f"{w}: expected [lognormal, sigma] or [fraction, p, factor], got {dist!r}")
    name = dist[0].strip().lower()
    if name == "lognormal":
        if len(dist) != 2:
            raise ConfigError(f"{w}: lognormal takes one parameter (sigma), e.g. lognormal:0.05")
        return ("lognormal", _number(dist[1], f"{w} sigma", lo_open=False, hi=5.0))
    if name == "fraction":
        if len(dist) != 3:
            raise ConfigError(f"{w}: fraction takes a probability and a factor, e.g. fraction:0.01:1.3")
        return ("fraction", _number(dist[1], f"{w} p", lo_open=False, hi=1.0),
                _number(dist[2], f"{w} factor", hi=MAX_FACTOR))
    raise ConfigError(f"{w}: unknown distribution {dist[0]!r}; known: {', '.join(DISTRIBUTIONS)}")


#: the command-line option of each field (clustersim.faults), for messages about either spelling
CLI_OPTION = {"stragglers": "--straggler", "straggler_distribution": "--straggler-dist", "jitter": "--jitter",
              "link_failures": "--fail-link", "link_degradation": "--degrade-link", "device_failures": "--fail-device",
              "seed": "--seed"}

FIELDS = ("stragglers", "straggler_distribution", "jitter", "link_failures", "link_degradation",
          "device_failures", "seed")


def inert_fault_notes(spec: FaultSpec) -> list[str]:
    """Notes for faults that change nothing as given: a seed with nothing random to draw, a straggler factor of
    1, a distribution that draws only factors of 1, a link left at full bandwidth."""
    notes = []
    dist = spec.straggler_distribution
    flat = dist is not None and (dist[1] == 0 if dist[0] == "lognormal" else (dist[1] == 0 or dist[2] == 1))
    if spec.seed and (dist is None or flat) and not spec.jitter:
        notes.append(f"seed {spec.seed} draws nothing: no random fault (a straggler distribution or jitter) is set")
    ones = sorted(r for r, f in spec.stragglers.items() if f == 1)
    if ones:
        notes.append(f"straggler factor 1 on rank(s) {', '.join(map(str, ones[:8]))}: they run as the others do")
    if flat:
        notes.append(f"straggler distribution {':'.join(map(str, dist))} draws only factors of 1: it changes nothing")
    whole = [k for k, f in spec.link_degradation.items() if f == 1]
    if whole:
        notes.append(f"{len(whole)} link(s) degraded to a factor of 1 keep their full bandwidth")
    return notes


def faults_from_dict(d: Any, where: str = "faults") -> FaultSpec:
    """A FaultSpec from the YAML ``faults:`` mapping (keys with dashes or underscores)."""
    if d is None:
        return FaultSpec()
    if isinstance(d, FaultSpec):
        return d
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: expected a mapping (stragglers, jitter, link_failures, ...), "
                          f"got {type(d).__name__}")
    kw = {}
    for k, v in d.items():
        key = k.replace("-", "_") if isinstance(k, str) else k
        if key not in FIELDS:
            raise ConfigError(f"{where}: unknown key {k!r}; known: {', '.join(FIELDS)}")
        if v is None:
            continue
        if key == "seed":
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"{where}.seed: expected an integer, got {v!r}")
        kw[key] = v
    try:
        return FaultSpec(**kw)
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg if where == "faults" else f"{where}: {msg}") from None


def breaks_symmetry(faults: FaultSpec) -> bool:
    """True when the spec makes per-class simulation invalid, so full mode is needed: jitter (a factor per
    rank and op) or a link fault (it changes some groups' routes but not their images'). Stragglers and
    device failures do not: a rank's slowdown factor and failure time are part of its device key, so class
    refinement (simulator.symmetry) gives such ranks, and every rank whose timing they change, classes of
    their own (the engine reports a failure's hung ranks member by member)."""
    return bool(faults.jitter or faults.link_failures or faults.link_degradation)


# ---------------------------------------------------------------------------------------------- cost model
class FaultyCostModel:
    """Wrap a cost model: compute time × straggler factor of the rank × jitter factor of the op.

    Jitter draws are a pure function of (seed, rank, op index) once ``bind(programs)`` was called; without
    it, of (seed, rank, the op's identity within its rank: name, stream, deps, layer, micro-batch, phase),
    so they never depend on the order or number of calls (runs can repeat with the same model).
    """

    def __init__(self, base: CostModel, factors: dict[int, float] | None = None, jitter: float = 0.0, seed: int = 0,
                 fail_at: dict[int, float] | None = None):
        self.base = base
        self.factors = dict(factors or {})
        self.fail_at = dict(fail_at or {})    # rank -> seconds at which its device dies (a class key only)
        self.jitter = float(jitter)
        self.seed = int(seed)
        self.contention_aware = bool(getattr(base, "contention_aware", False))
        self._index: dict[int, dict[int, int]] | None = None   # rank -> id(op) -> index
        self._jit: dict[int, np.ndarray] = {}

    def bind(self, programs) -> "FaultyCostModel":
        """Key jitter by op index in ``programs`` (call after building the programs, before running)."""
        if self.jitter:
            self._index = {r: {id(op): i for i, op in enumerate(prog)} for r, prog in programs.ops.items()}
            self._jit = {r: lognormal_mean_one(normal_draws(self.seed, _JITTER, r, np.arange(len(prog))),
                                               self.jitter) for r, prog in programs.ops.items()}
        return self

    def jitter_factor(self, rank: int, index: int) -> float:
        """The jitter factor of op ``index`` of ``rank`` (1 without jitter)."""
        if not self.jitter:
            return 1.0
        arr = self._jit.get(rank)
        if arr is not None and index < len(arr):
            return float(arr[index])
        return float(lognormal_mean_one(normal_draws(self.seed, _JITTER, rank, np.array([index])), self.jitter)[0])

    def compute_time_s(self, rank: int, op: Op) -> float:
        t = self.base.compute_time_s(rank, op) * self.factors.get(rank, 1.0)
        if self.jitter:
            idx = None
            if self._index is not None:
                idx = self._index.get(rank, {}).get(id(op))
            if idx is not None:
                t *= self.jitter_factor(rank, idx)
            else:
                key = zlib.crc32(repr((op.name, op.stream, op.deps, op.layer, op.microbatch, op.phase)).encode())
                z = normal_draws(self.seed, _JITTER_BY_CONTENT, rank, np.array([key]))
                t *= float(lognormal_mean_one(z, self.jitter)[0])
        return t

    def comm_time_s(self, request: CommRequest) -> float:
        return self.base.comm_time_s(request)

    def network(self):
        return self.base.network()

    def device_key(self, rank: int) -> Hashable:
        """What makes ranks differ for class refinement: the device, the straggler factor, the rank itself
        under jitter, and when the device dies (a failing rank gets a class of its own)."""
        return (self.base.device_key(rank), self.factors.get(rank, 1.0), rank if self.jitter else None,
                self.fail_at.get(rank))

    def peak_flops(self, rank: int) -> float:
        return self.base.peak_flops(rank)

    def memory_capacity_bytes(self, rank: int) -> float:
        return self.base.memory_capacity_bytes(rank)

    def __getattr__(self, name):      # anything else (cluster, calibration ...) comes from the base model
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)


# ---------------------------------------------------------------------------------------------- apply
def apply_faults(cost_model: CostModel, cluster, faults: FaultSpec, world_size: int, programs=None
                 ) -> tuple[CostModel, dict[int, float]]:
    """(cost model with the faults, engine ``failures`` dict). ``cluster`` is needed for link faults only.

    Ranks named in the spec must be < ``world_size``. Pass ``programs`` (or call ``.bind(programs)`` on the
    returned model) to key jitter draws by op index."""
    if not isinstance(faults, FaultSpec):
        faults = faults_from_dict(faults)
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size <= 0:
        raise ConfigError(f"faults: world size must be a positive integer, got {world_size!r}")
    for what, ranks in (("stragglers", faults.stragglers), ("device_failures", faults.device_failures)):
        bad = [r for r in ranks if r >= world_size]
        if bad:
            raise ConfigError(f"faults.{what} ({CLI_OPTION[what]}): rank(s) {bad[:8]} do not exist (world size "
                              f"{world_size}, ranks 0..{world_size - 1})")
    cost = cost_model
    if faults.link_failures or faults.link_degradation:
        cost = apply_link_faults(cost_model, cluster, faults)
    factors = faults.compute_factors(world_size)
    if factors or faults.jitter or faults.device_failures:
        cost = FaultyCostModel(cost, factors, faults.jitter, faults.seed, faults.device_failures)
        if programs is not None:
            cost.bind(programs)
    return cost, dict(faults.device_failures)


def apply_link_faults(cost_model, cluster, faults: FaultSpec):
    """A fresh cost model on a copy of ``cluster`` whose failed links are removed and degraded links slowed
    (see ``faulted_cluster``), built like ``cost_model`` (same network mode, calibration, algorithm)."""
    new_cluster = faulted_cluster(cluster, faults)
    rebuild = getattr(cost_model, "with_cluster", None)
    if rebuild is not None:
        return rebuild(new_cluster)
    if not isinstance(cost_model, ClusterCostModel):
        raise ConfigError(f"faults: link failures and degradation need the cluster's own network model "
                          f"(--network analytical or flow); {type(cost_model).__name__} (e.g. --network astra, a "
                          f"multi-dimensional view of the cluster) has no links to fail")
    return ClusterCostModel(new_cluster, network=cost_model.network_mode, calibration=cost_model.calibration,
                            algorithm=cost_model.algorithm,
                            compute_efficiency=None if cost_model.kernels is not None else cost_model.compute_efficiency,
                            efficiency=cost_model.efficiency, call_overhead_s=cost_model.call_overhead_s,
                            step_latency_s=cost_model.step_latency_s,
                            calibration_scope=cost_model.calibration_scope)


def _edge_of(graph, link, where: str):
    a, b = link
    if a not in graph:
        raise TopologyError(f"{where}: no node {node_label(a)!r} in the cluster (switches are written like "
                            f"leaf.0, spine.0.1, core.0.2, nvswitch.3; GPUs by index)")
    if not graph.has_edge(a, b):
        near = sorted((node_label(n) for n in graph.neighbors(a)), key=str)
        raise TopologyError(f"{where}: no link {node_label(a)}:{node_label(b)} in the cluster; {node_label(a)} "
                            f"links to {', '.join(near[:8])}{' ...' if len(near) > 8 else ''}")
    return a, b


_FABRIC_KINDS = ("leaf", "spine", "core")


def _trunk_keys(graph, a, b) -> list | None:
    """Directed link-table keys of a fabric edge (aggregated trunks), or None for a plain edge."""
    ka, kb = graph.nodes[a].get("kind"), graph.nodes[b].get("kind")
    if ka not in _FABRIC_KINDS or kb not in _FABRIC_KINDS:
        return None
    pair = {ka: a, kb: b}
    if "leaf" in pair and "spine" in pair:
        leaf = pair["leaf"][1]
        return [("up", leaf), ("down", leaf)]
    if "spine" in pair and "core" in pair:
        pod = pair["spine"][1]
        return [("podup", pod), ("poddown", pod)]
    raise TopologyError(f"link {node_label(a)}:{node_label(b)} joins two {ka} switches; not a fat-tree link")


def faulted_cluster(cluster, faults: FaultSpec):
    """A copy of ``cluster`` with ``faults``' link failures and degradations applied.

    The graph is copied (failed edges removed, degraded edges' ``bandwidth`` scaled) and so is the flow-level
    link table: a plain edge's two directed links get the new bandwidth; a leaf-spine or spine-core edge is
    one member of an ECMP trunk, whose capacity loses what the edge lost (ECMP spreads traffic over the
    remaining uplinks). Routes that would cross a link left with no capacity are re-routed along a
    shortest remaining path of the graph (e.g. a GPU whose NIC link died reaches the fabric through a
    peer's NIC over NVLink, as NCCL's PXN does). Raises TopologyError naming the cut if some placed GPUs
    can no longer reach the others."""
    import networkx as nx
    if cluster is None or not isinstance(getattr(cluster, "graph", None), nx.Graph):
        raise ConfigError("faults: link failures and degradation need a cluster with a network graph "
                          "(topologies.load_cluster)")
    g = cluster.graph.copy()
    cap = list(cluster.link_capacity)
    changes: dict[frozenset, tuple] = {}
    for link in faults.link_failures:
        a, b = _edge_of(g, link, "faults.link_failures")
        changes[frozenset((a, b))] = (a, b, 0.0)
    for link, f in faults.link_degradation.items():
        a, b = _edge_of(g, link, "faults.link_degradation")
        changes[frozenset((a, b))] = (a, b, f)          # (FaultSpec names each link once)
    removed = []
    from topologies.builders import MIN_LINK_BPS
    for a, b, f in changes.values():
        old = float(g.edges[a, b]["bandwidth"])
        new = old * f
        if 0.0 < new < MIN_LINK_BPS:
            raise ConfigError(f"faults: link {node_label(a)}:{node_label(b)} degraded by {f:g} keeps {new:g} B/s, "
                              f"below the {MIN_LINK_BPS:g} B/s any link carries; to take it down, fail it "
                              f"(--fail-link)")
        trunks = _trunk_keys(g, a, b)
        if trunks is None:
            for key in ((a, b), (b, a)):
                cap[cluster.link_id[key]] = new
        else:
            for key in trunks:
                i = cluster.link_id[key]
                cap[i] = max(0.0, cap[i] - (old - new))
                if cap[i] <= old * 1e-9:
                    cap[i] = 0.0
        if f == 0.0:
            g.remove_edge(a, b)
            removed.append((a, b))
        else:
            g.edges[a, b]["bandwidth"] = new
    placed = set(cluster.placement)
    comps = [c & placed for c in nx.connected_components(g)]
    comps = sorted((c for c in comps if c), key=lambda c: (len(c), min(c)))
    if len(comps) > 1:
        cut = ", ".join(f"{node_label(a)}:{node_label(b)}" for a, b in removed)
        small = sorted(comps[0])
        raise TopologyError(
            f"link failures cut the network: with {cut} down, GPU(s) {small[:16]}{' ...' if len(small) > 16 else ''} "
            f"can no longer reach the other {len(placed) - len(small)} GPU(s) ({len(comps)} disconnected parts); "
            f"fail fewer links")
    out = FaultedCluster.__new__(FaultedCluster)
    out.__dict__.update(cluster.__dict__)
    out.graph = g
    out.link_capacity = cap
    out._routes = {}
    out.faults = faults
    out.rerouted = 0
    return out


class FaultedCluster(Cluster):
    """A Cluster with failed / degraded links (see ``faulted_cluster``); routes avoid dead links."""

    def _route(self, src, dst):
        try:
            r = super()._route(src, dst)
        except TopologyError:
            r = None
        if r is not None and all(self.link_capacity[i] > 0 for i in r):
            return r
        self.rerouted += 1
        return self._graph_route(src, dst)

    def _graph_route(self, src, dst) -> list[int]:
        import networkx as nx
        try:
            path = nx.shortest_path(self.graph, src, dst)
        except (nx.NetworkXNoPath, nx.NodeNotFound):
            raise TopologyError(f"cluster {self.name!r}: no path from {node_label(src)} to {node_label(dst)} "
                                f"after link failures") from None
        out = []
        for u, v in zip(path, path[1:]):
            trunks = _trunk_keys(self.graph, u, v)
            if trunks is None:
                out.append(self.link_id[(u, v)])
                continue
            up = self.graph.nodes[u].get("kind") in ("leaf",) or (
                self.graph.nodes[u].get("kind") == "spine" and self.graph.nodes[v].get("kind") == "core")
            out.append(self.link_id[trunks[0] if up else trunks[1]])
        return out

    def __repr__(self) -> str:
        return f"<Cluster {self.name} {self.n_gpus}x{self.accelerator.name} with link faults>"
