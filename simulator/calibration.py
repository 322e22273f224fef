"""Calibration: the small versioned JSON that carries measured cost-model parameters.

Written by ``traces.calibrate`` (``clustersim calibrate TRACE_DIR -o calib.json``), read by the cost models
(``--calibration FILE``). This module only defines the format and how to evaluate it, so that neither the
topologies nor the traces package depends on the other.

Format (``version`` 1)::

    {
      "format": "clustersim-calibration", "version": 1,
      "source": {...free-form provenance: traces, devices, torch/NCCL versions, date...},
      "compute": [
        {"device": "NVIDIA H100 80GB HBM3", "peak_flops_per_s": 7.1e14, "half_saturation_flops": 3.0e9,
         "points": [[flops, achieved_flops_per_s], ...]}
      ],
      "collectives": [
        {"kind": "all_reduce", "backend": "nccl", "group_size": 8, "scope": "intra",
         "alpha_s": 2.1e-5, "busbw_bytes_per_s": 3.6e11, "points": [[size_bytes, time_s], ...]}
      ],
      "layers": [     (optional)
        {"device": "...", "phase": "forward", "peak_flops_per_s": 5.5e10, "half_saturation_flops": 4e7,
         "points": [[flops, achieved_flops_per_s], ...]}
      ]
    }

Compute model: achieved FLOP/s of an op of F FLOPs = peak_flops_per_s · F / (F + half_saturation_flops)
(small ops are latency/launch bound, big GEMMs saturate), plus an optional ``op_overhead_s`` added to every
compute op of a program: the framework time one program op carries beyond its FLOPs (dispatch, autograd,
unfused elementwise kernels), 0 unless set (``calibrate`` does not fit it: the layer fits below measure
that time directly).
Layer model (optional ``layers``, from the collector's layer benchmark): the same curve fitted to whole
transformer-layer forward / backward times (norms, attention, elementwise kernels and dispatch included)
against the layer's model FLOPs; where present it prices the per-layer compute ops of a program (ops with a
``layer``, by phase: forward, or backward for backward / backward_input / backward_weight) and the compute
fit prices the rest (embedding, LM head). Collective model (nccl-tests convention):
time = alpha_s + size_bytes · bus_factor(kind, n) / busbw_bytes_per_s, with bus_factor 2(n-1)/n for
all_reduce, (n-1)/n for all_gather / reduce_scatter / all_to_all, 1 for broadcast / reduce / p2p.
"""
from __future__ import annotations

import json
import math
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Callable

from simulator.errors import ConfigError
from simulator.inputs import brief, integer, load_json, number, text
from simulator.program import COLLECTIVE_KINDS

FORMAT = "clustersim-calibration"
VERSION = 1
# How a calibration is matched to the simulated cluster (``--calibration-scope``): "matching" uses only the
# compute / layer fits of the cluster's device and the collective fits of its backend, and refuses a
# calibration that covers neither; "any" applies the fits whatever hardware they were measured on.
CALIBRATION_SCOPES = ("matching", "any")


def check_scope(scope: str, calibration) -> None:
    """ConfigError for an unknown ``--calibration-scope``, or one other than "matching" without a calibration
    (it says which fits of a --calibration file apply: alone it would change nothing)."""
    if scope not in CALIBRATION_SCOPES:
        raise ConfigError(f"--calibration-scope must be one of {', '.join(CALIBRATION_SCOPES)}, got {scope!r}")
    if scope != "matching" and not calibration:
        raise ConfigError(f"--calibration-scope {scope} says which fits of a --calibration file apply: give "
                          f"--calibration too")


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' busbw / algbw factor for a collective on n ranks."""
    if n <= 1:
        return 1.0
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def saturating_rate(peak_flops_per_s: float, half_saturation_flops: float, flops: float) -> float:
    """Achieved FLOP/s of an op of ``flops`` FLOPs: peak · F / (F + F_half) (peak for F <= 0)."""
    if flops <= 0:
        return peak_flops_per_s
    return peak_flops_per_s * flops / (flops + half_saturation_flops)


@dataclass
class ComputeFit:
    device: str
    peak_flops_per_s: float
    half_saturation_flops: float = 0.0
    points: list = field(default_factory=list)
    op_overhead_s: float = 0.0

    def achieved_flops_per_s(self, flops: float) -> float:
        return saturating_rate(self.peak_flops_per_s, self.half_saturation_flops, flops)


