"""``clustersim simulate``: one experiment end to end, a summary table or ``--json``, and a report folder."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from clustersim.experiment import experiment_from_options, run_experiment, simulate_options
from clustersim.paths import NonEmptyPath
from simulator.errors import ConfigError


class DelayedProgress:
    """A rich progress bar on stderr that appears once a run has lasted ``delay_s`` seconds, counting
    ``unit`` (ops, plans) with an ETA from the average rate since the start (known from the first update)."""

    def __init__(self, description: str, delay_s: float = 1.0, enabled: bool = True, unit: str = "ops"):
        self.description, self.delay_s, self.enabled, self.unit = description, delay_s, enabled, unit
        self.t0 = time.perf_counter()
        self.bar = None
        self.task = None

    def eta_s(self, done: int, total: int, now: float | None = None) -> float | None:
        """Seconds left at the mean rate so far (None before anything is done)."""
        elapsed = (time.perf_counter() if now is None else now) - self.t0
        if done <= 0 or elapsed <= 0:
            return None
        return max(0.0, elapsed * (total - done) / done)

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        eta = self.eta_s(done, total)
        eta_text = "ETA --:--" if eta is None else f"ETA {int(eta) // 60:d}:{int(eta) % 60:02d}"
        if self.bar is None:
            if time.perf_counter() - self.t0 < self.delay_s or done >= total:
                return
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn(self.unit), TimeElapsedColumn(), TextColumn("{task.fields[eta]}"),
                                console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.description, total=total, eta=eta_text)
        self.bar.update(self.task, completed=done, eta=eta_text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _fmt_bytes(b: float) -> str:
    return f"{b / 1e9:,.1f} GB"


#: panels of simulate's memory.png: one per pipeline stage up to this many (plots.representative_ranks)
MEMORY_PLOT_RANKS = 8


def param_str(model) -> str:
    """The model's parameter count for tables: "8.03 B" (MoE: "671.03 B (37.55 B active)"; with multi-token
    prediction: "+ MTP x1 (11.61 B)")."""
    n = model.param_count()
    mtp = getattr(model, "mtp_layers", 0)
    extra = f" + MTP x{mtp} ({model.mtp_param_count() / 1e9:,.2f} B)" if mtp and not model.params_only else ""
    if getattr(model, "is_moe", False):
        return f"{n / 1e9:,.2f} B ({model.active_param_count() / 1e9:,.2f} B active){extra}"
    return f"{n / 1e9:,.2f} B{extra}"


def print_summary(outcome, console=None) -> None:
    """The human summary: a rich table of the metrics."""
    from rich.console import Console
    from rich.table import Table
    console = console or Console()
    m, exp = outcome.metrics, outcome.experiment
    p = outcome.plan
    t = Table(title=f"clustersim · {outcome.model.name} on {exp.cluster} × {m.world_size} GPUs", show_header=False,
              title_justify="left")
    t.add_column(style="bold")
    t.add_column(justify="right")
    plan_str = (f"tp{p.tp} pp{p.pp} dp{p.dp}" + (f" ep{p.ep}" if p.ep > 1 else "") + (f" etp{p.expert_tp}" if p.folded else "") + (f" cp{p.cp}" if p.cp > 1 else "")
                + (" sp" if getattr(p, "sp", False) else "") + (" tp-overlap" if getattr(p, "tp_comm_overlap", False) else "")
                + (" fsdp" if getattr(p, "fsdp", False) else "")
                + (f" {p.moe_dispatcher}" if getattr(p, "moe_dispatcher", "alltoall") != "alltoall" else "")
                + (f" zero{p.zero}" if getattr(p, "zero", 0) else "")
                + (f" lora{p.lora_rank}({','.join(p.lora_targets)})" if getattr(p, "lora_rank", 0) else "")
                + f" · {p.schedule}" + (f" v{p.virtual_stages}" if getattr(p, "virtual_stages", 1) > 1 else "")
                + f" · mb {p.micro_batch} · gb {p.global_batch} · seq {p.seq}")
    rows = [
        ("parameters", param_str(outcome.model)),
        ("plan", plan_str),
        ("network / mode", f"{exp.network} / {m.mode}"),
        ("calibration", f"{Path(exp.calibration).name}: {outcome.calibration}" if exp.calibration else "none"),
        ("step time", f"{m.step_time_s:.4f} s"),
        ("tokens / s", f"{m.tokens_per_s:,.0f}"),
        ("TFLOP/s per GPU (model)", f"{m.tflops_per_gpu:.1f}"),
        ("MFU", f"{m.mfu:.1%}"),
        ("precision / stack", f"{getattr(p, 'dtype', 'bf16')} / {getattr(p, 'stack', '')}"),
        *([("GEMM rate", rate)] if (rate := _gemm_rate(outcome)) else []),
        # (idle time: the pipeline's bubble where there is a pipeline, else waiting for slower peers)
        ("pipeline bubble" if p.pp > 1 else "idle (waiting for peers)", f"{m.bubble_fraction:.1%}"),
        ("exposed communication", f"{m.exposed_comm_fraction:.1%}"),
        ("overlap (comm hidden by compute)", f"{m.overlap_fraction:.1%}"),
        *[(f"  {ax.upper()} comm total / exposed / hidden", f"{d['total_fraction']:.1%} / {d['exposed_fraction']:.1%}"
           f" / {d['overlapped_fraction']:.1%}") for ax, d in m.comm_by_axis.items()],
        ("peak memory / HBM", f"{_fmt_bytes(m.peak_memory_bytes)} / {_fmt_bytes(m.memory_capacity_bytes)}"
                              + ("" if m.fits_in_memory else "  [red]does not fit[/red]")),
        ("ops simulated (represented)", f"{m.events_simulated:,} ({m.represented_ops:,})"),
        ("wall time", f"{m.wall_time_s:.2f} s"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
    ev = outcome.evidence()
    if ev is not None:
        from clustersim.evidence import evidence_line
        console.print(f"[cyan]evidence (clustersim validate):[/cyan] {evidence_line(ev)}", highlight=False)
    for n in outcome.notes:
        console.print(f"[yellow]note:[/yellow] {n}")


def _gemm_rate(outcome) -> str | None:
    """The run's GEMM rating for the table (sustained, burst or calibrated), where a kernel model priced it."""
    cost = getattr(outcome.cost, "base", outcome.cost)        # --network astra wraps the cluster's cost model
    rate = getattr(cost, "gemm_rate", None)
    return rate(getattr(outcome.plan, "dtype", "bf16")) if rate is not None else None


