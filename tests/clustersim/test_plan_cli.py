"""clustersim plan: JSON fields, fit verdicts, errors as `error: ...` with exit code 2."""
import json

import pytest

from clustersim.plan import model_from_options, plan_from_options, plan_report
from schedules.models import get_model
from clustersim.cli import main
from simulator.errors import ConfigError


def _json(capsys, *args):
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_zero_paper_example_from_the_cli(capsys):
    for stage, gb in [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)]:
        d = _json(capsys, "--params", "7.5e9", "--dp", "64", "--zero", str(stage), "--hbm-gb", "20")
        m = d["memory_bytes"]["stage0"]
        assert (m["parameters"] + m["gradients"] + m["optimizer"]) / 1e9 == pytest.approx(gb, abs=0.05)
        assert d["fits_in_memory"] == (stage >= 2)
        assert set(m) >= {"parameters", "gradients", "optimizer", "activations", "total"}
        assert d["comm_bytes_per_step"]


def test_json_for_a_preset_plan(capsys):
    d = _json(capsys, "-m", "tiny", "--gpus", "8", "--tp", "2", "--pp", "2", "--seq", "128", "--sp",
              "--zero", "1", "--hbm-gb", "80")
    assert d["world_size"] == 8 and d["plan"]["dp"] == 2
    assert set(d["memory_bytes"]) == {"stage0", "stage1"}
    assert d["fits_in_memory"] is True
    assert {"all_gather", "reduce_scatter", "p2p"} <= set(d["comm_bytes_per_step"])
    assert {"tp", "dp", "pp"} <= set(d["comm_bytes_per_step_by_group"])
    assert d["model_flops_per_step"] > 0


def test_cluster_preset_gives_device_memory(capsys):
    pytest.importorskip("topologies.presets")
    d = _json(capsys, "-m", "tiny", "--gpus", "8", "--cluster", "dgx-h100", "--seq", "128")
    assert d["device_memory_bytes"] == 81559 * 2**20          # H100 SXM as nvidia-smi reports it


def test_human_output(capsys):
    assert main(["plan", "-m", "tiny", "--gpus", "4", "--pp", "2", "--seq", "128", "--hbm-gb", "1e-6"]) == 0
    out = capsys.readouterr().out
    assert "stage1" in out and "does not fit" in out and "communication" in out


def test_plan_takes_simulates_default_virtual_stages(capsys):
    """Interleaved without --virtual-stages: 2 where every stage holds two chunks (schedules.plan.
    default_virtual_stages, as simulate), else 1 with a note."""
    base = ["--hidden", "256", "--heads", "8", "--pp", "4", "--schedule", "interleaved", "--global-batch", "16"]
    assert _json(capsys, "--layers", "8", *base)["plan"]["virtual_stages"] == 2
    assert _json(capsys, "--layers", "16", *base, "--virtual-stages", "4")["plan"]["virtual_stages"] == 4
    few = _json(capsys, "--layers", "5", *base)
    assert few["plan"]["virtual_stages"] == 1 and any("plain 1F1B" in n for n in few["notes"])


def test_plan_notes_options_that_do_nothing(capsys):
    """plan says what simulate says of a plan's inert parts: SP at tp 1, interleaving with one virtual stage,
    ZeRO / FSDP over one data-parallel rank (``schedules.plan.plan_notes``; JSON ``notes``)."""
    base = ["--layers", "8", "--hidden", "256", "--heads", "8", "--global-batch", "8", "--seq", "128"]
    notes = _json(capsys, *base, "--sp", "--zero", "1", "--pp", "2", "--schedule", "interleaved",
                  "--virtual-stages", "1")["notes"]
    assert len(notes) == 3 and "--sp does nothing at tp 1" in notes[0] and "plain 1F1B" in notes[1]
    assert "--zero 1 shards over the data-parallel group, which holds one rank" in notes[2]
    assert _json(capsys, *base, "--sp", "--tp", "2", "--zero", "1", "--dp", "2")["notes"] == []
    assert main(["plan", *base, "--fsdp"]) == 0
    assert "note: --fsdp shards over the data-parallel group" in capsys.readouterr().out
    notes = _json(capsys, *base, "--dp", "2", "--fsdp", "--bucket-mb", "50", "--schedule", "zb")["notes"]
    assert any("--bucket-mb and --no-overlap-grad-reduce" in n for n in notes)
    assert any("pp 1: there is no pipeline" in n for n in notes)


@pytest.mark.parametrize("args, match", [
    (["-m", "llama3-8b", "--gpus", "16", "--tp", "16"], "kv heads"),
    (["-m", "llama3-8b", "--gpus", "10", "--tp", "4"], "cannot infer dp"),
    (["-m", "nope"], "unknown model preset"),
    (["--layers", "4"], "missing --hidden, --heads"),
    (["--params", "1e9", "-m", "tiny"], "alone"),
])
def test_errors_exit_2(capsys, args, match):
    assert main(["plan", *args]) == 2
    assert match in capsys.readouterr().err


