"""``clustersim chakra``: run Chakra execution traces on ASTRA-sim network/system configurations
(``run``), and write our generated programs as Chakra traces plus ASTRA-sim configurations (``export``)."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import click

from clustersim.paths import NonEmptyPath
from simulator import atomic
from simulator.errors import ConfigError, TraceError


@click.group("chakra")
def chakra() -> None:
    """Chakra execution traces and ASTRA-sim configurations: run them, or export ours."""


def _jsonable(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


@chakra.command("run")
@click.argument("et_prefix")
@click.option("--network", "network_file", required=True, type=NonEmptyPath(dir_okay=False),
              help="ASTRA-sim analytical network YAML (topology, npus_count, bandwidth GB/s, latency ns per dim).")
@click.option("--system", "system_file", type=NonEmptyPath(dir_okay=False),
              help="ASTRA-sim system JSON (collective algorithm per dimension, chunking, roofline).")
@click.option("--comm-group", "comm_group_file", type=NonEmptyPath(dir_okay=False),
              help="ASTRA-sim communicator-group JSON ({name: [ranks]}) for nodes with pg_name.")
@click.option("--network-mode", type=click.Choice(["analytical", "flow"]), default="analytical", show_default=True,
              help="analytical: ASTRA-sim's congestion-unaware model. flow: the same times for a communication "
                   "alone, plus max-min fair sharing of the dimensions' links between concurrent ones.")
@click.option("--replicate", is_flag=True,
              help="A single rank file stands for every NPU of the network (its copies are identical).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--out", type=NonEmptyPath(file_okay=False), help="Write result.json, timeline.csv, trace.json (Perfetto).")
@click.option("--force", is_flag=True, help="Write into a non-empty --out that no clustersim run wrote.")
def run_cmd(et_prefix, network_file, system_file, comm_group_file, network_mode, replicate, as_json, out, force):
    """Simulate the Chakra ETs ET_PREFIX.<rank>.et (what ASTRA-sim's --workload-configuration takes)."""
    if out:
        atomic.OutputFolder.check(out, force)       # before the simulation, not after it
        _check_out_holds_no_input(Path(out), et_prefix, (network_file, system_file, comm_group_file))
    from simulator.engine import run
    from simulator.metrics import compute_metrics
    from topologies.astra import load_network, load_system
    from topologies.multidim import MultiDimCostModel
    from traces.chakra.reader import load_programs, rank_files, replicate_programs
    from traces.chakra.writer import load_comm_groups

    t0 = time.perf_counter()
    net = load_network(network_file)
    sysc = load_system(system_file)
    groups = load_comm_groups(comm_group_file) if comm_group_file else None
    dims = tuple(d.npus for d in net.dims)
    if replicate:
        # (read as the NPUs it stands for: a communicator group names their ranks, not the one file's)
        found = len(rank_files(et_prefix))
        if found != 1:
            raise TraceError(f"--replicate needs exactly one rank file, found {found}")
        programs, report = replicate_programs(et_prefix, dims, groups, sysc.roofline_enabled)
    else:
        programs, report = load_programs(et_prefix, dims=dims, comm_groups=groups, roofline=sysc.roofline_enabled)
    cost = MultiDimCostModel(net, sysc, network_mode)
    if programs.symmetric and not replicate:
        from simulator.symmetry import symmetry_problem
        problem = symmetry_problem(programs, cost)
        if problem:
            report.notes.append(f"symmetric mode not valid ({problem}); simulated every rank")
            programs, _ = load_programs(et_prefix, dims=dims, comm_groups=groups, roofline=sysc.roofline_enabled,
                                        symmetric=False)
    result = run(programs, cost)
    metrics = compute_metrics(result)
    metrics.wall_time_s = time.perf_counter() - t0
    summary = {
        "step_time_s": metrics.step_time_s, "exposed_comm_fraction": metrics.exposed_comm_fraction,
        "overlap_fraction": metrics.overlap_fraction, "compute_fraction": metrics.compute_fraction,
        "bubble_fraction": metrics.bubble_fraction, "world_size": metrics.world_size,
        "events_simulated": metrics.events_simulated, "represented_ops": metrics.represented_ops,
        "wall_time_s": metrics.wall_time_s, "mode": metrics.mode, "network_mode": network_mode,
        "network": str(network_file), "system": str(system_file) if system_file else None,
        "rank_files": report.files, "classes": report.classes, "node_types": dict(report.node_types),
        "unknown_attributes": dict(report.unknown_attributes), "notes": report.lines()[2:],
        "exposed_comm_s_per_rank": {str(rm.rank): rm.exposed_comm_s for rm in metrics.per_rank[:64]},
    }
    if out:
        from simulator.export import lane_ranks, write_perfetto, write_timeline
        folder = atomic.OutputFolder(out, force=force, command="chakra run")   # an earlier run's files go first
        atomic.write_text(folder.path("result.json"),
                          json.dumps({k: _jsonable(v) for k, v in summary.items()}, indent=1) + "\n")
        lanes = lane_ranks(result)
        write_timeline(result, folder.path("timeline.csv"), ranks=lanes)
        write_perfetto(result, folder.path("trace.json"), ranks=lanes)
        folder.finish()
    if as_json:
        click.echo(json.dumps({k: _jsonable(v) for k, v in summary.items()}, sort_keys=True))
        return
    for line in report.lines():
        click.echo(line)
    click.echo(f"step time            {metrics.step_time_s * 1e9:,.0f} ns ({metrics.step_time_s:.6g} s)")
    click.echo(f"exposed comm         {metrics.exposed_comm_fraction:.1%} of the step")
    click.echo(f"world / mode         {metrics.world_size} NPUs / {metrics.mode} ({report.classes} simulated)")
    click.echo(f"ops simulated        {metrics.events_simulated:,} (represent {metrics.represented_ops:,})")
    click.echo(f"wall time            {metrics.wall_time_s:.2f} s")
    if out:
        click.echo(f"wrote {out}/result.json, timeline.csv, trace.json")


def _check_out_holds_no_input(out: Path, et_prefix: str, files) -> None:
    """Refuse an ``--out`` folder that holds this run's inputs: a folder an earlier clustersim run wrote (e.g.
    ``chakra export``'s) has its recorded files removed before the results go in, inputs included."""
    from traces.chakra.reader import rank_files
    try:
        out = out.resolve()
        inputs = [Path(f) for f in rank_files(et_prefix)] + [Path(f) for f in files if f]
    except (OSError, TraceError):
        return                      # (the run itself reports a missing input)
    held = sorted({p.name for p in inputs if p.resolve().parent == out})
    if held:
        raise ConfigError(f"--out {out} holds this run's inputs ({', '.join(held[:4])}"
                          f"{', ...' if len(held) > 4 else ''}): an earlier run's files there are removed before the "
                          f"results are written; give another --out folder")


def _make_export():
    from clustersim.experiment import experiment_from_options, run_experiment, simulate_options

    @click.command("export")
    @simulate_options
    @click.option("--out", required=True, type=NonEmptyPath(file_okay=False), help="Folder for the ETs and configurations.")
    @click.option("--prefix", default="workload", show_default=True, help="ET file prefix (<prefix>.<rank>.et).")
    @click.option("--force", is_flag=True, help="Write into a non-empty --out that no clustersim run wrote.")
    def export(out, prefix, force, **options):
        """Write a simulated experiment's programs as one Chakra ET per rank, plus an ASTRA-sim network YAML,
        system JSON and communicator-group JSON approximating the cluster."""
        if not prefix or prefix.startswith(".") or any(c in prefix for c in "/\\") or prefix != prefix.strip():
            raise ConfigError(f"--prefix {prefix!r}: a plain file-name prefix, without folders or a leading dot "
                              f"(the ETs go into --out as <prefix>.<rank>.et)")
        from topologies.astra import AstraSystem, COLLECTIVE_KEYS
        from traces.chakra.writer import write_workload
        exp = experiment_from_options(**options)
        atomic.OutputFolder.check(out, force)       # before the simulation, not after it
        from clustersim.startup import single_simulation
        single_simulation()
        outcome = run_experiment(exp)
        programs = outcome.result.programs
        _price_kernel_ops(programs, outcome.cost)
        folder = atomic.OutputFolder(out, force=force, command="chakra export")   # an earlier run's files go first
        folder.record([f"{prefix}.{r}.et" for r in range(programs.world_size)]
                      + ["comm_groups.json", "network.yml", "system.json"])      # before they are written
        paths = write_workload(programs, out, prefix)
        from topologies.multidim import network_of_cluster
        net = network_of_cluster(outcome.cluster)
        acc = outcome.cluster.accelerator
        sysc = AstraSystem(implementations={k: ("ring",) * len(net.dims) for k in COLLECTIVE_KEYS},
                           preferred_dataset_splits=4, local_mem_bw_Bps=acc.hbm_bytes_per_s, roofline_enabled=True,
                           peak_perf_flops=acc.peak_bf16_flops)
        o = Path(out)
        atomic.write_text(o / "network.yml", net.to_yaml())
        atomic.write_text(o / "system.json", sysc.to_json(len(net.dims)))
        folder.finish()
        click.echo(f"wrote {len(paths) - 1} Chakra ETs ({o}/{prefix}.<rank>.et), comm_groups.json, network.yml, "
                   f"system.json; simulated step time {outcome.metrics.step_time_s:.6g} s")
        click.echo(f"ASTRA-sim: --workload-configuration={o}/{prefix} --comm-group-configuration={o}/comm_groups.json "
                   f"--network-configuration={o}/network.yml --system-configuration={o}/system.json")
        for note in list(outcome.notes) + export_left_out(exp):
            click.echo(f"note: {note}")

    return export


def export_left_out(exp) -> list[str]:
    """What of the simulated experiment the written files do not carry (the step above used it; an ET
    consumer will not): faults, a forced collective algorithm, an ASTRA-sim system file, the network model."""
    from topologies.faults import faults_from_dict
    left = []
    f = faults_from_dict(exp.faults or None)
    if f.stragglers or f.straggler_distribution or f.jitter:
        left.append("stragglers / jitter (the ETs hold every rank's nominal compute times)")
    if f.link_failures or f.link_degradation or f.device_failures:
        left.append("failed or degraded links and failed devices (network.yml describes the healthy fabric)")
    if exp.algorithm and exp.algorithm != "ring":
        left.append(f"--algorithm {exp.algorithm} (system.json runs ring on every dimension)")
    if exp.astra_system:
        left.append(f"--astra-system {exp.astra_system} (system.json is the default; pass your file to ASTRA-sim)")
    if exp.network != "analytical":
        left.append(f"--network {exp.network} (communication in the ETs is timed by the consumer's own network model)")
    return ["the written files leave out " + "; ".join(left)] if left else []


def _price_kernel_ops(programs, cost) -> None:
    """Compute ops priced kernel by kernel (``op.kernels``) carry no FLOP count a Chakra roofline could
    reproduce: give them the duration our cost model priced, so an ET consumer (ASTRA-sim, or our reader) runs
    the same compute time."""
    if cost is None:
        return
    done: set[int] = set()
    for rank, prog in programs.ops.items():
        for op in prog:
            if op.kind == "compute" and getattr(op, "kernels", None) is not None and op.duration_s is None \
                    and id(op) not in done:
                op.duration_s = cost.compute_time_s(rank, op)
                done.add(id(op))


chakra.add_command(_make_export())
