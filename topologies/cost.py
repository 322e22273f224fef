"""``ClusterCostModel``: the engine's cost model (simulator.costs.CostModel) on a ``Cluster``.

Compute: roofline ``max(flops / achieved FLOP/s, mem_bytes / achieved HBM bytes/s)``. Achieved FLOP/s is
the calibration's fit for the device when there is one (peak · F/(F+F½)), else peak dense bf16 ×
``DEFAULT_COMPUTE_EFFICIENCY``; achieved HBM bandwidth is the device's measured streaming rate
(``kernel_cost.stream_bandwidth``: BabelStream where measured, else peak × ``DEFAULT_MEMORY_EFFICIENCY``). Ops of a
transformer layer (``op.layer`` set) use the calibration's layer fit for their phase when it has one
(measured whole-layer forward / backward times: ``(F + F½) / peak``), still bounded below by memory time.

Communication (``comm_model``): "nccl" (default) prices NVIDIA clusters with NCCL's own model
(topologies.nccl: algorithm and protocol chosen per size by NCCL's tuner, channels, per-protocol latency and
bandwidth); "links" (and every cluster NCCL does not run on: TPU ICI, Ascend UB, optical) uses the
algorithms of topologies.collectives on the cluster's routes, alpha-beta with the bottleneck link (cost
``A + S·K`` per group and algorithm, cached), the fastest chosen per call or a named one. Either way the
route-level algorithm's link loads feed the flow network. A calibration fit for (kind, group size,
scope intra|inter) replaces the predicted time.

Calibration scope: only fits measured on the cluster's device (``topologies.specs.same_device``: "NVIDIA H100
80GB HBM3" is H100-SXM) and collective fits of its backend (``collective_backend``) apply; a calibration
whose compute fits cover another device only, or whose collective fits cover another backend only, is refused
unless ``calibration_scope="any"``. ``calibration_notes`` lists what applies.
Networks: ``analytical`` (no contention), ``flow``
(max-min fair sharing, topologies.flow), ``ideal`` (communication is free).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Hashable

import numpy as np

from simulator.calibration import Calibration
from simulator.costs import CommRequest
from simulator.errors import ConfigError, TopologyError
from simulator.program import BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, COLLECTIVE_KINDS, FORWARD, Op
from topologies.cluster import Cluster
from topologies import nccl
from topologies.collectives import ALGORITHMS, AUTO
from topologies.flow import BundleSpec, FlowNetwork, UncontendedNetwork
from topologies.kernel_cost import MEMORY_EFFICIENCY, KernelPricer
from topologies.variation import GPU_SPEED_SIGMA, MAX_SIGMA, slowest_gpu_factor
from topologies.specs import AcceleratorSpec, same_device

NETWORKS = ("analytical", "flow", "ideal")
COMM_MODELS = ("nccl", "links")
# NCCL algorithm -> the route-level algorithm (topologies.collectives) whose link loads stand for it in the
# flow network; NCCL_ONLY: names only the NCCL model knows
_LINK_ALGO = {"ring": "ring", "tree": "tree", "nvls": "nvls", "nvls_tree": "hierarchical", "pat": "ring",
              "collnet_direct": "hierarchical", "collnet_chain": "hierarchical"}
NCCL_ONLY = ("nvls_tree", "pat", "collnet_direct", "collnet_chain")
_BACKWARD_PHASES = (BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT)

# Fraction of peak dense bf16 FLOP/s a large GEMM reaches without calibration. Source: large bf16 GEMMs
# in cuBLAS reach ~70-80 % of the dense peak on A100/H100 (NVIDIA's published cuBLAS / Transformer
# Engine GEMM benchmarks; e.g. ~230 of 312 TFLOPS on A100). A single-kernel figure, deliberately not an
# end-to-end MFU: bubbles, communication and small ops are what the simulator adds on top.
DEFAULT_COMPUTE_EFFICIENCY = 0.75
# Fraction of peak HBM bandwidth streaming kernels reach on a device without its own BabelStream measurement:
# kernel_cost's figure (one constant for both models; the flat what-if roofline uses it on every device).
DEFAULT_MEMORY_EFFICIENCY = MEMORY_EFFICIENCY

# Protocol efficiency per link type: the fraction of line rate a collective library moves.
# nvlink 0.80: nccl-tests ring all_reduce on 8x A100 / 8x H100 (NVSwitch) reports busbw ~230-240 of
#   300 GB/s and ~360-370 of 450 GB/s per direction (NVIDIA nccl-tests results and DGX performance docs).
# ib 0.90: NCCL's InfiniBand transport reaches ~45 of 50 GB/s per 400 Gb/s NIC (~22-23 of 25 on HDR) in
#   multi-node nccl-tests.
# ethernet 0.80, pcie 0.75: RoCE/socket transports and PCIe peer-to-peer fall further below line rate
#   (PCIe Gen4 x16 NCCL busbw ~22-25 of 32 GB/s).
# ici, ub 0.80: no library figures published; assumed NVLink-like. Calibration overrides all of these.
DEFAULT_EFFICIENCY = {"nvlink": 0.80, "ib": 0.90, "ethernet": 0.80, "pcie": 0.75, "ici": 0.80, "ub": 0.80}

# Latency (alpha). Per call: NCCL's tuning model base latency for rings (src/graph/tuning.cc, baseLat
# Ring/LL, 6.6 us). Per algorithm step by the slowest link type on the step's path: NCCL tuning.cc
# hwLat for Ring/LL: NVLink 0.6 us, PCI 1.0 us, NET 2.7 us (ICI/UB taken as NVLink). These are NCCL's
# low-latency-protocol figures while bandwidth uses the efficiencies above (its bandwidth protocols):
# the lower envelope NCCL's per-size protocol choice follows. Link latencies on the path add to them.
CALL_OVERHEAD_S = 6.6e-6
STEP_LATENCY_S = {"nvlink": 0.6e-6, "ici": 0.6e-6, "ub": 0.6e-6, "pcie": 1.0e-6, "ib": 2.7e-6, "ethernet": 2.7e-6}

# The torch.distributed backend a vendor's devices talk over (what calibration fits record as ``backend``):
# NVIDIA GPUs use NCCL, Huawei Ascend HCCL (torch_npu), Google TPUs XLA collectives (torch_xla), CPUs gloo.
VENDOR_BACKEND = {"NVIDIA": "nccl", "Huawei": "hccl", "Google": "xla", "cpu": "gloo"}


def collective_backend(acc: AcceleratorSpec) -> str:
    """The collective backend of a cluster of ``acc`` devices (nccl for an unknown vendor)."""
    return VENDOR_BACKEND.get(acc.vendor, "nccl")


def _device_fit(lookup, acc):
    """A calibration fit for accelerator ``acc``: by its spec name, else by a name the device reports
    (``device_names``: a collector's calibration is keyed by torch's device name)."""
    for name in (acc.name,) + tuple(acc.device_names):
        fit = lookup(name)
        if fit is not None:
            return fit
    return None


class _AlgoCost:
    """Cost of one algorithm on one group: time(S) = A + S·K; ``links``/``coef``: bytes per byte of S
    on each directed link, all phases together (computed on first use when only A and K were needed)."""

    __slots__ = ("name", "A", "K", "_links", "_coef", "_make", "_bound")

    def __init__(self, name, A, K, links=None, coef=None, make=None):
        self.name, self.A, self.K, self._links, self._coef, self._make = name, A, K, links, coef, make
        self._bound = None

    def time_s(self, size: float) -> float:
        return self.A + size * self.K

    def _fill(self) -> None:
        self._links, self._coef = self._make()
        self._make = None

    @property
    def links(self) -> np.ndarray:
        if self._links is None:
            self._fill()
        return self._links

    @property
    def coef(self) -> np.ndarray:
        if self._coef is None:
            self._fill()
        return self._coef


class ClusterCostModel:
    """Topology-aware cost model (simulator.costs.CostModel protocol).

    network            "analytical" | "flow" | "ideal"
    calibration        measured compute / collective fits (override the defaults)
    algorithm          force a collective algorithm (ring, tree, hierarchical, nvls, direct, torus; NCCL's
                       nvls_tree, pat, collnet_direct, collnet_chain) where it applies; None = pick the fastest
    protocol           force NCCL's protocol (ll, ll128, simple); None = NCCL's choice
    comm_model         "nccl" (default) or "links" (see the module docstring)
    compute_efficiency fraction of peak FLOP/s when no calibration fit (default DEFAULT_COMPUTE_EFFICIENCY)
    efficiency         {link type: protocol efficiency} overriding DEFAULT_EFFICIENCY
    calibration_scope  "matching" (fits of the cluster's device and backend only) | "any" (see module doc)
    nccl_version       NCCL release whose tuning model prices collectives ("2.18.5"); None = the newest
    gpu_variation      relative std of one GPU's sustained speed; the job's compute runs at its slowest GPU's
                       pace (topologies.variation). None = GPU_SPEED_SIGMA on GPUs (SM architectures), 0
                       elsewhere; 0 turns it off. Not applied with an explicit compute_efficiency (what-if).
    """

    def __init__(self, cluster: Cluster, network: str = "analytical", calibration: Calibration | None = None,
                 algorithm: str | None = None, compute_efficiency: float | None = None,
                 efficiency: dict | None = None, call_overhead_s: float = CALL_OVERHEAD_S,
                 step_latency_s: dict | None = None, protocol: str | None = None, comm_model: str = "nccl",
                 calibration_scope: str = "matching", nccl_version: str | None = None,
                 gpu_variation: float | None = None):
        if network not in NETWORKS:
            raise ConfigError(f"unknown network mode {network!r}; known: {', '.join(NETWORKS)}")
        if algorithm is not None:
            algorithm = nccl.ALGO_ALIASES.get(str(algorithm).lower(), algorithm)
        if algorithm is not None and algorithm not in ALGORITHMS and algorithm not in NCCL_ONLY:
            raise ConfigError(f"unknown collective algorithm {algorithm!r}; known: "
                              f"{', '.join(sorted(set(ALGORITHMS) | set(NCCL_ONLY)))}")
        if protocol is not None:
            if str(protocol).lower() not in nccl.PROTO_ALIASES:
                raise ConfigError(f"unknown NCCL protocol {protocol!r}; known: ll, ll128, simple")
            protocol = nccl.PROTO_ALIASES[str(protocol).lower()]
        if comm_model not in COMM_MODELS:
            raise ConfigError(f"unknown communication model {comm_model!r}; known: {', '.join(COMM_MODELS)}")
        self.protocol = protocol
        self.comm_model = comm_model
        self.nccl_version = nccl_version
        self._nccl_release = nccl.parse_version(nccl_version)
        if nccl_version is not None and not nccl.C.OLDEST_RELEASE <= self._nccl_release:
            raise ConfigError(f"NCCL version {nccl_version!r}: the tuning models here are NCCL 2 releases from 2.18 on "
                              f"(2.18.x ... the newest 2.x); give such a release (e.g. 2.18.5 or 2.27.7), or leave the "
                              f"option out for the newest model")
        self._nccl_comms: dict = {}
        self._nccl_choices: dict = {}
        if compute_efficiency is not None and not (0 < compute_efficiency <= 1):
            raise ConfigError(f"compute_efficiency must be in (0, 1], got {compute_efficiency}")
        self.cluster = cluster
        self.network_mode = network
        self.contention_aware = network == "flow"
        self.calibration = calibration            # as given; self._cal holds the fits that apply
        self.calibration_scope = calibration_scope
        self.backend = collective_backend(cluster.accelerator)
        self._cal, self.calibration_notes = None, []
        if calibration is not None:
            acc = cluster.accelerator
            self._cal, self.calibration_notes = calibration.for_target(
                acc.name, lambda d: same_device(d, acc), self.backend, calibration_scope)
            if network == "ideal" and self._cal is not None and self._cal.collectives:
                # free communication: the collective fits price nothing (their note must not say they do)
                self.calibration_notes = [n for n in self.calibration_notes if "collective fit" not in n] + [
                    f"--network ideal makes every communication free: the calibration's "
                    f"{len(self._cal.collectives)} collective fits change nothing"]
        self.algorithm = algorithm
        # collective kinds the forced algorithm priced, and kinds where it did not apply to some group (there
        # NCCL's own choice, or the fastest route-level algorithm, priced them): forced_algorithm_note
        self.forced_applied: set[str] = set()
        self.forced_missed: set[str] = set()
        self.compute_efficiency = DEFAULT_COMPUTE_EFFICIENCY if compute_efficiency is None else compute_efficiency
        # NCCL's model carries the protocols' efficiency itself: under it the route-level loads bound
        # time at line rate (they bind where the fabric is narrower: oversubscription, faults, sharing)
        line_rate = comm_model == "nccl" and nccl.supports(cluster)
        base = {t: 1.0 for t in DEFAULT_EFFICIENCY} if line_rate else DEFAULT_EFFICIENCY
        self.efficiency = {**base, **(efficiency or {})}
        for t, e in self.efficiency.items():
            if not (0 < e <= 1):
                raise ConfigError(f"protocol efficiency for {t!r} must be in (0, 1], got {e}")
        self.call_overhead_s = call_overhead_s
        self.step_latency_s = {**STEP_LATENCY_S, **(step_latency_s or {})}
        types = cluster.link_type
        # per link: capacity x its type's protocol efficiency, its type's step latency (a lookup per type)
        kinds = set(types)
        eff = {t: self.efficiency.get(t, 1.0) for t in kinds}
        self.capacity = np.array(cluster.link_capacity, dtype=float)
        if any(e != 1.0 for e in eff.values()):
            self.capacity *= np.array(list(map(eff.__getitem__, types)), dtype=float)
        step = {t: self.step_latency_s.get(t, 0.0) for t in kinds}
        self._step_lat = list(map(step.__getitem__, types))
        self._cache: dict = {}
        self._shape_cache: dict = {}
        self._uniform_domains = self._domains_identical()
        self._image_cache: dict = {}
        self._paths: dict = {}
        self._time_cache: dict = {}
        self._sm_cache: dict = {}
        self._sm_shape_cache: dict = {}
        self._shape_time_cache: dict = {}
        self._compute_cache: dict = {}
        self._kl_times: dict = {}               # id(KernelList) -> (it, compute_time_s of an op launching it)
        self._bundle_cache: dict = {}
        acc = cluster.accelerator
        self._compute_fit = self._cal.compute[0] if self._cal is not None and self._cal.compute else None
        # per-layer fits (layer benchmark): price ops that belong to a transformer layer, by phase
        self._layer_fits = {f.phase: f for f in (self._cal.layers if self._cal is not None else ())}
        self._flops_per_s = acc.peak_bf16_flops * self.compute_efficiency
        # kernel-level model (topologies.kernel_cost) for ops that carry their kernels; an explicit
        # compute_efficiency keeps the flat roofline (what-if studies)
        self.kernels = KernelPricer(acc, self._compute_fit) if compute_efficiency is None else None
        # memory-bound ops stream at the kernel model's rate (the device's measured BabelStream rate where there
        # is one, kernel_cost.stream_bandwidth); the flat what-if model at the datasheet x DEFAULT_MEMORY_EFFICIENCY
        self._mem_per_s = (self.kernels.mem_per_s if self.kernels is not None
                           else acc.hbm_bytes_per_s * DEFAULT_MEMORY_EFFICIENCY)
        if gpu_variation is not None and not (isinstance(gpu_variation, (int, float))
                                              and 0 <= gpu_variation < MAX_SIGMA):
            raise ConfigError(f"gpu_variation (relative std of GPU speed) must be in [0, {MAX_SIGMA}), "
                              f"got {gpu_variation!r}")
        self.gpu_variation = gpu_variation
        sigma = (GPU_SPEED_SIGMA if acc.sm_count > 0 else 0.0) if gpu_variation is None else float(gpu_variation)
        #: compute-time multiplier: the slowest of the job's GPUs sets the pace (1.0 under a flat what-if model)
        self.slowest_gpu_factor = (slowest_gpu_factor(cluster.world_size, sigma)
                                   if compute_efficiency is None else 1.0)
        self._sigma = sigma

    def with_cluster(self, cluster: Cluster) -> "ClusterCostModel":
        """The same model (every setting) on another cluster (e.g. one with failed or degraded links). The
        kernel-level compute model stays: ``compute_efficiency`` is passed on only where a flat roofline
        was asked for (it always holds a number, and a number selects the flat what-if model)."""
        return ClusterCostModel(cluster, network=self.network_mode, calibration=self.calibration,
                                algorithm=self.algorithm,
                                compute_efficiency=None if self.kernels is not None else self.compute_efficiency,
                                efficiency=self.efficiency, call_overhead_s=self.call_overhead_s,
                                step_latency_s=self.step_latency_s, protocol=self.protocol,
                                comm_model=self.comm_model, calibration_scope=self.calibration_scope,
                                nccl_version=self.nccl_version, gpu_variation=self.gpu_variation)

    def calibration_summary(self) -> str:
        """One short line: which calibration fits price this cluster ("none" without a calibration)."""
        if self._cal is None:
            return "none"
        c = self._cal
        parts = [f"compute of {c.compute[0].device!r}"] if c.compute else []
        parts += [f"{len(c.layers)} layer fits"] if c.layers else []
        parts += [f"{len(c.collectives)} collective fits ({', '.join(sorted({f.backend for f in c.collectives}))})"
                  ] if c.collectives else []
        forced = any("forced" in n for n in self.calibration_notes)
        return (", ".join(parts) or "no fits apply") + (" [forced]" if forced else "")

    def _domains_identical(self) -> bool:
        """Star domains (one switch per domain) whose every device link has the same capacity and latency."""
        c = self.cluster
        if c.domain_switch(0) is None:
            return False
        codes = c._link_codes()
        if codes is not None:             # the device links are codes 0 and 1 (GPU <-> its domain switch)
            on = codes[0] <= 1
            cap, lat = self.capacity[on], np.asarray(c.link_latency, dtype=float)[on]
            return bool((cap == cap[0]).all() and (lat == lat[0]).all()) if len(cap) else True
        seen = set()
        cap, lat = self.capacity, c.link_latency
        for i, nm in enumerate(c.link_name):
            if (isinstance(nm, tuple) and len(nm) == 2 and any(isinstance(x, int) for x in nm) and
                    any(isinstance(x, tuple) and x and x[0] in ("nvswitch", "pcie", "ub") for x in nm)):
                seen.add((float(cap[i]), lat[i]))
                if len(seen) > 1:
                    return False
        return True

    # ------------------------------------------------------------------ compute
    def compute_time_s(self, rank: int, op: Op) -> float:
        if op.duration_s is not None:
            return op.duration_s
        if not (type(rank) is int and 0 <= rank < self.cluster.world_size):
            self.cluster.gpu_of(rank)           # raises the unplaced-rank error
        kl = op.kernels
        if kl is not None and not self._layer_fits:
            # the engine asks once per compute op (millions in full mode); ops share their kernel lists
            # (a template's ops, copies): the whole answer below, remembered per list object
            hit = self._kl_times.get(id(kl))
            if hit is not None and hit[0] is kl:
                return hit[1]
        layer_fit = self._layer_fit_for(op)
        if layer_fit is None and kl is not None and self.kernels is not None:
            t = self.kernels.time_s(kl) * self.slowest_gpu_factor
            if self._compute_fit is not None:
                t += self._compute_fit.op_overhead_s     # calibrated framework time per program op
            if not self._layer_fits:
                if len(self._kl_times) > 100_000:
                    self._kl_times.clear()
                self._kl_times[id(kl)] = (kl, t)
            return t
        key = (op.flops, op.mem_bytes, layer_fit is not None and layer_fit.phase)
        t = self._compute_cache.get(key)
        if t is None:
            if layer_fit is not None:
                # measured whole-layer time: norms, attention, elementwise kernels and dispatch included
                t = max(layer_fit.time_s(op.flops), op.mem_bytes / self._mem_per_s if op.mem_bytes else 0.0)
            else:
                if self._compute_fit is not None:
                    rate = self._compute_fit.achieved_flops_per_s(op.flops)
                else:
                    rate = self._flops_per_s
                t = max(op.flops / rate if op.flops else 0.0,
                        op.mem_bytes / self._mem_per_s if op.mem_bytes else 0.0)
            t *= self.slowest_gpu_factor
            if self._compute_fit is not None:
                t += self._compute_fit.op_overhead_s     # calibrated framework time per program op
            if len(self._compute_cache) > 100_000:
                self._compute_cache.clear()
            self._compute_cache[key] = t
        return t

    def _layer_fit_for(self, op: Op):
        if self._layer_fits and op.layer is not None:
            return self._layer_fits.get(FORWARD if op.phase == FORWARD else BACKWARD
                                        if op.phase in _BACKWARD_PHASES else None)
        return None

    def prices_by_kernels(self, op: Op) -> bool:
        """Whether ``op`` is priced by its kernels (not a measured duration, a layer fit or the flat model)."""
        return (self.kernels is not None and op.kernels is not None and op.duration_s is None
                and self._layer_fit_for(op) is None)

    def pricing(self) -> dict:
        """Which calibration and curves price compute on this cluster (every result reports it)."""
        d = {"calibration": (self.calibration.source or "given") if self.calibration is not None else None,
             "calibration_compute_fit": self._compute_fit.device if self._compute_fit is not None else None,
             "calibration_layer_fits": sorted(self._layer_fits)}
        if self.kernels is not None:
            d["kernels"] = self.kernels.describe()
        else:
            d["flat_compute_efficiency"] = self.compute_efficiency
        d["gpu_variation"] = {"sigma": self._sigma, "gpus": self.cluster.world_size,
                              "slowest_gpu_factor": self.slowest_gpu_factor,
                              "source": "topologies.variation (ml-engineering: 5% MAMF spread on an 8-GPU node)"}
        return d

    def gemm_rate(self, dtype: str = "bf16") -> str | None:
        """How this cluster's GEMMs of ``dtype`` are rated (KernelPricer.gemm_rate); None without the kernel
        model (a flat compute efficiency)."""
        return None if self.kernels is None else self.kernels.gemm_rate(dtype)

    def best_kernel_flops_per_s(self, dtype: str = "bf16") -> float:
        """The highest FLOP/s any kernel of a ``dtype`` plan reaches on this device (a bound for search
        pruning): BF16 GEMMs at the calibration's GEMM peak or the curve's sustained peak, FP8 GEMMs at
        theirs (attention and elementwise kernels are slower than GEMMs)."""
        if self.kernels is None:
            return 0.0
        g = self.kernels._gemm
        best = (self._compute_fit.peak_flops_per_s if self._compute_fit is not None
                else g["bf16"].params.eta * g["bf16"].peak_flops_per_s)
        if dtype == "fp8":
            best = max(best, g["fp8"].params.eta * g["fp8"].peak_flops_per_s)
        return best

    def device_key(self, rank: int) -> Hashable:
        return self.cluster.device(rank).name

    def device_keys(self, n: int) -> list:
        """``device_key`` of ranks 0 .. n-1 (symmetry refinement asks for every rank): one device per cluster."""
        if type(self).device_key is not ClusterCostModel.device_key or type(self.cluster).device is not Cluster.device:
            return [self.device_key(r) for r in range(n)]
        if n:
            self.cluster.gpu_of(n - 1)          # every rank placed (else the TopologyError device_key raises)
        return [self.cluster.accelerator.name] * n

    def peak_flops(self, rank: int) -> float:
        return self.cluster.device(rank).peak_bf16_flops

    def memory_capacity_bytes(self, rank: int) -> float:
        return self.cluster.device(rank).hbm_bytes

    # ------------------------------------------------------------------ communication
    def _gpus(self, request: CommRequest, ranks=None) -> tuple:
        ranks = request.ranks if ranks is None else ranks
        if request.kind not in COLLECTIVE_KINDS and request.kind != "p2p":
            raise ConfigError(f"unknown communication kind {request.kind!r}; known: "
                              f"{', '.join(COLLECTIVE_KINDS + ('p2p',))}")
        if request.kind == "p2p" and len(ranks) != 2:
            raise ConfigError(f"p2p request needs ranks=(src, dst), got {ranks}")
        if not (request.size_bytes >= 0 and math.isfinite(request.size_bytes)):
            raise ConfigError(f"communication size must be >= 0 bytes, got {request.size_bytes}")
        gpu_of = self.cluster.gpu_of
        gpus = tuple(gpu_of(r) for r in ranks)
        if request.kind != "p2p" and len(set(gpus)) != len(gpus):
            raise ConfigError(f"{request.kind} group {tuple(ranks)[:16]} names a rank twice")
        return gpus

    def _algo_cost(self, kind: str, gpus: tuple, name: str) -> _AlgoCost | None:
        key = (kind, gpus, name)
        if key in self._cache:
            return self._cache[key]
        shape = self._shape_key(kind, gpus, name)
        if shape is not None and shape in self._shape_cache:
            ak = self._shape_cache[shape]
            res = None if ak is None else _AlgoCost(name, ak[0], ak[1],
                                                    make=lambda: self._moved_links(kind, gpus, name, ak))
            if res is not None:
                res._bound = ak[2]
        else:
            ev = self._evaluate(kind, gpus, name)
            res = None if ev is None else _AlgoCost(name, *ev)
            if shape is not None:
                self._shape_cache[shape] = None if ev is None else (ev[0], ev[1], self._bound_per_byte(res), gpus, res)
        self._cache[key] = res
        return res

    def _moved_links(self, kind: str, gpus: tuple, name: str, ak: tuple):
        """(links, coef) of algorithm ``name`` on ``gpus``, a group of the same shape as ``ak``'s (the first
        priced): that group's links moved onto these by the cluster's automorphism (``Cluster.map_links``),
        the same bytes on each; evaluated afresh where the cluster cannot map them."""
        ref_gpus, ref = ak[3], ak[4]
        moved = self.cluster.map_links(ref.links, ref_gpus, gpus) if len(ref.links) else None
        if moved is None:
            return self._evaluate(kind, gpus, name)[2:]
        return moved, ref.coef

    def _shape_key(self, kind: str, gpus: tuple, name: str):
        """Groups inside one domain of a cluster whose star domains are identical cost the same wherever
        they sit: key them by their positions inside the domain. Groups across domains of a fat tree whose
        links of each kind are alike: by ``Cluster.comm_shape`` (an automorphism maps one onto the other,
        routes onto routes of the same links' kinds, so every algorithm's A and K are the same)."""
        if not self._uniform_domains:
            return None
        ds = self.cluster.domain_size
        base = gpus[0] // ds * ds
        local = tuple(g - base for g in gpus)
        if min(local) >= 0 and max(local) < ds:
            return (kind, name, local)
        if not self._uniform_links():
            return None
        shape = self.cluster.comm_shape(gpus)
        return None if shape is None else (kind, name, "across domains", shape)

    def _uniform_links(self) -> bool:
        """Every link of each kind (GPU <-> domain switch, GPU <-> leaf, leaf trunks, pod trunks: the link
        codes) has the same capacity and latency, as the cluster was built (no link changed since)."""
        hit = self.__dict__.get("_links_alike")
        if hit is None:
            codes = self.cluster._link_codes() if getattr(self.cluster, "faults", None) is None else None
            hit = codes is not None
            if hit:
                code = codes[0]
                lat = np.asarray(self.cluster.link_latency, dtype=float)
                # (without an index output np.unique imports numpy.ma: ~20 ms of a short command)
                for c in np.unique(code, return_index=True)[0].tolist():
                    on = code == c
                    cap, la = self.capacity[on], lat[on]
                    hit = hit and bool((cap == cap[0]).all() and (la == la[0]).all())
            self._links_alike = hit
        return hit

    def _evaluate(self, kind: str, gpus: tuple, name: str):
        """(A, K, links, coef) of algorithm ``name`` on ``gpus``, or None where it does not apply."""
        cap = self.capacity
        if name == "p2p":
            links, a = self._path(gpus[0], gpus[1])
            if kind != "p2p" or not links:
                return None
            K = max(1.0 / cap[l] for l in links)
            return (self.call_overhead_s + a, K, np.array(links, dtype=np.int64), np.ones(len(links)))
        phases = ALGORITHMS[name](self.cluster, gpus, kind)
        if phases is None:
            return None
        path = self._path
        A, K, total = self.call_overhead_s, 0.0, {}
        for ph in phases:
            load: dict = {}
            alpha = 0.0
            for src, dst, coef in ph.flows:
                links, a = path(src, dst)
                if not links:
                    continue
                if a > alpha:
                    alpha = a
                for l in links:
                    load[l] = load.get(l, 0.0) + coef
            if load:
                ids = np.fromiter(load.keys(), dtype=np.int64, count=len(load))
                co = np.fromiter(load.values(), dtype=float, count=len(load))
                K += float(np.max(co / cap[ids]))
                for l, c in load.items():
                    total[l] = total.get(l, 0.0) + c
            A += ph.steps * alpha
        return (A, K, np.fromiter(total.keys(), dtype=np.int64, count=len(total)),
                np.fromiter(total.values(), dtype=float, count=len(total)))

    def _path(self, src, dst):
        """(links, alpha): the route and its per-step latency (link latencies + the library's step latency
        for the slowest link type on it). Cached."""
        key = (src, dst)
        hit = self._paths.get(key)
        if hit is None:
            links = self.cluster.route(src, dst)
            lat, slat = self.cluster.link_latency, self._step_lat
            a = (sum(map(lat.__getitem__, links)) + max(map(slat.__getitem__, links))) if links else 0.0
            hit = self._paths[key] = (links, a)
        return hit

    def _candidates(self, kind: str, gpus: tuple) -> tuple:
        names = AUTO.get(kind, ())
        d = self.cluster.domain_spec
        if d.kind == "optical" and kind in ("all_gather", "reduce_scatter", "all_reduce"):
            names = names + ("direct",)
        return names

    def _choose(self, kind: str, gpus: tuple, size: float) -> _AlgoCost | None:
        if len(gpus) <= 1 or (kind == "p2p" and gpus[0] == gpus[1]):
            return None
        if kind == "p2p":
            return self._algo_cost("p2p", gpus, "p2p")
        forced = self.algorithm
        choice = self.nccl_choice(kind, gpus, size)
        if choice is not None:          # the route-level stand-in of NCCL's pick carries its link loads
            forced = _LINK_ALGO[choice.algorithm]
            if forced in ("ring", "tree") and len({g // self.cluster.domain_size for g in gpus}) > 1:
                forced = "rings" if forced == "ring" else "hierarchical"
        elif forced in NCCL_ONLY:
            forced = _LINK_ALGO[forced]
        if forced is not None:
            c = self._algo_cost(kind, gpus, forced)
            if choice is None:
                (self.forced_missed if c is None else self.forced_applied).add(kind)
            if c is not None:
                return c
        best = None
        for name in self._candidates(kind, gpus):
            c = self._algo_cost(kind, gpus, name)
            if c is not None and (best is None or c.time_s(size) < best.time_s(size)):
                best = c
        if best is None:
            raise TopologyError(f"no collective algorithm for {kind} on ranks {gpus[:8]}")
        return best

    def _calibrated(self, kind: str, gpus: tuple, size: float) -> float | None:
        if self._cal is None:
            return None
        ds = self.cluster.domain_size
        scope = "intra" if len({g // ds for g in gpus}) == 1 else "inter"
        fit = (self._cal.collective_fit(kind, len(gpus), scope, self.backend)
               or self._cal.collective_fit(kind, len(gpus), scope))
        return None if fit is None else fit.time_s(size, len(gpus))

    def _bound_per_byte(self, algo: _AlgoCost) -> float:
        """Seconds per byte no schedule of ``algo``'s traffic beats: its busiest link's bytes (all phases
        together, as a pipelined library overlaps them) over that link's capacity."""
        if algo._bound is None and algo.name == "p2p":
            algo._bound = algo.K                # one flow, one phase: its bottleneck is the bound
        if algo._bound is None:
            co = algo.coef
            algo._bound = float(np.max(co / self.capacity[algo.links])) if len(co) else 0.0
        return algo._bound

    def _nccl_comm(self, gpus: tuple):
        """NCCL's view of the group (topologies.nccl.Comm), None where the NCCL model does not apply."""
        if self.comm_model != "nccl":
            return None
        shape = nccl.group_shape(self.cluster, gpus)
        comm = self._nccl_comms.get(shape, False)
        if comm is False:
            comm = nccl.comm_for_shape(self.cluster, *shape)
            if comm is not None and self._nccl_release:
                comm = dataclasses.replace(comm, version=self._nccl_release)
            self._nccl_comms[shape] = comm
        return comm

    def nccl_choice(self, kind: str, gpus: tuple, size: float):
        """NCCL's (algorithm, protocol) choice and time (topologies.nccl.Choice) for a collective of ``kind``
        NCCL runs (all_reduce, all_gather, reduce_scatter, broadcast, reduce; barrier as a 1-byte
        all_reduce), honouring a forced algorithm / protocol; None where the NCCL model does not apply."""
        if kind == "barrier":
            kind, size = "all_reduce", 1.0
        if kind not in nccl.NCCL_KINDS or len(gpus) < 2:
            return None
        key = (kind, gpus, size)
        if key in self._nccl_choices:
            return self._nccl_choices[key]
        comm = self._nccl_comm(gpus)
        c = None if comm is None else self._nccl_pick(comm, kind, size, gpus)
        if len(self._nccl_choices) > 200_000:
            self._nccl_choices.clear()
        self._nccl_choices[key] = c
        return c

    def _nccl_pick(self, comm, kind: str, size: float, gpus: tuple):
        algo = self.algorithm
        if algo in nccl.ROUTE_LEVEL_ALGORITHMS:
            if self._algo_cost(kind, gpus, algo) is not None:
                return None                 # the route-level algorithm prices this group (links model)
            # it cannot run on this group: NCCL's own choice, as without --algorithm (not the fastest route)
            self.forced_missed.add(kind)
            algo = None
        c = nccl.choose(comm, kind, size, algo, self.protocol)
        if algo is not None:
            (self.forced_missed if c is None else self.forced_applied).add(kind)
        if c is None and (algo is not None or self.protocol is not None):
            c = nccl.choose(comm, kind, size)             # forced one does not apply here: NCCL's default
        return c

    def _nccl_time(self, kind: str, gpus: tuple, size: float) -> float | None:
        if kind == "all_to_all" or kind == "p2p":
            comm = self._nccl_comm(gpus)
            if comm is None:
                return None
            if kind == "p2p":
                ds = self.cluster.domain_size
                return nccl.p2p_time_s(comm, size, inter_node=gpus[0] // ds != gpus[1] // ds)
            return nccl.all_to_all_time_s(comm, size)
        c = self.nccl_choice(kind, gpus, size)
        return None if c is None else c.time_s

    def _time(self, request: CommRequest, gpus: tuple) -> tuple[float, _AlgoCost | None]:
        algo = self._choose(request.kind, gpus, request.size_bytes)
        if algo is None:
            return 0.0, None
        t = self._calibrated(request.kind, gpus, request.size_bytes)
        if t is None:
            t = self._nccl_time(request.kind, gpus, request.size_bytes)
            if t is not None:
                # never faster than the routes' bottleneck links allow (fabric shape, oversubscription,
                # failed or degraded links, which NCCL's per-node model does not see)
                t = max(t, request.size_bytes * self._bound_per_byte(algo))
                if request.kind == "p2p":           # + the route's wire latency (hops)
                    t += self.cluster.path_latency_s(self._path(gpus[0], gpus[1])[0])
        return (algo.time_s(request.size_bytes) if t is None else t), algo

    def forced_algorithm_note(self) -> str | None:
        """What became of a forced ``algorithm``: a note where it did not price every collective (None where it
        did, or where none is forced)."""
        if self.algorithm is None or not self.forced_missed:
            return None
        missed = ", ".join(sorted(self.forced_missed))
        if not self.forced_applied:
            return (f"--algorithm {self.algorithm} applies to none of this run's collectives ({missed}): NCCL's own "
                    f"choice (or the fastest route-level algorithm) priced them")
        return (f"--algorithm {self.algorithm} priced {', '.join(sorted(self.forced_applied))}, but not every group's "
                f"{missed} (it does not apply there): those ran NCCL's own choice (or the fastest route-level "
                f"algorithm)")

    def comm_time_s(self, request: CommRequest) -> float:
        """Uncontended seconds of a collective or transfer (0 with network="ideal")."""
        key = (request.kind, request.ranks, request.size_bytes)
        t = self._time_cache.get(key)
        if t is None:
            gpus = self._gpus(request)
            if self.network_mode == "ideal":
                t = 0.0
            else:
                # groups the cluster maps onto each other cost the same: price one of each shape
                shape = self.cluster.comm_shape(gpus) if self._uniform_domains else None
                skey = None if shape is None else (request.kind, shape, request.size_bytes)
                t = None if skey is None else self._shape_time_cache.get(skey)
                if t is None:
                    t = self._time(request, gpus)[0]
                    if skey is not None:
                        if len(self._shape_time_cache) > 200_000:
                            self._shape_time_cache.clear()
                        self._shape_time_cache[skey] = t
            if len(self._time_cache) > 200_000:
                self._time_cache.clear()
            self._time_cache[key] = t
        return t

    def comm_times_s(self, kind: str, groups, size_bytes: float) -> list[float]:
        """``comm_time_s`` of the same communication on each of ``groups`` (rank tuples, or an array with a
        row per group), pricing one group per shape (``Cluster.comm_shape``, found for all groups at once)
        where the cluster has shapes: what symmetry refinement asks of every member's transfers and groups."""
        c = self.cluster
        arrays = self._shape_arrays()
        try:
            ranks = np.asarray(groups, dtype=np.int64)
        except ValueError:                      # groups of different sizes
            ranks = np.zeros(0, dtype=np.int64)
        if (self.network_mode == "ideal" or arrays is None or ranks.ndim != 2 or ranks.shape[1] < 2
                or (kind == "p2p" and ranks.shape[1] != 2) or not len(ranks) or ranks.min() < 0
                or ranks.max() >= c.world_size):
            rows = groups.tolist() if isinstance(groups, np.ndarray) else groups
            return [self.comm_time_s(CommRequest(kind, tuple(g), size_bytes)) for g in rows]
        # the groups' shapes do not depend on the kind (but for p2p) or the size: found once per table of
        # groups (refinement prices each class's groups at several sizes)
        memo = self.__dict__.setdefault("_shape_rows", {})
        mkey = (kind == "p2p", ranks.shape, ranks.tobytes())
        hit = memo.get(mkey)
        if hit is None:
            if len(memo) > 1024:
                memo.clear()
            hit = memo[mkey] = self._group_shapes(kind, ranks, arrays)
        first, inv = hit
        times = [self.comm_time_s(CommRequest(kind, tuple(ranks[i].tolist()), size_bytes)) for i in first]
        return np.asarray(times)[inv].tolist()

    @staticmethod
    def _group_shapes(kind: str, ranks: np.ndarray, arrays) -> tuple[list, np.ndarray]:
        """(a row of each shape, each row's shape) of the rank groups ``ranks`` (a row each)."""
        gpn, rail_opt, placement, leaf_of, pod_of = arrays
        gpus = placement[ranks]
        node, loc = gpus // gpn, gpus % gpn
        if kind == "p2p":
            order = lambda v: np.sign(v[:, 1] - v[:, 0]) + 1      # noqa: E731  (comm_shape's _pair of a pair)
            last = order(loc) if rail_opt else loc[:, 0] * gpn + loc[:, 1]
            key = ((order(node) * 3 + order(leaf_of[gpus])) * 3 + order(pod_of[gpus])) * gpn * gpn + last
            _, first, inv = np.unique(key, return_index=True, return_inverse=True)
        else:       # comm_shape of every group: each member's (node, unit, pod, local index) ranked in its row
            cols = [_row_ranks(node), _row_ranks(leaf_of[gpus]), _row_ranks(pod_of[gpus]),
                    _row_ranks(loc) if rail_opt else loc]
            M = np.ascontiguousarray(np.concatenate(cols, axis=1))
            rows = M.view(np.dtype((np.void, M.dtype.itemsize * M.shape[1]))).reshape(-1)    # a row as bytes
            _, first, inv = np.unique(rows, return_index=True, return_inverse=True)
        return first.tolist(), inv.reshape(-1)

    def _shape_arrays(self):
        """(GPUs per node, rail-optimised, placement, unit and pod of each GPU) as arrays where
        ``comm_time_s`` prices by ``Cluster.comm_shape``; else None."""
        c = self.cluster
        if not self._uniform_domains or getattr(c, "faults", None) is not None:
            return None
        hit = self.__dict__.get("_shape_arr")
        if hit is None or hit[0] is not c.placement:
            c.comm_shape((0,))
            lay = c.__dict__.get("_shape_layout")
            arr = None if lay is None else (lay[0], lay[1], np.asarray(c.placement, dtype=np.int64),
                                            np.asarray(lay[2], dtype=np.int64), np.asarray(lay[3], dtype=np.int64))
            hit = self._shape_arr = (c.placement, arr)
        return hit[1]

    def comm_sm_fraction(self, request: CommRequest) -> float:
        """Share of each member GPU's SMs the communication's kernels hold while it runs. NCCL launches one
        thread block per channel (src/enqueue.cc), each on its own SM, so compute overlapped with it runs on
        the other SMs: collectives hold the channels NCCL launches at that size (topologies.nccl), an
        all-to-all the communicator's channels, a send/recv 2 (NCCL_NCHANNELS_PER_NET_PEER's default).
        0 where no NCCL model applies (ideal network, calibrated times, CPUs, route-level algorithms)."""
        sms = getattr(self.cluster.accelerator, "sm_count", 0)
        if not sms or self.network_mode == "ideal" or len(request.ranks) < 2:
            return 0.0
        key = (request.kind, request.ranks, request.size_bytes)
        f = self._sm_cache.get(key)
        if f is None:
            gpus = self._gpus(request)
            # the share is a function of (kind, NCCL's group shape, size): a calibrated fit is chosen by
            # the kind, the group's size and whether it spans nodes; NCCL's channels by its Comm, which
            # nccl.group_shape alone determines. Priced once per shape (distinct groups: ~35 k at 16k GPUs)
            skey = (request.kind, nccl.group_shape(self.cluster, gpus), request.size_bytes)
            f = self._sm_shape_cache.get(skey)
            if f is None:
                f = self._sm_shape_cache[skey] = self._sm_fraction(request.kind, gpus, request.size_bytes, sms)
            if len(self._sm_cache) > 200_000:
                self._sm_cache.clear()
            self._sm_cache[key] = f
        return f

    def _sm_fraction(self, kind: str, gpus: tuple, size: float, sms: int) -> float:
        """``comm_sm_fraction`` of a communication of ``kind`` and ``size`` on ``gpus``, priced afresh."""
        ch = 0
        if self._calibrated(kind, gpus, size) is None:
            if kind == "p2p":
                ch = 2 if self._nccl_comm(gpus) is not None else 0
            elif kind == "all_to_all":
                comm = self._nccl_comm(gpus)
                ch = 0 if comm is None else nccl.comm_channels(comm, nccl.graphs(comm))
            else:
                c = self.nccl_choice(kind, gpus, size)
                ch = 0 if c is None else c.channels
        return min(1.0, ch / sms)

    def algorithm_for(self, request: CommRequest) -> str:
        """Name of the algorithm the model uses for ``request`` ("none" when nothing moves)."""
        gpus = self._gpus(request)
        if self.network_mode == "ideal":
            return "ideal"
        algo = self._choose(request.kind, gpus, request.size_bytes)
        if algo is None:
            return "none"
        choice = self.nccl_choice(request.kind, gpus, request.size_bytes)
        name = algo.name if choice is None else choice.algorithm
        if self._calibrated(request.kind, gpus, request.size_bytes) is not None:
            return f"{name} (calibrated time)"
        return name

    def protocol_for(self, request: CommRequest) -> str:
        """NCCL protocol the model uses for ``request`` ("-" where the NCCL model does not price it)."""
        gpus = self._gpus(request)
        if self.network_mode == "ideal" or len(gpus) < 2:
            return "-"
        if request.kind == "p2p":
            return "-" if self._nccl_comm(gpus) is None else ("ll" if request.size_bytes <= nccl.C.P2P_LL_THRESHOLD_BYTES
                                                              else "simple")
        choice = self.nccl_choice(request.kind, gpus, request.size_bytes)
        return "-" if choice is None else choice.protocol

    def bundle(self, request: CommRequest):
        """(T seconds, link ids, bytes per link, reference bytes of one flow) of a request and its images,
        for the flow network."""
        key = (request.kind, request.ranks, request.size_bytes, id(request.images))
        hit = self._bundle_cache.get(key)
        if hit is not None and hit[0] is request.images:
            return hit[1]
        out = self._bundle(request)
        if len(self._bundle_cache) > 1_000_000:    # full mode at 16k GPUs: ~10^5 distinct requests
            self._bundle_cache.clear()
        self._bundle_cache[key] = (request.images, out)
        return out

    def _bundle(self, request: CommRequest):
        gpus = self._gpus(request)
        if self.network_mode == "ideal":
            return BundleSpec(0.0, np.zeros(0, dtype=np.int64), np.zeros(0), 0.0)
        T, algo = self._time(request, gpus)
        if algo is None:
            return BundleSpec(T, np.zeros(0, dtype=np.int64), np.zeros(0), 0.0)
        S = request.size_bytes
        scale = S
        if T > 0 and len(algo.links):
            # a calibrated T may be faster than the links allow: the representative alone never demands
            # more than a link holds (so it finishes in T when alone)
            over = float(np.max(algo.coef * S / T / self.capacity[algo.links]))
            if over > 1.0:
                scale = S / over
        ref = float(np.max(algo.coef)) * scale if len(algo.coef) else 0.0      # one flow of the representative
        if not request.images:
            return BundleSpec(T, algo.links, algo.coef * scale, ref)
        links, coef = self._with_images(request, algo)
        return BundleSpec(T, links, coef * scale, ref)

    def _with_images(self, request: CommRequest, algo: _AlgoCost):
        """Links and bytes-per-byte of a communication and its images together (cached per images tuple).

        Images are symmetric copies running the same algorithm. When they share links (spine trunks ...)
        every member's links are kept, which is exactly what a full launch of all of them loads. When they
        are link-disjoint from the representative and from each other, each image link mirrors one of the
        representative's, which carries the same constraint (symmetric mode's premise: the other
        communications load the images' links as they load the representative's), so nothing is added."""
        key = (request.kind, request.ranks, request.size_bytes, algo.name, id(request.images))
        hit = self._image_cache.get(key)
        if hit is not None and hit[0] is request.images:
            return hit[1], hit[2]
        parts_l, parts_c = [algo.links], [algo.coef]
        images = request.images
        if request.kind == "p2p":       # a pair's route carries each of its bytes once: no algorithm to price
            flat = self._image_routes(images)
            parts_l.append(flat)
            parts_c.append(np.ones(len(flat)))
            images = ()
        elif len({len(img) for img in images}) == 1:
            # images that an automorphism of the cluster maps the group onto (whole domains, rails) use
            # the mapped links with the same bytes (Cluster.translate_links); the others are priced below
            gpus = self._gpus(request)
            moved = self.cluster.translate_links(algo.links, gpus, self._gpus_of_images(request, images))
            if moved is not None:
                parts_l.append(moved.ravel())
                parts_c.append(np.tile(algo.coef, len(images)))
                images = ()
        for img in images:
            g = self._gpus(request, img)
            a = self._algo_cost(request.kind, g, algo.name) if len(g) > 1 else None
            if a is None:
                a = self._choose(request.kind, g, request.size_bytes)
            if a is not None:
                parts_l.append(a.links)
                parts_c.append(a.coef)
        links = np.concatenate(parts_l)
        uniq, inv = np.unique(links, return_inverse=True)
        if len(uniq) == len(links):
            out = (algo.links, algo.coef)
        else:
            out = (uniq, np.bincount(inv, weights=np.concatenate(parts_c), minlength=len(uniq)))
        if len(self._image_cache) > 4096:
            self._image_cache.clear()
        self._image_cache[key] = (request.images, *out)
        return out

    def _gpus_of_images(self, request: CommRequest, images) -> np.ndarray:
        """The GPUs of equal-sized rank groups ``images`` as an array (a row each), checked as ``_gpus``
        checks one group (the same errors)."""
        ranks = np.asarray(images, dtype=np.int64)
        placement = self.__dict__.get("_placement")
        if placement is None or placement[0] is not self.cluster.placement:
            placement = self._placement = (self.cluster.placement, np.asarray(self.cluster.placement, dtype=np.int64))
        if ranks.ndim != 2 or not ranks.size or ranks.min() < 0 or ranks.max() >= len(placement[1]):
            return np.array([self._gpus(request, img) for img in images], dtype=np.int64)
        gpus = placement[1][ranks]
        if request.kind != "p2p" and gpus.shape[1] > 1:
            s = np.sort(gpus, axis=1)
            bad = np.flatnonzero((s[:, 1:] == s[:, :-1]).any(axis=1))
            if len(bad):
                self._gpus(request, images[int(bad[0])])            # raises: a rank named twice
        return gpus

    def _image_routes(self, pairs) -> np.ndarray:
        """Link ids of the routes of the rank pairs ``pairs`` (src, dst), all together (a multiset)."""
        if not len(pairs):
            return np.zeros(0, dtype=np.int64)
        gpus = self._gpus_of_images(CommRequest("p2p", pairs[0], 0.0), pairs)
        src, dst = gpus[:, 0], gpus[:, 1]
        flat = self.cluster.route_many(src, dst)
        if flat is None:
            path, out = self._path, []
            for a, b in zip(src.tolist(), dst.tolist()):
                out.extend(path(a, b)[0])
            flat = np.array(out, dtype=np.int64)
        return flat

    def network(self):
        """A fresh FlowNetwork: max-min fair in "flow" mode, contention-free otherwise."""
        if self.network_mode == "flow":
            return FlowNetwork(self.capacity, self.bundle)
        return UncontendedNetwork(self.comm_time_s)


def _row_ranks(M: np.ndarray) -> np.ndarray:
    """Each entry's rank among the distinct values of its row (``cluster._ranks`` of every row at once)."""
    order = np.argsort(M, axis=1, kind="stable")
    S = np.take_along_axis(M, order, axis=1)
    step = np.concatenate((np.zeros((len(M), 1), dtype=np.int64), (S[:, 1:] != S[:, :-1]).astype(np.int64)), axis=1)
    out = np.empty_like(M)
    np.put_along_axis(out, order, np.cumsum(step, axis=1), axis=1)
    return out
