"""``clustersim calibrate``: fit a calibration JSON from trace folders and benchmarks (traces.calibrate)."""
from __future__ import annotations

from pathlib import Path

import click

from clustersim.paths import NonEmptyPath
from simulator.errors import ConfigError


PLOT_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")


def _check_output(path: Path, flag: str, suffixes: tuple[str, ...]) -> None:
    """An output path must have a known extension and an existing folder."""
    if path.suffix.lower() not in suffixes:
        raise ConfigError(f"{flag} {path}: expected a {' / '.join(suffixes)} file")
    if not path.parent.is_dir():
        raise ConfigError(f"{flag} {path}: folder {path.parent} does not exist")


@click.command("calibrate")
@click.argument("sources", nargs=-1, required=True, type=NonEmptyPath(path_type=Path))
@click.option("-o", "--output", "output", type=NonEmptyPath(path_type=Path), default=Path("calibration.json"),
              show_default=True, help="calibration JSON to write")
@click.option("--plot", "plot_path", type=NonEmptyPath(path_type=Path), default=None,
              help="PNG with every fit against its measured points")
@click.option("--allow-mixed", is_flag=True,
              help="use a folder whose files disagree on ranks, steps or manifest (files of different runs), "
                   "and fit a collective measured on different devices as one")
def calibrate(sources: tuple[Path, ...], output: Path, plot_path: Path | None, allow_mixed: bool) -> None:
    """Fit compute efficiency and collective alpha-beta from trace folders/files (TRACE_DIR ...) and
    collective benchmarks (a `clustersim collect --bench collectives` folder or its manifest.json)."""
    from simulator.calibration import CollectiveFit
    from traces.calibrate import FIT_WARN_ERROR, fit_errors, plot
    from traces.calibrate import calibrate as fit

    _check_output(output, "-o", (".json",))
    if plot_path is not None:
        _check_output(plot_path, "--plot", PLOT_SUFFIXES)
    cal = fit(list(sources), allow_mixed=allow_mixed)
    try:
        cal.save(output)
    except OSError as e:
        raise ConfigError(f"cannot write {output}: {e.strerror}") from None
    lines = [(f"compute  {c.device}", f"peak {c.peak_flops_per_s / 1e12:.4g} TFLOP/s, half-saturation "
                                        f"{c.half_saturation_flops:.3g} FLOPs", c) for c in cal.compute]
    lines += [(f"layer    {f.device} {f.phase}", f"peak {f.peak_flops_per_s / 1e12:.4g} TFLOP/s, half-saturation "
                                                  f"{f.half_saturation_flops:.3g} FLOPs", f) for f in cal.layers]
    lines += [(f"{c.kind:<15} {c.backend} n={c.group_size} {c.scope}",
               f"alpha {c.alpha_s * 1e6:.3g} us, busbw {c.busbw_bytes_per_s / 1e9:.4g} GB/s", c)
              for c in cal.collectives]
    for name, figures, f in lines:
        med, worst = fit_errors(f)
        click.echo(f"{name}: {figures} ({len(f.points)} sizes; error vs its points median {med:.1%}, "
                   f"max {worst:.1%})")
        fit = f"the {name.split()[0]} fit {' '.join(name.split()[1:])}"
        if isinstance(f, CollectiveFit) and len(f.points) == 1:
            click.echo(f"warning: {fit} rests on one size: its latency (alpha) cannot be told from its bandwidth, so "
                       f"the whole time is priced as bandwidth (alpha 0); measure more sizes (clustersim collect "
                       f"--bench collectives)", err=True)
        if worst > FIT_WARN_ERROR:
            click.echo(f"warning: {fit} misses one of its "
                       f"points by {worst:.0%} (> {FIT_WARN_ERROR:.0%}): the saturating / alpha-beta curve does "
                       f"not describe these measurements well", err=True)
    click.echo(f"wrote {output}")
    if plot_path is not None:
        try:
            click.echo(f"wrote {plot(cal, plot_path)}")
        except OSError as e:
            raise ConfigError(f"cannot write {plot_path}: {e.strerror}") from None
