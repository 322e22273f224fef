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

    python benchmarks/scaling.py --uneven [--plans u1k,a530b,...] [--agree 1] [--timeout 900]

Uneven placements (issue 15): realistic plans whose ranks do not all cost the same (DP not a power of two,
PP 35, stages across leaf switches, TP across nodes) from 1k to 16k GPUs, the 16k flagship with one
straggler GPU (classes split by the fault), plus a world-sized collective program. Each runs in class mode
(symmetric where valid, split into classes by cost signature) and, with ``--agree 1``, in full mode too
(minutes at 16k). Columns: plan, gpus, network, wall_s, cpu_s (the
process's CPU time: what the run costs on a busy machine), peak_rss_mb, classes (simulated ranks),
ops_simulated, step_time_s, full_step_time_s, rel_diff, validate_s. Writes uneven.csv.
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


# name -> (cluster, gpus, experiment fields); every plan is uneven on purpose (see the docstring)
UNEVEN = {
    # 125 nodes, DP 25 (not a power of two): stages of 25 nodes straddle the 32-node leaf groups
    "u1k": ("dgx-h100", 1000, dict(model="llama3-70b", tp=8, pp=5, dp=25, seq=4096, global_batch=100,
                                   micro_batch=1, schedule="1f1b", zero=1)),
    # the published 530B configuration of issue 15: PP 35, DP 9, 315 DGX A100 nodes
    "a530b": ("dgx-a100", 2520, dict(model=dict(layers=105, hidden=20480, heads=128, vocab=51200), seq=2048,
                                     tp=8, pp=35, dp=9, global_batch=2520, micro_batch=1, recompute="full",
                                     schedule="interleaved", virtual_stages=3)),
    # TP 16 across two nodes, PP 6, DP 42: 4,032 GPUs (GPT-3 175B: 96 heads, no grouped KV)
    "u4k_tp16": ("dgx-h100", 4032, dict(model="gpt3-175b", tp=16, pp=6, dp=42, seq=2048, global_batch=504,
                                        micro_batch=1, schedule="1f1b", recompute="selective")),
    # DP 127 (prime): 16,256 GPUs, interleaved
    "u16k": ("dgx-h100", 16256, dict(model="llama3-405b", tp=8, pp=16, dp=127, seq=8192, global_batch=2032,
                                     micro_batch=1, schedule="interleaved")),
    # the 16k flagship with one 1.2x straggler GPU: even placement, classes split by the fault
    "s16k": ("dgx-h100", 16384, dict(model="llama3-405b", tp=8, pp=16, dp=128, seq=8192, global_batch=2048,
                                     micro_batch=1, schedule="interleaved", faults={"stragglers": {1234: 1.2}})),
}

UNEVEN_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
from clustersim.experiment import Experiment, run_experiment
t = time.perf_counter()
out = run_experiment(Experiment(cluster={cluster!r}, gpus={gpus}, network={network!r}, mode={mode!r}, **{fields!r}),
                     check_budget=False)
wall = time.perf_counter() - t
m = out.metrics
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps(dict(wall_s=wall, cpu_s=ru.ru_utime + ru.ru_stime, peak_rss_mb=ru.ru_maxrss / 1024,
                      classes=len(out.result.programs.ops), ops_simulated=m.events_simulated,
                      step_time_s=m.step_time_s, mode=m.mode, notes=out.notes)))
