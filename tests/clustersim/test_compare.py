"""compare: the metrics table equals the engine's metrics; variants from files and flags; outputs on disk."""
import json

import matplotlib
import pandas as pd
import pytest

from clustersim import compare as cmp
from clustersim.runs import TABLE_COLUMNS
from simulator.costs import SimpleCostModel
from simulator.engine import run
from simulator.errors import ConfigError
from simulator.metrics import compute_metrics
from tests.clustersim.test_plots import toy_1f1b
from tests.simulator.toy import toy_dp_pipeline, toy_gpipe


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    matplotlib.pyplot.close("all")


def toy_runs():
    cm = SimpleCostModel(flops_per_s=1e12, link_bytes_per_s=2e8, memory_bytes=40e9)
    return cmp.plan_runs({
        "gpipe m4": run(toy_gpipe(4, 4), cm),
        "1f1b m8": run(toy_1f1b(4, 8), cm),
        "dp x64 (symmetric)": run(toy_dp_pipeline(4, 64, 4, symmetric=True), cm),
    }, {"1f1b m8": {"pp": 4, "schedule": "1f1b"}})


def test_metrics_table_equals_the_engine_metrics():
    runs = toy_runs()
    table = cmp.metrics_table(runs)
    assert list(table.index) == [r.name for r in runs]
    for r in runs:
        fresh = compute_metrics(r.result).to_dict()
        for col in TABLE_COLUMNS:
            assert table.loc[r.name, col] == fresh[col], (r.name, col)
    assert table.loc["1f1b m8", "peak_memory_bytes"] == pytest.approx(10e9 + 4 * 2e9)   # static + p activations
    assert table.loc["dp x64 (symmetric)", "mode"] == "symmetric"


def test_write_outputs_files_and_csv_round_trip(tmp_path):
    runs = toy_runs()[1:]
    files = cmp.write_outputs(runs, tmp_path / "out", tmp_path / "report.html", title="toys")
    names = {f.name for f in files}
    for key in ("gantt", "memory", "breakdown"):
        assert {f"{key}.png", f"{key}.svg"} <= names
        assert (tmp_path / "out" / f"{key}.png").read_bytes()[:4] == b"\x89PNG"
    assert {"metrics.csv", "metrics.json", "report.html"} <= names
    traces = sorted(n for n in names if n.endswith(".perfetto.json"))
    assert traces == ["1f1b_m8.perfetto.json", "dp_x64_symmetric.perfetto.json"]
    trace = json.loads((tmp_path / "out" / "1f1b_m8.perfetto.json").read_text())
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])
    back = pd.read_csv(tmp_path / "out" / "metrics.csv", index_col="plan")
    table = cmp.metrics_table(runs)
    for col in ("step_time_s", "bubble_fraction", "exposed_comm_fraction", "overlap_fraction", "peak_memory_bytes",
                "mfu"):
        assert back[col].tolist() == pytest.approx(table[col].tolist(), rel=1e-12)
    js = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert [p["name"] for p in js["plans"]] == [r.name for r in runs]
    assert js["plans"][0]["metrics"]["step_time_s"] == runs[0].metrics.step_time_s
    assert js["plans"][0]["definition"] == {"pp": 4, "schedule": "1f1b"}


def test_slugs_are_file_safe_and_unique(tmp_path):
    cm = SimpleCostModel(flops_per_s=1e12)
    runs = cmp.plan_runs({"a/b": run(toy_gpipe(2, 2), cm), "a b": run(toy_gpipe(2, 2), cm)})
    files = cmp.write_outputs(runs, tmp_path, None, svg=False)
    assert sorted(f.name for f in files if f.name.endswith(".perfetto.json")) == \
        ["a_b-2.perfetto.json", "a_b.perfetto.json"]


