"""Goodput Monte-Carlo against closed forms (Daly's exact expectation, first order, Young/Daly optima)
and against an independent event-by-event simulation of the same failure draws."""
import json
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from clustersim.cli import main
from simulator.errors import ConfigError, ResourceLimitError
from clustersim.goodput import (DAY_S, HOUR_S, GoodputConfig, analyse, daly_interval_s, exact_optimal_interval_s,
                               expected_goodput, first_order_goodput, monte_carlo, simulate_trajectory,
                               young_interval_s)


def event_loop(fails, horizon, tau, c, r):
    """Reference: walk the schedule state by state (work, write, restart), failure by failure."""
    t, useful, ckpt, lost, restart = 0.0, 0.0, 0.0, 0.0, 0.0
    fails = list(fails) + [math.inf]
    i = 0
    phase, left, unsaved_work, unsaved_write = "work", tau, 0.0, 0.0
    while t < horizon:
        nxt_fail = fails[i]
        end = min(t + left, nxt_fail, horizon)
        dt = end - t
        if phase == "work":
            unsaved_work += dt
        elif phase == "write":
            unsaved_write += dt
        else:
            restart += dt
        left -= dt
        t = end
        if t >= horizon:
            useful += unsaved_work
            ckpt += unsaved_write
            break
        if left > 1e-9 and t == nxt_fail:   # a phase ending at the failure instant completes first
            lost += unsaved_work + unsaved_write
            unsaved_work = unsaved_write = 0.0
            i += 1
            phase, left = "restart", r
            if left == 0:
                phase, left = "work", tau
            continue
        if phase == "work":
            phase, left = "write", c
            if left == 0:
                useful += unsaved_work
                unsaved_work = 0.0
                phase, left = "work", tau
        elif phase == "write":
            useful += unsaved_work
            ckpt += unsaved_write
            unsaved_work = unsaved_write = 0.0
            phase, left = "work", tau
        else:
            phase, left = "work", tau
    return useful, ckpt, lost, restart


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 998), st.floats(0.01, 0.99)), max_size=30, unique_by=lambda x: x[0]),
       st.integers(1, 200), st.integers(0, 50), st.integers(0, 80))
def test_vectorised_trajectory_matches_event_loop(fails, tau, c, r):
    # durations are integers and the failures' fractional parts differ pairwise, so no phase boundary
    # falls (within rounding) on a failure: the two computations cannot disagree on a floating-point tie
    fracs = sorted(f for _, f in fails)
    assume(all(b - a > 1e-6 for a, b in zip(fracs, fracs[1:])))
    horizon = 1000.0
    fails = np.sort(np.array([k + f for k, f in fails]))
    got = simulate_trajectory(fails, horizon, tau, c, r)
    ref = event_loop(fails, horizon, tau, c, r)
    assert got == pytest.approx(ref, abs=1e-6)
    assert sum(got) == pytest.approx(horizon)


def test_monte_carlo_matches_daly_exact_expectation():
    # 16k GPUs, device MTBF 50,000 h -> job MTBF 3.05 h (Llama 3: 419 interruptions in 54 days on 16k GPUs).
    cfg = GoodputConfig(gpus=16384, mtbf_device_s=50_000 * HOUR_S, checkpoint_s=60.0, restart_s=600.0,
                        horizon_s=30 * DAY_S, trials=1500, seed=1)
    for tau in (300.0, 1800.0, 7200.0):
        r = monte_carlo(cfg, tau)
        assert abs(r.goodput - r.expected_goodput) < 4 * r.goodput_stderr + 1e-3, (tau, r)
        assert r.useful_s + r.checkpoint_s + r.lost_work_s + r.restart_s == pytest.approx(cfg.horizon_s)
        assert r.failures == pytest.approx(cfg.horizon_s / cfg.system_mtbf_s, rel=0.02)


