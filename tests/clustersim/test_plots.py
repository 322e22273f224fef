"""Plot tests: lanes, labels, colours and spans read back from matplotlib's artists, checked against the
engine's metrics and closed forms of hand-built programs."""
import matplotlib
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgba

from clustersim import plots
from simulator.costs import IdealCostModel, SimpleCostModel
from simulator.engine import run
from simulator.errors import ConfigError
from simulator.metrics import compute_metrics
from simulator.program import Programs, compute, recv, send
from tests.simulator.toy import toy_dp_pipeline, toy_gpipe

GB = 1e9


def toy_1f1b(p: int, m: int, act_bytes: float = 2 * GB, static: float = 10 * GB, f_flops: float = 1e12,
             b_flops: float = 2e12) -> Programs:
    """p-stage 1F1B (PipeDream-flush): stage s runs min(p-s-1, m) warm-up forwards, then alternates one
    forward and one backward. Each forward allocates ``act_bytes`` of activations that its backward frees,
    so stage s holds at most min(p-s, m) micro-batches: peak = static + min(p-s, m)·act_bytes."""
    progs = Programs(world_size=p, ops={})
    pp = progs.add_group(range(p), "pp")
    for s in range(p):
        ops = []
        last = None

        def dep(*xs):
            return tuple(x for x in xs if x is not None)

        def fwd(mb):
            nonlocal last
            r = None
            if s > 0:
                ops.append(recv(f"recv_act{mb}", s - 1, 1e6, stream="pp_recv", group=pp, microbatch=mb))
                r = len(ops) - 1
            ops.append(compute(f"F{mb}", f_flops, deps=dep(r, last), phase="forward", microbatch=mb,
                               alloc=(("activations", act_bytes),)))
            last = len(ops) - 1
            if s < p - 1:
                ops.append(send(f"send_act{mb}", s + 1, 1e6, stream="pp_send", deps=(last,), group=pp,
                                microbatch=mb))

        def bwd(mb):
            nonlocal last
            r = None
            if s < p - 1:
                ops.append(recv(f"recv_grad{mb}", s + 1, 1e6, stream="pp_recv", group=pp, microbatch=mb))
                r = len(ops) - 1
            ops.append(compute(f"B{mb}", b_flops, deps=dep(r, last), phase="backward", microbatch=mb,
                               free=(("activations", act_bytes),)))
            last = len(ops) - 1
            if s > 0:
                ops.append(send(f"send_grad{mb}", s - 1, 1e6, stream="pp_send", deps=(last,), group=pp,
                                microbatch=mb))

        warm = min(p - s - 1, m)
        for mb in range(warm):
            fwd(mb)
        for i in range(m - warm):
            fwd(warm + i)
            bwd(i)
        for i in range(m - warm, m):
            bwd(i)
        ops.append(compute("optimizer", 1e11, deps=(last,), phase="optimizer"))
        progs.ops[s] = ops
        progs.static_memory[s] = {"parameters": static * 0.25, "gradients": static * 0.25,
                                  "optimizer": static * 0.5}
    progs.tokens_per_step = 1000.0 * m
    progs.model_flops_per_step = (f_flops + b_flops) * m * p
    return progs


def collections(ax) -> dict[str, PolyCollection]:
    return {c.get_label(): c for c in ax.collections if isinstance(c, PolyCollection)}


def widths(pc: PolyCollection) -> np.ndarray:
    return np.array([p.vertices[:, 0].max() - p.vertices[:, 0].min() for p in pc.get_paths()])


def centres_y(pc: PolyCollection) -> np.ndarray:
    return np.array([(p.vertices[:, 1].max() + p.vertices[:, 1].min()) / 2 for p in pc.get_paths()])


def panel_axes(fig):
    return [ax for ax in fig.axes if ax.get_yticks().size]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    matplotlib.pyplot.close("all")


