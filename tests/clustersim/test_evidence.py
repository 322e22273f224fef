"""The evidence printed next to a prediction (clustersim.evidence): its groups are validate's, its statistics
are the committed validate run's, and simulate / search print and return it."""
import json
import re
from pathlib import Path

import pytest

from clustersim import evidence as ev
from clustersim.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_group_for_names_validate_groups():
    assert ev.group_for("H100-SXM", "bf16", False) == "H100 BF16 dense"
    assert ev.group_for("H100-HBM2e", "fp8", False) == "H100-500W FP8 dense"
    assert ev.group_for("A100-40GB", "bf16", True) == "A100 BF16 MoE"
    assert ev.group_for("GB200", "fp8", True) == "GB200 FP8 MoE"
    for no_runs in ("H100-PCIe", "L40S", "TPU-v5p", "Ascend-910C", "cpu"):
        assert ev.group_for(no_runs, "bf16", False) is None


@pytest.mark.parametrize("row_id", ["411", "489", "565", "402", "311", "363", "36", "409", "621"])
def test_group_for_agrees_with_validate_group_of(row_id):
    """A validate row's group (from the source's hardware text) is the group a simulation of that row's
    experiment gets (from its cluster's accelerator): the evidence printed is the evidence of its kind."""
    from clustersim.experiment import experiment_from_dict, load_cluster_for, resolve_model
    from clustersim.validate import _experiment_fields, group_of, load_runs, row_experiment
    row = next(r for r in load_runs() if r["id"] == row_id)
    kw, _ = row_experiment(row, _experiment_fields())
    exp = experiment_from_dict(kw)
    acc = load_cluster_for(exp).accelerator.name
    assert ev.group_for(acc, exp.dtype, resolve_model(exp).is_moe) == group_of(row)


def test_summary_statistics_by_hand(tmp_path):
    rows = [{"group": "H100 BF16 dense", "stack": "megatron", "error": e, "gpus": g}
            for e, g in ((0.10, 8), (-0.02, 64), (0.04, 1024))]
    rows.append({"group": "H100 BF16 dense", "stack": "llm-foundry", "error": 0.30, "gpus": "16"})
    doc = ev.summarize_evidence(rows)
    g = doc["groups"]["H100 BF16 dense"]
    assert g["rows"] == 4 and g["gpus"] == [8, 1024]
    assert g["median_abs_error"] == pytest.approx((0.04 + 0.10) / 2)
    assert g["mean_signed_error"] == pytest.approx((0.10 - 0.02 + 0.04 + 0.30) / 4)
    m = doc["by_stack"]["H100 BF16 dense"]["megatron"]
    assert m["rows"] == 3 and m["median_abs_error"] == pytest.approx(0.04)
    assert m["p90_abs_error"] == pytest.approx(0.04 + 0.8 * (0.10 - 0.04))     # numpy's linear percentile

    path = tmp_path / "evidence.json"
    ev.write_evidence(rows, path)
    ev.load_evidence.cache_clear()
    got = ev.evidence_for("H100-SXM", "bf16", False, "megatron", path)
    assert got["rows"] == 4 and got["stack_rows"] == 3 and got["group"] == "H100 BF16 dense"
    line = ev.evidence_line(got)
    assert "vs 4 published H100 BF16 dense runs (8-1,024 GPUs)" in line and "megatron stack: 3 runs" in line
    other = ev.evidence_for("H100-SXM", "bf16", False, "torchtitan", path)      # no run of that stack
    assert other["rows"] == 4 and "stack_rows" not in other and "stack" not in ev.evidence_line(other)
    assert ev.evidence_for("B200", "fp8", False, "megatron", path)["rows"] == 0
    assert "no published run" in ev.evidence_line(ev.evidence_for("L40S", "bf16", False, "megatron", path))
    missing = ev.evidence_for("H100-SXM", "bf16", False, "megatron", tmp_path / "none.json")
    assert missing["rows"] == 0 and "benchmarks/validate.py" in missing["note"]


