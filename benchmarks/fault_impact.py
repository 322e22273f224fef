"""Step-time impact of faults at 1,024 GPUs (DGX H100 preset). Stragglers run in class mode (a slowed rank
and every rank whose timing it changes get classes of their own, simulator.symmetry); the DP straggler is
also run in full per-rank mode, and both step times and wall times are printed. Link faults run in full mode.

1. One 1.2x straggler GPU in a data-parallel job (Llama-3-8B, TP8 x DP128, ZeRO-1) vs in a pipeline job
   (Llama-3-70B, TP8 x PP8 x DP16, 1F1B, 8 micro-batches per replica), placed on stages 0, 3 and 7.
   Bound printed next to the simulation: the step grows by at most (k - 1) x the straggler's compute time
   (everybody waits for all of its extra compute, none of it hidden). DP reaches nearly that: every replica
   waits for the slow one at the gradient reduction, and TP collectives make its whole TP group run at its
   pace. In 1F1B only the last stage is on the critical path all step (it alternates F and B with no
   slack); earlier stages have slack in warm-up and cool-down and absorb most of the delay. (GPipe, a
   flow shop, would add (k - 1)·m·t on any stage: tests/simulator/test_faults.py checks that case.)
2. One failed leaf-spine link and one failed GPU-NIC link under the flow (max-min fair) network model,
   pipeline job. ECMP is modelled as ideal load balancing over a leaf's uplinks (topologies.cluster), so
   losing 1 of 32 uplinks of a non-blocking leaf costs nothing until the other 31 saturate; a GPU whose
   NIC link dies reaches the fabric over NVLink through a peer's NIC (PXN) and shares that NIC.
3. The same spine-link failure on a tapered fabric (4:1 oversubscribed leaves, not rail-optimised): in the
   DP job, and in a pattern that saturates every leaf's uplinks (each GPU sends 1 GB across the cluster),
   where losing 1 of c uplinks must stretch the step by c/(c-1).

Usage: .venv/bin/python benchmarks/fault_impact.py [--quick]   (--quick: 256 GPUs, for a smoke run)
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from clustersim.experiment import experiment_from_dict, run_experiment

K = 1.2
TAPERED = {"tiers": 3, "leaf_down": 32, "oversubscription": 4, "rail_optimised": False, "link": "ib"}


def run(base: dict, faults: dict | None = None, network: str = "analytical", mode: str | None = None):
    """(outcome, wall seconds); ``mode`` None: symmetric (class) mode where the faults allow it, else full."""
    exp = experiment_from_dict({**base, "mode": mode, "network": network, "faults": faults or {}})
    t = time.perf_counter()
    out = run_experiment(exp)
    return out, time.perf_counter() - t


def compute_s(outcome, rank: int) -> float:
    """Seconds of compute of ``rank`` (its class representative's, in symmetric mode)."""
    rep = outcome.programs.representative_of().get(rank, rank)
    return next(rm.compute_s for rm in outcome.metrics.per_rank if rm.rank == rep)


def pct(a: float, b: float) -> str:
    return f"{(b / a - 1) * 100:+6.2f}%"


def main() -> None:
    quick = "--quick" in sys.argv
    gpus = 256 if quick else 1024
    dp_job = {"cluster": "dgx-h100", "gpus": gpus, "model": "llama3-8b", "tp": 8, "dp": gpus // 8, "zero": 1,
              "seq": 8192, "global_batch": gpus // 4}
    pp_dp = gpus // 64
    m = 8
    pp_job = {"cluster": "dgx-h100", "gpus": gpus, "model": "llama3-70b", "tp": 8, "pp": 8, "dp": pp_dp,
              "seq": 8192, "global_batch": pp_dp * m, "schedule": "1f1b"}
    print(f"fault impact at {gpus} GPUs (dgx-h100); straggler factor {K}")

    print("\n1. one straggler GPU")
    base, w = run(dp_job)
    T0 = base.metrics.step_time_s
    rank = 5
    comp = compute_s(base, rank)
    out, w2 = run(dp_job, {"stragglers": {rank: K}})
    full, w3 = run(dp_job, {"stragglers": {rank: K}}, mode="full")
    T, Tf = out.metrics.step_time_s, full.metrics.step_time_s
    print(f"  DP job  llama3-8b tp8 dp{gpus // 8}: baseline {T0:.4f} s; straggler on rank {rank}: "
          f"{T:.4f} s ({pct(T0, T)}); bound {T0 + (K - 1) * comp:.4f} s ({pct(T0, T0 + (K - 1) * comp)})")
    print(f"    class mode {len(out.programs.ops)} representatives, {w2:.1f} s wall; full mode {Tf:.4f} s "
          f"(relative difference {abs(T - Tf) / Tf:.1e}), {w3:.1f} s wall")

    base, w = run(pp_job)
    T0 = base.metrics.step_time_s
    per_stage = gpus // 8
    print(f"  PP job  llama3-70b tp8 pp8 dp{pp_dp}, {m} micro-batches: baseline {T0:.4f} s [{w:.0f} s wall]")
    for stage in (0, 3, 7):
        rank = stage * per_stage + 5          # axis order tp-cp-ep-dp-pp: stage is the outermost axis
        comp = compute_s(base, rank)
        out, w = run(pp_job, {"stragglers": {rank: K}})
        T = out.metrics.step_time_s
        expect = T0 + (K - 1) * comp
        print(f"    straggler on rank {rank} (stage {stage}): {T:.4f} s ({pct(T0, T)}); bound {expect:.4f} s "
              f"({pct(T0, expect)}) [{w:.0f} s wall]")

    print("\n2. one failed link (flow network, PP job)")
    base, w = run(pp_job, network="flow")
    T0 = base.metrics.step_time_s
    print(f"  baseline {T0:.4f} s [{w:.0f} s wall]")
    cluster = base.cluster
    ft = cluster.fat_tree
    # the leaf of rail 0 that the stage-1 -> stage-2 activations leave through (they cross leaves)
    src = 1 * per_stage + 8 * (pp_dp - 1)
    leaf = ft.leaf_of[src]
    for label, spec in (
            (f"leaf.{leaf}:spine.0.0 (1 of {ft.uplinks} uplinks of the leaf)", {"link_failures": [f"leaf.{leaf}:spine.0.0"]}),
            (f"{src}:leaf.{leaf} (GPU {src}'s NIC link: traffic re-routed over NVLink to a peer's NIC)",
             {"link_failures": [f"{src}:leaf.{leaf}"]})):
        out, w = run(pp_job, spec, network="flow")
        T = out.metrics.step_time_s
        print(f"  failed {label}: {T:.4f} s ({pct(T0, T)}) [{w:.0f} s wall]")

    print("\n3. one failed spine link on a tapered fabric (4:1 oversubscribed leaves, not rail-optimised; DP job, flow)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tapered.yaml"
        path.write_text(f"preset: dgx-h100\nfabric: {TAPERED}\n".replace("'", ""))
        job = {**dp_job, "cluster": str(path)}
        base, w = run(job, network="flow")
        T0 = base.metrics.step_time_s
        ft = base.cluster.fat_tree
        out, w2 = run(job, {"link_failures": ["leaf.0:spine.0.0"]}, network="flow")
        T = out.metrics.step_time_s
        print(f"  DP job: baseline {T0:.4f} s; failed leaf.0:spine.0.0 (1 of {ft.uplinks} uplinks): {T:.4f} s "
              f"({pct(T0, T)}) [{w + w2:.0f} s wall]")
    print("  trunk-bound pattern (every GPU sends 1 GB to the GPU half the cluster away, no compute):")
    T0, T, c_up = shifted_transfer(gpus)
    print(f"    baseline {T0:.4f} s; failed leaf.0:spine.0.0: {T:.4f} s ({pct(T0, T)}); closed form "
          f"{c_up}/{c_up - 1} -> {pct(c_up - 1, c_up)}")


def shifted_transfer(gpus: int):
    """Step time of every rank r sending 1 GB to r + gpus/2 on the tapered fabric, without and with one
    failed uplink of leaf 0; and the number of uplinks per leaf."""
    import topologies
    from simulator.engine import run as engine_run
    from clustersim.faults import parse_fault_options
    from topologies.faults import apply_faults
    from simulator.program import Programs, recv, send
    from topologies.cost import ClusterCostModel
    cluster = topologies.load_cluster("dgx-h100", gpus, fabric=TAPERED)
    cost = ClusterCostModel(cluster, network="flow")
    progs = Programs(world_size=gpus, ops={})
    for r in range(gpus):
        peer = (r + gpus // 2) % gpus
        progs.ops[r] = [send("tx", peer, 1e9), recv("rx", peer, 1e9, stream="rx")]
    faulted, _ = apply_faults(cost, cluster, parse_fault_options(fail_links=["leaf.0:spine.0.0"]), gpus)
    return engine_run(progs, cost).step_time_s, engine_run(progs, faulted).step_time_s, cluster.fat_tree.uplinks


if __name__ == "__main__":
    main()