LAYER_PHASES = ("forward", "backward")


@dataclass
class LayerFit:
    """Achieved FLOP/s of a whole transformer layer's forward or backward against its model FLOPs."""

    device: str
    phase: str                    # "forward" or "backward"
    peak_flops_per_s: float
    half_saturation_flops: float = 0.0
    points: list = field(default_factory=list)

    def achieved_flops_per_s(self, flops: float) -> float:
        return saturating_rate(self.peak_flops_per_s, self.half_saturation_flops, flops)

    def time_s(self, flops: float) -> float:
        """Seconds for a layer op of ``flops`` FLOPs: (F + F_half) / peak."""
        return (flops + self.half_saturation_flops) / self.peak_flops_per_s if flops > 0 else 0.0


@dataclass
class CollectiveFit:
    kind: str
    group_size: int
    scope: str                    # "intra" (inside a scale-up domain / host) or "inter"
    alpha_s: float
    busbw_bytes_per_s: float
    backend: str = "nccl"
    points: list = field(default_factory=list)

    def time_s(self, size_bytes: float, n: int | None = None) -> float:
        n = n or self.group_size
        return self.alpha_s + size_bytes * bus_factor(self.kind, n) / self.busbw_bytes_per_s


@dataclass
class Calibration:
    compute: list[ComputeFit] = field(default_factory=list)
    collectives: list[CollectiveFit] = field(default_factory=list)
    source: dict = field(default_factory=dict)
    layers: list[LayerFit] = field(default_factory=list)

    # ----------------------------------------------------------------- lookup
    def compute_fit(self, device: str) -> ComputeFit | None:
        """The fit for ``device`` (exact name, else case-insensitive substring either way), or None."""
        return _by_device(self.compute, device)

    def layer_fit(self, device: str, phase: str) -> LayerFit | None:
        """The layer fit for ``device`` (matched as compute_fit) and ``phase`` ("forward" / "backward")."""
        return _by_device([f for f in self.layers if f.phase == phase], device)

    def collective_fit(self, kind: str, group_size: int, scope: str, backend: str | None = None
                       ) -> CollectiveFit | None:
        """Best matching collective fit: same kind and scope, nearest group size (log distance)."""
        cands = [c for c in self.collectives if c.kind == kind and c.scope == scope
                 and (backend is None or c.backend == backend)]
        if not cands and kind == "p2p":
            return None
        if not cands:
            return None
        return min(cands, key=lambda c: abs(math.log(max(c.group_size, 1)) - math.log(max(group_size, 1))))

    def for_target(self, device: str, same_device: Callable[[str], bool], backend: str,
                   scope: str = "matching", where: str = "calibration") -> tuple["Calibration", list[str]]:
        """The fits that apply to a cluster of ``device`` accelerators talking over ``backend`` and one line
        per fit group saying what is applied or left unused.

        ``same_device(name)`` says whether a fit's device name is the cluster's device (the device identity
        lives with the accelerator specs). With ``scope="matching"`` a calibration whose compute / layer fits
        cover another device only, or whose collective fits cover another backend only, is refused with a
        ConfigError; ``scope="any"`` applies them anyway (compute and layer fits of the first device listed,
        collective fits of every backend, those of the cluster's backend first) and says so."""
        if scope not in CALIBRATION_SCOPES:
            raise ConfigError(f"unknown calibration scope {scope!r}; choose one of {', '.join(CALIBRATION_SCOPES)}")
        notes: list[str] = []
        compute = [c for c in self.compute if same_device(c.device)]
        layers = [f for f in self.layers if same_device(f.device)]
        colls = [c for c in self.collectives if c.backend == backend]
        measured = sorted({c.device for c in self.compute + self.layers})
        backends = sorted({c.backend for c in self.collectives})
        wrong_device = bool(self.compute or self.layers) and not (compute or layers)
        wrong_backend = bool(self.collectives) and not colls
        if scope == "matching" and (wrong_device or wrong_backend):
            parts = []
            if wrong_device:
                parts.append(f"its compute fits are for {', '.join(map(repr, measured))}, not {device}")
            if wrong_backend:
                parts.append(f"its collective fits are for {', '.join(backends)}, not {backend}")
            raise ConfigError(f"{where} does not cover this cluster: {'; '.join(parts)} (measure on this hardware, "
                              f"or give --calibration-scope any to apply it anyway)")
        forced = " (forced by --calibration-scope any)"
        if scope == "any" and wrong_device:
            compute = [c for c in self.compute if c.device == measured[0]]
            layers = [f for f in self.layers if f.device == measured[0]]
        if scope == "any":
            colls = colls + [c for c in self.collectives if c.backend != backend]
        why = forced if wrong_device else ""
        if compute:
            notes.append(f"calibration: compute fit of {compute[0].device!r} applied to {device}{why}")
        if layers:
            notes.append(f"calibration: layer fits ({', '.join(f.phase for f in layers)}) of "
                         f"{layers[0].device!r} applied to {device}{why}")
        unused = sorted({c.device for c in self.compute + self.layers} - {c.device for c in compute + layers})
        if unused:
            notes.append(f"calibration: fits of {', '.join(map(repr, unused))} not used (cluster device {device})")
        if colls:
            used = sorted({c.backend for c in colls})
            notes.append(f"calibration: {len(colls)} collective fits ({', '.join(used)}) replace the topology's "
                         f"times on a {backend} cluster" + (forced if used != [backend] else ""))
        return Calibration(compute, colls, self.source, layers), notes

    # ----------------------------------------------------------------- io
    def to_dict(self) -> dict:
        d = {
            "format": FORMAT, "version": VERSION, "source": self.source,
            "compute": [vars(c) for c in self.compute],
            "collectives": [vars(c) for c in self.collectives],
        }
        if self.layers:
            d["layers"] = [vars(f) for f in self.layers]
        return d

    def save(self, path: str | Path) -> None:
        """Write the calibration atomically, after checking every value as ``load`` would (a fit that could not
        be read back, NaN or a peak of 1e50 FLOP/s, is an error naming the entry, never a file)."""
        from simulator.atomic import write_text
        d = self.to_dict()
        Calibration.from_dict(d, where=f"calibration {path}")
        write_text(path, json.dumps(d, indent=1, sort_keys=True, allow_nan=False) + "\n")

    @classmethod
    def from_dict(cls, data: dict, where: str = "calibration") -> "Calibration":
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ConfigError(f"{where}: not a clustersim calibration (expected \"format\": \"{FORMAT}\")")
        if data.get("version") != VERSION or isinstance(data.get("version"), bool):
            raise ConfigError(f"{where}: unsupported calibration version {brief(data.get('version'))} "
                              f"(know {VERSION})")
        compute = [ComputeFit(**_fields(c, ComputeFit, f"{where}: compute fit #{i}"))
                   for i, c in enumerate(_entries(data, "compute", where))]
        colls = [CollectiveFit(**_fields(c, CollectiveFit, f"{where}: collective fit #{i}"))
                 for i, c in enumerate(_entries(data, "collectives", where))]
        layers = [LayerFit(**_fields(f, LayerFit, f"{where}: layer fit #{i}"))
                  for i, f in enumerate(_entries(data, "layers", where))]
        source = data.get("source", {})
        if not isinstance(source, dict):
            raise ConfigError(f"{where}: source must be a mapping, got {brief(source)}")
        if not (compute or colls or layers):
            raise ConfigError(f"{where}: holds no fit (compute, layers or collectives): it would calibrate nothing")
        _unique(compute, lambda c: (c.device.lower(),), "compute", "device", where)
        _unique(layers, lambda f: (f.device.lower(), f.phase), "layer", "device and phase", where)
        _unique(colls, lambda c: (c.kind, c.group_size, c.scope, c.backend), "collective",
                "kind, group size, scope and backend", where)
        return cls(compute, colls, source, layers)

    @classmethod
    def load(cls, path: str | Path) -> "Calibration":
        """Read a calibration file (bounded read, linear duplicate-key check, every value validated)."""
        return cls.from_dict(load_json(path, "calibration file"), where=str(path))