def test_moe_evidence_splits_megatron_bridge_runs_by_cuda_graphs(tmp_path):
    rows = [{"group": "GB200 FP8 MoE", "stack": "megatron", "error": e, "gpus": 8, "cuda_graphs": cg}
            for e, cg in ((0.05, "full iteration"), (-0.15, "full iteration"), (0.6, "partial: attn"),
                          (0.8, "none"), (0.4, "none"), (0.3, None))]
    rows.append({"group": "GB200 FP8 dense", "stack": "megatron", "error": 0.2, "gpus": 8, "cuda_graphs": "none"})
    doc = ev.summarize_evidence(rows)
    assert set(doc["by_cuda_graphs"]) == {"MoE", "dense"}
    moe = doc["by_cuda_graphs"]["MoE"]
    assert {k: v["rows"] for k, v in moe.items()} == {"full iteration": 2, "partial": 1, "none": 2}
    assert moe["full iteration"]["mean_signed_error"] == pytest.approx(-0.05)
    assert moe["none"]["median_abs_error"] == pytest.approx(0.6)
    path = tmp_path / "evidence.json"
    ev.write_evidence(rows, path)
    ev.load_evidence.cache_clear()
    got = ev.evidence_for("GB200", "fp8", True, "megatron", path)
    assert got["cuda_graphs"]["none"]["rows"] == 2
    line = ev.evidence_line(got)
    assert "capturing whole iterations in CUDA graphs: 2, median |error| 10.0%, mean -5.0%" in line
    assert "capturing none: 2, 60.0%, +60.0%" in line and "host-side work is not modelled" in line
    dense = ev.evidence_for("GB200", "fp8", False, "megatron", path)
    assert "cuda_graphs" not in dense and "CUDA graphs" not in ev.evidence_line(dense)
    ev.load_evidence.cache_clear()


def test_published_mfu_range_of_pretraining_runs_and_where_a_plan_stands(tmp_path):
    """The published MFU range (pre-training rows only: a fine-tuning row's MFU counts a frozen model's FLOPs)
    per group and per model preset, and the search's sentence placing a predicted MFU against it."""
    def row(model, mfu, task="pretrain", group="H100 BF16 dense"):
        return {"group": group, "stack": "megatron", "error": 0.0, "gpus": 64, "task": task,
                "experiment": {"model": model}, "published_mfu": mfu}
    rows = [row("llama3-70b", 0.50), row("llama3-70b", 0.54), row("llama3-70b", 0.31, task="lora"),
            row("llama3-8b", 0.62), row("llama3-8b", None), row("llama3-8b", 0.30, group="A100 BF16 dense"),
            row("llama3-405b", 1.05, group="A100 FP8 dense")]
    doc = ev.summarize_evidence(rows)
    assert doc["by_model"]["llama3-70b"]["H100 BF16 dense"]["published_mfu"] == [0.50, 0.54]
    assert doc["by_model"]["llama3-70b"]["H100 BF16 dense"]["rows"] == 3        # errors still count every row
    assert doc["groups"]["H100 BF16 dense"]["published_mfu"] == [0.50, 0.62]
    assert doc["by_model"]["llama3-8b"]["(all)"]["published_mfu"] == [0.30, 0.62]
    assert "published_mfu" not in ev.summarize_evidence([row("x", None)])["groups"]["H100 BF16 dense"]
    path = tmp_path / "evidence.json"
    ev.write_evidence(rows, path)
    ev.load_evidence.cache_clear()
    got = ev.evidence_for("H100-SXM", "bf16", False, "megatron", path, model="llama3-70b")
    assert got["model_published_mfu"] == [0.50, 0.54] and got["published_mfu"] == [0.50, 0.62]
    assert "llama3-70b itself: 3 runs (H100 BF16 dense), median |error| 0.0%, mean +0.0%, published " \
           "pre-training MFU 50.0%-54.0%" in ev.evidence_line(got)
    assert ev.mfu_against_published(got, 0.548) == ("MFU 54.8% against 50.0%-54.0% reached by published llama3-70b "
                                                    "pre-training runs (H100 BF16 dense): 0.8 points above the highest")
    assert ev.mfu_against_published(got, 0.52).endswith("within their range")
    assert ev.mfu_against_published(got, 0.45).endswith("5.0 points below the lowest")
    assert ev.mfu_against_published(got, 0.5404).endswith("within their range")     # 54.0% as printed
    # a model's runs of another kind (here FP8 on A100, MFU on the BF16 peak) are not this prediction's measure
    elsewhere = ev.evidence_for("H100-SXM", "bf16", False, "megatron", path, model="llama3-405b")
    assert elsewhere["model_scope"] == "all hardware" and "published pre-training MFU" not in ev.evidence_line(elsewhere)
    assert "reached by published H100 BF16 dense pre-training runs" in ev.mfu_against_published(elsewhere, 0.5)
    other = ev.evidence_for("H100-SXM", "bf16", False, "megatron", path, model="gpt3-175b")     # no runs of it
    assert ev.mfu_against_published(other, 0.6) == ("MFU 60.0% against 50.0%-62.0% reached by published H100 BF16 "
                                                    "dense pre-training runs: within their range")
    assert ev.mfu_against_published(ev.evidence_for("L40S", "bf16", False, "megatron", path), 0.5) is None
    ev.load_evidence.cache_clear()


