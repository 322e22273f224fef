"""Issue 18 items 5 and 8: the memory plot says which ranks it shows, search progress counts plans to the
end, progress bars have an ETA, and long full-mode runs announce their cost first."""
from pathlib import Path

import pytest

from clustersim import guards
from clustersim.experiment import Experiment, run_experiment
from clustersim.simulate import DelayedProgress, write_report_folder


def test_memory_plot_says_which_ranks_it_shows(tmp_path):
    o = run_experiment(Experiment(cluster="dgx-h100", gpus=16, model="tiny", tp=2, pp=4, mode="full"),
                       timeline=True)
    write_report_folder(o, tmp_path)
    (note,) = [n for n in o.notes if n.startswith("memory.png:")]
    assert "showing 4 of 16 simulated ranks" in note and "one per pipeline stage" in note
    assert (tmp_path / "memory.png").stat().st_size > 0
    from clustersim import plots
    picks = plots.representative_ranks(o.result, 8)
    fig = plots.memory_over_time(o.result, ranks=[r for r, _ in picks])
    assert [t.get_text() for t in fig.texts if t.get_gid() == "ranks_note"] == [plots.shown_ranks_note(o.result, picks)]
    plots.close(fig)
    small = run_experiment(Experiment(cluster="dgx-h100", gpus=8, model="tiny", tp=2, pp=4, mode="full"))
    assert plots.shown_ranks_note(small.result, plots.representative_ranks(small.result, 8)) == ""


def test_search_progress_counts_plans_and_finishes():
    from clustersim.search import SearchSpace, run_search
    calls = []
    base = Experiment(cluster="dgx-h100", gpus=16, model="tiny", global_batch=32, seq=512, mode="symmetric")
    run_search(base, top_k=1, space=SearchSpace(micro_batches=(1,), schedules=("1f1b",), recompute=("none",), zero=(0,), cp=(1,)),
               workers=1, cache_path=None, progress=lambda d, t: calls.append((d, t)))
    assert calls and calls[-1][0] == calls[-1][1]
    assert DelayedProgress("searching", unit="plans").unit == "plans"


def test_progress_eta_from_the_mean_rate():
    bar = DelayedProgress("x", enabled=False)
    assert bar.eta_s(0, 100) is None
    assert bar.eta_s(10, 100, now=bar.t0 + 2.0) == pytest.approx(18.0)
    assert bar.eta_s(100, 100, now=bar.t0 + 5.0) == 0.0


def test_long_full_runs_announce_time_and_memory(monkeypatch):
    heard = []
    monkeypatch.setattr(guards, "ANNOUNCE_ABOVE_OPS", 100)
    o = run_experiment(Experiment(cluster="dgx-h100", gpus=16, model="tiny", tp=2, pp=4, mode="full"),
                       announce=heard.append)
    (line,) = heard
    ops = o.result.programs.op_count
    secs = ops * guards.SECONDS_PER_OP["analytical"]
    assert f"simulating {ops:,} ops" in line and f"{secs:.0f} s" in line and "B of memory" in line
    heard.clear()
    run_experiment(Experiment(cluster="dgx-h100", gpus=16, model="tiny", tp=2, pp=4), announce=heard.append)
    assert heard == []          # symmetric runs are small by construction
