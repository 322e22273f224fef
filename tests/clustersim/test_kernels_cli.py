"""simulate --dtype / --stack / --breakdown and the pricing provenance in results."""
import json

from clustersim.cli import main

BASE = ["simulate", "--cluster", "dgx-h100", "--gpus", "16", "--model", "llama3-8b", "--tp", "8", "--pp", "2",
        "--seq", "4096", "--global-batch", "8", "--sp"]


def _run(capsys, *extra):
    assert main(BASE + ["--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_reports_dtype_stack_pricing_and_breakdown(capsys):
    bf = _run(capsys, "--breakdown")
    assert bf["dtype"] == "bf16" and bf["stack"] == "megatron"          # NVIDIA preset default
    assert bf["pricing"]["kernels"]["device"] == "H100-SXM" and "gemm.csv" in bf["pricing"]["kernels"]["gemm_bf16"]
    assert bf["pricing"]["calibration"] is None
    assert bf["top_kernels"] and bf["top_kernels"][0]["share"] > 0.1
    phases = {p["label"]: p for p in bf["breakdown"]["phases"]}
    fwd = phases["dense layer forward"]
    assert {k["kernel"] for k in fwd["kernels"]} >= {"qkv", "flash attention fwd", "mlp fc2", "input norm"}
    fp8 = _run(capsys, "--dtype", "fp8")
    assert fp8["dtype"] == "fp8" and fp8["step_time_s"] < bf["step_time_s"]
    eager = _run(capsys, "--stack", "torchtitan")
    assert eager["stack"] == "torchtitan" and eager["step_time_s"] > bf["step_time_s"]


def test_bad_dtype_is_a_one_line_error(capsys, tmp_path):
    p = tmp_path / "e.yaml"
    p.write_text("model: llama3-8b\ndtype: fp4\n")
    assert main(["simulate", "-c", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "dtype" in err and "Traceback" not in err


def test_fp8_on_a_device_without_fp8_is_refused(capsys, tmp_path):
    """A100, TPU v5p and Ascend 910C have no FP8 tensor cores (Transformer Engine refuses FP8 below compute
    capability 8.9): simulate, a YAML experiment, plan --cluster and search say so in one line instead of
    pricing BF16 GEMMs under an "fp8" label; H100 still runs FP8."""
    a100 = ["--cluster", "dgx-a100", "--gpus", "16", "--model", "llama3-8b", "--tp", "8", "--global-batch", "8",
            "--dtype", "fp8"]
    runs = [["simulate", *a100], ["plan", *a100], ["search", *a100, "--no-cache"],
            ["plan", "--cluster", "tpu-v5p", "--gpus", "64", "--model", "llama3-8b", "--dtype", "fp8"]]
    p = tmp_path / "e.yaml"
    p.write_text("cluster: cloudmatrix-384\ngpus: 16\nmodel: llama3-8b\ndtype: fp8\nglobal_batch: 16\n")
    runs.append(["simulate", "-c", str(p)])
    for args in runs:
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("error: --dtype fp8: ") and "no FP8 tensor cores" in err, (args, err)
        assert "Traceback" not in err
    assert main(BASE + ["--json", "--dtype", "fp8"]) == 0
    assert json.loads(capsys.readouterr().out)["dtype"] == "fp8"


def test_breakdown_table_prints(capsys):
    assert main(BASE + ["--breakdown"]) == 0
    out = capsys.readouterr().out
    assert "dense layer forward" in out and "flash attention fwd" in out


def test_the_gemm_rate_is_named_in_the_table_and_the_json(capsys):
    """H100's BF16 GEMMs run at the burst curve slowed by ml-engineering's MSMF / MAMF, A100's at Azure's sweep
    timed at its power limit: the table says which, and `pricing.kernels.gemm_rate` too."""
    assert main(BASE) == 0
    out = capsys.readouterr().out
    assert "GEMM rate" in out and "sustained x0.888 (MSMF / MAMF)" in out
    a100 = ["simulate", "--cluster", "dgx-a100", "--gpus", "8", "--model", "llama3-8b", "--tp", "8",
            "--seq", "2048", "--global-batch", "8"]
    assert main(a100 + ["--json"]) == 0
    rate = json.loads(capsys.readouterr().out)["pricing"]["kernels"]["gemm_rate"]
    assert rate["bf16"] == "sustained (sweep at the power limit)" and rate["fp8"] == rate["bf16"]  # no FP8 on A100
    assert main(a100) == 0
    assert "sustained (sweep at the power limit)" in capsys.readouterr().out
    gb300 = ["simulate", "--cluster", "gb300-nvl72", "--gpus", "72", "--model", "llama3-8b", "--tp", "8",
             "--dp", "9", "--seq", "2048", "--global-batch", "72"]
    assert main(gb300) == 0
    assert "burst (no sustained measurement)" in capsys.readouterr().out


def test_fp8_param_gather_flag_yaml_and_json(capsys, tmp_path):
    """--fp8-param-gather (YAML fp8_param_gather) reaches the plan and the JSON field ``fp8_param_gather``; less
    memory than FP8 with BF16 weights; a plan it does not apply to is a one-line error."""
    fp8 = ["--dtype", "fp8", "--fp8-recipe", "current", "--zero", "1", "--pp", "1", "--tp", "4"]
    plain = _run(capsys, *fp8)
    pg = _run(capsys, *fp8, "--fp8-param-gather")
    assert plain["fp8_param_gather"] is False and pg["fp8_param_gather"] is True
    assert pg["plan"]["fp8_param_gather"] is True and pg["peak_memory_bytes"] < plain["peak_memory_bytes"]
    p = tmp_path / "e.yaml"
    p.write_text("cluster: dgx-h100\ngpus: 16\nmodel: llama3-8b\ntp: 4\nsp: true\nzero: 1\nglobal_batch: 8\n"
                 "dtype: fp8\nfp8_param_gather: true\n")
    assert main(["simulate", "-c", str(p), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fp8_param_gather"] is True
    assert main(BASE + ["--fp8-param-gather"]) == 2          # BF16: nothing in FP8 to keep
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--fp8-param-gather" in err and "Traceback" not in err


def test_a_device_of_another_vendor_says_its_stack_stands_in(capsys):
    """On a TPU or an Ascend NPU no stack here is the device's own: the result notes that the stack's kernels
    stand in (and for --stack megatron and a named FlashAttention kernel, that those CUDA kernels do); an
    NVIDIA device gets none of these notes."""
    tpu = ["simulate", "--cluster", "tpu-v5p", "--gpus", "64", "--model", "llama3-8b", "--tp", "4", "--seq", "4096",
           "--global-batch", "64", "--json"]
    assert main(tpu) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any("TPU-v5p (Google) runs its own compiler's kernels" in n and "the torchtitan stack (the default off "
               "NVIDIA) stands in" in n for n in notes)
    assert not any("--stack megatron" in n or "--attention-kernel" in n for n in notes)
    assert main(tpu + ["--stack", "megatron", "--attention-kernel", "flash2"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any("the megatron stack stands in" in n for n in notes)
    assert any(n.startswith("--stack megatron is Megatron-Core with Transformer Engine") for n in notes)
    assert any(n.startswith("--attention-kernel flash2 names FlashAttention-2's CUDA kernel") for n in notes)
    # the stack's own kernel named explicitly (torchtitan's is FlashAttention-2) changes nothing: no note
    assert main(tpu + ["--attention-kernel", "flash2"]) == 0
    assert not any("--attention-kernel" in n for n in json.loads(capsys.readouterr().out)["notes"])
    nvidia = _run(capsys, "--stack", "megatron", "--attention-kernel", "flash2")
    assert not any("compiler's kernels" in n or "CUDA" in n for n in nvidia.get("notes", []))