"""

WORLD_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
from simulator.costs import SimpleCostModel
from simulator.engine import Engine
from simulator.program import Programs, collective, compute, validate
n = {gpus}
p = Programs(world_size=n, ops={{}})
g = p.add_group(range(n), "world")
for r in range(n):
    ops = []
    for i in range(10):
        ops.append(compute("c", flops=1e9 * (1 + r % 3), deps=(len(ops) - 1,) if ops else ()))
        ops.append(collective("ar", "all_reduce", g, 1e6, deps=(len(ops) - 1,)))
    p.ops[r] = ops
c0 = time.process_time()
t = time.perf_counter(); validate(p); tv = time.perf_counter() - t
t = time.perf_counter(); res = Engine(p, SimpleCostModel(link_bytes_per_s=1e11, alpha_s=1e-6)).run()
ru = resource.getrusage(resource.RUSAGE_SELF)   # wall and CPU exclude building the programs
print(json.dumps(dict(wall_s=time.perf_counter() - t + tv, cpu_s=time.process_time() - c0, validate_s=tv,
                      classes=n, ops_simulated=p.op_count, step_time_s=res.step_time_s, mode="full",
                      peak_rss_mb=ru.ru_maxrss / 1024)))
"""


def _child(code: str, timeout: float) -> dict:
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


def run_uneven(plans: list[str], network: str, agree: bool, timeout: float, out_dir: str) -> list[dict]:
    rows = []
    for name in plans:
        if name == "world16k":
            r = _child(WORLD_CHILD.format(root=ROOT, gpus=16384), timeout)
            r.update(plan=name, gpus=16384, network="simple")
        else:
            cluster, gpus, fields = UNEVEN[name]
            r = _child(UNEVEN_CHILD.format(root=ROOT, cluster=cluster, gpus=gpus, network=network, mode=None,
                                           fields=fields), timeout)
            r.update(plan=name, gpus=gpus, network=network)
            if agree and r["status"] == "ok":
                f = _child(UNEVEN_CHILD.format(root=ROOT, cluster=cluster, gpus=gpus, network=network, mode="full",
                                               fields=fields), timeout)
                if f["status"] == "ok":
                    r["full_step_time_s"] = f["step_time_s"]
                    r["full_wall_s"] = f["wall_s"]
                    r["rel_diff"] = abs(r["step_time_s"] - f["step_time_s"]) / f["step_time_s"]
                else:
                    r["full_step_time_s"] = f["status"]
        if r["status"] == "ok":
            print(f"{name:9s} {r['gpus']:6d} GPUs {r['network']:10s}: {r['wall_s']:8.2f} s "
                  f"({r.get('cpu_s', float('nan')):.1f} s CPU) {r['peak_rss_mb']:7.0f} MB "
                  f"{r['classes']:6d} classes {r['ops_simulated']:>11,} ops  step {r['step_time_s']:.9g} s"
                  + (f"  full {r['full_step_time_s']!s:.12} rel {r.get('rel_diff', float('nan')):.1e}"
                     if "full_step_time_s" in r else "")
                  + (f"  (validation {r['validate_s']:.2f} s)" if "validate_s" in r else ""), flush=True)
        else:
            print(f"{name:9s}: {r['status']}", flush=True)
        rows.append(r)
    cols = ["plan", "gpus", "network", "status", "wall_s", "cpu_s", "peak_rss_mb", "classes", "ops_simulated",
            "step_time_s", "full_step_time_s", "full_wall_s", "rel_diff", "validate_s"]
    with open(os.path.join(out_dir, "uneven.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    print(f"wrote {out_dir}/uneven.csv")
    return rows


def bare_simpy_rate(processes: int = 1024, each: int = 1000) -> float:
    """Bare SimPy timeouts per second (the baseline engine_throughput.py measures too)."""
    sys.path.insert(0, HERE)
    from engine_throughput import bare_simpy
    return bare_simpy(processes, each)


def run_one(world: int, mode: str, network: str, timeout: float) -> dict:
    return _child(CHILD.format(root=ROOT, world=world, mode=mode, network=network), timeout)


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
    ap.add_argument("--uneven", action="store_true", help="The uneven-placement table instead (issue 15).")
    ap.add_argument("--plans", default=",".join(list(UNEVEN) + ["world16k"]))
    ap.add_argument("--network", default="flow", help="Network of the uneven table.")
    ap.add_argument("--agree", type=int, default=0, help="1: also run full mode and compare step times.")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.uneven:
        run_uneven(a.plans.split(","), a.network, bool(a.agree), a.timeout, a.out)
        return
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
