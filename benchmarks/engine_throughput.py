"""Engine throughput: simulated ops per second on ~1,000 ranks x 1,000 mixed ops (full mode), printed as a
ratio to bare SimPy timeouts per second measured in the same run (same number of processes and events).
Both are timed in CPU seconds of this process (time.process_time), so other jobs on the machine do not skew
the ratio, and each is the best of ``--repeat`` runs (as timeit does: on a shared machine the slower runs
measure the neighbours' load on caches and clocks, not the code).

    python benchmarks/engine_throughput.py [--ranks 1024] [--ops 1000] [--repeat 3]

Mixed ops per rank: compute (60%), tensor-parallel collectives on groups of 8 (20%), pipeline send/recv
pairs between neighbouring groups (10%), data-parallel all-reduces on a second stream (10%).
"""
from __future__ import annotations

import argparse
import math
import os
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import simpy  # noqa: E402

from simulator.costs import SimpleCostModel  # noqa: E402
from simulator.engine import run  # noqa: E402
from simulator.program import Programs, collective, compute, recv, send  # noqa: E402


def build(ranks: int, ops_per_rank: int) -> Programs:
    tp = 8
    progs = Programs(world_size=ranks, ops={r: [] for r in range(ranks)})
    ngroups = ranks // tp
    tp_groups = [progs.add_group(range(g * tp, (g + 1) * tp), "tp") for g in range(ngroups)]
    dp_groups = [progs.add_group(range(j, ranks, tp), "dp") for j in range(tp)]
    # a fixed cycle of 10 ops keeps every rank's op count and the collective order identical
    cycle = ["c", "c", "tp", "c", "c", "p2p", "c", "tp", "c", "dp"]
    for r in range(ranks):
        g = r // tp
        prog = progs.ops[r]
        for k in range(ops_per_rank):
            what = cycle[k % len(cycle)]
            last = (len(prog) - 1,) if prog else ()
            if what == "c":
                prog.append(compute("gemm", 2e9 + (k % 7) * 1e8, deps=()))
            elif what == "tp":
                prog.append(collective("tp_ar", "all_reduce", tp_groups[g], 8e6))
            elif what == "p2p":
                # even groups send to the next group, odd groups receive: pairs of groups
                if g % 2 == 0 and g + 1 < ngroups:
                    prog.append(send("act", r + tp, 4e6, stream="pp", deps=last))
                elif g % 2 == 1:
                    prog.append(recv("act", r - tp, 4e6, stream="pp"))
                else:
                    prog.append(compute("gemm", 1e9))
            else:
                prog.append(collective("dp_ar", "all_reduce", dp_groups[r % tp], 32e6, stream="dp", deps=last))
    return progs


def bare_simpy(processes: int, timeouts_each: int) -> float:
    env = simpy.Environment()

    def proc():
        for _ in range(timeouts_each):
            yield env.timeout(1.0)

    for _ in range(processes):
        env.process(proc())
    t = time.process_time()
    env.run()
    return processes * timeouts_each / (time.process_time() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--ops", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    t = time.perf_counter()
    progs = build(a.ranks, a.ops)
    build_s = time.perf_counter() - t
    cost = SimpleCostModel(flops_per_s=400e12, link_bytes_per_s=100e9, alpha_s=5e-6)
    sim_s, base = math.inf, 0.0
    for _ in range(max(1, a.repeat)):
        t = time.process_time()
        res = run(progs, cost, check=False)
        sim_s = min(sim_s, time.process_time() - t)
        base = max(base, bare_simpy(a.ranks, a.ops))
    ops = progs.op_count
    rate = ops / sim_s
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"ranks={a.ranks} ops/rank={a.ops} total ops={ops:,} (program build {build_s:.2f} s)")
    print(f"engine:     {sim_s:.2f} s CPU, {rate:,.0f} simulated ops/s, step {res.step_time_s * 1e3:.3f} ms simulated")
    print(f"bare simpy: {base:,.0f} timeouts/s ({a.ranks} processes x {a.ops} timeouts)")
    print(f"ratio engine/bare = {rate / base:.2f}  (target >= 0.5; best of {a.repeat} runs each)   "
          f"peak RSS {rss_mb:,.0f} MB")


if __name__ == "__main__":
    main()