# ---------------------------------------------------------------------------------------------- variants
def test_compare_file_variants_and_precedence(tmp_path):
    f = tmp_path / "cmp.yaml"
    f.write_text("title: pp schedules\nbase:\n  model: llama3-8b\n  gpus: 32\n  tp: 8\n  pp: 4\n"
                 "variants:\n  - {name: g, schedule: gpipe}\n  - {name: i, schedule: interleaved, virtual_stages: 2,"
                 " gpus: 64}\n")
    variants, title = cmp.build_variants(str(f), None, {"gpus": 16, "seq": 2048, "tp": None})
    assert title == "pp schedules"
    # base < command line < variant
    assert variants == [
        ("g", {"model": "llama3-8b", "gpus": 16, "tp": 8, "pp": 4, "seq": 2048, "schedule": "gpipe"}),
        ("i", {"model": "llama3-8b", "gpus": 64, "tp": 8, "pp": 4, "seq": 2048, "schedule": "interleaved",
               "virtual_stages": 2}),
    ]


def test_variants_as_mapping_and_schedules_cross_product(tmp_path):
    f = tmp_path / "cmp.yaml"
    f.write_text("base: {pp: 4}\nvariants:\n  small: {micro_batch: 1}\n  big: {micro_batch: 2}\n")
    variants, _ = cmp.build_variants(str(f), "1f1b,interleaved", {})
    assert [n for n, _ in variants] == ["small/1f1b", "small/interleaved", "big/1f1b", "big/interleaved"]
    assert variants[1][1] == {"pp": 4, "micro_batch": 1, "schedule": "interleaved", "virtual_stages": 2}
    assert variants[0][1]["virtual_stages"] == 1


def test_schedules_flag_alone_and_plain_experiment_file_as_base(tmp_path):
    f = tmp_path / "exp.yaml"
    f.write_text("model: llama3-8b\npp: 4\nvirtual_stages: 4\n")
    variants, title = cmp.build_variants(str(f), "gpipe, zb ,interleaved", {})
    assert title is None
    assert [(n, o["schedule"], o["virtual_stages"]) for n, o in variants] == \
        [("gpipe", "gpipe", 1), ("zb", "zb", 1), ("interleaved", "interleaved", 4)]


@pytest.mark.parametrize("text,schedules,match", [
    ("base: {pp: 4}\nvariants: [{name: a}, {name: a}]\n", None, "used twice"),
    # an empty name had labelled a note "note ():" and a file "plan.perfetto.json"; two identical variants ran
    # one plan twice without a word
    ("base: {pp: 4}\nvariants: {'': {tp: 2}, b: {tp: 1}}\n", None, "a variant has an empty name"),
    ("base: {pp: 4}\nvariants: {a: {tp: 2}, b: {tp: 2}}\n", None, "variants 'a' and 'b' set the same options"),
    ("base: {pp: 4}\nvariants: {a: null, b: {}}\n", None, "variants 'a' and 'b' set the same options"),
    ("base: {pp: 4}\nvariants: [3]\n", None, "must be a mapping"),
    ("base: {pp: 4}\nvariants: [{name: a}]\nextra: 1\n", None, "unknown top-level"),
    ("base: [1, 2]\nvariants: [{name: a}]\n", None, "base must be a mapping"),
    ("base: {pp: 4}\n", None, "nothing to compare"),
    ("pp: 4\n", "gpipe,warp", "unknown schedule 'warp'"),
    ("pp: 4\n", "gpipe,gpipe", "given twice"),
    ("pp: 4\n", " , ", "comma-separated"),
])
def test_bad_compare_input_is_a_config_error(tmp_path, text, schedules, match):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=match):
        cmp.build_variants(str(f), schedules, {})


def test_missing_compare_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        cmp.build_variants(str(tmp_path / "nope.yaml"), None, {})


# ---------------------------------------------------------------------------------------------- end to end
def _end_to_end_available() -> bool:
    try:
        import schedules  # noqa: F401
        from schedules import build_programs  # noqa: F401
        from topologies.cost import ClusterCostModel  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _end_to_end_available(), reason="schedules.build_programs / topologies.cost not built yet")