def test_custom_model_flags_and_helpers():
    m = model_from_options(layers=4, hidden=256, heads=4, experts=4)
    assert m.ffn == 1024 and m.vocab == 51200 and m.top_k == 2
    m2 = model_from_options(model="llama3-8b", layers=8)
    assert m2.layers == 8 and m2.hidden == 4096
    p = plan_from_options(gpus=64, tp=4, pp=2, schedule="zb", unknown_flag=1)
    assert p.dp == 8 and p.schedule == "zb"
    with pytest.raises(ConfigError):
        model_from_options()
    rep = plan_report(get_model("tiny"), plan_from_options(gpus=2, seq=128), hbm_bytes=1e12)
    assert rep["fits_in_memory"] and rep["comm_bytes_per_step"]["all_reduce"] > 0


def test_stage_table_and_uneven_layers(capsys):
    d = _json(capsys, "--layers", "22", "--hidden", "256", "--heads", "8", "--pp", "8", "--schedule",
              "interleaved", "--virtual-stages", "2", "--global-batch", "16", "--seq", "128")
    rows = d["stages"]
    assert [sum(r["layers"]) for r in rows] == [2, 3, 3, 3, 3, 3, 3, 2]
    assert rows[0]["embedding"] and rows[-1]["head"] and max(r["relative_time"] for r in rows) == 1.0
    d = _json(capsys, "--layers", "22", "--hidden", "256", "--heads", "8", "--pp", "4", "--stage-layers",
              "5,6,6,5", "--global-batch", "16", "--seq", "128")
    assert [r["layers"] for r in d["stages"]] == [[5], [6], [6], [5]]


def test_zb_auto_memory_limit_forms(capsys):
    base = ["--layers", "8", "--hidden", "256", "--heads", "8", "--pp", "4", "--schedule", "zb-auto",
            "--global-batch", "16", "--seq", "128"]
    act = {}
    for lim in ("1p", "2p", "6", "0.05GB", "50MB", "50 mb", "50000kB"):
        act[lim] = max(r["activations"] for r in _json(capsys, *base, "--memory-limit", lim)["memory_bytes"].values())
    assert act["1p"] <= act["6"] <= act["2p"]
    assert act["0.05GB"] <= 0.05e9          # the LM head's fp32 logits count too (~28 MB here)
    assert act["50MB"] == act["50 mb"] == act["50000kB"] == act["0.05GB"]      # SI units, any case


