"""``clustersim replay``: replay a measured trace through the engine and compare step times (traces.replay)."""
from __future__ import annotations

import json
from pathlib import Path

import click

from clustersim.paths import NonEmptyPath
from simulator.calibration import CALIBRATION_SCOPES
from simulator.inputs import json_safe


@click.command("replay")
@click.argument("trace_dir", type=NonEmptyPath(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
@click.option("--cluster", default=None, help="what-if: simulate the collectives on this cluster preset")
@click.option("--gpus", type=int, default=None, help="GPUs of the --cluster preset (default: the preset's default size; the trace's ranks sit on its first GPUs)")
@click.option("--network", type=click.Choice(["analytical", "flow"]), default="analytical", show_default=True,
              help="network model of --cluster")
@click.option("--calibration", type=NonEmptyPath(path_type=Path), default=None,
              help="calibration JSON: with --cluster, for its cost model; alone, time the trace's collectives "
                   "with its alpha-beta fits")
@click.option("--calibration-scope", type=click.Choice(CALIBRATION_SCOPES), default="matching", show_default=True,
              help="with --calibration: 'any' applies fits measured on other hardware or another backend")
@click.option("--scale-bandwidth", type=float, default=1.0, show_default=True,
              help="what-if: divide communication times by this factor")
@click.option("--scale-compute", type=float, default=1.0, show_default=True,
              help="what-if: divide compute times by this factor (faster compute > 1)")
@click.option("--allow-mixed", is_flag=True,
              help="replay a folder whose files disagree on ranks, steps or manifest (files of different runs)")
def replay(trace_dir: Path, as_json: bool, cluster: str | None, gpus: int | None, network: str,
           calibration: Path | None, calibration_scope: str, scale_bandwidth: float, scale_compute: float,
           allow_mixed: bool) -> None:
    """Replay a trace (TRACE_DIR: a folder of per-rank Kineto files, or one file) through the simulator and
    compare the predicted step time with the measured one, per rank and overall."""
    from traces.replay import replay as run_replay

    res = run_replay(trace_dir, cluster=cluster, gpus=gpus, scale_bandwidth=scale_bandwidth,
                     scale_compute=scale_compute, network=network, calibration=calibration,
                     allow_mixed=allow_mixed, calibration_scope=calibration_scope)
    if as_json:
        click.echo(json.dumps(json_safe(res), indent=1, default=float, allow_nan=False))
        return
    click.echo(f"replay of {trace_dir}: {res['ranks_in_trace']} rank(s) of {res['world_size']}, "
               f"{res['steps']} step(s), {res['ops']} ops, backend {res['backend']}")
    if res.get("what_if"):
        click.echo(f"what-if: {res['what_if']}")
    for n in res.get("notes", ()):
        click.echo(f"note: {n}")
    # a what-if predicts another machine: the difference is a change, not an error of the model
    col = "change" if res.get("what_if") else "error"
    click.echo(f"{'rank':>5} {'measured (ms)':>14} {'predicted (ms)':>15} {col:>8}")
    for row in res["per_rank"]:
        click.echo(f"{row['rank']:>5} {row['measured_step_time_s'] * 1e3:>14.3f} "
                   f"{row['predicted_step_time_s'] * 1e3:>15.3f} {row['error']:>+8.1%}")
    click.echo(f"{'all':>5} {res['measured_step_time_s'] * 1e3:>14.3f} {res['predicted_step_time_s'] * 1e3:>15.3f} "
               f"{res['error']:>+8.1%}   (median over ranks and steps; |{col}| median "
               f"{res['abs_error_median']:.1%})")