def test_cli_compare_schedules_end_to_end(tmp_path, capsys):
    from clustersim.cli import main
    from clustersim.experiment import experiment_from_dict, run_experiment
    report = tmp_path / "r.html"
    rc = main(["compare", "--cluster", "dgx-h100", "--gpus", "8", "--model", "llama3-8b", "--layers", "8",
               "--pp", "4", "--tp", "2", "--seq", "1024", "--global-batch", "8", "--schedules", "gpipe,1f1b",
               "--out", str(tmp_path / "out"), "--report", str(report), "--json"])
    assert rc == 0
    js = json.loads(capsys.readouterr().out)
    html = report.read_text()
    assert "gpipe" in html and "1f1b" in html
    assert "clustersim compare --cluster dgx-h100 --gpus 8 --model llama3-8b --layers 8 --pp 4 --tp 2" in html
    assert "--schedules gpipe,1f1b" in html and "--json" in html
    table = pd.read_csv(tmp_path / "out" / "metrics.csv", index_col="plan")
    assert list(table.index) == ["gpipe", "1f1b"] == [p["name"] for p in js["plans"]]
    # each row is what `simulate` gives for the same experiment
    for name in ("gpipe", "1f1b"):
        alone = run_experiment(experiment_from_dict(dict(cluster="dgx-h100", gpus=8, model="llama3-8b", layers=8,
                                                         pp=4, tp=2, seq=1024, global_batch=8, schedule=name)))
        assert table.loc[name, "step_time_s"] == pytest.approx(alone.metrics.step_time_s, rel=1e-12)
        assert table.loc[name, "peak_memory_bytes"] == pytest.approx(alone.metrics.peak_memory_bytes, rel=1e-12)
    assert {"gpipe.perfetto.json", "1f1b.perfetto.json", "gantt.png", "memory.png"} <= \
        {f.name for f in (tmp_path / "out").iterdir()}


def test_cli_compare_reports_bad_input_as_error_exit_2(tmp_path, capsys):
    from clustersim.cli import main
    if cmp.compare is None:
        pytest.skip("clustersim.experiment not importable")
    rc = main(["compare", "--schedules", "gpipe,nope"])
    assert rc == 2
    assert "unknown schedule 'nope'" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- measured
def _fixture_trace(tmp_path, kind: str):
    from tests.traces.kineto_fixtures import gloo_rank, nccl_rank, write
    from traces.parse import load_trace
    make = nccl_rank if kind == "nccl" else gloo_rank
    for r in range(2):
        write(make(r), tmp_path / kind / f"rank{r}.json")
    return load_trace(tmp_path / kind)


def test_trace_timeline_of_a_gpu_trace_has_kernels_and_collectives_where_the_trace_puts_them(tmp_path):
    trace = _fixture_trace(tmp_path, "nccl")
    df = cmp.trace_timeline(trace)                      # the last step both ranks recorded: ProfilerStep#4
    assert df.attrs["step"] == 4
    assert df.attrs["step_time_s"] == pytest.approx(999e-6)
    for r in (0, 1):
        mine = df[df["rank"] == r].sort_values("start_s")
        assert mine["stream"].tolist() == ["cuda:7", "cuda:7", "cuda:20"]
        assert mine["kind"].tolist() == ["compute", "compute", "collective"]
        assert mine["phase"].tolist()[:2] == ["forward", "backward"]     # AddmmBackward0 > aten::mm > kernel
        assert mine["collective"].tolist()[2] == "all_reduce"
        assert mine["start_s"].to_numpy() * 1e6 == pytest.approx([30, 320, 450])
        assert mine["end_s"].to_numpy() * 1e6 == pytest.approx([80, 360, 570])
    m = cmp.timeline_metrics(df)
    T = 999e-6
    assert m["step_time_s"] == pytest.approx(T)
    assert m["compute_fraction"] == pytest.approx(90e-6 / T)
    assert m["exposed_comm_fraction"] == pytest.approx(120e-6 / T)
    assert m["bubble_fraction"] == pytest.approx((T - 210e-6) / T)
    assert m["overlap_fraction"] == 0.0
    with pytest.raises(ConfigError, match="step 9 is not recorded"):
        cmp.trace_timeline(trace, step=9)