# ---------------------------------------------------------------------------------------------- gantt
def test_gantt_lanes_colours_and_microbatch_numbers():
    p, m = 4, 6
    res = run(toy_gpipe(p, m), SimpleCostModel(flops_per_s=1e12, link_bytes_per_s=1e9))   # 1 ms per message
    fig = plots.gantt(res)
    (ax,) = panel_axes(fig)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    # one lane per (rank, stream); the compute lane first and carrying the rank's name
    # (streams after the compute one in order of first appearance in the program)
    expected_streams = {0: ["compute", "pp_send", "pp_recv"], 1: ["compute", "pp_recv", "pp_send"],
                        2: ["compute", "pp_recv", "pp_send"], 3: ["compute", "pp_recv", "pp_send"]}
    exp_labels = []
    for r, ss in expected_streams.items():
        exp_labels += [f"rank {r} · {ss[0]}"] + ss[1:]
    assert labels == exp_labels
    cols = collections(ax)
    assert to_rgba(cols["forward"].get_facecolor()[0]) == to_rgba(plots.PHASE_COLOURS["forward"])
    assert to_rgba(cols["backward"].get_facecolor()[0]) == to_rgba(plots.PHASE_COLOURS["backward"])
    assert to_rgba(cols["p2p"].get_facecolor()[0]) == to_rgba(plots.COMM_COLOURS["p2p"])
    assert len(cols["forward"].get_paths()) == p * m
    assert len(cols["backward"].get_paths()) == p * m
    assert len(cols["p2p"].get_paths()) == 2 * 2 * (p - 1) * m         # a send and a recv per message
    # every forward of rank r sits on rank r's compute lane: 1 s each (1e12 FLOPs at 1e12 FLOP/s)
    assert np.allclose(widths(cols["forward"]), 1.0)
    assert np.allclose(widths(cols["backward"]), 2.0)
    lane_y = dict(zip(labels, ax.get_yticks()))
    ys = centres_y(cols["forward"])
    for r in range(p):
        assert np.sum(np.isclose(ys, lane_y[f"rank {r} · compute"])) == m
    # micro-batch numbers on every compute bar (they are wide): 0..m-1, twice per rank
    texts = sorted(int(t.get_text()) for t in ax.texts if t.get_gid() == "microbatch")
    assert texts == sorted(list(range(m)) * 2 * p)


def test_microbatch_numbers_left_out_when_bars_are_too_narrow():
    res = run(toy_gpipe(2, 400), IdealCostModel(flops_per_s=1e12))
    fig = plots.gantt(res)
    (ax,) = panel_axes(fig)
    assert not [t for t in ax.texts if t.get_gid() == "microbatch"]
    assert len(collections(ax)["forward"].get_paths()) == 2 * 400


def test_bubble_and_exposed_spans_equal_the_engine_metrics():
    # 4 stages x 2 replicas, slow links so the gradient all-reduce is partly exposed
    res = run(toy_dp_pipeline(4, 2, 4), SimpleCostModel(flops_per_s=1e12, link_bytes_per_s=2e8))
    met = compute_metrics(res)
    fig = plots.gantt(res)
    (ax,) = panel_axes(fig)
    cols = collections(ax)
    lane_y = dict(zip([t.get_text() for t in ax.get_yticklabels()], ax.get_yticks()))
    for rm in met.per_rank:
        y = lane_y[f"rank {rm.rank} · compute"]
        for key, want in (("bubble", rm.idle_s), ("exposed_fill", rm.exposed_comm_s)):
            on_lane = np.isclose(centres_y(cols[key]), y)
            assert widths(cols[key])[on_lane].sum() == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert met.exposed_comm_fraction > 0.01 and met.bubble_fraction > 0.1      # both visible
    assert cols["bubble"].get_hatch() == plots.BUBBLE_STYLE["hatch"]
    assert to_rgba(cols["exposed"].get_facecolor()[0]) == to_rgba(plots.EXPOSED_STRIP_STYLE["facecolor"])
    assert sorted(widths(cols["exposed_fill"])) == pytest.approx(sorted(widths(cols["exposed"])))
    assert to_rgba(cols["all_reduce"].get_facecolor()[0]) == to_rgba(plots.COMM_COLOURS["all_reduce"])
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert plots.BUBBLE_LABEL in legend and plots.EXPOSED_LABEL in legend and "all-reduce (DP/FSDP)" in legend


def test_symmetric_run_is_labelled_by_stage_representatives():
    res = run(toy_dp_pipeline(4, 256, 2, symmetric=True), SimpleCostModel(flops_per_s=1e12))
    fig = plots.gantt(res)
    (ax,) = panel_axes(fig)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert [lb for lb in labels if "·" in lb] == [f"stage {s} (rep. of 256 ranks) · compute" for s in range(4)]
    assert "1024 ranks, symmetric mode" in ax.get_title(loc="left")