def test_monte_carlo_matches_first_order_when_failures_are_rare():
    # tau, C, R << M: the first-order waste C/tau + (tau+C)/2M + R/M is accurate.
    cfg = GoodputConfig(gpus=1000, mtbf_device_s=1000 * 100 * HOUR_S, checkpoint_s=30.0, restart_s=300.0,
                        horizon_s=200 * DAY_S, trials=800, seed=2)
    r = monte_carlo(cfg, 1200.0)
    fo = first_order_goodput(1200.0, 30.0, 300.0, cfg.system_mtbf_s)
    assert abs(r.goodput - fo) < 4 * r.goodput_stderr + 2e-3
    # each cause separately, per unit wall time: checkpoints ~ C/(tau+C), restarts ~ R/M, lost ~ (tau+C)/2M
    m, h = cfg.system_mtbf_s, cfg.horizon_s
    assert r.restart_s / h == pytest.approx(300.0 / m, rel=0.08)
    assert r.lost_work_s / h == pytest.approx((1200.0 + 30.0) / (2 * m), rel=0.08)
    assert r.checkpoint_s / h == pytest.approx(30.0 / 1230.0, rel=0.02)


def test_young_and_daly_formulas():
    assert young_interval_s(60.0, 3 * HOUR_S) == pytest.approx(math.sqrt(2 * 60 * 10800))
    # Daly's correction is small when C << M and his formula returns M when C >= 2M
    assert daly_interval_s(60.0, 10800.0) == pytest.approx(
        math.sqrt(2 * 60 * 10800) * (1 + math.sqrt(60 / 21600) / 3 + 60 / 21600 / 9) - 60)
    assert daly_interval_s(100.0, 40.0) == 40.0
    # Daly's higher-order optimum is within 1% of the true optimum of the exact expectation when R = 0
    for c, m in [(10.0, 3600.0), (60.0, 10800.0), (600.0, 7200.0)]:
        exact = exact_optimal_interval_s(c, 0.0, m)
        assert daly_interval_s(c, m) == pytest.approx(exact, rel=0.01)
        g = expected_goodput(exact, c, 0.0, m)
        assert g >= expected_goodput(exact * 1.1, c, 0.0, m) and g >= expected_goodput(exact / 1.1, c, 0.0, m)


def test_sweep_optimum_is_near_daly_and_goodput_there_is_near_optimal():
    cfg = GoodputConfig(gpus=16384, mtbf_device_s=50_000 * HOUR_S, checkpoint_s=120.0, restart_s=600.0,
                        horizon_s=30 * DAY_S, trials=400, seed=3)
    rep = analyse(cfg, sweep_points=21, sweep_span=4.0)
    assert rep.daly_interval_s / 1.6 < rep.best_interval_s < rep.daly_interval_s * 1.6
    best = max(r.goodput for r in rep.sweep)
    assert rep.at_interval.interval_s == pytest.approx(rep.daly_interval_s)  # default interval: Daly's
    assert rep.at_interval.goodput > best - 0.003
    # the curve falls off away from the optimum
    assert rep.sweep[0].goodput < best - 0.01 and rep.sweep[-1].goodput < best - 0.01


def test_step_time_rounds_interval_to_whole_steps_and_counts_steps():
    cfg = GoodputConfig(gpus=512, mtbf_device_s=20_000 * HOUR_S, checkpoint_s=30.0, restart_s=300.0,
                        horizon_s=2 * DAY_S, interval_s=1000.0, step_time_s=7.0, trials=8, seed=0)
    rep = analyse(cfg, sweep_points=5)
    assert rep.at_interval.interval_s == pytest.approx(7.0 * 143)
    assert rep.at_interval.steps == pytest.approx(rep.at_interval.useful_s / 7.0)
    for r in rep.sweep:
        assert r.interval_s / 7.0 == pytest.approx(round(r.interval_s / 7.0))


def test_same_seed_same_report_different_seed_different_draws():
    kw = dict(gpus=4096, mtbf_device_s=30_000 * HOUR_S, checkpoint_s=45.0, restart_s=420.0, horizon_s=10 * DAY_S,
              trials=16)
    a = json.dumps(analyse(GoodputConfig(**kw, seed=5)).to_dict(), sort_keys=True)
    b = json.dumps(analyse(GoodputConfig(**kw, seed=5)).to_dict(), sort_keys=True)
    c = json.dumps(analyse(GoodputConfig(**kw, seed=6)).to_dict(), sort_keys=True)
    assert a == b and a != c


