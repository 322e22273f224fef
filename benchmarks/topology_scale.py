"""Topology scale benchmark: the 16,384-GPU dgx-h100 cluster and every group of a TP8·PP16·DP128 plan.

Builds the graph, then costs every TP all-reduce, DP all-reduce and PP send of the plan (rank order
tp innermost, then dp, then pp, as Megatron-LM's default) in analytical mode, and in flow mode both as a
full launch (every group started at once in one network) and symmetrically (one representative per
family carrying the others as images). Prints wall times and the simulated collective times; the target
is under 10 s in total on a 2-core machine.

    .venv/bin/python benchmarks/topology_scale.py [--gpus 16384]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator.costs import CommRequest  # noqa: E402
from topologies import load_cluster  # noqa: E402
from topologies.cost import ClusterCostModel  # noqa: E402
from topologies.flow import drive  # noqa: E402

TP_BYTES = 64 * 2**20      # an activation all-reduce (b·s·h·2 bytes, e.g. 1·8192·4096·2)
DP_BYTES = 1 * 2**30       # a gradient bucket
PP_BYTES = 32 * 2**20      # an activation send between stages


def plan_groups(tp: int, pp: int, dp: int):
    rank = lambda t, d, p: t + tp * (d + dp * p)  # noqa: E731
    tps = [tuple(rank(t, d, p) for t in range(tp)) for p in range(pp) for d in range(dp)]
    dps = [tuple(rank(t, d, p) for d in range(dp)) for p in range(pp) for t in range(tp)]
    pps = [(rank(t, d, p), rank(t, d, p + 1)) for p in range(pp - 1) for d in range(dp) for t in range(tp)]
    return tps, dps, pps


def drain(net, requests):
    """Start every request at t=0 in one network, run to completion; return {key: finish time}."""
    return drive(net, [(0.0, k, r) for k, r in enumerate(requests)])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--pp", type=int, default=16)
    args = ap.parse_args()
    dp = args.gpus // (args.tp * args.pp)
    t_all = time.perf_counter()
    cpu_all = time.process_time()

    t0 = time.perf_counter()
    cluster = load_cluster("dgx-h100", args.gpus)
    t_build = time.perf_counter() - t0
    d = cluster.describe()
    print(f"cluster: {d['devices']} GPUs, {sum(d['switches'].values())} switches, {d['links']} links, "
          f"{len(cluster.link_capacity)} flow-level links, bisection {d['bisection_bytes_per_s'] / 1e12:.1f} TB/s; "
          f"built in {t_build:.2f} s")
    tps, dps, pps = plan_groups(args.tp, args.pp, dp)
    reqs = {"tp all_reduce": [CommRequest("all_reduce", g, TP_BYTES) for g in tps],
            "dp all_reduce": [CommRequest("all_reduce", g, DP_BYTES) for g in dps],
            "pp p2p": [CommRequest("p2p", g, PP_BYTES) for g in pps]}
    print(f"plan TP{args.tp}·PP{args.pp}·DP{dp}: {len(tps)} TP groups, {len(dps)} DP groups, {len(pps)} PP pairs")

    an = ClusterCostModel(cluster)
    t0 = time.perf_counter()
    analytical = {name: [an.comm_time_s(r) for r in rs] for name, rs in reqs.items()}
    t_an = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = {name: [an.comm_time_s(r) for r in rs] for name, rs in reqs.items()}
    t_an_cached = time.perf_counter() - t0
    assert again == analytical
    print(f"\nanalytical: costed {sum(map(len, reqs.values()))} communications in {t_an:.2f} s "
          f"(again, cached: {t_an_cached:.3f} s)")
    for name, ts in analytical.items():
        r = reqs[name][0]
        print(f"  {name:14s} {r.size_bytes / 2**20:7.0f} MiB  {min(ts) * 1e3:8.3f} .. {max(ts) * 1e3:8.3f} ms  "
              f"({an.algorithm_for(r)})")

    fl = ClusterCostModel(cluster, network="flow")
    print("\nflow, full launch (every group of a family at once):")
    t_flow = 0.0
    for name, rs in reqs.items():
        t0 = time.perf_counter()
        done = drain(fl.network(), rs)
        dt = time.perf_counter() - t0
        t_flow += dt
        ts = [done[k] for k in range(len(rs))]
        ratio = max(ts) / max(analytical[name])
        print(f"  {name:14s} {min(ts) * 1e3:8.3f} .. {max(ts) * 1e3:8.3f} ms  contention x{ratio:5.2f} vs "
              f"analytical   [{dt:.2f} s wall]")
    print("flow, symmetric (one representative with the others as images):")
    for name, rs in reqs.items():
        rep = rs[0]
        img = CommRequest(rep.kind, rep.ranks, rep.size_bytes, images=tuple(r.ranks for r in rs[1:]))
        t0 = time.perf_counter()
        t_sym = drain(fl.network(), [img])[0]
        dt = time.perf_counter() - t0
        t_flow += dt
        full0 = drain(fl.network(), rs)[0] if name != "pp p2p" else None
        check = "" if full0 is None else f"  (full launch, same group: {full0 * 1e3:.3f} ms)"
        print(f"  {name:14s} {t_sym * 1e3:8.3f} ms{check}   [{dt:.3f} s wall]")
    total = time.perf_counter() - t_all
    cpu = time.process_time() - cpu_all
    print(f"\nwall: build {t_build:.2f} s, analytical {t_an:.2f} s, flow {t_flow:.2f} s; total {total:.2f} s "
          f"(target < 10 s); CPU time {cpu:.2f} s")


if __name__ == "__main__":
    main()