def test_large_full_run_shows_one_representative_per_stage():
    p, d = 4, 32
    res = run(toy_dp_pipeline(p, d, 2), SimpleCostModel(flops_per_s=1e12))
    fig = plots.gantt(res, max_lanes=40)
    (ax,) = panel_axes(fig)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    firsts = [lb for lb in labels if "·" in lb]
    assert firsts == [f"stage {s} (rep. of {d} ranks) · compute" for s in range(p)]
    assert len(labels) <= 40
    assert f"showing {p} of {p * d} simulated ranks" in ax.get_title(loc="left")
    # the representatives are the first rank of each stage: their forwards start where the engine says
    fwd = collections(ax)["forward"]
    starts = sorted(np.round([path.vertices[:, 0].min() for path in fwd.get_paths()], 9))
    want = sorted(np.round([res.start_s[s * d][i] for s in range(p) for i, op in enumerate(res.programs.ops[s * d])
                            if op.phase == "forward"], 9))
    assert starts == want


def test_many_stages_are_thinned_evenly():
    res = run(toy_gpipe(16, 2), IdealCostModel(flops_per_s=1e12))
    picks = plots.representative_ranks(res, 4)
    assert [r for r, _ in picks] == [0, 5, 10, 15]


def test_panels_share_one_time_axis_and_name_their_plans():
    a = run(toy_gpipe(4, 4), IdealCostModel(flops_per_s=1e12))
    b = run(toy_gpipe(4, 8), IdealCostModel(flops_per_s=1e12))
    mets = {"m=4": compute_metrics(a), "m=8": compute_metrics(b)}
    fig = plots.gantt({"m=4": a, "m=8": b}, metrics=mets, title="two")
    ax0, ax1 = panel_axes(fig)
    assert ax0.get_shared_x_axes().joined(ax0, ax1)
    assert ax0.get_xlim() == ax1.get_xlim()
    assert ax0.get_xlim()[1] >= b.step_time_s
    assert ax0.get_title(loc="left").startswith("m=4 — step ") and ax1.get_title(loc="left").startswith("m=8 — step ")
    assert f"bubble {mets['m=4'].bubble_fraction:.1%}" in ax0.get_title(loc="left")
    assert fig._suptitle.get_text() == "two"


def test_gantt_accepts_a_timeline_dataframe_like_a_result():
    res = run(toy_gpipe(3, 3), IdealCostModel(flops_per_s=1e12))
    ax_r = panel_axes(plots.gantt(res))[0]
    ax_d = panel_axes(plots.gantt(res.timeline[["rank", "stream", "kind", "start_s", "end_s", "phase",
                                                "microbatch", "collective"]]))[0]
    assert [t.get_text() for t in ax_r.get_yticklabels()] == [t.get_text() for t in ax_d.get_yticklabels()]
    for key in ("forward", "backward", "bubble"):
        assert sorted(widths(collections(ax_r)[key])) == pytest.approx(sorted(widths(collections(ax_d)[key])))


def test_gantt_writes_png_and_svg(tmp_path):
    res = run(toy_gpipe(2, 2), IdealCostModel(flops_per_s=1e12))
    plots.gantt(res, path=tmp_path / "g.png")
    plots.gantt(res, path=tmp_path / "g.svg")
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (tmp_path / "g.svg").read_bytes()[:1000]


def test_gantt_errors_are_clear():
    res = run(toy_gpipe(2, 2), IdealCostModel(flops_per_s=1e12))
    with pytest.raises(ConfigError, match=r"rank\(s\) \[7\] are not simulated"):
        plots.gantt(res, ranks=[7])
    with pytest.raises(ConfigError, match="lacks column"):
        plots.gantt(pd.DataFrame({"rank": [0]}))
    with pytest.raises(ConfigError, match="cannot plot"):
        plots.gantt({"x": 3})
    with pytest.raises(ConfigError, match="nothing to plot"):
        plots.gantt({})


# ---------------------------------------------------------------------------------------------- intervals
intervals = st.lists(st.tuples(st.floats(0, 10), st.floats(0, 3)), max_size=12)