def test_trace_timeline_of_a_cpu_gloo_trace_uses_outermost_ops_and_worker_collectives(tmp_path):
    trace = _fixture_trace(tmp_path, "gloo")
    df = cmp.trace_timeline(trace)
    r0 = df[df["rank"] == 0]
    comp = r0[r0["kind"] == "compute"].sort_values("start_s")
    assert comp["name"].tolist() == ["aten::mm", "aten::copy_"]        # c10d enqueue ops are not compute
    assert comp["start_s"].to_numpy() * 1e6 == pytest.approx([10, 1100])
    coll = r0[r0["kind"] == "collective"].sort_values("start_s")
    want = trace.collectives[trace.collectives["rank"] == 0].sort_values("ts")
    assert len(coll) == len(want) == 2
    assert coll["end_s"].to_numpy() - coll["start_s"].to_numpy() == pytest.approx(want["dur"].to_numpy())
    assert not set(zip(coll["rank"], coll["stream"])) & set(zip(comp["rank"], comp["stream"]))


def test_timeline_metrics_agree_with_the_engine_metrics():
    # two independent implementations of the same definitions
    cm = SimpleCostModel(flops_per_s=1e12, link_bytes_per_s=2e8)
    for progs in (toy_dp_pipeline(4, 2, 4), toy_dp_pipeline(4, 16, 4, symmetric=True), toy_1f1b(4, 8)):
        res = run(progs, cm)
        m = compute_metrics(res)
        t = cmp.timeline_metrics(res.timeline, res.step_time_s)
        for k in cmp.MEASURED_COLUMNS:
            assert t[k] == pytest.approx(getattr(m, k), rel=1e-9, abs=1e-12), k


def test_measured_vs_simulated_view_and_report(tmp_path):
    trace = _fixture_trace(tmp_path, "nccl")
    runs = cmp.plan_runs({"ddp sim": run(toy_dp_pipeline(1, 2, 2), SimpleCostModel(flops_per_s=1e16))})
    fig, table = cmp.measured_vs_simulated(trace, runs)
    titles = [ax.get_title(loc="left") for ax in fig.axes if ax.get_yticks().size]
    assert titles[0].startswith("measured (step 4) — step ") and titles[1].startswith("replay of the trace — ")
    assert titles[2].startswith("ddp sim — ")
    assert table.loc["measured (step 4)", "step_time_s"] == pytest.approx(999e-6)
    assert list(table.index) == ["measured (step 4)", "replay of the trace", "ddp sim"]
    assert table.loc["ddp sim", "step_time_s"] == runs[0].metrics.step_time_s
    files = cmp.write_outputs(runs, tmp_path / "out", tmp_path / "r.html", svg=False, trace=trace)
    assert {"measured.png", "measured.csv"} <= {f.name for f in files}
    html = (tmp_path / "r.html").read_text()
    assert "Measured vs simulated" in html and "measured (step 4)" in html


def test_replay_of_a_complete_gpu_trace_reproduces_the_measured_step(tmp_path):
    # every rank is in the trace and durations are measured: the replayed step is the measured one
    trace = _fixture_trace(tmp_path, "nccl")
    measured = cmp.trace_timeline(trace)
    rep = cmp.replay_timeline(trace)
    assert rep.attrs["step"] == 4
    cols = ["rank", "stream", "kind", "phase", "collective"]
    a = measured.sort_values(["rank", "start_s"]).reset_index(drop=True)
    b = rep.sort_values(["rank", "start_s"]).reset_index(drop=True)
    assert a[cols].astype(str).values.tolist() == b[cols].astype(str).values.tolist()
    assert b["start_s"].to_numpy() == pytest.approx(a["start_s"].to_numpy(), abs=1e-9)
    assert b["end_s"].to_numpy() == pytest.approx(a["end_s"].to_numpy(), abs=1e-9)
    ma, mb = cmp.timeline_metrics(measured), cmp.timeline_metrics(rep)
    for k in cmp.MEASURED_COLUMNS:
        assert mb[k] == pytest.approx(ma[k], abs=1e-9), k