def _md_summary() -> dict:
    """The group table of the committed benchmarks/results/validate.md: group -> (rows, median, p90, mean) in %."""
    out = {}
    for line in (ROOT / "benchmarks" / "results" / "validate.md").read_text().splitlines():
        m = re.match(r"\| ([^|]+?) \| (\d+) \| ([\d.]+)% \| ([\d.]+)% \| ([+-][\d.]+)% \|$", line)
        if m:
            out[m.group(1)] = (int(m.group(2)), *(float(m.group(i)) for i in (3, 4, 5)))
    return out


def test_committed_evidence_is_the_committed_validate_run():
    """validation/evidence.json and benchmarks/results/validate.md come from the same whole run."""
    doc = json.loads(ev.EVIDENCE.read_text())
    md = _md_summary()
    assert md and set(md) == set(doc["groups"])
    for group, (rows, med, p90, mean) in md.items():
        g = doc["groups"][group]
        assert g["rows"] == rows
        assert round(100 * g["median_abs_error"], 1) == pytest.approx(med, abs=0.051)
        assert round(100 * g["p90_abs_error"], 1) == pytest.approx(p90, abs=0.051)
        assert round(100 * g["mean_signed_error"], 1) == pytest.approx(mean, abs=0.051)
        assert sum(s["rows"] for s in doc["by_stack"][group].values()) == rows
    graphs = {}
    for line in (ROOT / "benchmarks" / "results" / "validate.md").read_text().splitlines():
        m = re.match(r"\| (MoE|dense) \| ([a-z ]+) \| (\d+) \| ([\d.]+)% \| ([\d.]+)% \| ([+-][\d.]+)% \|$", line)
        if m:
            graphs[(m.group(1), m.group(2))] = (int(m.group(3)), float(m.group(6)))
    assert graphs and {(k, c) for k, d in doc["by_cuda_graphs"].items() for c in d} == set(graphs)
    for (kind, capture), (rows, mean) in graphs.items():
        s = doc["by_cuda_graphs"][kind][capture]
        assert s["rows"] == rows and round(100 * s["mean_signed_error"], 1) == pytest.approx(mean, abs=0.051)