@settings(max_examples=200, deadline=None)
@given(comp=intervals, comm=intervals)
def test_idle_spans_partition_the_step(comp, comm):
    rows = [("compute", s, s + d) for s, d in comp] + [("collective", s, s + d) for s, d in comm]
    df = pd.DataFrame(rows, columns=["kind", "start_s", "end_s"])
    T = max([e for _, _, e in rows], default=0.0) + 1.0
    spans = plots.idle_spans(df, T)
    c = plots.merge_intervals(df.loc[df.kind == "compute", "start_s"], df.loc[df.kind == "compute", "end_s"])
    length = {k: float(np.sum(e - s)) for k, (s, e) in spans.items()}
    # compute + exposed + bubble = T, and bubble never overlaps an op
    assert float(np.sum(c[1] - c[0])) + length["exposed"] + length["bubble"] == pytest.approx(T)
    for s, e in zip(*spans["bubble"]):
        assert not any(a < e and b > s for _, a, b in rows if b > a)
    for s, e in zip(*spans["exposed"]):
        assert not any(a < e and b > s for k, a, b in rows if k == "compute" and b > a)


# ---------------------------------------------------------------------------------------------- memory
@pytest.mark.parametrize("p,m", [(4, 8), (4, 2)])
def test_memory_over_time_peaks_match_closed_form_and_metrics(p, m):
    act, static = 2 * GB, 10 * GB
    res = run(toy_1f1b(p, m, act, static), IdealCostModel(flops_per_s=1e12, memory_bytes=40 * GB))
    met = compute_metrics(res)
    fig = plots.memory_over_time(res)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == p
    for s, ax in enumerate(axes):
        # stacked layers in category order, the top of the stack peaks at static + min(p-s, m) activations
        polys = [c for c in ax.collections if c.get_label() in plots.MEMORY_COLOURS]
        assert [c.get_label() for c in polys] == ["parameters", "gradients", "optimizer", "activations"]
        for c in polys:
            assert to_rgba(c.get_facecolor()[0]) == to_rgba(plots.MEMORY_COLOURS[c.get_label()])
        top = max(path.vertices[:, 1].max() for path in polys[-1].get_paths())
        assert top * GB == pytest.approx(static + min(p - s, m) * act)
        assert top * GB == pytest.approx(met.per_rank[s].peak_memory_bytes)
        (hbm,) = [ln for ln in ax.lines if ln.get_gid() == "hbm"]
        assert hbm.get_ydata()[0] == pytest.approx(40.0)
        assert f"stage {s}" in ax.get_title() or f"rank {s}" in ax.get_title()


def test_memory_curve_levels_follow_alloc_and_free():
    res = run(toy_1f1b(2, 3, act_bytes=1.0, static=4.0), IdealCostModel(flops_per_s=1e12))
    t, levels = plots.memory_curve(res, 0)
    assert levels["parameters"].tolist() == [1.0] * len(t)
    # rank 0 of 2 stages: F0 F1 B0 F2 B1 B2 -> activations 1, 2, 1, 2, 1, 0 at op boundaries
    acts = [levels["activations"][np.searchsorted(t, x, side="right") - 1]
            for x in [0.5, 1.5, 2.5, 3.0]]
    assert acts[0] == 1.0 and max(levels["activations"]) == 2.0 and levels["activations"][-1] == 0.0


# ---------------------------------------------------------------------------------------------- breakdown
def test_time_breakdown_sums_to_step_and_matches_metrics():
    res = run(toy_dp_pipeline(4, 2, 4), SimpleCostModel(flops_per_s=1e12, link_bytes_per_s=2e8))
    met = compute_metrics(res)
    parts = plots.time_breakdown(res)
    T = met.step_time_s
    assert sum(parts.values()) == pytest.approx(T)
    assert parts["bubble"] == pytest.approx(met.bubble_fraction * T)
    assert parts["exposed_comm"] == pytest.approx(met.exposed_comm_fraction * T)
    assert parts["forward"] == pytest.approx(4.0)              # 4 micro-batches x 1 s on every rank
    assert parts["backward"] == pytest.approx(8.0)


