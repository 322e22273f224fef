"""Scaling benchmark: wall time, peak RSS and simulated ops per second against world size, for symmetric
and full modes and each network mode, with a bare-SimPy baseline measured in the same run.

    python benchmarks/scaling.py [--sizes 64,256,1024,4096,16384] [--modes symmetric,full]
                                 [--networks ideal,analytical,flow] [--timeout 900] [--out benchmarks/results]

Workload: Llama-3-70B, TP8 (+SP) x PP8 x DP = N/64, interleaved 1F1B with 2 virtual stages, 16 micro-batches
per replica (global batch 16·DP), sequence 8192, selective recompute, on the dgx-h100 preset. Each run is a
separate process (so its peak RSS is its own) with a time limit; runs that exceed it are recorded as such.

Columns: world, mode, network, wall_s, peak_rss_mb, ops_simulated (ops the engine executed),
ops_represented (ops of the whole job), sim_ops_per_s, represented_ops_per_s, step_time_s, ratio_to_simpy
(sim_ops_per_s over bare SimPy timeouts per second). Writes scaling.csv and scaling.png (log-log).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
from clustersim.experiment import Experiment, run_experiment
world, mode, network = {world}, {mode!r}, {network!r}
dp = world // 64
exp = Experiment(cluster="dgx-h100", gpus=world, model="llama3-70b", tp=8, pp=8, dp=dp, sp=True, seq=8192,
                 global_batch=16 * dp, micro_batch=1, schedule="interleaved", virtual_stages=2,
                 recompute="selective", network=network, mode=mode)
t = time.perf_counter()
out = run_experiment(exp, check_budget=False)
wall = time.perf_counter() - t
m = out.metrics
print(json.dumps(dict(wall_s=wall, peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      ops_simulated=m.events_simulated, ops_represented=m.represented_ops,
                      step_time_s=m.step_time_s, mode=m.mode)))
"""


def bare_simpy_rate(processes: int = 1024, each: int = 1000) -> float:
    """Bare SimPy timeouts per second (the baseline engine_throughput.py measures too)."""
    sys.path.insert(0, HERE)
    from engine_throughput import bare_simpy
    return bare_simpy(processes, each)


def run_one(world: int, mode: str, network: str, timeout: float) -> dict:
    code = CHILD.format(root=ROOT, world=world, mode=mode, network=network)
    t = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": f"timeout>{timeout:.0f}s", "wall_s": time.perf_counter() - t}
    if p.returncode != 0:
        return {"status": "error: " + (p.stderr.strip().splitlines() or ["?"])[-1][:200]}
    d = json.loads(p.stdout.strip().splitlines()[-1])
    d["status"] = "ok"
    return d


def plot(rows: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for (mode, net), style in zip(sorted({(r["mode"], r["network"]) for r in rows}), range(100)):
        pts = sorted((r for r in rows if r["mode"] == mode and r["network"] == net and r["status"] == "ok"),
                     key=lambda r: r["world"])
        if not pts:
            continue
        ls = "-" if mode == "symmetric" else "--"
        lab = f"{mode} / {net}"
        axes[0].plot([r["world"] for r in pts], [float(r["wall_s"]) for r in pts], ls, marker="o", label=lab)
        axes[1].plot([r["world"] for r in pts], [float(r["peak_rss_mb"]) for r in pts], ls, marker="o", label=lab)
    for ax, yl in zip(axes, ("wall time (s)", "peak RSS (MB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("GPUs simulated")
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=8)
    fig.suptitle("clustersim scaling: Llama-3-70B, TP8·PP8·DP, interleaved 1F1B")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="64,256,1024,4096,16384")
    ap.add_argument("--modes", default="symmetric,full")
    ap.add_argument("--networks", default="ideal,analytical,flow")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    base = bare_simpy_rate()
    print(f"bare SimPy: {base:,.0f} timeouts/s (1,024 processes x 1,000 timeouts)")
    rows = []
    for mode in a.modes.split(","):
        for net in a.networks.split(","):
            for world in (int(x) for x in a.sizes.split(",")):
                r = run_one(world, mode, net, a.timeout)
                r.update(world=world, mode=mode, network=net)
                if r["status"] == "ok":
                    r["sim_ops_per_s"] = r["ops_simulated"] / r["wall_s"]
                    r["represented_ops_per_s"] = r["ops_represented"] / r["wall_s"]
                    r["ratio_to_simpy"] = r["sim_ops_per_s"] / base
                    print(f"{mode:9s} {net:10s} {world:6d} GPUs: {r['wall_s']:8.2f} s  {r['peak_rss_mb']:8.0f} MB  "
                          f"{r['ops_simulated']:>11,} ops ({r['ops_represented']:,} represented)  "
                          f"{r['sim_ops_per_s']:>9,.0f} ops/s = {r['ratio_to_simpy']:.2f} x SimPy", flush=True)
                else:
                    print(f"{mode:9s} {net:10s} {world:6d} GPUs: {r['status']}", flush=True)
                rows.append(r)
    cols = ["world", "mode", "network", "status", "wall_s", "peak_rss_mb", "ops_simulated", "ops_represented",
            "sim_ops_per_s", "represented_ops_per_s", "step_time_s", "ratio_to_simpy"]
    with open(os.path.join(a.out, "scaling.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    plot(rows, os.path.join(a.out, "scaling.png"))
    print(f"wrote {a.out}/scaling.csv and scaling.png; bare SimPy {base:,.0f} timeouts/s")


if __name__ == "__main__":
    main()