# ---------------------------------------------------------------------------------------------- validation
# Plausibility bounds of fitted values: far outside any device, so they only stop absurd fits and typos.
MAX_PEAK_FLOPS_PER_S = 1e18      # 1 EFLOP/s per device: ~50x a B200's dense FP4 peak (NVIDIA datasheet, 2e16)
MAX_BUSBW_BYTES_PER_S = 1e15     # 1 PB/s: ~500x NVLink 5 (1.8e12 B/s per GPU, NVIDIA datasheet)
# floors: a fit below them prices an op at years (a 1e-300 peak made every op never end, reported as a
# deadlock at t=0); our slowest fits, a 2-core CPU under gloo, are ~1e10 FLOP/s and ~1e8 B/s
MIN_PEAK_FLOPS_PER_S = 1e6       # 1 MFLOP/s
MIN_BUSBW_BYTES_PER_S = 1e3      # 1 kB/s
MAX_SECONDS = 3600.0             # alpha / op overhead above an hour is not a latency
MAX_GROUP_SIZE = 1 << 24         # ranks in one collective
KINDS = COLLECTIVE_KINDS + ("gather", "scatter", "p2p")
SCOPES = ("intra", "inter")


def _unique(fits: list, key: Callable, what: str, by: str, where: str) -> None:
    """Refuse two fits of one key: lookups take the first, so the file's order would decide (a slow duplicate
    listed first made a step 24x longer)."""
    first: dict = {}
    for i, f in enumerate(fits):
        k = key(f)
        if k in first:
            raise ConfigError(f"{where}: {what} fits #{first[k]} and #{i} have the same {by} "
                              f"({', '.join(map(str, k))}); keep one")
        first[k] = i