def test_evidence_names_a_commit_with_uncommitted_code_as_such(tmp_path):
    """The evidence file names the commit whose code ran; changed tracked files other than the run's own
    outputs (evidence.json, benchmarks/results) mark it, untracked files do not."""
    import shutil
    import subprocess
    if shutil.which("git") is None:
        pytest.skip("git is not installed")

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       check=True, capture_output=True)
    (tmp_path / "validation").mkdir()
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    for f in ("model.py", "validation/evidence.json", "benchmarks/results/validate.md"):
        (tmp_path / f).write_text("1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "x")
    sha = ev._commit(tmp_path)
    assert sha and ev.UNCOMMITTED not in sha
    (tmp_path / "validation" / "evidence.json").write_text("2\n")
    (tmp_path / "benchmarks" / "results" / "validate.md").write_text("2\n")
    (tmp_path / "new.py").write_text("2\n")
    assert ev._commit(tmp_path) == sha
    assert ev._commit(tmp_path / "validation") == sha          # the whole checkout, from anywhere in it
    (tmp_path / "model.py").write_text("2\n")
    assert ev._commit(tmp_path) == sha + ev.UNCOMMITTED
    assert ev._commit(tmp_path / "validation") == sha + ev.UNCOMMITTED
    assert ev._commit(tmp_path.parent / "no-such-checkout") is None


def test_simulate_and_search_print_and_return_the_evidence(capsys):
    base = ["--cluster", "dgx-h100", "--gpus", "16", "--model", "llama3-8b", "--tp", "8", "--global-batch", "8"]
    assert main(["simulate", *base, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["evidence"]
    doc = json.loads(ev.EVIDENCE.read_text())
    assert got["group"] == "H100 BF16 dense" and got["rows"] == doc["groups"]["H100 BF16 dense"]["rows"]
    assert got["stack"] == "megatron" and got["stack_rows"] == doc["by_stack"]["H100 BF16 dense"]["megatron"]["rows"]
    assert main(["simulate", *base]) == 0
    assert "evidence (clustersim validate): vs " in capsys.readouterr().out
    assert main(["search", *base, "--no-cache", "--json", "--tp", "8"]) == 0
    got = json.loads(capsys.readouterr().out)["evidence"]
    assert got["group"] == "H100 BF16 dense" and got["model_published_mfu"] == \
        doc["by_model"]["llama3-8b"]["H100 BF16 dense"]["published_mfu"]
    assert main(["search", *base, "--no-cache", "--tp", "8"]) == 0
    assert "best plan: MFU " in capsys.readouterr().out
    assert main(["simulate", "--cluster", "pcie-ethernet-lab", "--gpus", "8", "--model", "tiny", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["evidence"]["rows"] == 0


def test_validate_evidence_prints_the_committed_file(capsys):
    """`clustersim validate evidence` prints the evidence without simulating; --json is the file."""
    doc = json.loads(ev.EVIDENCE.read_text())
    assert main(["validate", "evidence", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == doc
    assert main(["validate", "evidence"]) == 0
    out = capsys.readouterr().out
    for group, s in doc["groups"].items():
        assert group in out and f"{s['median_abs_error']:.1%}" in out


def test_compare_gives_each_plan_the_evidence_of_its_kind(capsys, tmp_path):
    """Plans of different kinds (BF16 and FP8 on H100) carry their own evidence; the table names which
    plans each evidence line is for."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("base:\n  cluster: dgx-h100\n  gpus: 16\n  model: llama3-8b\n  tp: 8\n  global_batch: 8\n"
                   "variants:\n  bf16:\n    dtype: bf16\n  fp8:\n    dtype: fp8\n")
    assert main(["compare", "-c", str(cfg), "--json"]) == 0
    plans = {p["name"]: p for p in json.loads(capsys.readouterr().out)["plans"]}
    assert plans["bf16"]["evidence"]["group"] == "H100 BF16 dense"
    assert plans["fp8"]["evidence"]["group"] == "H100 FP8 dense"
    assert main(["compare", "-c", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "evidence (clustersim validate) (bf16): vs " in out and "evidence (clustersim validate) (fp8): vs " in out


def test_evidence_says_when_it_is_of_another_model(capsys):
    """The published runs were predicted uncalibrated over a modelled network: a calibrated or ideal-network
    prediction gets the evidence with that caveat; an ordinary one without."""
    base = ["simulate", "--cluster", "dgx-h100", "--gpus", "16", "--model", "llama3-8b", "--tp", "8", "--json"]
    assert main(base) == 0
    assert "caveat" not in json.loads(capsys.readouterr().out)["evidence"]
    assert main(base + ["--network", "ideal"]) == 0
    assert "ideal network" in json.loads(capsys.readouterr().out)["evidence"]["caveat"]
    assert main(base + ["--calibration", str(ROOT / "traces" / "data" / "h100.json")]) == 0
    ev_ = json.loads(capsys.readouterr().out)["evidence"]
    assert "uncalibrated" in ev_["caveat"] and "uncalibrated" in ev.evidence_line(ev_)


def test_evidence_says_when_a_run_is_beyond_the_published_scale(tmp_path, capsys):
    """A prediction for more GPUs than the largest published run of its kind is an extrapolation: said so."""
    rows = [{"group": "H100 BF16 dense", "stack": "megatron", "error": 0.05, "gpus": g} for g in (8, 64, 2304)]
    path = tmp_path / "e.json"
    ev.write_evidence(rows, path)
    ev.load_evidence.cache_clear()
    inside = ev.evidence_for("H100-SXM", "bf16", False, "megatron", path, gpus=2304)
    beyond = ev.evidence_for("H100-SXM", "bf16", False, "megatron", path, gpus=16384)
    assert "extrapolation" not in inside
    assert "16,384 GPUs" in beyond["extrapolation"] and "(2,304)" in beyond["extrapolation"]
    assert "this run: 16,384 GPUs, beyond" in ev.evidence_line(beyond)
    args = ["simulate", "--cluster", "dgx-h100", "--model", "llama3-8b", "--tp", "8", "--json"]
    assert main(args + ["--gpus", "4096", "--global-batch", "512"]) == 0
    big = json.loads(capsys.readouterr().out)["evidence"]
    assert big["extrapolation"].startswith("4,096 GPUs")
    assert main(args + ["--gpus", "16", "--global-batch", "8"]) == 0
    assert "extrapolation" not in json.loads(capsys.readouterr().out)["evidence"]


def test_a_models_own_published_runs_join_its_evidence(tmp_path):
    """Where the validation set has runs of the simulated preset, the evidence adds their statistics: in the
    prediction's group where it has some, else over every group; proxies (fewer layers) count as the preset."""
    rows = [{"group": "H100 BF16 MoE", "stack": "megatron", "error": e, "gpus": g, "experiment": {"model": m}}
            for e, g, m in ((0.10, 8, "qwen3-30b-a3b"), (1.0, 64, "gpt-oss-120b"), (1.2, 64, "gpt-oss-120b"))]
    rows.append({"group": "GB200 BF16 MoE", "stack": "megatron", "error": 0.9, "gpus": 64,
                 "experiment": {"model": {"base": "gpt-oss-120b", "layers": 12}}})
    doc = ev.summarize_evidence(rows)
    assert doc["by_model"]["gpt-oss-120b"]["H100 BF16 MoE"]["rows"] == 2
    assert doc["by_model"]["gpt-oss-120b"]["(all)"]["rows"] == 3
    path = tmp_path / "evidence.json"
    ev.write_evidence(rows, path)
    ev.load_evidence.cache_clear()
    got = ev.evidence_for("H100-SXM", "bf16", True, "megatron", path, model="gpt-oss-120b")
    assert (got["rows"], got["model_rows"], got["model_scope"]) == (3, 2, "H100 BF16 MoE")
    assert got["model_mean_signed_error"] == pytest.approx(1.1)
    assert "gpt-oss-120b itself: 2 runs (H100 BF16 MoE), median |error| 110.0%, mean +110.0%" in ev.evidence_line(got)
    b200 = ev.evidence_for("B200", "bf16", True, "megatron", path, model="gpt-oss-120b")     # no B200 group at all
    assert b200["rows"] == 0 and b200["model_scope"] == "all hardware" and "itself: 3 runs" in ev.evidence_line(b200)
    assert "model_rows" not in ev.evidence_for("H100-SXM", "bf16", True, "megatron", path, model="tiny-moe")
