"""Published collective measurements against the cost model (``clustersim validate collectives``).

``collective_rows`` reads ../shared/validation/collectives.csv (nccl-tests / all_reduce_bench busbw per
size), ``moe_rows`` moe_alltoall.csv (DeepEP dispatch/combine); each row is mapped onto a bundled preset
(``express``) or listed with the reason it cannot be. Predictions come from the cluster cost model with no
calibration (NCCL's model, topologies.nccl), errors are (predicted - published) / published busbw.

Mapping of platforms onto presets, each from the platform's published specification:
- Azure ND H100 v5 / ND H200 v5 / ND A100 v4, DGX and "8x" nodes: dgx-h100 / dgx-h200 / dgx-a100.
- GCP A3 Mega: 8x H100 with 8 NICs of 200 Gb/s (GPUDirect-TCPXO, Ethernet; cloud.google.com A3 Mega
  machine type: 1,800 Gb/s per VM of which 8 x 200 Gb/s for GPUs) -> dgx-h100, nic 25 GB/s, Ethernet.
- AWS p5en (H200): EFA 3,200 Gb/s per 8 GPUs = 400 Gb/s per GPU (AWS instance page) -> dgx-h200, Ethernet.
- AWS p6-b200: 8x B200, EFA v4 8 x 400 Gb/s (row notes) -> dgx-b200, Ethernet.
- GB200 NVL72 (CoreWeave): gb200-nvl72, one rack of 72.
- DeepEP H800: dgx-h100 with the H800's NVLink of 400 GB/s bidirectional (200 GB/s per direction; H800
  datasheet) and CX7 400 Gb/s.
"""
from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

BANDS = (("< 64 KiB", 0, 64 * 1024), ("64 KiB - 1 MiB", 64 * 1024, 1024**2), (">= 1 MiB", 1024**2, math.inf))


@dataclass
class Row:
    """One published row and its prediction (busbw GB/s; time s)."""

    source: str
    hardware: str
    collective: str
    size_bytes: float
    ranks: int
    published_busbw: float | None
    published_time_s: float | None
    preset: str | None = None
    reason: str | None = None
    gpus: int = 0
    group: tuple = ()
    overrides: dict = field(default_factory=dict)
    algorithm: str | None = None      # forced NCCL algorithm the row states
    label: str = ""                   # hardware label for grouping
    predicted_busbw: float | None = None
    predicted_time_s: float | None = None
    chosen: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def error(self) -> float | None:
        if self.predicted_busbw is None or not self.published_busbw:
            return None
        return (self.predicted_busbw - self.published_busbw) / self.published_busbw

    @property
    def band(self) -> str:
        for name, lo, hi in BANDS:
            if lo <= self.size_bytes < hi:
                return name
        return BANDS[-1][0]


