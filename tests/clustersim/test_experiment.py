"""Experiment parsing (flags and YAML) and the CLI's error contract."""
import pytest

from clustersim.cli import main
from simulator.errors import ConfigError
from clustersim.experiment import experiment_from_dict, load_experiment


def test_yaml_experiment_round_trip(tmp_path):
    p = tmp_path / "exp.yaml"
    p.write_text("cluster: dgx-h100\ngpus: 64\nmodel: llama3-8b\ntp: 8\npp: 2\nglobal-batch: 64\n"
                 "schedule: interleaved\nvirtual_stages: 2\nnetwork: flow\n")
    exp = load_experiment(p)
    assert (exp.gpus, exp.tp, exp.pp, exp.global_batch, exp.schedule, exp.network) == \
           (64, 8, 2, 64, "interleaved", "flow")


@pytest.mark.parametrize("text,match", [
    ("tp: 8\ntp: 4\n", "duplicate key 'tp' at line 2"),
    ("tp: [1, 2\n", "invalid YAML"),
    ("- 1\n- 2\n", "expected a mapping"),
    ("tp: -3\n", "tp: must be >= 1"),
    ("tp: .nan\n", "tp: expected an integer"),
    ("tp: 1.5\n", "tp: expected an integer"),
    ("tpp: 2\n", "unknown option 'tpp'"),
    ("network: warp\n", "unknown network 'warp'"),
    ("zero: 4\n", "ZeRO stage must be 0, 1, 2 or 3"),
    ("sp: 3\n", "expected true or false"),
    ("bucket_mb: .inf\n", "finite positive"),
    ("bucket_mb: 1e308\n", r"bucket_mb: a gradient bucket of 1e\+308 MB is beyond any model's gradients"),
    ("bucket_bytes: 2e15\n", r"a gradient bucket of 2e\+09 MB is beyond"),
    ("lora_rank: 8\nlora_targets: []\n", "lora_targets: no LoRA target named; give at least one of qkv"),
    ("recompute_modules: ' , '\n", "recompute_modules: no recompute module named; give at least one of core_attn"),
    ("gpus: 100000000000\n", "unreasonably large"),
    ("!!python/object/apply:os.system ['true']\n", "invalid YAML"),
])
def test_bad_yaml_is_a_clear_config_error(tmp_path, text, match):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_experiment(p)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_experiment(tmp_path / "nope.yaml")


def test_custom_model_fields_override_a_preset():
    exp = experiment_from_dict({"model": "llama3-8b", "layers": 4})
    assert exp.model == {"base": "llama3-8b", "layers": 4}
    exp = experiment_from_dict({"model": None, "layers": 4, "hidden": 256, "heads": 4})
    assert exp.model == {"layers": 4, "hidden": 256, "heads": 4}


def test_cli_bad_input_exits_2_with_one_line(capsys, tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("tp: 8\ntp: 4\n")
    assert main(["simulate", "-c", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "duplicate key" in err and "Traceback" not in err
    assert main(["simulate", "--network", "warp"]) == 2
    assert main(["no-such-command"]) == 2


def test_the_cli_offers_the_stacks_and_dtypes_the_kernel_model_knows():
    """clustersim.experiment keeps its own copy of the choices (the CLI's --help reads it without importing
    schedules): it must equal the kernel model's."""
    from clustersim import experiment
    from schedules import kernels
    assert experiment.STACKS == kernels.STACKS
    assert experiment.DTYPES == kernels.DTYPES
    assert experiment.GRAD_REDUCE_DTYPES == kernels.GRAD_REDUCE_DTYPES
    from schedules import plan
    assert experiment.EXPERT_GRIDS == plan.EXPERT_GRIDS
    assert experiment.MOE_DISPATCHERS == plan.MOE_DISPATCHERS
    assert experiment.LORA_STYLES == plan.LORA_STYLES
    assert experiment.ATTENTION == plan.ATTENTION and experiment.ATTENTION_KERNELS == plan.ATTENTION_KERNELS


def test_grad_reduce_dtype_flag_and_yaml_reach_the_result(tmp_path, capsys):
    """--grad-reduce-dtype (YAML grad_reduce_dtype) sets the reduction precision; --json reports the one run
    (auto resolved by the stack); fp32 doubles the FSDP reduce-scatters and slows a comm-heavy step."""
    import json
    base = ["simulate", "--cluster", "dgx-h100", "--gpus", "8", "--model", "mpt-1b", "--fsdp", "--seq", "1024",
            "--micro-batch", "2", "--global-batch", "16", "--json"]
    out = {}
    for extra in ([], ["--stack", "llm-foundry"], ["--grad-reduce-dtype", "fp32"]):
        assert main(base + extra) == 0
        d = json.loads(capsys.readouterr().out)
        out[tuple(extra)] = d
    assert out[()]["grad_reduce_dtype"] == "bf16"
    assert out[("--stack", "llm-foundry")]["grad_reduce_dtype"] == "fp32"
    assert out[("--grad-reduce-dtype", "fp32")]["grad_reduce_dtype"] == "fp32"
    assert out[("--grad-reduce-dtype", "fp32")]["step_time_s"] > out[()]["step_time_s"]
    p = tmp_path / "e.yaml"
    p.write_text("grad_reduce_dtype: fp16\n")
    assert main(["simulate", "-c", str(p)]) == 2
    assert "unknown grad reduce dtype 'fp16'" in capsys.readouterr().err


def test_a_plan_that_barely_fits_is_flagged():
    from clustersim.experiment import Experiment, headroom_note, run_experiment
    assert headroom_note(79e9, 80e9) and "99% of device memory" in headroom_note(79e9, 80e9)
    assert headroom_note(70e9, 80e9) is None          # room to spare
    assert headroom_note(81e9, 80e9) is None          # does not fit: said elsewhere ("does not fit")
    assert headroom_note(1.0, 0.0) is None
    out = run_experiment(Experiment(cluster="dgx-h100", gpus=8, model="tiny", seq=256))
    assert not any("of device memory" in n for n in out.notes)


def test_expert_grid_reaches_the_plan_and_bad_values_are_named():
    from clustersim.experiment import resolve_model, resolve_plan
    base = dict(cluster="dgx-h100", gpus=64, model="mixtral-8x22b", tp=2, cp=2, dp=4, ep=4, pp=4, seq=8192)
    old = experiment_from_dict({**base, "expert_grid": "carved"})
    plan = resolve_plan(old, resolve_model(old), 64)
    assert plan.expert_grid == "carved" and not plan.folded
    new = experiment_from_dict({**base, "sp": True})
    assert resolve_plan(new, resolve_model(new), 64).folded
    with pytest.raises(ConfigError, match="unknown expert grid 'carvd'; choose one of folded, carved"):
        experiment_from_dict({**base, "expert_grid": "carvd"})


@pytest.mark.parametrize("args,said", [(["--kv-heads", "0"], "--kv-heads: must be >= 1"),
                                       (["--sliding-window", "-1"], "--sliding-window: must be >= 0"),
                                       (["--tp", "0"], "--tp: must be >= 1")])
def test_command_line_options_are_named_as_typed(args, said, capsys):
    """Errors about command-line options named the experiment's fields ('options: kv_heads')."""
    assert main(["simulate", "--gpus", "8", "--layers", "2", "--hidden", "256", "--heads", "4", *args]) == 2
    err = capsys.readouterr().err
    assert said in err and "options:" not in err