def write_report_folder(outcome, out: Path, force: bool = False, breakdown: bool = True) -> list[Path]:
    """Write timeline.csv, trace.json (Perfetto), gantt.png, memory.png and last result.json (with the run id)
    into ``out``, each atomically; an earlier run's files are removed first (``simulator.atomic.OutputFolder``)."""
    from simulator.atomic import OutputFolder, write_text
    from simulator.export import lane_ranks, write_perfetto, write_rank_traces, write_timeline
    from simulator.inputs import json_safe
    folder = OutputFolder(out, force=force, command="simulate")
    res = outcome.result
    written = []
    summary = outcome.summary()
    summary["experiment"] = outcome.experiment.to_dict()
    summary["run_id"] = folder.run_id
    if breakdown:
        summary["breakdown"] = outcome.breakdown()
    lanes = lane_ranks(res)
    written.append(write_timeline(res, folder.path("timeline.csv"), ranks=lanes))
    written.append(write_perfetto(res, folder.path("trace.json"), ranks=lanes))
    written += write_rank_traces(res, folder.subfolder("traces"), ranks=lanes)   # one file per rank: HTA / Perfetto folder
    try:
        from clustersim import plots
    except ImportError:
        plots = None
    if plots is not None:
        import matplotlib.pyplot as plt
        fig = plots.gantt(res, path=folder.path("gantt.png"), ranks=lanes)
        plt.close(fig)
        written.append(out / "gantt.png")
        picks = plots.representative_ranks(res, MEMORY_PLOT_RANKS)
        fig = plots.memory_over_time(res, path=folder.path("memory.png"), ranks=[r for r, _ in picks])
        plt.close(fig)
        written.append(out / "memory.png")
        shown = plots.shown_ranks_note(res, picks)
        if shown:
            outcome.notes.append(f"memory.png: {shown}")
    written.insert(0, write_text(folder.path("result.json"), json.dumps(
        json_safe(summary), indent=1, sort_keys=True, default=str, allow_nan=False) + "\n"))
    folder.finish()
    return written


