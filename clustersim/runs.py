"""The plans of a comparison and their metrics tables (used by ``compare`` and its HTML report)."""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

#: metrics-table columns (``simulator.metrics.Metrics`` fields), in display order.
TABLE_COLUMNS = ("step_time_s", "tokens_per_s", "mfu", "tflops_per_gpu", "bubble_fraction",
                 "exposed_comm_fraction", "overlap_fraction", "compute_fraction", "peak_memory_bytes",
                 "memory_capacity_bytes", "fits_in_memory", "world_size", "mode")


@dataclass
class PlanRun:
    """One plan of a comparison: its name, what was simulated, and the engine's metrics."""

    name: str
    result: object                  # SimResult
    metrics: object                 # Metrics
    definition: dict = field(default_factory=dict)   # the experiment options (or a description)
    notes: list = field(default_factory=list)
    evidence: dict | None = None    # how predictions of its kind compared with published runs (clustersim.evidence)


def plan_runs(results: dict, definitions: dict | None = None) -> list[PlanRun]:
    """PlanRuns from {name: SimResult} (metrics computed here); for hand-built programs and tests."""
    from simulator.metrics import compute_metrics
    defs = definitions or {}
    return [PlanRun(n, r, compute_metrics(r), dict(defs.get(n, {}))) for n, r in results.items()]


def metrics_table(runs: list[PlanRun]) -> pd.DataFrame:
    """One row per plan (index: plan name), the columns of TABLE_COLUMNS taken from each run's Metrics."""
    rows = {run.name: {c: getattr(run.metrics, c) for c in TABLE_COLUMNS} for run in runs}
    return pd.DataFrame.from_dict(rows, orient="index", columns=list(TABLE_COLUMNS))


def formatted_table(runs: list[PlanRun]) -> pd.DataFrame:
    """``metrics_table`` with human units (s, %, GB) for reports and the terminal."""
    t = metrics_table(runs)
    out = pd.DataFrame(index=t.index)
    params = [run.definition.get("model_params") for run in runs]
    if any(n is not None for n in params):
        out["params (B)"] = [f"{n / 1e9:,.2f}" if n is not None else "" for n in params]
    out["step time (s)"] = t["step_time_s"].map(lambda v: f"{v:.4g}")
    out["tokens/s"] = t["tokens_per_s"].map(lambda v: f"{v:,.0f}")
    out["MFU"] = t["mfu"].map(lambda v: f"{v:.1%}")
    out["bubble"] = t["bubble_fraction"].map(lambda v: f"{v:.1%}")
    out["exposed comm"] = t["exposed_comm_fraction"].map(lambda v: f"{v:.1%}")
    out["overlap"] = t["overlap_fraction"].map(lambda v: f"{v:.1%}")
    out["peak memory (GB)"] = [f"{p / 1e9:.1f} / {c / 1e9:.0f}" + ("" if fits else " OOM")
                               for p, c, fits in zip(t["peak_memory_bytes"], t["memory_capacity_bytes"],
                                                     t["fits_in_memory"])]
    return out