def _entries(data: dict, key: str, where: str) -> list:
    v = data.get(key, [])
    if not isinstance(v, list) or not all(isinstance(e, dict) for e in v):
        raise ConfigError(f"{where}: {key} must be a list of mappings, got {brief(v)}")
    return v


def _points(v, where: str) -> list:
    if not isinstance(v, list):
        raise ConfigError(f"{where}: points must be a list of [x, y] pairs, got {brief(v)}")
    for j, pt in enumerate(v):
        if not isinstance(pt, (list, tuple)) or len(pt) != 2:
            raise ConfigError(f"{where}: points[{j}] must be an [x, y] pair, got {brief(pt)}")
        for x in pt:
            number(x, f"{where}: points[{j}]")
    return v


def _fields(d: dict, cls, where: str) -> dict:
    """The keyword arguments of ``cls`` from entry ``d``, each type- and range-checked."""
    known = {f for f in cls.__dataclass_fields__}
    unknown = sorted(str(k) for k in d if k not in known)
    if unknown:
        raise ConfigError(f"{where}: unknown field {brief(unknown[0])}; known: {', '.join(sorted(known))}")
    out = dict(d)
    for k, v in d.items():
        w = f"{where}.{k}"
        if k == "peak_flops_per_s":
            out[k] = number(v, w, lo=MIN_PEAK_FLOPS_PER_S, hi=MAX_PEAK_FLOPS_PER_S)
        elif k == "half_saturation_flops":
            out[k] = number(v, w, lo=0, hi=1e30)
        elif k in ("op_overhead_s", "alpha_s"):
            out[k] = number(v, w, lo=0, hi=MAX_SECONDS)
        elif k == "busbw_bytes_per_s":
            out[k] = number(v, w, lo=MIN_BUSBW_BYTES_PER_S, hi=MAX_BUSBW_BYTES_PER_S)
        elif k == "group_size":
            out[k] = integer(v, w, lo=1, hi=MAX_GROUP_SIZE)
        elif k == "kind":
            out[k] = text(v, w, choices=KINDS)
        elif k == "scope":
            out[k] = text(v, w, choices=SCOPES)
        elif k == "phase":
            out[k] = text(v, w, choices=LAYER_PHASES)
        elif k in ("device", "backend"):
            out[k] = text(v, w)
        elif k == "points":
            out[k] = _points(v, w)
    missing = [f.name for f in cls.__dataclass_fields__.values()
               if f.default is MISSING and f.default_factory is MISSING and f.name not in d]
    if missing:
        raise ConfigError(f"{where}: missing field {missing[0]!r}")
    return out


def _by_device(fits: list, device: str):
    """The fit whose device is ``device`` (exact, else case-insensitive substring either way), or None."""
    for c in fits:
        if c.device == device:
            return c
    d = device.lower()
    for c in fits:
        if c.device.lower() in d or d in c.device.lower():
            return c
    return None