@pytest.mark.parametrize("args, match", [
    (["--memory-limit", "2p"], "zb-auto"),
    (["--schedule", "zb-auto", "--memory-limit", "lots"], "memory-limit"),
    (["--schedule", "zb-auto", "--memory-limit", "1e-9GB"], "less than one"),
    (["--schedule", "zb-auto", "--memory-limit", "50XB"], "bytes with a unit"),
    (["--schedule", "zb-auto", "--memory-limit", "-5MB"], "bytes with a unit"),
    (["--stage-layers", "1,2,3"], "one per pipeline stage"),
    (["--stage-layers", "3,3,3,3"], "add up"),
    (["--schedule", "dualpipe", "--global-batch", "6"], "dualpipe"),
])
def test_pipeline_flag_errors(capsys, args, match):
    base = ["plan", "--layers", "16", "--hidden", "256", "--heads", "8", "--pp", "4", "--global-batch", "16"]
    assert main(base + args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and match in err


def test_stage_times_at_the_devices_peak(capsys):
    d = _json(capsys, "--layers", "8", "--hidden", "256", "--heads", "8", "--pp", "2", "--global-batch", "8",
              "--seq", "128", "--cluster", "dgx-h100", "--gpus", "8")
    for r in d["stages"]:      # H100 SXM dense bf16 peak, 989 TFLOP/s (topologies.specs)
        assert r["time_at_peak_s"] == pytest.approx(r["flops_per_microbatch"] / 989e12, rel=1e-3)


def test_dtype_and_stack_reach_the_memory_model(capsys):
    """`plan --dtype/--stack` price memory as simulate does: FP8 keeps Transformer Engine's weight copies
    (row- and column-wise, 1 byte each, without ZeRO-3), torchtitan's eager loss keeps an fp32 copy of the
    logits; plan's peak equals simulate's for the same flags (no FSDP: both are the same closed form)."""
    pytest.importorskip("topologies.presets")
    args = ["-m", "llama3-8b", "--layers", "4", "--gpus", "16", "--tp", "4", "--pp", "2", "--seq", "1024",
            "--zero", "1", "--sp", "--cluster", "dgx-h100", "--global-batch", "8"]
    bf16 = _json(capsys, *args)
    fp8 = _json(capsys, *args, "--dtype", "fp8")
    titan = _json(capsys, *args, "--stack", "torchtitan")
    assert bf16["plan"]["dtype"] == "bf16" and bf16["plan"]["stack"] == "megatron"      # NVIDIA default
    assert fp8["plan"]["dtype"] == "fp8" and titan["plan"]["stack"] == "torchtitan"
    m = get_model("llama3-8b")
    for s in ("stage0", "stage1"):
        extra = fp8["memory_bytes"][s]["parameters"] - bf16["memory_bytes"][s]["parameters"]
        assert extra > 0
        assert titan["memory_bytes"][s]["activations"] >= bf16["memory_bytes"][s]["activations"]
    # stage 1 holds the LM head: its fp32 logits copy (vocab / tp per token of a micro-batch) is at least there
    assert titan["memory_bytes"]["stage1"]["activations"] - bf16["memory_bytes"]["stage1"]["activations"] >= \
        4 * 1024 * m.vocab / 4
    for flags, rep in ((), bf16), (("--dtype", "fp8"), fp8), (("--stack", "torchtitan"), titan):
        assert main(["simulate", *args, *flags, "--json"]) == 0
        sim = json.loads(capsys.readouterr().out)
        assert sim["peak_memory_bytes"] == pytest.approx(rep["peak_memory_bytes"], rel=1e-9)


def test_default_stack_follows_the_cluster(capsys):
    pytest.importorskip("topologies.presets")
    d = _json(capsys, "-m", "tiny", "--gpus", "64", "--seq", "128", "--cluster", "tpu-v5p")
    assert d["plan"]["stack"] == "torchtitan"
    assert _json(capsys, "-m", "tiny", "--gpus", "8", "--seq", "128")["plan"]["stack"] == "megatron"
    assert main(["plan", "-m", "tiny", "--gpus", "8", "--seq", "128", "--dtype", "fp4"]) == 2


def test_a_bucket_beyond_any_gradients_is_refused_by_name(capsys):
    """--bucket-mb 1e308 is finite, but in bytes it is not: the error had named the internal bucket_bytes (inf)."""
    assert main(["plan", "--params", "7e9", "--gpus", "8", "--bucket-mb", "1e308"]) == 2
    err = capsys.readouterr().err
    assert "--bucket-mb: a gradient bucket of 1e+308 MB is beyond any model's gradients; at most 1e+09 MB" in err
    assert main(["plan", "--params", "7e9", "--gpus", "8", "--bucket-mb", "1e9"]) == 0
    capsys.readouterr()
    assert main(["plan", "--params", "7e9", "--gpus", "8", "--bucket-mb", "0"]) == 2     # it named bucket_bytes
    assert "--bucket-mb: a gradient bucket must hold a positive number of MB, got 0" in capsys.readouterr().err


def test_zero_virtual_stages_is_refused_as_simulate_refuses_it(capsys):
    """plan read --virtual-stages 0 as 1 (simulate says 'must be >= 1')."""
    assert main(["plan", "-m", "llama3-8b", "--gpus", "16", "--tp", "2", "--pp", "2", "--schedule", "interleaved",
                 "--virtual-stages", "0"]) == 2
    assert "--virtual-stages must be a positive integer, got 0" in capsys.readouterr().err


def test_empty_stage_layers_are_refused(capsys, tmp_path):
    """--stage-layers '' crashed simulate (exit 3: None joined) and plan ignored it."""
    for cmd in (["plan"], ["simulate"]):
        assert main(cmd + ["-m", "llama3-8b", "--gpus", "8", "--pp", "4", "--stage-layers", ""]) == 2
        assert "stage layers: none given" in capsys.readouterr().err
    f = tmp_path / "e.yaml"
    f.write_text('cluster: dgx-h100\ngpus: 8\nmodel: llama3-8b\npp: 4\nstage_layers: ""\n')
    assert main(["simulate", "-c", str(f)]) == 2
    assert "stage layers: none given" in capsys.readouterr().err


def test_a_memory_limit_at_pp_1_is_named_among_the_inert_pipeline_options(capsys):
    """zb-auto's --memory-limit at pp 1 was left out of the note that lists the pipeline options at pp 1."""
    notes = _json(capsys, "-m", "llama3-8b", "--gpus", "8", "--schedule", "zb-auto", "--memory-limit", "1")["notes"]
    assert any("pp 1: there is no pipeline" in n and "--memory-limit" in n for n in notes)


def test_params_only_plans_say_what_they_count_and_refuse_overflow(capsys):
    """--params 1e308 printed a table of inf (exit 0) where --json refused; --params counted no activations and
    said nothing while --seq 100000 was given."""
    assert main(["plan", "--gpus", "8", "--params", "1e308"]) == 2
    assert "a memory or communication figure is not finite" in capsys.readouterr().err
    notes = _json(capsys, "--gpus", "8", "--params", "8e9", "--zero", "3", "--seq", "100000")["notes"]
    assert any("activations are not" in n for n in notes)


def test_hbm_gb_beside_a_cluster_is_noted_and_zero_refused_plainly(capsys):
    """--hbm-gb over a --cluster's device memory was silent; --hbm-gb 0 said 'from 0 to 1e+06' and refused 0."""
    notes = _json(capsys, "--gpus", "8", "-m", "llama3-8b", "--hbm-gb", "10", "--cluster", "dgx-h100")["notes"]
    assert any("--hbm-gb 10 stands for the H100-SXM's own 85.5 GB" in n for n in notes)
    assert main(["plan", "--gpus", "8", "-m", "llama3-8b", "--hbm-gb", "0"]) == 2
    assert "--hbm-gb must be a number of GB above 0 and at most" in capsys.readouterr().err
