"""Issue 18 item 6: communication by parallel axis, against hand-built programs whose answer is known."""
import pytest

from simulator.costs import SimpleCostModel
from simulator.engine import run
from simulator.metrics import AXES, compute_metrics
from simulator.program import Programs, collective, compute


def _two_axis_program() -> Programs:
    """Two ranks. Compute F [0, 2]; a TP all-reduce [1, 3] on a side stream after a 1-second compute there;
    compute G [3, 4] after both; then a DP all-reduce [4, 5].
    Durations are measured (duration_s) so that the answer is exact."""
    p = Programs(world_size=2, ops={})
    tp = p.add_group((0, 1), "tp")
    dp = p.add_group((0, 1), "dp")
    for r in (0, 1):
        a = compute("F", 1.0, stream="compute")
        a.duration_s = 2.0
        pre = compute("wait", 1.0, stream="side")
        pre.duration_s = 1.0
        t = collective("tp_ar", "all_reduce", tp, 1.0, stream="side", deps=(1,))
        t.duration_s = 2.0
        gap = compute("G", 1.0, stream="compute", deps=(0, 2))
        gap.duration_s = 1.0            # [3, 4]
        d = collective("dp_ar", "all_reduce", dp, 1.0, stream="dp", deps=(3,))
        d.duration_s = 1.0              # [4, 5]
        p.ops[r] = [a, pre, t, gap, d]
    return p


def test_comm_by_axis_closed_form():
    res = run(_two_axis_program(), SimpleCostModel())
    m = compute_metrics(res)
    T = m.step_time_s
    assert T == pytest.approx(5.0)
    tp, dp = m.comm_by_axis["tp"], m.comm_by_axis["dp"]
    # TP [1, 3] against compute [0, 2] ∪ [3, 4] (G waits for the all-reduce): [1, 2] hidden, [2, 3] exposed
    assert tp["total_s"] == pytest.approx(2.0) and tp["exposed_s"] == pytest.approx(1.0)
    assert tp["overlapped_s"] == pytest.approx(1.0) and tp["total_fraction"] == pytest.approx(2 / 5)
    # DP [4, 5] after all compute: all exposed
    assert dp["total_s"] == pytest.approx(1.0) and dp["exposed_s"] == pytest.approx(1.0)
    assert dp["exposed_fraction"] == pytest.approx(1 / 5) and dp["overlapped_fraction"] == pytest.approx(0.0)
    assert set(m.comm_by_axis) == {"tp", "dp"}
    # the axes add up to the job's figures when they do not overlap one another
    assert sum(d["exposed_fraction"] for d in m.comm_by_axis.values()) == pytest.approx(m.exposed_comm_fraction)


def test_comm_by_axis_in_json_table_and_bars(capsys):
    import json

    from clustersim import plots
    from clustersim.cli import main
    from clustersim.experiment import Experiment, run_experiment
    assert main(["simulate", "--cluster", "dgx-h100", "--gpus", "32", "--model", "tiny-moe", "--tp", "2",
                 "--pp", "2", "--ep", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    axes = out["comm_by_axis"]
    assert {"tp", "pp", "ep", "dp"} <= set(axes) <= set(AXES)
    for d in axes.values():
        assert d["total_s"] == pytest.approx(d["exposed_s"] + d["overlapped_s"])
        assert d["exposed_fraction"] == pytest.approx(d["exposed_s"] / out["step_time_s"])
    o = run_experiment(Experiment(cluster="dgx-h100", gpus=32, model="tiny-moe", tp=2, pp=2, ep=2))
    split = plots.exposed_by_axis(o.result, o.metrics)
    assert sum(split.values()) == pytest.approx(o.metrics.exposed_comm_fraction * o.metrics.step_time_s)
    fig = plots.breakdown_bars({"run": o.result}, metrics={"run": o.metrics})
    labels = {t.get_text() for t in fig.axes[0].get_legend().get_texts()}
    assert "exposed TP comm" in labels and "exposed EP comm" in labels
    plots.close(fig)
    assert main(["simulate", "--cluster", "dgx-h100", "--gpus", "32", "--model", "tiny-moe", "--tp", "2",
                 "--pp", "2", "--ep", "2"]) == 0
    assert "EP comm total / exposed / hidden" in capsys.readouterr().out


def test_gantt_shows_inline_tp_and_ep_communication_and_names_axes():
    from clustersim import plots
    from clustersim.experiment import Experiment, run_experiment
    o = run_experiment(Experiment(cluster="dgx-h100", gpus=32, model="tiny-moe", tp=2, pp=2, ep=2), timeline=True)
    assert plots.comm_axes(o.result.timeline) == {"all_reduce": ["tp", "dp"], "all_to_all": ["ep"], "p2p": ["pp"]}
    fig = plots.gantt(o.result)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "all-to-all (EP)" in labels and "all-reduce (TP, DP/FSDP)" in labels
    inline = {c.get_label() for ax in fig.axes for c in ax.collections if c.get_label().endswith(" inline")}
    assert {"all_to_all inline", "all_reduce inline"} <= inline
    plots.close(fig)