@click.command("simulate")
@simulate_options
@click.option("--out", type=NonEmptyPath(file_okay=False), help="Write a report folder (JSON, timeline, Perfetto, PNGs).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (stable contract, see README).")
@click.option("--breakdown", is_flag=True, help="Per-kernel time of each layer phase (also in --json and --out).")
@click.option("--force", is_flag=True, help="Write into a non-empty --out that no clustersim run wrote.")
def simulate(out, as_json, breakdown, force, **options):
    """Simulate one training step of a model and parallel plan on a cluster."""
    if force and not out:
        raise ConfigError("--force lets --out write into a non-empty folder: give --out too")
    if out:
        from simulator.atomic import OutputFolder
        OutputFolder.check(out, force)          # before the simulation, not after it
    exp = experiment_from_options(**options)
    from clustersim.startup import single_simulation
    single_simulation()
    progress = DelayedProgress("simulating", enabled=sys.stderr.isatty())
    try:
        outcome = run_experiment(exp, progress=progress, timeline=bool(out),
                                 announce=lambda line: click.echo(line, err=True))
    finally:
        progress.close()
    if out:
        files = write_report_folder(outcome, Path(out), force=force)
    if as_json:
        summary = outcome.summary()
        if breakdown:
            summary["breakdown"] = outcome.breakdown()
        from simulator.inputs import json_safe
        click.echo(json.dumps(json_safe(summary), sort_keys=True, default=str, allow_nan=False))
    else:
        print_summary(outcome)
        if breakdown:
            print_breakdown(outcome.breakdown())
        if out:
            rank_files = [f for f in files if f.parent.name == "traces"]
            shown = [str(f) for f in files if f not in rank_files]
            if rank_files:
                shown.append(f"{rank_files[0].parent}/ ({len(rank_files)} rank-N.json files)")
            click.echo(f"wrote {', '.join(shown)}")


def print_breakdown(bd: dict, console=None) -> None:
    """One table per layer phase: each kernel's shape, time, achieved TFLOP/s and share of the phase."""
    from rich.console import Console
    from rich.table import Table
    console = console or Console()
    console.width = max(console.width, 132)     # keep kernel rows on one line when piped
    if not bd["phases"]:
        console.print("no kernel-priced ops (a calibration's layer fits or measured durations price them)")
        return
    for ph in bd["phases"]:
        t = Table(title=f"rank {bd['rank']} · {ph['label']} ({ph['stack']}, {ph['dtype']}) · {ph['ops']} ops × "
                        f"{ph['time_s'] * 1e3:.3f} ms", title_justify="left")
        for c in ("kernel", "kind", "shape", "time us", "TFLOP/s", "share"):
            t.add_column(c, justify="left" if c in ("kernel", "kind", "shape") else "right")
        for k in ph["kernels"]:
            t.add_row(k["kernel"], f"{k['kind']} {k['dtype']}" if k["kind"] == "gemm" else k["kind"], k["shape"],
                      f"{k['time_s'] * 1e6:,.1f}", f"{k['tflops_per_s']:.0f}" if k["flops"] else "",
                      f"{k['time_s'] / ph['time_s']:.1%}" if ph["time_s"] else "")
        console.print(t)
    f = bd.get("slowest_gpu_factor", 1.0)
    if f != 1.0:
        console.print(f"kernel times of a typical GPU; the job runs at its slowest GPU's pace: every compute op "
                      f"takes x{f:.4f} (--gpu-variation)")