def _read(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        lines = [ln for ln in fh if not ln.startswith("#")]
    return list(csv.DictReader(lines))


def _num(x):
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _forced_algorithm(text: str) -> str | None:
    t = text.lower()
    if "forced" in t or "nvls_enable=0" in t:
        if "nvlstree" in t:
            return "nvls_tree"
        if "ring" in t:
            return "ring"
    if "nvls_enable=1" in t or t.startswith("nvls (nccl default") is False and "nvls_enable" in t:
        return None
    return None


def express(r: dict) -> dict:
    """Preset, GPUs, overrides, label of a collectives.csv row, or {"reason": ...}."""
    hw, plat = r["hardware"], r["platform"]
    nodes = int(re.match(r"\d+", r["nodes"]).group(0))
    gpn = int(r["gpus_per_node"])
    total = int(r["total_gpus"])
    text = f"{hw} {plat}"
    out: dict = {"overrides": {}}
    if "GB200" in text:
        out.update(preset="gb200-nvl72", gpus=72, label="GB200 NVL72", group=tuple(range(72)))
        return out if total == 72 else {"reason": "GB200 row not a full NVL72 rack"}
    if "B200" in text:
        out.update(preset="dgx-b200", label="B200")
        if nodes > 1:
            out["overrides"] = {"fabric_link": "ethernet"}
    elif "H200" in text:
        out.update(preset="dgx-h200", label="H200")
        if nodes > 1:
            out["overrides"] = {"fabric_link": "ethernet"}
    elif "H100" in text:
        out.update(preset="dgx-h100", label="H100")
        if "A3 Mega" in plat:
            out["overrides"] = {"nic_bandwidth": 25e9, "fabric_link": "ethernet"}
            out["label"] = "H100 (A3 Mega, 2 nodes)"
    elif "A100" in text:
        out.update(preset="dgx-a100", label="A100")
    else:
        return {"reason": f"no preset for {hw}"}
    if nodes > 1 and gpn != 8:
        return {"reason": f"{nodes} nodes of {gpn} GPUs: presets place 8 GPUs per node"}
    out["gpus"] = max(8, nodes * 8)
    # a node's first gpn GPUs per node
    out["group"] = tuple(n * 8 + i for n in range(nodes) for i in range(gpn))
    if nodes > 1 and "label" in out and "A3" not in out["label"]:
        out["label"] += f" ({nodes} nodes)"
    alg = r["algorithm"].lower()
    if "nvls_enable=0" in alg or "forced nccl_algo=allreduce:ring" in alg:
        out["algorithm"] = "ring"
    elif "nvlstree" in alg and "forced" in alg:
        out["algorithm"] = "nvls_tree"
    return out


def collective_rows(path: Path) -> list[Row]:
    rows = []
    for r in _read(path):
        mapped = express(r)
        row = Row(source=r["source"], hardware=r["hardware"], collective=r["collective"],
                  size_bytes=float(r["size_bytes"]), ranks=int(r["total_gpus"]),
                  published_busbw=_num(r["busbw_GBps"]), published_time_s=_num(r["time_s"]))
        if "reason" in mapped:
            row.reason = mapped["reason"]
        else:
            row.preset, row.gpus, row.group = mapped["preset"], mapped["gpus"], mapped["group"]
            row.overrides, row.label = mapped["overrides"], mapped["label"]
            row.algorithm = mapped.get("algorithm")
            row.extra = {"platform": r["platform"], "placement": r["placement"], "algorithm": r["algorithm"]}
        rows.append(row)
    return rows


def predict(rows: list[Row]) -> list[Row]:
    """Fill predicted busbw / time / chosen algorithm of every expressible row (no calibration)."""
    import topologies
    from simulator.calibration import bus_factor
    from simulator.costs import CommRequest
    from topologies.cost import ClusterCostModel

    models: dict = {}
    for row in rows:
        if row.preset is None:
            continue
        key = (row.preset, row.gpus, tuple(sorted(row.overrides.items())), row.algorithm)
        if key not in models:
            cluster = topologies.load_cluster(row.preset, row.gpus, **row.overrides)
            models[key] = ClusterCostModel(cluster, algorithm=row.algorithm)
        model = models[key]
        req = CommRequest(row.collective, row.group, row.size_bytes)
        t = model.comm_time_s(req)
        row.predicted_time_s = t
        row.predicted_busbw = row.size_bytes / t / 1e9 * bus_factor(row.collective, len(row.group))
        row.chosen = model.algorithm_for(req)
    return rows


def summary(rows: list[Row]) -> list[dict]:
    """Median and max |error| per hardware x collective x size band."""
    groups: dict = {}
    for r in rows:
        if r.error is None:
            continue
        groups.setdefault((r.label, r.collective, r.band), []).append(r.error)
    out = []
    for (label, coll, band), errs in sorted(groups.items()):
        a = sorted(abs(e) for e in errs)
        s = sorted(errs)
        out.append({"hardware": label, "collective": coll, "band": band, "rows": len(errs),
                    "median_abs_error": _median(a), "median_error": _median(s), "max_abs_error": a[-1]})
    return out


def _median(xs):
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])