def test_breakdown_bars_stack_each_plan():
    a = run(toy_gpipe(4, 4), IdealCostModel(flops_per_s=1e12))
    b = run(toy_gpipe(4, 16), IdealCostModel(flops_per_s=1e12))
    fig = plots.breakdown_bars({"m=4": a, "m=16": b})
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["m=4", "m=16"]
    bars = {}
    for patch in ax.patches:
        bars.setdefault(patch.get_gid(), []).append(patch)
    assert set(bars) == {"forward", "backward", "bubble"}
    for i, res in enumerate((a, b)):
        right = max(bars[k][i].get_x() + bars[k][i].get_width() for k in bars)
        assert right == pytest.approx(res.step_time_s)
        assert bars["bubble"][i].get_width() == pytest.approx(compute_metrics(res).bubble_fraction * res.step_time_s)
    assert to_rgba(bars["forward"][0].get_facecolor()) == to_rgba(plots.PHASE_COLOURS["forward"])


def test_p2p_streams_share_a_lane_when_stages_would_not_fit():
    # 8 stages x 3 streams (compute, pp_recv, pp_send) = 24 lanes; a budget of 16 keeps every stage
    res = run(toy_gpipe(8, 2), SimpleCostModel(flops_per_s=1e12, link_bytes_per_s=1e9))
    (ax,) = panel_axes(plots.gantt(res, max_lanes=16))
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert [lb for lb in labels if "·" in lb] == [f"rank {r} · compute" for r in range(8)]
    assert [lb for lb in labels if "·" not in lb] == [plots.P2P_LANE] * 8
    assert "send/recv streams share one lane" in ax.get_title(loc="left")
    assert len(collections(ax)["p2p"].get_paths()) == 2 * 2 * 7 * 2       # every send and recv still drawn
    (ax,) = panel_axes(plots.gantt(res, max_lanes=24))
    assert len(ax.get_yticklabels()) == 24 and plots.P2P_LANE not in [t.get_text() for t in ax.get_yticklabels()]


def test_every_op_kind_has_a_colour_and_a_legend_label():
    from simulator.program import COLLECTIVE_KINDS, PHASES
    keys = {plots.colour_key("compute", ph, None) for ph in PHASES + (None, "warmup")}
    keys |= {plots.colour_key("collective", None, k) for k in COLLECTIVE_KINDS + ("gather",)}
    keys |= {plots.colour_key(k, None, None) for k in ("send", "recv")}
    assert keys == set(plots.PHASE_COLOURS) | set(plots.COMM_COLOURS)
    colours = [plots.colour_of(k) for k in keys]
    assert len(set(colours)) == len(colours)                  # no two kinds share a colour
    labels = [plots.legend_label(k) for k in keys]
    assert len(set(labels)) == len(labels)
    assert plots.legend_label("all_reduce") == "all-reduce" and plots.legend_label("p2p") == "send/recv (p2p)"


def test_blocks_merge_one_microbatch_phase_and_keep_gaps():
    rows = [  # kind, start, end, microbatch, phase, collective
        ("compute", 0.0, 1.0, 0, "forward", None), ("collective", 1.0, 1.2, 0, "forward", "all_reduce"),
        ("compute", 1.2, 2.0, 0, "forward", None), ("compute", 2.0, 3.0, 1, "forward", None),
        ("compute", 5.0, 6.0, 0, "backward", None), ("compute", 6.0, 6.5, None, "optimizer", None),
        ("compute", 6.5, 7.0, None, "optimizer", None), ("compute", 8.0, 9.0, None, "optimizer", None),
    ]
    df = pd.DataFrame(rows, columns=["kind", "start_s", "end_s", "microbatch", "phase", "collective"])
    df = df.assign(rank=0, stream="compute", microbatch=df["microbatch"].astype("Int64"))
    df["_key"] = [plots.colour_key(k, p, c) for k, p, c in zip(df["kind"], df["phase"], df["collective"])]
    b = plots.blocks(df, tol_s=1e-9)
    got = [(s, e, None if pd.isna(mb) else int(mb), k, n)
           for s, e, mb, k, n in zip(b["start_s"], b["end_s"], b["microbatch"], b["_key"], b["ops"])]
    assert got == [(0.0, 2.0, 0, "forward", 3), (2.0, 3.0, 1, "forward", 1), (5.0, 6.0, 0, "backward", 1),
                   (6.0, 7.0, None, "optimizer", 2), (8.0, 9.0, None, "optimizer", 1)]
    # merge_blocks=False draws every op
    res = run(toy_gpipe(2, 2), IdealCostModel(flops_per_s=1e12))
    (ax,) = panel_axes(plots.gantt(res, merge_blocks=False))
    assert len(collections(ax)["forward"].get_paths()) == 4


