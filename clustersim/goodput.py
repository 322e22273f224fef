"""Goodput of a long training run under device failures, checkpoints and restarts (Monte-Carlo, seeded).

Model (the one Young 1974 and Daly 2006 analyse):
- N devices fail independently with exponential lifetimes of mean ``mtbf_device_s``, so the job is
  interrupted by a Poisson process of rate N / mtbf_device_s (system MTBF M = mtbf_device_s / N).
  Failures strike at any time: during work, checkpoint writes and restarts alike.
- The job alternates ``interval_s`` of training with a blocking checkpoint write of ``checkpoint_s``.
- A failure throws away everything since the last *completed* checkpoint (work and an unfinished write)
  and costs a restart of ``restart_s`` (detection + rescheduling + reloading the checkpoint); a failure
  during a restart starts the restart over.

Time is split into: ``useful`` (training that survives), ``checkpoint`` (completed writes), ``lost``
(work and unfinished writes since the last checkpoint, thrown away by a failure) and ``restart``.
Goodput = useful / wall time. Training still unsaved when the horizon ends counts as useful.

Between two consecutive failures the schedule is deterministic, so each trajectory is computed per
failure gap with numpy (no event loop). Expected values in closed form, for tests and comparison:

- exact (Daly 2006, eq. 13): wall time per interval = M·e^(R/M)·(e^((τ+C)/M) − 1), so
  goodput = τ / (M·e^(R/M)·(e^((τ+C)/M) − 1));
- first order: waste fraction ≈ C/τ + (τ + C)/(2M) + R/M;
- optimal interval: Young τ = sqrt(2CM); Daly τ = sqrt(2CM)·[1 + sqrt(C/2M)/3 + (C/2M)/9] − C (C < 2M), else M.

Units: seconds (CLI options in the units their names say).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

import click
import numpy as np

from clustersim.paths import NonEmptyPath
from simulator.errors import ConfigError, ResourceLimitError

HOUR_S = 3600.0
DAY_S = 86400.0
# At most this many failure events in one analysis (all trials and sweep points share them): ~10 bytes
# each in a few numpy temporaries, so a few hundred MB at worst.
MAX_FAILURE_EVENTS = 20_000_000
# Longest time any input may be (s): ~31,700 years, beyond any run or MTBF worth analysing; larger values
# only overflow the closed forms (M·50, exp) and the sweep.
MAX_TIME_S = 1e12
#: the shortest training step taken as real (s): below it steps per run overflow into nonsense (1e-308 s gave inf)
MIN_STEP_S = 1e-6
#: the options each setting comes from, for messages
FLAG = {"mtbf_device_s": "--mtbf-hours (in s)", "horizon_s": "--days (in s)", "checkpoint_s": "--checkpoint-cost-s",
        "restart_s": "--restart-s", "interval_s": "--checkpoint-interval-min (in s)", "step_time_s": "--step-time-s"}
# Most Monte-Carlo trajectories: each costs a few numpy calls per sweep point (100,000 take ~35 s on a
# 2-core machine); the standard error at the default 64 is already printed beside the estimate.
MAX_TRIALS = 100_000


@dataclass(frozen=True)
class GoodputConfig:
    """One training run to analyse.

    gpus            devices in the job (N)
    mtbf_device_s   mean time between failures of one device (s)
    interval_s      training time between checkpoints (s); None = Daly's optimum
    checkpoint_s    time one blocking checkpoint write takes (s)
    restart_s       time from a failure to training again: detection + reschedule + reload (s)
    horizon_s       wall-clock length of the run (s)
    step_time_s     one training step (s); when set, the interval is a whole number of steps
    trials          independent Monte-Carlo trajectories
    seed            random seed (same seed, same answer)
    """

    gpus: int
    mtbf_device_s: float
    checkpoint_s: float
    restart_s: float
    horizon_s: float
    interval_s: float | None = None
    step_time_s: float | None = None
    trials: int = 64
    seed: int = 0

    def __post_init__(self):
        _positive_int("gpus", self.gpus)
        _positive_int("trials", self.trials)
        if self.trials > MAX_TRIALS:
            raise ResourceLimitError(f"goodput: {self.trials:,} trials exceed the budget of {MAX_TRIALS:,} "
                                     f"(the standard error falls as 1/sqrt(trials): a few thousand suffice)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise ConfigError(f"goodput: seed must be an integer >= 0, got {self.seed!r}")
        _finite("mtbf_device_s", self.mtbf_device_s, strict=True)
        _finite("horizon_s", self.horizon_s, strict=True)
        _finite("checkpoint_s", self.checkpoint_s, strict=False)
        _finite("restart_s", self.restart_s, strict=False)
        if self.interval_s is not None:
            _finite("interval_s", self.interval_s, strict=True)
            if self.interval_s > self.horizon_s:
                raise ConfigError(f"goodput: the checkpoint interval ({self.interval_s / 60:g} min) is longer than "
                                  f"the run ({self.horizon_s / 86400:g} days): no checkpoint would be taken; lower "
                                  f"--checkpoint-interval-min or raise --days")
            if self.interval_s <= self.checkpoint_s:
                raise ConfigError(f"goodput: the checkpoint interval ({self.interval_s:g} s) is not longer than one "
                                  f"checkpoint write ({self.checkpoint_s:g} s, --checkpoint-cost-s): the run would do "
                                  f"nothing but checkpoint; raise --checkpoint-interval-min")
        if self.step_time_s is not None:
            _finite("step_time_s", self.step_time_s, strict=True)
            if self.step_time_s < MIN_STEP_S:
                raise ConfigError(f"goodput: --step-time-s {self.step_time_s:g} is shorter than any training step "
                                  f"(at least {MIN_STEP_S:g} s)")
            if self.step_time_s > self.horizon_s:
                raise ConfigError(f"goodput: one training step ({self.step_time_s:g} s) is longer than the run "
                                  f"({self.horizon_s:g} s = {self.horizon_s / 86400:g} days): no step would "
                                  f"complete; raise --days or check --step-time-s")

    @property
    def system_mtbf_s(self) -> float:
        """M: mean time between interruptions of the whole job (s)."""
        return self.mtbf_device_s / self.gpus


def _positive_int(name, v):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
        raise ConfigError(f"goodput: {name} must be a positive integer, got {v!r}")


def _finite(name, v, strict: bool):
    ok = isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or (v <= 0 if strict else v < 0) or v > MAX_TIME_S:
        flag = f" ({FLAG[name]})" if name in FLAG else ""
        raise ConfigError(f"goodput: {name}{flag} must be a number {'> 0' if strict else '>= 0'} and at most "
                          f"{MAX_TIME_S:.0e} s, got {v!r}")


# ---------------------------------------------------------------------------------------------- closed forms
def young_interval_s(checkpoint_s: float, system_mtbf_s: float) -> float:
    """Young (1974): optimal compute time between checkpoints, sqrt(2·C·M) (s)."""
    return math.sqrt(2.0 * checkpoint_s * system_mtbf_s)


def daly_interval_s(checkpoint_s: float, system_mtbf_s: float) -> float:
    """Daly (2006), higher-order optimum: sqrt(2CM)·[1 + sqrt(C/2M)/3 + (C/2M)/9] − C for C < 2M, else M."""
    c, m = checkpoint_s, system_mtbf_s
    if c >= 2.0 * m:
        return m
    x = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - c


def expected_goodput(interval_s: float, checkpoint_s: float, restart_s: float, system_mtbf_s: float) -> float:
    """Exact expected goodput of the model above (Daly 2006, eq. 13), in the long-run limit."""
    m = system_mtbf_s
    # τ / (M e^(R/M) (e^((τ+C)/M) − 1)), written with expm1 and logs to stay finite for huge exponents
    a = (interval_s + checkpoint_s) / m
    if a > 700 or restart_s / m > 700:
        return 0.0
    return interval_s / (m * math.exp(restart_s / m) * math.expm1(a))


def first_order_goodput(interval_s: float, checkpoint_s: float, restart_s: float, system_mtbf_s: float) -> float:
    """First-order expectation: 1 − C/τ − (τ + C)/(2M) − R/M (valid when τ, C, R << M)."""
    m = system_mtbf_s
    return 1.0 - checkpoint_s / interval_s - (interval_s + checkpoint_s) / (2.0 * m) - restart_s / m


def exact_optimal_interval_s(checkpoint_s: float, restart_s: float, system_mtbf_s: float) -> float:
    """The interval maximising ``expected_goodput`` (golden-section search on log τ; it is unimodal)."""
    lo, hi = math.log(max(1e-9, system_mtbf_s * 1e-9)), math.log(system_mtbf_s * 50.0)
    g = (math.sqrt(5.0) - 1.0) / 2.0

    def f(x):
        return -expected_goodput(math.exp(x), checkpoint_s, restart_s, system_mtbf_s)

    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(200):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return math.exp((a + b) / 2.0)


# ---------------------------------------------------------------------------------------------- Monte-Carlo
@dataclass
class GoodputResult:
    """Monte-Carlo estimate for one checkpoint interval (times are means per trajectory, s)."""

    interval_s: float
    goodput: float
    goodput_stderr: float
    useful_s: float
    checkpoint_s: float
    lost_work_s: float
    restart_s: float
    wall_s: float
    failures: float
    expected_goodput: float
    first_order_goodput: float
    steps: float | None = None

    @property
    def lost_by_cause(self) -> dict[str, float]:
        """Wall time not spent on useful training, by cause (s per trajectory)."""
        return {"checkpoint_writes": self.checkpoint_s, "lost_work": self.lost_work_s, "restarts": self.restart_s}


def failure_times(cfg: GoodputConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """Per trajectory, sorted failure instants in [0, horizon) of a Poisson process of rate N/MTBF."""
    rate = 1.0 / cfg.system_mtbf_s
    expected = rate * cfg.horizon_s * cfg.trials
    if expected > MAX_FAILURE_EVENTS:
        raise ResourceLimitError(
            f"goodput: {expected:.3g} expected failures over {cfg.trials} trial(s) of "
            f"{cfg.horizon_s / DAY_S:.3g} day(s) exceeds the budget of {MAX_FAILURE_EVENTS:.0e}; "
            f"use fewer --days or --trials (system MTBF is {cfg.system_mtbf_s:.3g} s)")
    counts = rng.poisson(rate * cfg.horizon_s, size=cfg.trials)
    return [np.sort(rng.uniform(0.0, cfg.horizon_s, size=k)) for k in counts]


def simulate_trajectory(fails: np.ndarray, horizon_s: float, interval_s: float, checkpoint_s: float,
                        restart_s: float) -> tuple[float, float, float, float]:
    """(useful, checkpoint, lost, restart) seconds of one trajectory with the given failure instants.

    Gap i runs from the previous failure (or 0) to failure i (or the horizon). After a failure the gap
    starts with a restart; if the gap ends first the whole gap is restart time. The rest of the gap
    runs k whole (interval + write) cycles, then a partial cycle that the failure throws away (at the
    horizon, its training part is kept as useful and its partial write counted as checkpoint time)."""
    bounds = np.concatenate(([0.0], fails, [horizon_s]))
    gaps = np.diff(bounds)
    n = len(gaps)
    restart_need = np.full(n, restart_s)
    restart_need[0] = 0.0                       # the run starts fresh
    restart = np.minimum(gaps, restart_need)
    run = gaps - restart
    cycle = interval_s + checkpoint_s
    k = np.floor(run / cycle)
    rem = run - k * cycle
    useful = k * interval_s
    ckpt = k * checkpoint_s
    # last gap ends at the horizon, not in a failure: its partial cycle is not lost
    tail_work = min(rem[-1], interval_s)
    lost = rem.copy()
    lost[-1] = 0.0
    u = float(useful.sum()) + tail_work
    c = float(ckpt.sum()) + (rem[-1] - tail_work)
    return u, c, float(lost.sum()), float(restart.sum())


def monte_carlo(cfg: GoodputConfig, interval_s: float, fails: list[np.ndarray] | None = None) -> GoodputResult:
    """Estimate goodput at ``interval_s`` over ``cfg.trials`` trajectories (common failure draws if given)."""
    if fails is None:
        fails = failure_times(cfg, np.random.default_rng(cfg.seed))
    rows = np.array([simulate_trajectory(f, cfg.horizon_s, interval_s, cfg.checkpoint_s, cfg.restart_s)
                     for f in fails])
    per_traj = rows[:, 0] / cfg.horizon_s
    mean = rows.mean(axis=0)
    stderr = float(per_traj.std(ddof=1) / math.sqrt(len(per_traj))) if len(per_traj) > 1 else 0.0
    m = cfg.system_mtbf_s
    return GoodputResult(
        interval_s=interval_s, goodput=float(per_traj.mean()), goodput_stderr=stderr,
        useful_s=float(mean[0]), checkpoint_s=float(mean[1]), lost_work_s=float(mean[2]), restart_s=float(mean[3]),
        wall_s=cfg.horizon_s, failures=float(np.mean([len(f) for f in fails])),
        expected_goodput=expected_goodput(interval_s, cfg.checkpoint_s, cfg.restart_s, m),
        first_order_goodput=first_order_goodput(interval_s, cfg.checkpoint_s, cfg.restart_s, m),
        steps=float(mean[0] / cfg.step_time_s) if cfg.step_time_s else None,
    )


@dataclass
class GoodputReport:
    """Goodput at the chosen interval, the sweep, and the optimal intervals (s)."""

    config: GoodputConfig
    at_interval: GoodputResult
    sweep: list[GoodputResult]
    best_interval_s: float           # Monte-Carlo optimum of the sweep
    young_interval_s: float
    daly_interval_s: float
    exact_optimal_interval_s: float  # maximises the closed-form expectation
    extra: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)   # what the figures do not mean for this configuration

    def to_dict(self) -> dict:
        def res(r: GoodputResult) -> dict:
            d = asdict(r)
            d["lost_by_cause_s"] = r.lost_by_cause
            return d
        return {
            "config": {**asdict(self.config), "system_mtbf_s": self.config.system_mtbf_s},
            "at_interval": res(self.at_interval),
            "optimal_interval_s": {
                "monte_carlo": self.best_interval_s, "young": self.young_interval_s, "daly": self.daly_interval_s,
                "exact_model": self.exact_optimal_interval_s},
            "sweep": [res(r) for r in self.sweep],
            "notes": list(self.notes),
        }


def _round_to_steps(interval_s: float, step_time_s: float | None) -> float:
    if not step_time_s:
        return interval_s
    steps = interval_s / step_time_s
    if not steps < 2.0 ** 53:       # beyond exact integers (or infinite): already a whole number of steps
        return interval_s
    return max(1, round(steps)) * step_time_s


def analyse(cfg: GoodputConfig, sweep_points: int = 25, sweep_span: float = 8.0) -> GoodputReport:
    """Monte-Carlo goodput at ``cfg.interval_s`` (Daly's optimum if None) and over a geometric sweep of
    ``sweep_points`` intervals from Daly/span to Daly·span, all on the same failure draws (common random
    numbers, so the sweep's shape is not noise)."""
    m = cfg.system_mtbf_s
    young = young_interval_s(cfg.checkpoint_s, m) if cfg.checkpoint_s > 0 else 0.0
    daly = daly_interval_s(cfg.checkpoint_s, m) if cfg.checkpoint_s > 0 else 0.0
    exact = exact_optimal_interval_s(cfg.checkpoint_s, cfg.restart_s, m)
    fails = failure_times(cfg, np.random.default_rng(cfg.seed))
    centre = daly if daly > 0 else exact
    chosen = _round_to_steps(cfg.interval_s if cfg.interval_s is not None else centre, cfg.step_time_s)
    grid = sorted({_round_to_steps(float(t), cfg.step_time_s)
                   for t in np.geomspace(centre / sweep_span, centre * sweep_span, sweep_points)})
    sweep = [monte_carlo(cfg, t, fails) for t in grid]
    best = max(sweep, key=lambda r: r.goodput).interval_s
    return GoodputReport(cfg, monte_carlo(cfg, chosen, fails), sweep, best, young, daly, exact,
                         notes=short_run_notes(cfg, chosen, grid))


def short_run_notes(cfg: GoodputConfig, interval_s: float, grid: list[float]) -> list[str]:
    """Notes for a run too short for its checkpoint intervals (seconds): one that never reaches its first
    checkpoint writes none, and the closed forms (a steady state of many intervals) do not describe it."""
    notes = []
    if interval_s >= cfg.horizon_s:
        notes.append(f"the checkpoint interval ({_fmt_t(interval_s)}) is no shorter than the run "
                     f"({_fmt_t(cfg.horizon_s)}): no checkpoint is written in it, a failure loses all work since "
                     f"the start, and the closed forms (a steady state over many intervals) do not describe it; "
                     f"give a longer --days or a shorter --checkpoint-interval-min")
    longer = sum(t >= cfg.horizon_s for t in grid)
    if longer > 1:
        notes.append(f"{longer} of the sweep's {len(grid)} intervals are no shorter than the run: they tie, so its "
                     f"Monte-Carlo optimum among them means nothing")
    return notes


# ---------------------------------------------------------------------------------------------- CLI
def _fmt_t(s: float) -> str:
    if s >= DAY_S:
        return f"{s / DAY_S:.2f} d"
    if s >= HOUR_S:
        return f"{s / HOUR_S:.2f} h"
    if s >= 60:
        return f"{s / 60:.1f} min"
    return f"{s:.3g} s"


def format_report(rep: GoodputReport) -> str:
    cfg, r = rep.config, rep.at_interval
    lines = [
        f"{cfg.gpus} devices, device MTBF {cfg.mtbf_device_s / HOUR_S:.4g} h -> job MTBF {_fmt_t(cfg.system_mtbf_s)}; "
        f"checkpoint {cfg.checkpoint_s:.4g} s, restart {cfg.restart_s:.4g} s; {cfg.horizon_s / DAY_S:.4g} days x "
        f"{cfg.trials} trials (seed {cfg.seed})",
        f"checkpoint every {_fmt_t(r.interval_s)}: goodput {r.goodput:.4f} ± {r.goodput_stderr:.4f} "
        f"(closed form {r.expected_goodput:.4f}, first order {r.first_order_goodput:.4f}); "
        f"{r.failures:.1f} failures per run",
        "time per run: " + ", ".join(f"{k} {_fmt_t(v)} ({v / r.wall_s:.2%})" for k, v in
                                     [("useful", r.useful_s), *r.lost_by_cause.items()]),
    ]
    if r.steps is not None:
        lines.append(f"training steps per run: {r.steps:.0f}")
    lines += [
        "optimal checkpoint interval: "
        f"Monte-Carlo sweep {_fmt_t(rep.best_interval_s)}, Young sqrt(2CM) {_fmt_t(rep.young_interval_s)}, "
        f"Daly {_fmt_t(rep.daly_interval_s)}, exact model {_fmt_t(rep.exact_optimal_interval_s)}",
        "sweep (interval: goodput MC / closed form): " + "; ".join(
            f"{_fmt_t(s.interval_s)}: {s.goodput:.4f}/{s.expected_goodput:.4f}" for s in rep.sweep[::3]),
    ]
    lines += [f"note: {n}" for n in rep.notes]
    return "\n".join(lines)


def read_simulate_result(path: str) -> tuple[int, float]:
    """(world size, step time s) from a ``clustersim simulate --json`` output or a report folder's result.json."""
    from pathlib import Path

    from simulator.inputs import load_json
    p = Path(path)
    if p.is_dir():
        p = p / "result.json"
    d = load_json(p, "--result", err=ConfigError)      # bounded read: a JSON result, not /dev/zero
    if not isinstance(d, dict):
        raise ConfigError(f"--result: {p} is not a simulate result (expected a JSON object)")
    if "world_size" not in d and "step_time_s" not in d:
        raise ConfigError(f"--result: {p} is not a simulate result: it has neither world_size nor step_time_s "
                          f"(expected the output of `clustersim simulate --json` or a report folder)")
    world, step = d.get("world_size"), d.get("step_time_s")
    if isinstance(world, bool) or not isinstance(world, int) or world <= 0:
        raise ConfigError(f"--result: {p} has no valid world_size (got {world!r})")
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not (math.isfinite(step) and step > 0):
        raise ConfigError(f"--result: {p} has no valid step_time_s (got {step!r})")
    return world, float(step)


@click.command("goodput")
@click.option("--gpus", type=int, help="Devices in the job (default: the --result's world size).")
@click.option("--result", "result_path", type=NonEmptyPath(),
              help="A `clustersim simulate --json` output (or --out folder): GPUs and step time from it.")
@click.option("--mtbf-hours", type=float, required=True, help="Mean time between failures of ONE device (hours).")
@click.option("--checkpoint-interval-min", type=float, default=None,
              help="Training minutes between checkpoints (default: Daly's optimum).")
@click.option("--checkpoint-cost-s", type=float, required=True, help="Seconds one blocking checkpoint write takes.")
@click.option("--restart-s", type=float, required=True,
              help="Seconds from a failure to training again (detection + reschedule + reload).")
@click.option("--days", type=float, default=30.0, show_default=True, help="Wall-clock length of the run (days).")
@click.option("--step-time-s", type=float, default=None, help="Training step time (s): intervals are whole steps.")
@click.option("--trials", type=int, default=64, show_default=True, help="Monte-Carlo trajectories (at most 100,000).")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def goodput(gpus, result_path, mtbf_hours, checkpoint_interval_min, checkpoint_cost_s, restart_s, days, step_time_s,
            trials, seed, as_json):
    """Expected goodput of a long run under failures, and the optimal checkpoint interval vs Young/Daly."""
    if result_path and gpus is not None and step_time_s is not None:
        raise ConfigError("goodput: --result gives the GPUs and the step time, and --gpus and --step-time-s both "
                          "override it: drop --result, or one of the two")
    if result_path:
        world, step = read_simulate_result(result_path)
        gpus = world if gpus is None else gpus
        step_time_s = step if step_time_s is None else step_time_s
    if gpus is None:
        raise ConfigError("goodput: give --gpus N or --result FILE (a simulate --json output)")
    for name, v, unit_s, unit in (("--mtbf-hours", mtbf_hours, HOUR_S, "hours"), ("--days", days, DAY_S, "days"),
                                  ("--checkpoint-interval-min", checkpoint_interval_min, 60.0, "minutes")):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ConfigError(f"goodput: {name} must be a finite number > 0, got {v}")
        if v is not None and v * unit_s > MAX_TIME_S:      # said in the option's own unit
            raise ConfigError(f"goodput: {name} must be at most {MAX_TIME_S / unit_s:.3g} {unit}, got {v:g}")
    cfg = GoodputConfig(
        gpus=gpus, mtbf_device_s=mtbf_hours * HOUR_S, checkpoint_s=checkpoint_cost_s, restart_s=restart_s,
        horizon_s=days * DAY_S,
        interval_s=None if checkpoint_interval_min is None else checkpoint_interval_min * 60.0,
        step_time_s=step_time_s, trials=trials, seed=seed)
    if not math.isfinite(cfg.horizon_s) or not math.isfinite(cfg.mtbf_device_s):
        raise ConfigError("goodput: --days / --mtbf-hours too large")
    rep = analyse(cfg)
    if as_json:
        click.echo(json.dumps(rep.to_dict(), indent=1, sort_keys=True, allow_nan=False, default=_json_default))
    else:
        click.echo(format_report(rep))


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    raise TypeError(type(o).__name__)