def test_cli_compare_trace_only_shows_measured_and_replay(tmp_path, capsys):
    from clustersim.cli import main
    if cmp.compare is None:
        pytest.skip("clustersim.experiment not importable")
    _fixture_trace(tmp_path, "nccl")
    rc = main(["compare", "--trace", str(tmp_path / "nccl"), "--json", "--report", str(tmp_path / "r.html")])
    assert rc == 0
    js = json.loads(capsys.readouterr().out)
    assert js["plans"] == []
    assert set(js["measured"]) == {"measured (step 4)", "replay of the trace"}
    assert js["measured"]["measured (step 4)"]["step_time_s"] == pytest.approx(999e-6)
    assert (tmp_path / "r_files" / "measured.png").exists() and "Measured vs simulated" in (tmp_path / "r.html").read_text()
    assert main(["compare", "--trace", str(tmp_path / "nccl"), "--trace-step", "9"]) == 2
    assert "step 9 is not recorded" in capsys.readouterr().err


def test_cli_compare_unwritable_output_is_a_clear_error(tmp_path, capsys):
    from clustersim.cli import main
    if cmp.compare is None:
        pytest.skip("clustersim.experiment not importable")
    _fixture_trace(tmp_path, "nccl")
    (tmp_path / "afile").write_text("x")
    rc = main(["compare", "--trace", str(tmp_path / "nccl"), "--report", str(tmp_path / "afile" / "r.html")])
    assert rc == 2
    assert "cannot write the outputs" in capsys.readouterr().err


def test_schedules_flag_takes_the_new_schedules():
    from clustersim.compare import schedule_variants
    got = schedule_variants("1f1b,interleaved,zb-h1,zb-v,zb-auto,dualpipe,dualpipev,zb-h2")
    assert [n for n, _ in got] == ["1f1b", "interleaved", "zb-h1", "zb-v", "zb-auto", "dualpipe", "dualpipev", "zb-h2"]
    assert {n: o["virtual_stages"] for n, o in got}["interleaved"] == 2
    assert all(o["virtual_stages"] == 1 for n, o in got if n != "interleaved")


def test_report_does_not_write_over_what_no_report_wrote(tmp_path, capsys):
    """--report replaced any file with HTML, and a foreign file in its <stem>_files folder was blamed on an
    --out never given; both are refused before simulating (--force allows them), a report is rewritten."""
    from clustersim.cli import main
    base = ["compare", "--layers", "2", "--hidden", "256", "--heads", "4", "--gpus", "8", "--pp", "2",
            "--schedules", "1f1b,zb"]
    notes = tmp_path / "notes.txt"
    notes.write_text("precious")
    assert main(base + ["--report", str(notes)]) == 2
    assert "exists and is no clustersim report" in capsys.readouterr().err and notes.read_text() == "precious"
    (tmp_path / "r_files").mkdir()
    (tmp_path / "r_files" / "mine.txt").write_text("mine")
    assert main(base + ["--report", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert "its picture folder" in err and "--out " not in err
    report = tmp_path / "s.html"
    assert main(base + ["--report", str(report)]) == 0 and main(base + ["--report", str(report)]) == 0
    assert main(base + ["--report", str(notes), "--force"]) == 0
    assert notes.read_text().startswith("<!DOCTYPE html>")


def test_report_picture_folder_that_is_a_file_is_said_as_it_is(tmp_path, capsys):
    """Every OutputError of the <stem>_files folder read 'is not empty ... or pass --force', a file there too."""
    from clustersim.cli import main
    (tmp_path / "r_files").write_text("a file")
    assert main(["compare", "--layers", "2", "--hidden", "256", "--heads", "4", "--gpus", "8", "--pp", "2",
                 "--schedules", "1f1b,zb", "--report", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert "its picture folder:" in err and "exists and is not a folder" in err and "--force" not in err