def test_16k_gpu_run_shows_one_labelled_representative_per_stage():
    pytest.importorskip("schedules.generate")
    from clustersim.experiment import experiment_from_dict, run_experiment
    out = run_experiment(experiment_from_dict(dict(cluster="dgx-h100", gpus=16384, model="llama3-8b", layers=8,
                                                   tp=8, pp=4, seq=1024, global_batch=8192)))
    res = out.result
    (ax,) = panel_axes(plots.gantt(res))
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert [lb for lb in labels if "·" in lb] == [f"stage {s} (rep. of 4096 ranks) · compute" for s in range(4)]
    assert len(labels) <= plots.DEFAULT_MAX_LANES
    assert "16384 ranks, symmetric mode" in ax.get_title(loc="left")
    fig = plots.memory_over_time(res)
    axes = [a for a in fig.axes if a.get_visible()]
    assert [a.get_title().splitlines()[0] for a in axes] == [f"stage {s} (rep. of 4096 ranks)" for s in range(4)]
    peaks = {rm.rank: rm.peak_memory_bytes for rm in out.metrics.per_rank}
    for a, (rank, _) in zip(axes, plots.representative_ranks(res, 8)):
        top = max(c.get_paths()[0].vertices[:, 1].max() for c in a.collections if c.get_label() in plots.MEMORY_COLOURS)
        assert top * GB == pytest.approx(peaks[rank], rel=1e-9)


def test_model_chunks_from_layer_runs():
    df = pd.DataFrame({"rank": [0, 0, 0, 0, 0, 1, 1], "layer": [0, 1, 4, 5, None, 2, 3]})
    assert plots.model_chunks(df).tolist() == [0, 0, 1, 1, pd.NA, pd.NA, pd.NA]


def test_interleaved_chunks_are_drawn_lighter():
    pytest.importorskip("schedules.generate")
    from clustersim.experiment import experiment_from_dict, run_experiment
    out = run_experiment(experiment_from_dict(dict(cluster="dgx-h100", gpus=8, model="llama3-8b", layers=8, tp=2,
                                                   pp=4, seq=1024, global_batch=8, schedule="interleaved",
                                                   virtual_stages=2)))
    (ax,) = panel_axes(plots.gantt(out.result))
    cols = collections(ax)
    assert to_rgba(cols["forward"].get_facecolor()[0]) == to_rgba(plots.PHASE_COLOURS["forward"])
    light = to_rgba(cols["forward chunk 1"].get_facecolor()[0])
    assert light == to_rgba(plots.lighten(plots.PHASE_COLOURS["forward"], 0.38))
    # every stage runs each micro-batch's forward once per chunk: as many chunk-1 bars as chunk-0 bars
    assert len(cols["forward chunk 1"].get_paths()) == len(cols["forward"].get_paths()) == 4 * 8
    legend = [t.get_text() for t in plt_legend_texts(ax.figure)]
    assert "forward (F), model chunk 2" in legend


def plt_legend_texts(fig):
    return [t for lg in fig.legends for t in lg.get_texts()]


def test_rectangles_are_the_bars_corners():
    from clustersim.plots import _polys, _rects
    r = _rects(1.0, [0.0, 2.0], [1.0, 3.5], 2.0, 0.5)
    assert len(r) == 1 and r[0].tolist() == [[[0.0, 0.75], [0.0, 1.25], [2.0, 1.25], [2.0, 0.75]],
                                            [[4.0, 0.75], [4.0, 1.25], [7.0, 1.25], [7.0, 0.75]]]
    assert _rects(1.0, [], [], 2.0, 0.5) == []
    pc = _polys(r + r)
    assert len(pc.get_paths()) == 4 and pc.get_paths()[1].vertices.tolist()[:4] == r[0][1].tolist()
    assert len(_polys([]).get_paths()) == 0