@pytest.mark.parametrize("field,value", [("gpus", 0), ("gpus", -3), ("gpus", 2.5), ("mtbf_device_s", 0.0),
                                         ("mtbf_device_s", float("nan")), ("checkpoint_s", -1.0),
                                         ("restart_s", float("inf")), ("horizon_s", -5.0), ("trials", 0),
                                         ("interval_s", 0.0), ("seed", -1), ("step_time_s", float("nan"))])
def test_bad_config_is_a_config_error(field, value):
    kw = dict(gpus=8, mtbf_device_s=1e6, checkpoint_s=10.0, restart_s=10.0, horizon_s=1e5)
    kw[field] = value
    with pytest.raises(ConfigError, match=field):
        GoodputConfig(**kw)


def test_huge_horizon_is_a_resource_limit_not_a_hang():
    cfg = GoodputConfig(gpus=100_000, mtbf_device_s=1000.0, checkpoint_s=10.0, restart_s=10.0,
                        horizon_s=1e9, trials=10)
    with pytest.raises(ResourceLimitError, match="fewer --days"):
        analyse(cfg)


def test_cli_text_and_json(capsys):
    args = ["goodput", "--gpus", "16384", "--mtbf-hours", "50000", "--checkpoint-cost-s", "60",
            "--restart-s", "600", "--days", "5", "--trials", "8", "--checkpoint-interval-min", "30"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "goodput" in out and "Young" in out and "Daly" in out
    assert main(args + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["at_interval"]["interval_s"] == 1800.0
    assert set(d["at_interval"]["lost_by_cause_s"]) == {"checkpoint_writes", "lost_work", "restarts"}
    assert set(d["optimal_interval_s"]) == {"monte_carlo", "young", "daly", "exact_model"}
    assert d["notes"] == []          # five days of 30-minute intervals: nothing to warn about


def test_a_run_shorter_than_its_checkpoint_interval_is_noted(capsys):
    """86 s of training against Daly's 18.5-minute interval: no checkpoint is ever written, so the closed forms
    (a steady state) and the sweep's optimum (every interval ties) say nothing about it."""
    args = ["goodput", "--gpus", "16384", "--mtbf-hours", "50000", "--checkpoint-cost-s", "60",
            "--restart-s", "600", "--days", "1e-3", "--trials", "8"]
    assert main(args + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["at_interval"]["interval_s"] > d["config"]["horizon_s"]
    assert len(d["notes"]) == 2
    assert "no checkpoint is written" in d["notes"][0] and "18.5 min" in d["notes"][0]
    assert d["notes"][1].startswith("25 of the sweep's 25 intervals")
    assert main(args) == 0
    assert "note: the checkpoint interval (18.5 min) is no shorter than the run (1.4 min)" in capsys.readouterr().out
    # an interval given shorter than the run: the sweep's longest intervals may still tie, the chosen one is fine
    assert main(args + ["--json", "--checkpoint-interval-min", "1.2"]) == 0
    assert not any("no checkpoint is written" in n for n in json.loads(capsys.readouterr().out)["notes"])


@pytest.mark.parametrize("bad", [["--gpus", "0"], ["--mtbf-hours", "nan"], ["--days", "inf"],
                                 ["--checkpoint-cost-s", "-1"], ["--gpus", "abc"], ["--days", "1e300"]])
def test_cli_bad_values_exit_2(bad, capsys):
    base = {"--gpus": "64", "--mtbf-hours": "1000", "--checkpoint-cost-s": "10", "--restart-s": "60",
            "--days": "1", "--trials": "2"}
    base[bad[0]] = bad[1]
    args = ["goodput"] + [x for kv in base.items() for x in kv]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "error" in err.lower() and "Traceback" not in err


def test_cli_reads_gpus_and_step_time_from_a_simulate_result(tmp_path, capsys):
    res = tmp_path / "result.json"
    res.write_text(json.dumps({"world_size": 1024, "step_time_s": 1.63, "mfu": 0.4}))
    args = ["goodput", "--result", str(tmp_path), "--mtbf-hours", "50000", "--checkpoint-cost-s", "60",
            "--restart-s", "600", "--days", "2", "--trials", "4", "--json"]
    assert main(args) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["config"]["gpus"] == 1024 and d["config"]["step_time_s"] == 1.63
    assert d["at_interval"]["interval_s"] / 1.63 == pytest.approx(round(d["at_interval"]["interval_s"] / 1.63))
    for bad in ({"world_size": 0, "step_time_s": 1.0}, {"world_size": 8}, [1], {"world_size": 8, "step_time_s": "x"}):
        res.write_text(json.dumps(bad))
        assert main(args) == 2
    res.write_text("{not json")
    assert main(args) == 2
    res.write_text(json.dumps({"devices": {"H100-SXM": {}}, "collectives": {}}))     # e.g. a calibration file
    capsys.readouterr()
    assert main(args) == 2
    assert "is not a simulate result: it has neither world_size nor step_time_s" in capsys.readouterr().err
    assert main(args[:1] + args[3:]) == 2          # neither --gpus nor --result
    assert "--gpus N or --result" in capsys.readouterr().err


@pytest.mark.parametrize("kw", [
    # the largest times accepted, with and without checkpoint cost
    dict(gpus=1, mtbf_device_s=1e12, checkpoint_s=0, restart_s=0, horizon_s=1),
    dict(gpus=1, mtbf_device_s=1e12, checkpoint_s=1e12, restart_s=1e12, horizon_s=1e12),
    # an interval of 1e18 steps of the shortest step taken (MIN_STEP_S): rounding to whole steps used to
    # raise OverflowError (the run as long: an interval longer than the run is refused)
    dict(gpus=1, mtbf_device_s=1e12, checkpoint_s=0, restart_s=0, horizon_s=1e12, interval_s=1e12,
         step_time_s=1e-6),
])
def test_extreme_inputs_give_finite_goodput(kw):
    """Found by the fuzz test (tests/test_fuzz.py) with random seeds."""
    import math
    from clustersim.goodput import GoodputConfig, analyse
    r = analyse(GoodputConfig(**kw), sweep_points=3).at_interval
    assert 0.0 <= r.goodput <= 1.0 + 1e-9
    assert all(math.isfinite(v) for v in (r.useful_s, r.checkpoint_s, r.lost_work_s, r.restart_s))


@pytest.mark.parametrize("field", ["mtbf_device_s", "checkpoint_s", "restart_s", "horizon_s"])
def test_times_beyond_the_bound_are_a_clear_error(field):
    from simulator.errors import ConfigError
    from clustersim.goodput import GoodputConfig
    kw = dict(gpus=8, mtbf_device_s=1e6, checkpoint_s=60, restart_s=600, horizon_s=86400)
    kw[field] = 1e308
    with pytest.raises(ConfigError, match=f"{field} .*must be a number .* at most 1e\\+12 s"):
        GoodputConfig(**kw)


def test_steps_intervals_and_overrides_that_cannot_be_are_refused(capsys):
    """A step shorter than a microsecond (1e-308 s made the steps per run infinite and crashed --json), a
    checkpoint interval no longer than one checkpoint (the first-order goodput went negative), and --gpus with
    --step-time-s beside --result (which then gave nothing) are one-line errors naming the option."""
    base = ["goodput", "--mtbf-hours", "50000", "--checkpoint-cost-s", "30", "--restart-s", "600", "--gpus", "8"]
    for extra, needle in ((["--step-time-s", "1e-308", "--json"], "--step-time-s 1e-308 is shorter than any"),
                          (["--checkpoint-interval-min", "1e-9"], "is not longer than one checkpoint write"),
                          (["--checkpoint-cost-s", "-1"], "checkpoint_s (--checkpoint-cost-s) must be")):
        assert main(base + extra) == 2
        assert needle in capsys.readouterr().err
    assert main(base + ["--step-time-s", "5", "--result", "x.json"]) == 2
    assert "drop --result, or one of the two" in capsys.readouterr().err
