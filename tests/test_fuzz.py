"""Bad input never breaks clustersim: fuzz every entry point users feed (hypothesis).

Each must answer garbage with one ClusterSimError subclass (the CLI: exit code 2 and ``error: ...``), never
another exception, a traceback, a hang, or a silent success with non-finite numbers. Targets: programs
(simulator.program.validate and the engine), calibration JSON, fault options, the goodput model, YAML
experiment files, parallel plans, cluster presets, the Kineto trace parser and the CLI itself.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import signal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from simulator.errors import ClusterSimError, ConfigError, PlanError, ProgramError, TraceError

ROOT = Path(__file__).resolve().parents[1]
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])

NASTY_FLOATS = st.sampled_from([0.0, -0.0, -1.0, 1e-300, 1e300, 1e308, float("nan"), float("inf"), float("-inf"),
                                2.0 ** 63, -(2.0 ** 63)])
NUMBERS = st.one_of(st.integers(-10, 10), st.integers(-(2 ** 70), 2 ** 70), NASTY_FLOATS,
                    st.floats(allow_nan=True, allow_infinity=True))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=12))
JSONISH = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(st.text(max_size=10), inner, max_size=4)),
                       max_leaves=12)


@contextlib.contextmanager
def no_hang(seconds: int = 30):
    """Fail (instead of hanging the suite) if the body runs longer than ``seconds``."""
    def on_alarm(signum, frame):
        raise TimeoutError(f"no answer within {seconds} s: a hang")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------------------------------------- programs
@st.composite
def garbage_programs(draw):
    """Programs with random (often invalid) structure; values have the contract's types (numbers, ints)
    but any sign, size or NaN. Wrong *types* in op fields are not covered: see test_known_bugs below."""
    from simulator.program import COLLECTIVE_KINDS, Op, Programs
    world = draw(st.integers(-2, 6))
    n_ranks = draw(st.integers(0, 6))
    progs = Programs(world_size=world, ops={})
    for _ in range(draw(st.integers(0, 3))):
        ranks = draw(st.lists(st.integers(-2, 7), min_size=0, max_size=5))
        progs.groups.append(__import__("simulator.program", fromlist=["ProcessGroup"]).ProcessGroup(
            tuple(ranks), draw(st.sampled_from(["dp", "tp", "pp", "world"]))))
    kinds = st.sampled_from(["compute", "collective", "send", "recv", "bogus"])
    for r in draw(st.lists(st.integers(-1, 7), min_size=n_ranks, max_size=n_ranks, unique=True)):
        ops = []
        n = draw(st.integers(0, 6))
        for i in range(n):
            kind = draw(kinds)
            ops.append(Op(
                kind, f"op{i}", draw(st.sampled_from(["compute", "comm", "x"])),
                tuple(draw(st.lists(st.integers(-2, 8), max_size=2))),
                flops=draw(st.one_of(st.floats(0, 1e12), NASTY_FLOATS)),
                mem_bytes=draw(st.one_of(st.just(0.0), NASTY_FLOATS)),
                size_bytes=draw(st.one_of(st.floats(0, 1e9), NASTY_FLOATS)),
                collective=draw(st.sampled_from(list(COLLECTIVE_KINDS) + ["bogus", None])),
                group=draw(st.one_of(st.none(), st.integers(-1, 4))),
                peer=draw(st.one_of(st.none(), st.integers(-1, 7))),
                duration_s=draw(st.one_of(st.none(), st.floats(0, 1.0), NASTY_FLOATS)),
            ))
        progs.ops[r] = ops
    if draw(st.booleans()) and progs.ops:
        reps = list(progs.ops)
        progs.classes = {r: tuple(draw(st.lists(st.integers(-1, 7), max_size=4))) + (r,) for r in reps}
    return progs


@FUZZ
@given(garbage_programs())
def test_programs_validate_or_raise_program_error_and_then_run_or_report(progs):
    from simulator.costs import SimpleCostModel
    from simulator.engine import run
    from simulator.program import validate
    try:
        validate(progs)
    except ProgramError:
        event("invalid")
        return
    event("valid")
    with no_hang(20):
        try:
            res = run(progs, SimpleCostModel(), check=False)
        except ClusterSimError:
            return
    assert math.isfinite(res.step_time_s) and res.step_time_s >= 0


def _two_rank_programs():
    from simulator.program import Programs, collective, compute
    p = Programs(world_size=2, ops={})
    g = p.add_group([0, 1], "dp")
    for r in range(2):
        p.ops[r] = [compute("c", 1e9), collective("ar", "all_reduce", g, 1e6, deps=(0,))]
    return p


def _set(attr, value, rank=0, op=0):
    return lambda p: setattr(p.ops[rank][op], attr, value)


WRONG_TYPES = {
    "flops-str": _set("flops", "1"), "flops-none": _set("flops", None), "size-complex": _set("size_bytes", 1j, op=1),
    "world-size-str": lambda p: setattr(p, "world_size", "2"), "group-str": _set("group", "0", op=1),
    "group-float": _set("group", 0.0, op=1), "duration-str": _set("duration_s", "x"),
    "program-none": lambda p: p.ops.__setitem__(0, None), "op-is-int": lambda p: p.ops[0].append(5),
    "deps-none": _set("deps", None, op=1), "stream-list": _set("stream", []), "alloc-int": _set("alloc", 5),
    "classes-list": lambda p: setattr(p, "classes", [0, 1]),
    "group-ranks-str": lambda p: p.groups.append(__import__("simulator.program", fromlist=["x"]).ProcessGroup(
        ("a", "b"), "tp")),
}


@pytest.mark.parametrize("case", sorted(WRONG_TYPES))
def test_validate_rejects_wrongly_typed_fields(case):
    from simulator.program import validate
    p = _two_rank_programs()
    WRONG_TYPES[case](p)
    with pytest.raises(ProgramError):
        validate(p)


# ---------------------------------------------------------------------------------------------- calibration
@st.composite
def calibration_dicts(draw):
    fit = st.fixed_dictionaries({}, optional={
        "device": SCALARS, "peak_flops_per_s": NUMBERS, "half_saturation_flops": NUMBERS, "points": JSONISH,
        "kind": SCALARS, "group_size": NUMBERS, "scope": SCALARS, "alpha_s": NUMBERS,
        "busbw_bytes_per_s": NUMBERS, "backend": SCALARS, "extra": SCALARS})
    d = {"format": draw(st.sampled_from(["clustersim-calibration", "other", None])),
         "version": draw(st.sampled_from([1, 2, "1", None, 1.0]))}
    for key in ("compute", "collectives"):
        d[key] = draw(st.one_of(st.lists(fit, max_size=3), JSONISH))
    if draw(st.booleans()):
        d["source"] = draw(JSONISH)
    return draw(st.one_of(st.just(d), JSONISH))


@FUZZ
@given(calibration_dicts())
def test_calibration_from_dict_accepts_or_raises_config_error(d):
    from simulator.calibration import Calibration
    try:
        cal = Calibration.from_dict(d)
    except ConfigError:
        return
    # accepted: every fit must evaluate to finite, positive numbers
    for c in cal.compute:
        assert math.isfinite(c.achieved_flops_per_s(1e9)) and c.achieved_flops_per_s(1e9) > 0
    for c in cal.collectives:
        t = c.time_s(1e6)
        assert math.isfinite(t) and t >= 0


@FUZZ
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_calibration_load_of_random_bytes(tmp_path, data):
    from simulator.calibration import Calibration
    p = tmp_path / "cal.json"
    p.write_bytes(data)
    with pytest.raises(ConfigError):
        Calibration.load(p)


def test_calibration_duplicate_keys_are_an_error(tmp_path):
    from simulator.calibration import Calibration
    p = tmp_path / "cal.json"
    p.write_text('{"format": "clustersim-calibration", "version": 1, "compute": [], "compute": [], "collectives": []}')
    with pytest.raises(ConfigError, match="duplicate"):
        Calibration.load(p)


# ---------------------------------------------------------------------------------------------- faults, goodput
FAULT_TEXT = st.one_of(st.text(max_size=12), st.sampled_from(
    ["5:1.2", "5:nan", "-1:2", "5:", ":", "leaf.0:spine.0.1", "0:leaf.0:0.5", "3@0.1", "3@inf", "1e400", "0x10",
     "lognormal:0.05", "fraction:0.1:1.3", "fraction:2:1", "lognormal:-1", "", "  ", "9" * 40]))


@FUZZ
@given(st.lists(FAULT_TEXT, max_size=3), st.one_of(st.none(), FAULT_TEXT), st.one_of(st.none(), FAULT_TEXT),
       st.lists(FAULT_TEXT, max_size=2), st.lists(FAULT_TEXT, max_size=2), st.lists(FAULT_TEXT, max_size=2),
       st.one_of(st.none(), FAULT_TEXT))
def test_fault_cli_strings_parse_or_raise_config_error(strag, dist, jitter, fail, degrade, dev, seed):
    from clustersim.faults import parse_fault_options
    from topologies.faults import apply_faults
    from simulator.costs import SimpleCostModel
    try:
        spec = parse_fault_options(strag, dist, jitter, fail, degrade, dev, seed)
    except ConfigError:
        return
    try:
        cost, failures = apply_faults(SimpleCostModel(), None, spec, 8)
    except ConfigError:
        return
    assert all(math.isfinite(t) and t >= 0 for t in failures.values())
    for f in spec.compute_factors(8).values():
        assert math.isfinite(f) and f > 0


@FUZZ
@given(st.one_of(JSONISH, st.dictionaries(st.sampled_from(
    ["stragglers", "straggler_distribution", "jitter", "link_failures", "link_degradation", "device_failures",
     "seed", "straggler-distribution", "bogus"]), JSONISH, max_size=4)))
def test_fault_yaml_parses_or_raises_config_error(d):
    from topologies.faults import faults_from_dict
    try:
        spec = faults_from_dict(d)
    except ConfigError:
        return
    assert spec == faults_from_dict(spec.to_dict())


@FUZZ
@given(st.fixed_dictionaries({"gpus": NUMBERS, "mtbf_device_s": NUMBERS, "checkpoint_s": NUMBERS,
                              "restart_s": NUMBERS, "horizon_s": NUMBERS}, optional={
    "interval_s": NUMBERS, "step_time_s": NUMBERS, "trials": st.integers(-2, 4), "seed": NUMBERS}))
def test_goodput_config_runs_or_raises(kw):
    from clustersim.goodput import GoodputConfig, analyse
    try:
        cfg = GoodputConfig(**kw)
    except ConfigError:
        return
    with no_hang(20):
        try:
            rep = analyse(cfg, sweep_points=3)
        except ClusterSimError:
            return
    r = rep.at_interval
    assert 0.0 <= r.goodput <= 1.0 + 1e-9
    assert all(math.isfinite(v) for v in (r.useful_s, r.checkpoint_s, r.lost_work_s, r.restart_s))


# ---------------------------------------------------------------------------------------------- YAML experiments
EXPERIMENT_KEYS = ["cluster", "gpus", "model", "tp", "pp", "dp", "ep", "cp", "sp", "zero", "fsdp", "schedule",
                   "virtual_stages", "micro_batch", "global_batch", "seq", "recompute", "bucket_mb", "network",
                   "mode", "faults", "layers", "hidden", "heads", "bogus-key", "global-batch"]
YAML_VALUES = st.one_of(st.sampled_from(
    ["8", "16", "-4", "0", "1e400", ".nan", ".inf", "abc", "~", "[]", "{}", "[1, 2]", "true", "'8'", "99999999999",
     "llama3-8b", "dgx-h100", "flow", "full", "1f1b", "!!python/object/apply:os.system ['echo pwned']",
     "&a [*a]", "{stragglers: {1: 1.2}}", "{jitter: .nan}", "{device_failures: {99: 1}}", "\"\\x00\""]),
    st.integers(-5, 40).map(str))


@st.composite
def yaml_texts(draw):
    lines = []
    for _ in range(draw(st.integers(0, 8))):
        key = draw(st.sampled_from(EXPERIMENT_KEYS))
        lines.append(f"{key}: {draw(YAML_VALUES)}")
    text = "\n".join(lines)
    mode = draw(st.sampled_from(["plain", "truncate", "garbage", "list", "tab"]))
    if mode == "truncate" and text:
        text = text[: draw(st.integers(0, len(text)))]
    elif mode == "garbage":
        text += draw(st.sampled_from(["\n: :", "\n\t- x", "\n{", "\n- a\nb: c", "\n%YAML 9.9", "\n\x00"]))
    elif mode == "list":
        text = "- " + text.replace("\n", "\n- ")
    elif mode == "tab":
        text = text.replace(": ", ":\t")
    return text


@FUZZ
@given(yaml_texts())
def test_yaml_experiment_loads_or_raises_config_error(tmp_path, text):
    from clustersim.experiment import load_experiment
    p = tmp_path / "exp.yaml"
    p.write_text(text)
    try:
        load_experiment(p)
    except ConfigError:
        pass


def test_yaml_is_loaded_safely_and_duplicate_keys_are_errors(tmp_path):
    from clustersim.experiment import load_experiment
    p = tmp_path / "evil.yaml"
    p.write_text("gpus: !!python/object/apply:os.system ['touch hacked']\n")
    with pytest.raises(ConfigError):
        load_experiment(p)
    assert not Path("hacked").exists()
    p.write_text("gpus: 8\ntp: 2\ngpus: 16\n")
    with pytest.raises(ConfigError, match="duplicate key 'gpus' at line 3"):
        load_experiment(p)


# ---------------------------------------------------------------------------------------------- plans
INT_FIELDS = ("dp", "tp", "pp", "ep", "cp", "zero", "micro_batch", "virtual_stages", "seq", "fsdp_prefetch")
PLAN_VALUES = {
    **{k: st.one_of(st.integers(-3, 9), st.integers(-(2 ** 70), 2 ** 70)) for k in INT_FIELDS},
    "sp": st.booleans(), "fsdp": st.booleans(),
    "global_batch": st.one_of(st.none(), st.integers(-8, 10 ** 6)),
    "schedule": st.sampled_from(["1f1b", "gpipe", "interleaved", "zb", "bogus", ""]),
    "bucket_bytes": st.one_of(st.floats(-1e9, 1e12), NASTY_FLOATS),
    "recompute": st.sampled_from(["none", "selective", "full", "some"]),
    "skew": st.one_of(st.floats(-1, 2), NASTY_FLOATS),
    "axis_order": st.sampled_from(["tp-cp-ep-dp-pp", "pp-dp-tp-cp-ep", "tp-tp-dp-pp-cp", "x", ""]),
    "layer_split": st.sampled_from(["balanced", "even", "odd"]),
}
VALID_PLAN = dict(dp=2, tp=2, pp=2, micro_batch=1, global_batch=16, seq=2048)


@FUZZ
@given(st.dictionaries(st.sampled_from(sorted(PLAN_VALUES)), st.none(), min_size=1, max_size=3).flatmap(
    lambda keys: st.fixed_dictionaries({k: PLAN_VALUES[k] for k in keys})),
       st.sampled_from(["llama3-8b", "mixtral-8x22b", "gpt3-175b"]))
def test_plan_validate_accepts_or_raises_plan_error(changes, model_name):
    """A valid plan with one to three fields changed to any value of the field's type."""
    from schedules.models import get_model
    from schedules.plan import ParallelPlan
    kw = {**VALID_PLAN, **changes}
    model = get_model(model_name)
    plan = ParallelPlan(**kw)
    world = plan.dp * plan.tp * plan.pp * plan.cp if all(
        isinstance(getattr(plan, a), int) for a in ("dp", "tp", "pp", "cp")) else 8
    try:
        plan.validate(model, world)
    except PlanError:
        event("rejected")
        return
    event("accepted")
    assert plan.world_size == world and plan.num_microbatches >= 1 and plan.tokens_per_step >= 1
    assert math.isfinite(plan.bucket_bytes) and plan.bucket_bytes > 0
    assert 0.0 <= plan.skew <= 1.0


@pytest.mark.parametrize("changes", [
    pytest.param({"bucket_bytes": float("nan")}, id="bucket-nan"),
    pytest.param({"bucket_bytes": float("inf")}, id="bucket-inf"),
    pytest.param({"grad_bytes_per_param": float("nan")}, id="grad-bytes-nan"),
    pytest.param({"fsdp_prefetch": float("nan")}, id="prefetch-nan"),
    pytest.param({"sp": "yes"}, id="sp-string"),
    pytest.param({"skew": "0"}, id="skew-string"),
    pytest.param({"global_batch": "8"}, id="global-batch-string"),
    pytest.param({"axis_order": 5}, id="axis-order-int"),
])
def test_plan_rejects_non_finite_and_wrongly_typed_fields(changes):
    """Regressions found by the fuzz above (fixed in 447abb5)."""
    from schedules.models import get_model
    from schedules.plan import ParallelPlan
    with pytest.raises(PlanError):
        ParallelPlan(**{**VALID_PLAN, **changes}).validate(get_model("llama3-8b"), 8)


# ---------------------------------------------------------------------------------------------- topologies
@FUZZ
@given(st.sampled_from(["dgx-h100", "dgx-a100", "gb200-nvl72", "tpu-v5p", "cloudmatrix-384", "pcie-ethernet-lab",
                        "nope", ""]),
       st.one_of(st.none(), st.integers(-8, 70000), st.sampled_from([2 ** 40, 7, 9, 1000]), NASTY_FLOATS,
                 st.text(max_size=4)))
def test_cluster_presets_load_or_raise(preset, gpus):
    import topologies
    with no_hang(30):
        try:
            c = topologies.load_cluster(preset, gpus)
        except ClusterSimError:
            return
    assert c.world_size >= 1


# ---------------------------------------------------------------------------------------------- traces
@pytest.fixture(scope="module")
def small_trace() -> dict:
    d = json.loads(gzip.decompress((ROOT / "traces/samples/cpu-gloo-ddp/rank0.json.gz").read_bytes()))
    ev = d["traceEvents"]
    keep = [e for e in ev if e.get("cat") in (None, "Trace", "user_annotation")] + \
        [e for e in ev if e.get("cat") == "cpu_op"][:150]
    d["traceEvents"] = keep
    return d


def _mutate(obj, path, value):
    """Replace the element at ``path`` (list of keys / indices, taken modulo the container) by ``value``."""
    for i, step in enumerate(path):
        if isinstance(obj, dict) and obj:
            key = sorted(obj, key=str)[step % len(obj)]
        elif isinstance(obj, list) and obj:
            key = step % len(obj)
        else:
            return
        if i == len(path) - 1 or not isinstance(obj[key], (dict, list)):
            obj[key] = value
            return
        obj = obj[key]


@FUZZ
@given(st.lists(st.tuples(st.lists(st.integers(0, 10 ** 6), min_size=1, max_size=4), JSONISH), max_size=4),
       st.sampled_from(["json", "truncate", "gz", "truncated-gz", "bytes"]), st.integers(0, 10 ** 6))
def test_trace_parser_reads_or_raises_trace_error(tmp_path, small_trace, mutations, form, cut):
    import copy
    from traces.parse import load_trace
    d = copy.deepcopy(small_trace)
    for path, value in mutations:
        _mutate(d["traceEvents"], path, value)       # top-level fields: see the next test
    text = json.dumps(d).encode()
    folder = tmp_path / "trace"
    folder.mkdir(exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    if form == "json":
        (folder / "rank0.json").write_bytes(text)
    elif form == "truncate":
        (folder / "rank0.json").write_bytes(text[: cut % max(1, len(text))])
    elif form == "gz":
        (folder / "rank0.json.gz").write_bytes(gzip.compress(text))
    elif form == "truncated-gz":
        z = gzip.compress(text)
        (folder / "rank0.json.gz").write_bytes(z[: cut % max(1, len(z))])
    else:
        (folder / "rank0.json").write_bytes(bytes((cut + i * 7) % 256 for i in range(cut % 300)))
    with no_hang(30):
        try:
            load_trace(folder)
        except TraceError:
            return
        event("parsed")
        from clustersim.cli import main
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = main(["replay", str(folder), "--json"])
        event(f"replay exit {rc}")
        assert rc in (0, 2) and "Traceback" not in err.getvalue()


@pytest.mark.parametrize("field,value", [("pid", []), ("tid", {})])
def test_trace_metadata_event_with_unhashable_pid(tmp_path, small_trace, field, value):
    """Regression found by the fuzz above: _RankParser.add hashed a thread_name event's (pid, tid)."""
    from traces.parse import load_trace
    d = dict(small_trace)
    events = [dict(e) for e in d["traceEvents"]]
    i = next(k for k, e in enumerate(events) if e.get("ph") == "M" and e.get("name") == "thread_name")
    events[i][field] = value
    d["traceEvents"] = events
    (tmp_path / "rank0.json").write_text(json.dumps(d))
    try:
        load_trace(tmp_path)
    except TraceError:
        pass


@pytest.mark.parametrize("args", [
    pytest.param(["calibrate", "{sample}", "-o", "{tmp}/c.json", "--plot", "{tmp}/fit.yaml"], id="calibrate-plot-ext"),
    pytest.param(["calibrate", "{sample}", "-o", "{tmp}/c.json", "--plot", "{tmp}/missing/fit.png"],
                 id="calibrate-plot-dir"),
    pytest.param(["topology", "dgx-h100", "--gpus", "16", "--draw", "{tmp}/missing/graph.png"],
                 id="topology-draw-dir"),
    pytest.param(["topology", "dgx-h100", "--gpus", "16", "--draw", "{tmp}/graph.yaml"],
                 id="topology-draw-ext"),
    pytest.param(["simulate", "--gpus", "8", "--model", "llama3-8b", "--tp", "8", "--out", "/proc/clustersim-out"],
                 id="simulate-out-unwritable"),
])
def test_bad_output_paths_are_errors_not_tracebacks(tmp_path, args):
    from clustersim.cli import main
    args = [a.format(sample=SAMPLE, tmp=tmp_path) for a in args]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(args)
    assert rc == 2 and err.getvalue().startswith("error")


TOP_LEVEL_VALUES = {"list": [], "dict": {}, "str": "x", "null": None, "float": 1.5, "nan": float("nan"),
                    "negative": -1, "huge": 10 ** 30}


@pytest.mark.parametrize("key,kind", [(k, v) for k in ("baseTimeNanoseconds", "deviceProperties",
                                                         "displayTimeUnit", "distributedInfo", "host_name",
                                                         "schemaVersion", "traceName", "traceEvents")
                                      for v in TOP_LEVEL_VALUES])
def test_trace_top_level_fields_of_wrong_type(tmp_path, small_trace, key, kind):
    from traces.parse import load_trace
    d = dict(small_trace)
    d[key] = TOP_LEVEL_VALUES[kind]
    (tmp_path / "rank0.json").write_text(json.dumps(d))
    try:
        load_trace(tmp_path)
    except TraceError:
        pass


# ---------------------------------------------------------------------------------------------- the CLI
CLI_VALUES = st.sampled_from(["8", "16", "0", "-8", "abc", "", "nan", "inf", "-inf", "1e300", "1e9",
                              "99999999999999999999", "2.5", "llama3-8b", "gpt3-175b", "dgx-h100", "nope",
                              "flow", "full", "symmetric", "1f1b", "interleaved", "/nonexistent.yaml", "tp-dp"])
SIMULATE_FLAGS = ["--cluster", "--gpus", "--model", "--tp", "--pp", "--dp", "--ep", "--cp", "--zero", "--schedule",
                  "--virtual-stages", "--micro-batch", "--global-batch", "--seq", "--recompute", "--bucket-mb",
                  "--network", "--mode", "--calibration", "--layers", "--hidden", "--heads", "-c", "--bogus"]
GOODPUT_FLAGS = ["--gpus", "--mtbf-hours", "--checkpoint-interval-min", "--checkpoint-cost-s", "--restart-s",
                 "--days", "--step-time-s", "--trials", "--seed"]
TOPOLOGY_FLAGS = ["--gpus", "--collective", "--ranks", "--network", "--min-bytes", "--max-bytes", "--factor",
                  "--set", "--algorithm"]
PLOT_VALUES = st.sampled_from(["fit.png", "fit", "8", "fit.svg", "", "fit.yaml", "missing/fit.png"])
REPLAY_FLAGS = ["--cluster", "--gpus", "--network", "--scale-bandwidth", "--scale-compute", "--calibration"]
SAMPLE = str(ROOT / "traces" / "samples" / "cpu-gloo-ddp")
PLAN_FLAGS = ["--model", "--gpus", "--tp", "--pp", "--dp", "--ep", "--cp", "--zero", "--schedule",
              "--virtual-stages", "--micro-batch", "--global-batch", "--seq", "--layers", "--hidden", "--heads"]


@st.composite
def cli_args(draw, commands=("goodput", "topology", "plan", "replay", "calibrate", "nonexistent", "--help")):
    cmd = draw(st.sampled_from(commands))
    args = [cmd]
    if cmd == "simulate":
        # keep runs small: a valid default world of 8 or 16 GPUs unless the fuzz picks a value
        args += ["--gpus", draw(st.sampled_from(["8", "16"])), "--model", "llama3-8b"]
        flags = SIMULATE_FLAGS
    elif cmd == "goodput":
        args += ["--gpus", "1024", "--mtbf-hours", "50000", "--checkpoint-cost-s", "60", "--restart-s", "600",
                 "--days", "2", "--trials", "4"]
        flags = GOODPUT_FLAGS
    elif cmd == "topology":
        args += [draw(st.sampled_from(["dgx-h100", "tpu-v5p", "nope"])), "--gpus", "16", "--max-bytes", "65536"]
        flags = TOPOLOGY_FLAGS
    elif cmd == "plan":
        args += ["--model", "llama3-8b", "--gpus", "16"]
        flags = PLAN_FLAGS
    elif cmd == "replay":
        args += [draw(st.sampled_from([SAMPLE, "/nonexistent", str(ROOT / "README.md")]))]
        flags = REPLAY_FLAGS
    elif cmd == "calibrate":
        args += [draw(st.sampled_from([SAMPLE, "/nonexistent", str(ROOT / "pyproject.toml")])),
                 "-o", "calibration.json"]
        flags = ["--plot"]      # values: see PLOT_VALUES 
    else:
        flags = SIMULATE_FLAGS
    for _ in range(draw(st.integers(0, 4))):
        flag = draw(st.sampled_from(flags))
        value = draw(PLOT_VALUES if flag == "--plot" else CLI_VALUES)
        if cmd == "simulate" and flag == "--gpus" and value in ("1e9", "99999999999999999999"):
            value = "1e9"        # invalid (not an int): still fast
        args += [flag, value]
    if draw(st.booleans()):
        args.append("--json")
    return args


@settings(max_examples=40, deadline=None)
@given(cli_args(("simulate",)))
def test_cli_simulate_exits_0_or_2_and_never_raises(args):
    check_cli(args)


@settings(max_examples=40, deadline=None)
@given(cli_args())
def test_cli_exits_0_or_2_and_never_raises(args):
    check_cli(args)


def check_cli(args):
    import tempfile
    from clustersim.cli import main
    out, err = io.StringIO(), io.StringIO()
    with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch), no_hang(60), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):   # files the CLI writes land here
        rc = main(args)
    event(f"{args[0]} exit {rc}")
    assert rc in (0, 2), (args, rc, err.getvalue()[-2000:])
    assert "Traceback" not in err.getvalue()
    if rc == 2:
        assert err.getvalue().strip(), "exit 2 without a message"
    elif "--json" in args and "--help" not in args and out.getvalue().strip().startswith("{"):
        def no_constant(name):
            raise AssertionError(f"--json output holds {name}: silent nonsense ({args})")
        json.loads(out.getvalue(), parse_constant=no_constant)


FAULT_VALUES = st.one_of(JSONISH, st.sampled_from([
    {"stragglers": {3: 1.2}}, {"stragglers": {9: 1.2}}, {"jitter": 0.05}, {"device_failures": {1: 0.0}},
    {"device_failures": {2: 1e-3}}, {"link_failures": ["0:nvswitch.0"]}, {"link_failures": ["nvswitch.0:7"]},
    {"link_degradation": {"0:nvswitch.0": 0.1}}, {"straggler_distribution": ["fraction", 0.5, 3.0], "seed": 2},
    {"link_failures": [[0, ["nvswitch", 0]]]}, {"stragglers": {"0": "1.5"}}]))


@settings(max_examples=30, deadline=None)
@given(st.dictionaries(st.sampled_from(["stragglers", "jitter", "device_failures", "link_failures",
                                        "link_degradation", "straggler_distribution", "seed"]),
                       FAULT_VALUES, max_size=2) | FAULT_VALUES,
       st.sampled_from(["analytical", "flow"]))
def test_simulate_with_random_faults_runs_or_reports(faults, network):
    from clustersim.experiment import experiment_from_dict, run_experiment
    if isinstance(faults, dict) and len(faults) == 1 and next(iter(faults)) in FAULT_FIELDS \
            and isinstance(next(iter(faults.values())), dict) and next(iter(faults.values())).keys() <= FAULT_FIELDS:
        faults = next(iter(faults.values()))       # a sample mapping drawn as a value: use it as the spec
    with no_hang(60):
        try:
            exp = experiment_from_dict({"cluster": "dgx-h100", "gpus": 8, "model": "llama3-8b", "tp": 8,
                                        "global_batch": 2, "network": network, "faults": faults})
            out = run_experiment(exp)
        except ClusterSimError as e:
            event(type(e).__name__)
            assert str(e)
            return
    event("ran")
    assert math.isfinite(out.metrics.step_time_s) and out.metrics.step_time_s > 0


FAULT_FIELDS = {"stragglers", "jitter", "device_failures", "link_failures", "link_degradation",
                "straggler_distribution", "seed"}


# ---------------------------------------------------------------------------------------------- issue 19: the input boundary
def run_cli(args, cwd=None):
    """(exit code, stdout, stderr) of ``clustersim ARGS`` run in-process."""
    from clustersim.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        if cwd is not None:
            stack.enter_context(contextlib.chdir(cwd))
        stack.enter_context(no_hang(120))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def assert_one_line_error(rc, err, code=2):
    assert rc == code, err
    assert "Traceback" not in err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_long_errors_keep_their_lines_apart_and_say_what_was_cut():
    """An unknown preset names every preset (it was cut mid-name at 400 characters); a watchdog report's lines
    stay apart (" | ") on the one line; a message past the limit says how much it left out."""
    from clustersim.cli import _one_line
    from schedules.models import _PRESETS as MODEL_PRESETS
    rc, _, err = run_cli(["simulate", "--model", "nope"])
    line = assert_one_line_error(rc, err)
    assert all(name in line for name in MODEL_PRESETS) and "more characters" not in line
    assert _one_line("hang:\n  rank 0  waits\n\n  rank 1 waits") == "hang: | rank 0 waits | rank 1 waits"
    cut = _one_line("x" * 2500)
    assert cut == "x" * 2000 + " ... (500 more characters; --debug prints them)"


_X = '{"ph":"X","cat":"cpu_op","name":"ProfilerStep#1","pid":1,"tid":1,"ts":0,"dur":100}'


@pytest.mark.parametrize("text,needle", [
    ('{"traceEvents":[' + "[" * 100_000 + "]" * 100_000 + "]}", "nested too deeply"),
    ('{"traceEvents":[{"ph":"X","cat":"cpu_op","ts":' + "9" * 5000 + "}]}", "invalid JSON number"),
    ('{"traceEvents":[{"ph":"X","cat":"cpu_op","name":"ProfilerStep#99999999999999999999","pid":1,"tid":1,'
     '"ts":0,"dur":100}]}', "too large"),
    ('{"traceEvents":[{"ph":"X","cat":"cpu_op","name":"aten::mm","ts":1,"dur":3}]}', "ProfilerStep"),
    ('{"traceEvents":[' + _X + ',{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":1e400,"dur":1},'
     '{"ph":"X","cat":"cpu_op","name":"b","pid":1,"tid":1,"ts":' + "1" * 300 + ',"dur":1}]}', None),
])
def test_hostile_traces_end_in_one_line(tmp_path, text, needle):
    """Deep nesting (RecursionError), 5,000-digit numbers (ValueError), huge step numbers (OverflowError),
    X events without pid/tid (IndexError) and infinite / huge times: one line or a result, never a traceback."""
    p = tmp_path / "t.json"
    p.write_text(text)
    rc, out, err = run_cli(["replay", p])
    if needle is None:
        assert rc == 0, err
        return
    assert needle in assert_one_line_error(rc, err)


def test_one_long_json_value_is_refused_in_linear_time(tmp_path, monkeypatch):
    """A gzip holding one enormous string (2 GiB in the probe) used to be re-scanned at every refill: now the
    buffer grows geometrically and a value longer than MAX_VALUE_CHARS is refused."""
    from traces import kineto
    monkeypatch.setattr(kineto, "CHUNK_CHARS", 1 << 12)
    monkeypatch.setattr(kineto, "MAX_VALUE_CHARS", 1 << 20)
    p = tmp_path / "s.json.gz"
    p.write_bytes(gzip.compress(b'{"traceEvents":[{"name":"' + b"a" * (4 << 20) + b'"}]}'))
    calls = []
    real = kineto.Scan._decode
    monkeypatch.setattr(kineto.Scan, "_decode", lambda self, pos: calls.append(1) or real(self, pos))
    with no_hang(30), pytest.raises(TraceError, match="longer than"):
        list(kineto.Scan(p).events())
    assert len(calls) < 30          # doubling: log2(1 MiB / 4 KiB) + a few, not 256 rescans


def test_millions_of_tiny_events_are_refused(tmp_path, monkeypatch):
    """14 M tiny events in a 3.6 MB gzip needed 7.7 GB: events far denser than a profiler writes are refused."""
    from traces import parse
    monkeypatch.setattr(parse, "ROWS_FREE", 1000)
    ev = b'{"ph":"X","cat":"cpu_op","ts":1},'
    p = tmp_path / "tiny.json.gz"
    p.write_bytes(gzip.compress(b'{"traceEvents":[' + ev * 200_000 + _X.encode() + b"]}"))
    with no_hang(60), pytest.raises(TraceError, match="characters per event"):
        parse.load_trace(p)


BAD_FIT_VALUES = [("compute", "peak_flops_per_s", None), ("compute", "peak_flops_per_s", "7e14"),
                  ("compute", "peak_flops_per_s", True), ("compute", "peak_flops_per_s", 1e50),
                  ("compute", "half_saturation_flops", float("inf")), ("compute", "op_overhead_s", -1),
                  ("compute", "device", 3), ("compute", "bogus_field", 1),
                  ("collectives", "group_size", 0), ("collectives", "group_size", -1),
                  ("collectives", "group_size", float("nan")), ("collectives", "group_size", True),
                  ("collectives", "kind", "allreduce_typo"), ("collectives", "scope", "galaxy"),
                  ("collectives", "alpha_s", float("nan")), ("collectives", "busbw_bytes_per_s", 0),
                  ("collectives", "points", [[1, "x"]]), ("collectives", "points", {"a": 1})]


@pytest.mark.parametrize("section,field,value", BAD_FIT_VALUES)
def test_calibration_values_are_validated(tmp_path, section, field, value):
    from simulator.calibration import Calibration
    d = json.loads((ROOT / "traces/data/h100.json").read_text())
    d[section][0][field] = value
    with pytest.raises(ConfigError, match=field if field != "bogus_field" else "unknown field"):
        Calibration.from_dict(d)
    p = tmp_path / "c.json"
    p.write_text(json.dumps(d))             # NaN / Infinity as JSON literals too
    assert_one_line_error(*run_cli(["simulate", "--model", "llama3-8b", "--gpus", "8", "--tp", "8",
                                    "--global-batch", "8", "--calibration", p])[::2])


@pytest.mark.parametrize("text", ['{"format": ' + "[" * 50_000 + "]" * 50_000 + "}",
                                  '{"format": "clustersim-calibration", "version": ' + "1" * 5000 + "}",
                                  "[1, 2]", '{"a": 1, "a": 2}'])
def test_calibration_files_that_break_the_json_parser(tmp_path, text):
    from simulator.calibration import Calibration
    p = tmp_path / "c.json"
    p.write_text(text)
    with no_hang(10), pytest.raises(ConfigError):
        Calibration.load(p)


def test_calibration_duplicate_key_check_is_linear(tmp_path):
    from simulator.inputs import parse_json
    text = "{" + ",".join(f'"k{i}": {i}' for i in range(60_000)) + ', "k5": 0}'
    with no_hang(10), pytest.raises(ConfigError, match="duplicate key 'k5'"):
        parse_json(text, "x")


def test_unbounded_files_are_read_with_a_limit():
    """``--calibration /dev/zero`` and ``-c /dev/urandom`` read at most the limit, then one line."""
    import os
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    rc, _, err = run_cli(["simulate", "--model", "llama3-8b", "--gpus", "8", "--tp", "8", "--global-batch", "8",
                          "--calibration", "/dev/zero"])
    assert "larger than" in assert_one_line_error(rc, err)
    rc, _, err = run_cli(["simulate", "-c", "/dev/urandom"])
    assert "larger than" in assert_one_line_error(rc, err)
    rc, _, err = run_cli(["goodput", "--result", "/dev/zero", "--mtbf-hours", "50000", "--checkpoint-cost-s", "60", "--restart-s", "600"])
    assert "larger than" in assert_one_line_error(rc, err)


def test_replicated_chakra_et_is_read_with_the_limit(tmp_path, monkeypatch):
    """``replicate_programs`` read its one rank file without a bound (every other rank file had one; the CLI
    reads it through ``load_programs`` first, a Python caller need not)."""
    from simulator.errors import TraceError
    from traces.chakra import reader
    monkeypatch.setattr(reader, "ET_LIMIT_BYTES", 1 << 20)
    (tmp_path / "w.0.et").write_bytes(b"\0" * (2 << 20))
    with pytest.raises(TraceError, match="larger than"):
        reader.replicate_programs(tmp_path / "w", (4,))


def test_goodput_result_errors_name_the_file(tmp_path):
    for content, needle in ((None, "does not exist"), ("not json", "not valid JSON"), ("[1]", "expected a JSON object")):
        p = tmp_path / "r.json"
        if content is not None:
            p.write_text(content)
        rc, _, err = run_cli(["goodput", "--result", p, "--mtbf-hours", "50000", "--checkpoint-cost-s", "60", "--restart-s", "600"])
        assert needle in assert_one_line_error(rc, err) and "r.json" in err
        p.unlink(missing_ok=True)


def test_a_truncated_json_file_is_reported_once_where_it_breaks(tmp_path):
    """json's own message ends in 'at' ('Unterminated string starting at'): it read '... at at line 1'."""
    from simulator.errors import ConfigError
    from simulator.inputs import load_json
    p = tmp_path / "cut.json"
    p.write_text('{"format": "clustersim-manifest", "na')
    with pytest.raises(ConfigError, match=r"not valid JSON: Unterminated string starting at line 1 column 35$"):
        load_json(p, "manifest", err=ConfigError)


def test_yaml_alias_bomb_is_rejected_without_expanding_it(tmp_path):
    """516 bytes of nested aliases reached 3 GB because error messages repr'ed the value."""
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 12):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    lines.append("model: *a11")
    p = tmp_path / "bomb.yaml"
    p.write_text("\n".join(lines) + "\n")
    rc, _, err = run_cli(["simulate", "-c", p])
    assert "too large or nested" in assert_one_line_error(rc, err)


def test_brief_is_bounded_on_aliased_structures():
    from simulator.inputs import brief
    x: list = ["y"] * 10
    for _ in range(40):                  # 10**40 leaves when walked
        x = [x] * 10
    with no_hang(5):
        s = brief(x)
    assert len(s) < 100 and s.endswith("...")
    assert "digits" in brief(10 ** 5000)


@pytest.mark.parametrize("extra,needle", [(["--micro-batches", "0"], "--micro-batches"), (["--cp", "0"], "--cp"),
                                          (["--scheduler", "garbage://x"], "Dask scheduler"),
                                          (["--pareto", "p.xyz"], "unknown image type"),
                                          (["--workers", "0"], "--workers")])
def test_search_values_are_checked_before_searching(tmp_path, monkeypatch, extra, needle):
    from clustersim import search
    if "--scheduler" in extra:
        pytest.importorskip("distributed")
    else:
        monkeypatch.setattr(search, "run_search", lambda *a, **k: pytest.fail("searched before checking"))
    rc, _, err = run_cli(["search", "--gpus", "8", "--model", "llama3-8b", "--global-batch", "8", "--no-cache",
                          *extra], cwd=tmp_path)
    assert needle in assert_one_line_error(rc, err)


def test_internal_error_is_exit_3_with_a_crash_file(monkeypatch):
    from clustersim import cli, simulate
    monkeypatch.setattr(simulate, "experiment_from_options", lambda **kw: {}["boom"])
    rc, _, err = run_cli(["simulate", "--model", "llama3-8b"])
    line = assert_one_line_error(rc, err, code=3)
    assert "KeyError" in line and "internal error" in line
    crash = Path(line.split("details in ")[1].split(". ")[0])
    try:
        assert "Traceback" in crash.read_text() and "simulate --model llama3-8b" in crash.read_text()
    finally:
        crash.unlink()
    rc, _, err = run_cli(["--debug", "simulate", "--model", "llama3-8b"])
    assert rc == 3 and "Traceback" in err
    for line in err.splitlines():
        if "details in " in line:
            Path(line.split("details in ")[1].split(". ")[0]).unlink(missing_ok=True)
    assert cli._DEBUG["on"]
    cli._DEBUG["on"] = False


def test_guard_runs_before_programs_are_built(monkeypatch):
    """--global-batch 1000000000 built the schedule (34 s, 5.6 GB) before the resource guard ran."""
    import schedules
    from simulator.errors import ResourceLimitError
    monkeypatch.setattr(schedules, "build_programs", lambda *a, **k: pytest.fail("programs built first"))
    from clustersim.experiment import Experiment, run_experiment
    with no_hang(30), pytest.raises(ResourceLimitError):
        run_experiment(Experiment(model="llama3-8b", gpus=16, tp=8, global_batch=1_000_000_000))


def test_minimum_ops_is_a_lower_bound():
    from clustersim.experiment import Experiment, load_cluster_for, resolve_model, resolve_plan
    from clustersim.guards import minimum_ops
    from schedules import build_programs
    for kw in (dict(tp=8, pp=1, global_batch=16), dict(tp=4, pp=2, global_batch=32, schedule="zb"),
               dict(tp=2, pp=4, global_batch=64, schedule="interleaved", virtual_stages=2)):
        e = Experiment(model="llama3-8b", gpus=16, **kw)
        c = load_cluster_for(e)
        m = resolve_model(e)
        p = resolve_plan(e, m, c.world_size)
        for sym in (True, False):
            progs = build_programs(m, p, c.world_size, symmetric=sym)
            assert minimum_ops(m, p, c.world_size, sym) <= progs.op_count, (kw, sym)


# ---------------------------------------------------------------------------------------------- outputs
def test_atomic_write_keeps_the_old_file_and_names_the_path_on_failure(tmp_path):
    import errno
    from simulator.atomic import TMP_PREFIX, write_with
    from simulator.errors import OutputError
    target = tmp_path / "trace.json"
    target.write_text("old")

    def full_disk(tmp):
        Path(tmp).write_text("partial")
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(OutputError, match=f"cannot write {target}: No space left"):
        write_with(target, full_disk)
    assert target.read_text() == "old"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(TMP_PREFIX)]


def test_writes_never_follow_a_planted_symlink(tmp_path):
    from simulator.atomic import write_text
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / "result.json").symlink_to(victim)
    write_text(out / "result.json", "{}")
    assert victim.read_text() == "precious"
    assert not (out / "result.json").is_symlink() and (out / "result.json").read_text() == "{}"


def test_output_folder_removes_stale_files_and_refuses_foreign_ones(tmp_path):
    from simulator.atomic import MARKER, OutputFolder
    from simulator.errors import OutputError
    out = tmp_path / "out"
    f = OutputFolder(out, command="compare")
    for name in ("a.png", "b.perfetto.json"):
        f.path(name).write_text("1")
    f.finish()
    (out / ".clustersim-tmp-killed.csv").write_text("partial")     # left by a run killed while writing
    g = OutputFolder(out, command="compare")          # an earlier run's files go before the new run writes
    assert sorted(p.name for p in out.iterdir()) == [MARKER]
    assert g.run_id != f.run_id
    marker = json.loads((out / MARKER).read_text())
    assert marker["complete"] is False and marker["run_id"] == g.run_id
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="--force"):
        OutputFolder(foreign)
    OutputFolder(foreign, force=True).finish()
    assert (foreign / "notes.txt").read_text() == "mine"


def test_simulate_out_is_one_run(tmp_path):
    out = tmp_path / "out"
    base = ["simulate", "--model", "llama3-8b", "--gpus", "8", "--tp", "8", "--global-batch", "8", "--out", out]
    rc, _, err = run_cli(base)
    assert rc == 0, err
    (out / "gantt.png").unlink()
    (out / "gantt.png").symlink_to(tmp_path / "victim")
    rc, _, err = run_cli(base)
    assert rc == 0, err
    assert not (tmp_path / "victim").exists()
    res = json.loads((out / "result.json").read_text())
    marker = json.loads((out / ".clustersim-run.json").read_text())
    assert marker["complete"] and res["run_id"] == marker["run_id"]
    assert set(marker["files"]) == {p.name for p in out.iterdir()} - {".clustersim-run.json"}


def test_json_output_never_holds_nan():
    from simulator.inputs import json_safe
    import numpy as np
    s = json.dumps(json_safe({"a": float("nan"), "b": [np.float64("inf"), 1.5], "c": np.int64(3)}), allow_nan=False)
    assert json.loads(s) == {"a": None, "b": [None, 1.5], "c": 3}


# ---------------------------------------------------------------------------------------------- runs, processes
def test_mixed_trace_folders_are_refused_unless_allowed(tmp_path):
    import shutil
    src = ROOT / "traces/samples/cpu-gloo-ddp"
    folder = tmp_path / "run"
    shutil.copytree(src, folder)
    d = json.loads(gzip.decompress((folder / "rank1.json.gz").read_bytes()))
    d["distributedInfo"].update(rank=3, world_size=4)                    # a leftover of a 4-rank run
    (folder / "rank3.json.gz").write_bytes(gzip.compress(json.dumps(d).encode()))
    rc, _, err = run_cli(["replay", folder])
    line = assert_one_line_error(rc, err)
    assert "rank3.json.gz" in line and "--allow-mixed" in line
    rc, _, err = run_cli(["calibrate", folder, "-o", tmp_path / "c.json"])
    assert "mixes files" in assert_one_line_error(rc, err)
    rc, _, err = run_cli(["replay", folder, "--allow-mixed"])
    assert "mixes" not in err


@pytest.mark.parametrize("manifest", ["[1, 2]", '{"format": "clustersim-trace-manifest", "devices": {"a": 1}}',
                                      '{"world_size": ' + "9" * 5000 + "}"])
def test_bad_manifests_end_in_one_line(tmp_path, manifest):
    import shutil
    folder = tmp_path / "run"
    shutil.copytree(ROOT / "traces/samples/cpu-gloo-ddp", folder)
    (folder / "manifest.json").write_text(manifest)
    rc, _, err = run_cli(["calibrate", folder / "manifest.json", "-o", tmp_path / "c.json"])
    assert_one_line_error(rc, err)
    rc, _, err = run_cli(["replay", folder])
    assert_one_line_error(rc, err)


def test_collect_clears_an_earlier_runs_ranks(tmp_path):
    from traces.launch import clear_previous_run
    for n in ("manifest.json", "rank0.json.gz", "rank3.json.gz", "collect.log", "notes.txt"):
        (tmp_path / n).write_text("x")
    clear_previous_run(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_a_child_dies_with_its_parent(tmp_path):
    """What collect relies on when clustersim is SIGKILLed: torchrun and every rank die with their parent."""
    import os
    import subprocess
    import sys
    import time
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux only")
    pidfile = tmp_path / "child.pid"
    child = (f"import os, time; from traces.lifetime import die_with_parent; die_with_parent(); "
             f"open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)")
    parent = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", parent], cwd=ROOT)
    for _ in range(200):
        if pidfile.exists() and pidfile.read_text():
            break
        time.sleep(0.1)
    pid = int(pidfile.read_text())
    p.kill()
    p.wait()
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, 9)
    pytest.fail("the child outlived its SIGKILLed parent")


# ---------------------------------------------------------------------------------------------- search cache, Dask
def test_search_cache_survives_torn_tails_and_rejects_bad_records(tmp_path):
    from clustersim.search import Cache
    good = {"step_time_s": 1.0, "tokens_per_s": 2.0, "peak_memory_bytes": 3.0, "mfu": 0.4, "bubble_fraction": 0.1,
            "exposed_comm_fraction": 0.0, "fits_in_memory": True, "plan": {}}
    p = tmp_path / "search.jsonl"
    p.write_text(json.dumps({"key": "empty", "result": {}}) + "\n"
                 + json.dumps({"key": "nan", "result": {**good, "step_time_s": float("nan")}}) + "\n"
                 + '{"key": "torn", "resu')
    c = Cache(p)
    assert c.get("empty") is None and c.get("nan") is None
    c.put("next", good)                       # must not be swallowed by the torn line
    assert Cache(p).get("next") == good


def test_search_cache_concurrent_writers_lose_nothing(tmp_path):
    import multiprocessing
    p = tmp_path / "search.jsonl"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_cache_writer, args=(p, w)) for w in range(3)]
    for pr in procs:
        pr.start()
    for pr in procs:
        pr.join(60)
    from clustersim.search import Cache
    assert len(Cache(p).data) == 3 * 200


def _cache_writer(path, w):
    from clustersim.search import Cache
    c = Cache(path)
    big = "x" * 5000                  # lines longer than a pipe buffer interleave without the lock
    for i in range(200):
        c.put(f"{w}-{i}", {"error": big})


class _Crafted:
    """A result that runs code when unpickled: the client must never unpickle what workers send."""

    def __init__(self, mark):
        self.mark = mark

    def __reduce__(self):
        import os
        return (os.system, (f"touch {self.mark}",))


@pytest.mark.slow
def test_a_rogue_dask_worker_cannot_run_code_in_the_client(tmp_path):
    pytest.importorskip("distributed")
    from distributed import LocalCluster
    from clustersim.search import _Executor
    mark = tmp_path / "pwned"
    with no_hang(120), LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                    dashboard_address=None) as lc:
        ex = _Executor(None, lc.scheduler_address, fn=lambda d, m=str(mark): _Crafted(m))
        try:
            with pytest.raises(ClusterSimError, match="Dask worker result"):
                list(ex.map([("k", {})]))
            ex.fn = lambda d: '{"step_time_s": NaN}'
            with pytest.raises(ClusterSimError, match="Dask worker result"):
                list(ex.map([("k", {})]))
        finally:
            ex.close()
    assert not mark.exists()


@pytest.mark.slow
def test_a_scheduler_without_workers_times_out(tmp_path):
    pytest.importorskip("distributed")
    from distributed import LocalCluster
    from clustersim.search import _Executor
    with no_hang(60), LocalCluster(n_workers=0, processes=False, dashboard_address=None) as lc:
        with pytest.raises(ConfigError, match="no workers"):
            _Executor(None, lc.scheduler_address, worker_wait_s=1)


def test_ranks_sharing_no_step_are_different_runs():
    """A rank may miss a step (replay handles that), but ranks that share no step are not one run."""
    import pandas as pd
    from traces.parse import RankInfo, one_run_problems

    class T:
        ranks = {0: RankInfo(0, Path("rank0.json"), world_size=2), 1: RankInfo(1, Path("rank1.json"), world_size=2)}
        steps = pd.DataFrame({"rank": [0, 0, 1, 1], "step": [3, 4, 4, 5]})
    assert one_run_problems(T(), None) == []
    T.steps = pd.DataFrame({"rank": [0, 0, 1, 1], "step": [3, 4, 8, 9]})
    assert "share no profiled step" in one_run_problems(T(), None)[0]


# ---------------------------------------------------------------------------------------------- recent commands
_HF = {"model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "hidden_size": 4096,
       "intermediate_size": 11008, "vocab_size": 32000}
_QWEN = {**_HF, "model_type": "qwen2_moe", "num_experts": 8, "num_experts_per_tok": 2,
         "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632}


@pytest.mark.parametrize("text,needle", [
    ('{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    (json.dumps({**_QWEN, "moe_intermediate_size": 0}), "moe_intermediate_size"),
    (json.dumps({**_QWEN, "moe_intermediate_size": "1408"}), "moe_intermediate_size"),
    (json.dumps({**_QWEN, "shared_expert_intermediate_size": [1]}), "shared_expert_intermediate_size"),
    (json.dumps({**_HF, "tie_word_embeddings": "false"}), "tie_word_embeddings"),
    (json.dumps({**_HF, "num_hidden_layers": 10 ** 8}), "ops"),        # refused before walking the layers
    (json.dumps({**_HF, "hidden_size": 2 ** 62, "num_attention_heads": 2 ** 31}), "unreasonably large"),
    (json.dumps(_HF)[:-1] + ', "hidden_size": 8}', "duplicate key"),
])
def test_hostile_model_configs_end_in_one_line(tmp_path, text, needle):
    p = tmp_path / "config.json"
    p.write_text(text)
    rc, _, err = run_cli(["simulate", "--gpus", "8", "--tp", "8", "--global-batch", "8", "--model-config", p])
    assert needle in assert_one_line_error(rc, err)


def test_model_config_reads_are_bounded():
    rc, _, err = run_cli(["simulate", "--gpus", "8", "--tp", "8", "--model-config", "/dev/zero"])
    assert "larger than" in assert_one_line_error(rc, err)


@pytest.mark.parametrize("content", [bytes(range(256)) * 20, b"a,b,c\n1,2,3\n", b'id,model\n"' + b"a" * 200_000])
def test_bad_published_runs_csv_end_in_one_line(tmp_path, content):
    p = tmp_path / "runs.csv"
    p.write_bytes(content)
    rc, _, err = run_cli(["validate", "--runs", p])
    assert_one_line_error(rc, err)


@pytest.mark.parametrize("which,content", [("collectives.csv", b"x,y\n1,2\n"), ("collectives.csv", b"\xff\xfe" * 50),
                                           ("moe_alltoall.csv", b"x,y\n1,2\n")])
def test_bad_collective_data_end_in_one_line(tmp_path, which, content):
    from clustersim.validate_collectives import COLUMNS
    for name, cols in COLUMNS.items():                  # the other file: a header without rows
        (tmp_path / name).write_text(",".join(cols) + "\n")
    (tmp_path / which).write_bytes(content)
    rc, _, err = run_cli(["validate", "collectives", "--data", tmp_path])
    assert_one_line_error(rc, err)


def test_collective_data_rows_that_do_not_parse_are_named(tmp_path):
    from clustersim.validate_collectives import COLUMNS, collective_rows
    p = tmp_path / "collectives.csv"
    cols = COLUMNS["collectives.csv"]
    row = {c: "x" for c in cols} | {"hardware": "H100", "nodes": "1", "gpus_per_node": "8", "total_gpus": "eight"}
    p.write_text(",".join(cols) + "\n" + ",".join(row[c] for c in cols) + "\n")
    with pytest.raises(ConfigError, match="data row 1"):
        collective_rows(p)


@pytest.mark.parametrize("size", ["inf", "nan", "-5"])
def test_collective_data_sizes_must_be_finite(tmp_path, size):
    from clustersim.validate_collectives import COLUMNS, collective_rows
    p = tmp_path / "collectives.csv"
    cols = COLUMNS["collectives.csv"]
    row = {c: "1" for c in cols} | {"hardware": "H100", "size_bytes": size, "total_gpus": "8"}
    p.write_text(",".join(cols) + "\n" + ",".join(row[c] for c in cols) + "\n")
    with pytest.raises(ConfigError, match="data row 1.*size_bytes"):
        collective_rows(p)


def _chakra_net(tmp_path):
    net = tmp_path / "net.yaml"
    net.write_text("topology: [ Ring ]\nnpus_count: [ 2 ]\nbandwidth: [ 50 ]\nlatency: [ 500 ]\n")
    return net


def test_chakra_et_of_zeros_is_refused_without_a_node_per_byte(tmp_path):
    (tmp_path / "w.0.et").write_bytes(bytes(4 << 20))           # 4 Mi empty messages
    rc, _, err = run_cli(["chakra", "run", tmp_path / "w", "--network", _chakra_net(tmp_path), "--replicate"])
    assert "empty" in assert_one_line_error(rc, err)


@pytest.mark.parametrize("option", ["--comm-group", "--system"])
def test_chakra_json_options_are_bounded(tmp_path, option):
    from simulator.program import Programs
    from traces.chakra.writer import write_workload
    from simulator.program import COMPUTE, Op
    progs = Programs(world_size=2, ops={r: [Op(COMPUTE, "gemm", "compute", duration_s=1e-3)] for r in range(2)})
    write_workload(progs, tmp_path, "w")
    deep = tmp_path / "deep.json"
    deep.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    for bad, needle in ((deep, "nested too deeply"), ("/dev/zero", "larger than")):
        rc, _, err = run_cli(["chakra", "run", tmp_path / "w", "--network", _chakra_net(tmp_path), option, bad])
        assert needle in assert_one_line_error(rc, err)


# ---------------------------------------------------------------------------------------------- replay intervals
def _merge_reference(intervals):
    out = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=30),
       st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=6))
def test_vectorised_interval_union_and_difference_match_the_plain_loop(ivs, holes):
    import numpy as np
    from traces.replay import _merge, _subtract
    s = np.array([a for a, _ in ivs], dtype=float)
    e = np.array([b for _, b in ivs], dtype=float)
    bs, be = _merge(s, e)
    ref = _merge_reference([(float(a), float(b)) for a, b in ivs])
    assert [[a, b] for a, b in zip(bs, be)] == ref
    hs, he = _merge(np.array([a for a, _ in holes], dtype=float), np.array([b for _, b in holes], dtype=float))
    ds, de = _subtract(bs, be, hs, he)
    covered = {t for a, b in ref for t in range(int(a), int(b))} - \
        {t for a, b in zip(hs, he) for t in range(int(a), int(b))}
    assert {t for a, b in zip(ds, de) for t in range(int(a), int(b))} == covered
    assert all(a < b for a, b in zip(ds, de)) and all(b1 <= a2 for b1, a2 in zip(de, ds[1:]))


# ---------------------------------------------------------------------------------------------- thirty-second session
# A robustness hunt (949 CLI invocations) found these inputs ending in an internal error (exit 3), a hang, invalid
# JSON or a misleading message; each must now be one clear line with exit 2.
@pytest.mark.parametrize("model, needle", [
    ("{layers: 2, hidden: 64, heads: 4, bogus: 1}", "unknown key(s) bogus"),
    ("{layers: 2, hidden: 64, heads: 4, experts: [1]}", "experts must be an integer"),
    ("{layers: 2, hidden: 64, heads: 4, name: [1]}", "name must be text"),
    ("{hidden: 64, heads: 4, hybrid_pattern: 7}", "hybrid_pattern must be text"),
    ("{base: llama3-8b, layers: x}", "layers must be an integer"),
    ("{base: [1], layers: 2}", "base must name a preset"),
])
def test_inline_model_fields_are_type_checked(tmp_path, model, needle):
    p = tmp_path / "m.yaml"
    p.write_text(f"model: {model}\ngpus: 8\ntp: 1\nglobal_batch: 8\n")
    rc, _, err = run_cli(["simulate", "-c", p])
    assert needle in assert_one_line_error(rc, err)
    f = tmp_path / "mf.yaml"
    f.write_text(model.strip("{}").replace(", ", "\n").replace(": ", ": ") + "\n")
    if "base" not in model:
        rc, _, err = run_cli(["plan", "-m", f, "--gpus", "8"])
        assert "must be" in assert_one_line_error(rc, err) or "unknown key" in err


@pytest.mark.parametrize("rule, needle", [
    ("{default: 16, multiple_of: 0}", "gpus.multiple_of must be a positive integer"),
    ("{default: 16, min: 64, max: 8}", "gpus.max (8) is below gpus.min (64)"),
    ("{default: 16, max: x}", "gpus.max must be a positive integer"),
])
def test_cluster_gpu_rules_are_checked(tmp_path, rule, needle):
    p = tmp_path / "c.yaml"
    p.write_text(f"preset: dgx-h100\ngpus: {rule}\n")
    rc, _, err = run_cli(["topology", p])
    assert needle in assert_one_line_error(rc, err)


def test_exponent_numbers_read_as_numbers_in_yaml_and_set(tmp_path):
    """YAML 1.1 (PyYAML) reads 5.0e10 and 5e10 as text; every input of ours reads them as numbers."""
    from simulator.yamlio import load_yaml_text
    assert load_yaml_text("[5e10, 5.0e10, -1e-3, .5E2, 5, 1e, e5]", "x") == [5e10, 5e10, -1e-3, 50.0, 5, "1e", "e5"]
    rc, out, err = run_cli(["topology", "dgx-h100", "--gpus", "16", "--set", "nic_bandwidth=5.0e10"])
    assert rc == 0 and "NIC 50.0 GB/s" in out, err


def test_bad_runs_of_validate_goodput_plan_and_chakra_are_one_line(tmp_path):
    for args, needle in (
            (["validate", "--ids", ""], "--ids names no row id"),                       # ran all 946 rows
            (["validate", "--ids", "1", "--plot", tmp_path / "p.txt"], "expected a .png"),   # exit 3 after the run
            (["validate", "--ids", "1", "--plot", tmp_path / "p"], "expected a .png"),       # a 0-byte file
            (["goodput", "--gpus", "16", "--mtbf-hours", "50000", "--checkpoint-cost-s", "30", "--restart-s", "600",
              "--trials", "10000000"], "exceed the budget"),                             # hung
            (["plan", "--params", "1e308", "--hbm-gb", "80", "--json"], "not finite"),     # printed Infinity
            (["chakra", "export", "--cluster", "dgx-h100", "--gpus", "8", "--model", "tiny", "--tp", "2",
              "--global-batch", "4", "--out", tmp_path / "ex", "--prefix", "../evil"], "plain file-name prefix"),
            (["simulate", "--gpus", "abc"], "(clustersim simulate --help)"),            # click's 4-line usage block
    ):
        rc, out, err = run_cli(args)
        assert needle in assert_one_line_error(rc, err), args
    assert not (tmp_path / "evil.0.et").exists()


def test_communicator_group_ranks_outside_the_workload_are_refused(tmp_path):
    import json
    rc, _, err = run_cli(["chakra", "export", "--cluster", "dgx-h100", "--gpus", "8", "--model", "tiny", "--tp", "2",
                          "--global-batch", "4", "--out", tmp_path / "ex"])
    assert rc == 0, err
    groups = json.loads((tmp_path / "ex" / "comm_groups.json").read_text())
    name = next(iter(groups))
    for bad, needle in ((groups[name][:-1] + [99], "outside 0..7"), ([groups[name][0]] + groups[name], "a rank twice")):
        (tmp_path / "cg.json").write_text(json.dumps({**groups, name: bad}))
        rc, _, err = run_cli(["chakra", "run", tmp_path / "ex" / "workload", "--network", tmp_path / "ex" / "network.yml",
                              "--comm-group", tmp_path / "cg.json"])
        assert needle in assert_one_line_error(rc, err)


def test_a_cluster_file_is_built_at_the_size_asked_for(tmp_path):
    """A custom cluster valid for --gpus 16 but not at its preset's default size (1,024 GPUs on 4-port leaves)
    was refused by simulate, which built it at the default size first; topology --gpus 16 accepted it."""
    p = tmp_path / "c.yaml"
    p.write_text("preset: dgx-h100\nfabric: {leaf_down: 4}\n")
    rc, out, err = run_cli(["simulate", "-m", "tiny", "--gpus", "16", "--cluster", p, "--global-batch", "16", "--json"])
    assert rc == 0, err


def test_a_communication_that_never_ends_is_named_as_such(monkeypatch):
    """A link degraded to a vanishing share left its transfer in flight forever: the report listed it as
    'op None : in_flight'; it now names the op and why, and the headline says an op never ends. (The CLI now
    refuses a degradation below 1 MB/s first; the engine's report is reached here with that bound lifted.)"""
    args = ["simulate", "--cluster", "dgx-h100", "--gpus", "16", "-m", "tiny", "--tp", "8", "--global-batch", "16",
            "--network", "flow", "--degrade-link", "0:nvswitch.0:1e-200", "--mode", "full"]
    rc, _, err = run_cli(args)
    assert "keeps 4.5e-189 B/s, below the 1e+06 B/s any link carries" in assert_one_line_error(rc, err)
    import topologies.builders
    monkeypatch.setattr(topologies.builders, "MIN_LINK_BPS", 0.0)
    rc, _, err = run_cli(args)
    line = assert_one_line_error(rc, err)
    assert "in an op that never ends" in line and "communication started but never ends" in line
    assert "op None" not in line


def test_goodput_limits_are_said_in_the_options_unit():
    rc, _, err = run_cli(["goodput", "--gpus", "16", "--mtbf-hours", "1e9", "--checkpoint-cost-s", "30",
                          "--restart-s", "600"])
    assert "--mtbf-hours must be at most 2.78e+08 hours" in assert_one_line_error(rc, err)


def test_messages_say_what_to_do_not_which_class_refused():
    for args, needle in (
            (["topology", "dgx-h100", "--gpus", "16", "--collective", "all_reduce", "--nccl-version", "99.0.0"],
             "leave the option out for the newest model"),
            (["search", "--gpus", "16", "-m", "tiny", "--global-batch", "16", "--schedules", "zb-v"],
             "the search tries gpipe, 1f1b, interleaved and zb"),
            (["search", "--gpus", "8", "-m", "tiny", "--global-batch", "16", "--cp", "3", "--no-cache"],
             "no degree of 3 divides the 8 GPUs"),                  # was 'no plan ... try more GPUs'
            (["search", "--gpus", "8", "-m", "tiny", "--global-batch", "16", "--ep", "2", "--no-cache"],
             "tiny is a dense model"),
    ):
        rc, _, err = run_cli(args)
        assert needle in assert_one_line_error(rc, err), args


def test_refusals_name_the_packed_documents_and_whose_window():
    """Packed documents under context parallelism were refused as "llama3-8b's chunked attention" (the model
    was blameless), and search then advised more GPUs; a window given on the command line was called the
    model's own."""
    packed_cp = "with sequences packed from documents of 2048 tokens (--packed-doc-tokens) is not modelled"
    for args, needles in (
            (["simulate", "--gpus", "16", "-m", "llama3-8b", "--seq", "8192", "--cp", "2", "--tp", "8",
              "--packed-doc-tokens", "2048"], (packed_cp, "use --cp 1")),
            (["search", "--gpus", "16", "-m", "llama3-8b", "--global-batch", "16", "--seq", "8192", "--cp", "2",
              "--packed-doc-tokens", "2048", "--no-cache"],
             ("every candidate plan of the search space is invalid", packed_cp)),
            (["simulate", "--gpus", "8", "-m", "llama3-8b", "--seq", "8192", "--sliding-window", "1024",
              "--packed-doc-tokens", "2048"], ("the sliding window of 1024 tokens given for llama3-8b",
                                               "drop one of them")),
            (["simulate", "--gpus", "8", "-m", "gpt-oss-20b", "--seq", "8192", "--packed-doc-tokens", "2048"],
             ("gpt-oss-20b's own sliding window of 128 tokens", "drop --packed-doc-tokens")),
            (["plan", "--gpus", "16", "-m", "llama3-8b", "--seq", "8192", "--cp", "2", "--tp", "8",
              "--packed-doc-tokens", "2048"], (packed_cp,)),
            # plans dropped for the batch are counted beside the invalid ones, commonest first
            (["search", "--gpus", "64", "-m", "llama3-8b", "--global-batch", "1", "--seq", "4100", "--tp", "8",
              "--pp", "1", "--cp", "1,8", "--no-cache"],
             ("(72 plans: 60 × global batch 1 is not divisible by dp · micro-batch; 12 × seq 4100 must be "
              "divisible by 2·cp = 16",)),
    ):
        rc, _, err = run_cli(args)
        line = assert_one_line_error(rc, err)
        assert all(n in line for n in needles), (args, line)
        assert "try more GPUs" not in line and "chunked attention" not in line
    # a sliding window no shorter than the documents never applies within one: dropped, and said so
    rc, out, err = run_cli(["simulate", "--gpus", "8", "-m", "gpt-oss-20b", "--seq", "8192", "--packed-doc-tokens",
                            "64", "--json"])
    assert rc == 0, err
    assert any("sliding window of 128 tokens is no shorter than a document: it never applies" in n
               for n in json.loads(out)["notes"])


def test_options_that_would_be_silently_ignored_are_refused(tmp_path):
    """Each of these ran and printed a result that had ignored the option (or, for --out '', wrote nothing)."""
    sim = ["simulate", "-m", "tiny", "--gpus", "8", "--global-batch", "8"]
    for args, needle in (
            (sim + ["--out", ""], "empty path"),
            (["calibrate", " "], "empty path"),
            (sim + ["--astra-system", tmp_path / "s.json"], "add --network astra or drop --astra-system"),
            (sim + ["--fp8-recipe", "current"], "add --dtype fp8 or drop --fp8-recipe"),
            (sim + ["--dtype", "fp8", "--fp8-recipe", "mxfp8"], "need Blackwell tensor cores"),      # on H100
            (sim + ["--top-k", "4"], "top_k (--top-k) applies to MoE models"),
            (["simulate", "--layers", "2", "--hidden", "256", "--heads", "4", "--moe-layer-every", "2", "--gpus", "8",
              "--global-batch", "8"], "moe_layer_every (--moe-layer-every) applies to MoE models"),
            (["plan", "-m", "llama3-8b", "--gpus", "8", "--top-k", "2"], "applies to MoE models"),
            (sim + ["--params", "1e9"], "do not combine it with --model"),                 # ran tiny instead
            (sim + ["--mamba-state", "64"], "applies to Mamba-2 layers, and tiny has none"),
            (sim + ["--calibration-scope", "any"], "give --calibration too"),
            (["replay", ROOT / "traces" / "samples" / "cpu-gloo-ddp", "--network", "flow"], "give --cluster too"),
    ):
        rc, _, err = run_cli(args)
        assert needle in assert_one_line_error(rc, err), args
    p = tmp_path / "m.yaml"
    p.write_text("preset: llama3-8b\ntop_k: 2\n")
    rc, _, err = run_cli(["plan", "-m", p, "--gpus", "8"])
    assert "applies to MoE models" in assert_one_line_error(rc, err)
    # the same options where they apply still run
    rc, _, err = run_cli(["simulate", "-m", "tiny", "--gpus", "8", "--global-batch", "8", "--cluster", "dgx-b200",
                          "--dtype", "fp8", "--fp8-recipe", "mxfp8", "--json"])
    assert rc == 0, err
    rc, _, err = run_cli(["simulate", "--layers", "2", "--hidden", "256", "--heads", "4", "--experts", "8",
                          "--top-k", "2", "--gpus", "8", "--global-batch", "8", "--json"])
    assert rc == 0, err


def test_options_that_do_nothing_here_say_so_in_notes():
    import json
    rc, out, err = run_cli(["simulate", "-m", "tiny", "--gpus", "8", "--global-batch", "8", "--sp", "--json"])
    assert rc == 0, err
    assert any("--sp does nothing at tp 1" in n for n in json.loads(out)["notes"])
    # NVLS reduces inside a node's NVSwitch: not on A100's switches at all, on H100 not across nodes
    base = ["simulate", "-m", "tiny", "--gpus", "16", "--tp", "2", "--global-batch", "16", "--json",
            "--algorithm", "nvls"]
    rc, out, err = run_cli(base + ["--cluster", "dgx-a100"])
    notes = json.loads(out)["notes"]
    assert rc == 0 and any("--algorithm nvls applies to none of this run's collectives" in n for n in notes), notes
    rc, out, err = run_cli(base + ["--cluster", "dgx-h100"])
    notes = json.loads(out)["notes"]
    assert rc == 0 and any("--algorithm nvls priced all_reduce, but not every group's" in n for n in notes), notes
    rc, out, err = run_cli(base[:-1] + ["ring"])
    assert rc == 0 and not any("--algorithm" in n for n in json.loads(out)["notes"])


def test_goodput_refuses_a_step_longer_than_the_run():
    """It printed 'training steps per run: 0' beside a goodput of 0.71 (useful time of a step never finished)."""
    rc, _, err = run_cli(["goodput", "--gpus", "1024", "--mtbf-hours", "50000", "--checkpoint-cost-s", "10",
                          "--restart-s", "600", "--step-time-s", "200000", "--days", "1"])
    assert "no step would complete" in assert_one_line_error(rc, err)


def test_calibration_fits_below_any_processor_are_refused(tmp_path):
    """A 1e-300 FLOP/s peak made every op never end, reported as a deadlock at t=0."""
    import json
    cal = json.loads((ROOT / "traces" / "data" / "h100.json").read_text())
    cal["compute"][0]["peak_flops_per_s"] = 1e-300
    (tmp_path / "c.json").write_text(json.dumps(cal))
    rc, _, err = run_cli(["simulate", "-m", "tiny", "--gpus", "8", "--global-batch", "8", "--calibration",
                          tmp_path / "c.json"])
    assert "peak_flops_per_s: must be >= 1e+06" in assert_one_line_error(rc, err)


def test_plan_options_for_another_strategy_are_refused_and_inert_ones_noted(tmp_path):
    """From a helper's hunt: each ran and printed a step that had ignored the option, without a word."""
    import json
    sim = ["simulate", "-m", "tiny", "--gpus", "8", "--global-batch", "8", "--json"]
    for extra, needle in ((["--fsdp-prefetch", "3"], "add --fsdp (or --zero 3) or drop it"),
                          (["--zero", "1", "--fsdp-reshard-after-forward", "false"], "this plan runs ZeRO stage 1"),
                          (["--recompute", "full", "--recompute-every", "5"], "so none would be")):
        rc, _, err = run_cli(sim + extra)
        assert needle in assert_one_line_error(rc, err), extra
    for extra, needle in ((["--tp", "8", "--zero", "1"], "nothing is sharded"),
                          (["--fsdp", "--bucket-mb", "200"], "--bucket-mb and --no-overlap-grad-reduce"),
                          (["--schedule", "zb"], "pp 1: there is no pipeline"),
                          (["--network", "ideal", "--algorithm", "tree"], "--algorithm tree changes nothing"),
                          (["--gpus", "16", "--global-batch", "16", "--network", "ideal", "--mode", "full",
                            "--degrade-link", "0:leaf.0:0.1"], "failed and degraded links change nothing"),
                          (["-m", "tiny-moe", "--moe-dispatcher", "deepep"], "ep 1 sends none"),
                          (["-m", "tiny-moe", "--ep", "2", "--expert-grid", "carved"], "here it changes nothing"),
                          (["--attention", "eager", "--packed-doc-tokens", "32"], "local attention saves no time")):
        rc, out, err = run_cli(sim + extra)
        assert rc == 0, err
        assert any(needle in n for n in json.loads(out)["notes"]), (extra, json.loads(out)["notes"])
    rc, _, err = run_cli(["calibrate", ROOT / "traces" / "samples" / "cpu-gloo-bench", "-o", tmp_path / "c.json"])
    assert rc == 0, err
    rc, out, err = run_cli(sim + ["--network", "ideal", "--calibration", tmp_path / "c.json",
                                  "--calibration-scope", "any"])
    notes = json.loads(out)["notes"]
    assert any("collective fits change nothing" in n for n in notes) and not any("replace" in n for n in notes)


def test_options_of_another_command_are_refused():
    """validate's own options before a subcommand, and topology's collective options without --collective, were
    taken and ignored: `validate --ids 1 --json diff A B` printed text, `topology dgx-h100 --algorithm tree`
    described the cluster."""
    for args, needle in (
            (["validate", "--ids", "1", "--json", "evidence"], "--ids, --json: option(s) of the run of published rows"),
            (["topology", "dgx-h100", "--gpus", "16", "--algorithm", "tree"], "add --collective KIND"),
            (["topology", "dgx-h100", "--gpus", "16", "--collective", "all_reduce", "--concurrent"],
             "add --network flow"),
            (["compare", "-m", "tiny", "--gpus", "8", "--global-batch", "8", "--pp", "2", "--schedule", "zb",
              "--schedules", "1f1b,gpipe"], "give one or the other"),
            (["compare", "-m", "tiny", "--gpus", "8", "--global-batch", "8", "--title", "T"], "give that option too"),
            (["simulate", "-m", "tiny", "--gpus", "8", "--global-batch", "8", "--force"], "give --out too"),
            (["search", "--gpus", "8", "-m", "tiny", "--global-batch", "8", "--no-fold"], "tiny is a dense model"),
            (["search", "--gpus", "8", "-m", "tiny", "--global-batch", "8", "--fold"], "--fold turns on MoE"),
            (["search", "--gpus", "8", "-m", "tiny", "--global-batch", "8", "--tp", "1", "--tp-comm-overlap"],
             "--tp 1 has none"),
    ):
        rc, _, err = run_cli(args)
        assert needle in assert_one_line_error(rc, err), args
    rc, out, err = run_cli(["validate", "evidence", "--json"])
    assert rc == 0, err


def test_chakra_export_says_what_its_files_leave_out(tmp_path):
    """It printed the straggler's step time beside ETs that hold every rank's nominal times, without a word."""
    rc, out, err = run_cli(["chakra", "export", "--cluster", "dgx-h100", "--gpus", "8", "--model", "tiny",
                            "--global-batch", "8", "--out", tmp_path / "a", "--straggler", "3:2", "--algorithm", "tree"])
    assert rc == 0, err
    assert "note: the written files leave out stragglers / jitter" in out and "--algorithm tree" in out
    rc, out, err = run_cli(["chakra", "export", "--cluster", "dgx-h100", "--gpus", "8", "--model", "tiny",
                            "--global-batch", "8", "--out", tmp_path / "b"])
    assert rc == 0 and "leave out" not in out


def test_byte_size_reads_numbers_and_units_and_refuses_the_rest():
    """simulator.inputs.byte_size: SI units (1 MB = 1e6 B) and binary ones, any case and spacing, plain numbers;
    booleans, text, zero, negatives and non-finite values are errors naming the option."""
    from simulator.errors import ConfigError
    from simulator.inputs import byte_size
    good = {"40GB": 40e9, "100 MB": 1e8, "1.5GiB": 1.5 * 2**30, "512kB": 512e3, "512KB": 512e3, "1e6": 1e6,
            " 4 tib ": 4 * 2**40, ".5GB": 5e8, "7": 7.0, "16b": 16.0, 1048576: 1048576.0, 2.5e9: 2.5e9}
    for value, expected in good.items():
        assert byte_size(value, "--x") == expected, value
    from clustersim.paths import ByteSize
    assert ByteSize().convert("9007199254740993", None, None) == 9007199254740993     # digits stay exact past 2^53
    assert ByteSize().convert("4.1MB", None, None) == 4_100_000
    assert ByteSize(allow_zero=True).convert("0", None, None) == 0
    for bad in ("40 GBs", "-1GB", "0", "0MB", "abc", "GB", "1e999GB", "nanGB", "inf", "1_000", "", True, None, [1]):
        with pytest.raises(ConfigError, match="--x"):
            byte_size(bad, "--x")
    for bits in ("40Gb", "5 Mb", "1.5Tb"):       # an upper-case prefix before a lower-case b is bits: read as bytes
        with pytest.raises(ConfigError, match="reads as bits"):
            byte_size(bits, "--x")


def test_second_hunt_refusals_are_quick_one_line_errors(tmp_path):
    """From a second helper's hunt (thirty-fourth session): each hung, ate gigabytes, ran with a silently
    ignored option or printed a nonsensical figure."""
    import json
    import time
    row = {"id": "1", "group": "H100 BF16 dense", "published_tokens_per_s_per_gpu": 1.0,
           "predicted_tokens_per_s_per_gpu": 1.0, "error": 0.0}
    run_file = tmp_path / "v.json"
    run_file.write_text(json.dumps({"rows": [row]}))
    (tmp_path / "dup.yaml").write_text("cluster: dgx-h100\ngpus: 8\nmodel: tiny\nglobal-batch: 8\nglobal_batch: 16\n")
    base = ["simulate", "-m", "llama3-8b", "--gpus", "8", "--global-batch", "8"]
    for args, needle in (
            (["plan", "--layers", "1000", "--hidden", "64", "--heads", "4", "--pp", "1000"], "plan builds"),  # > 60 s
            (["plan", "--layers", "1000000000", "--hidden", "64", "--heads", "4", "--gpus", "8"], "plan builds"),
            (["plan", "-m", "tiny", "--dp", "10000000"], "GPUs exceed"),                            # 42 s, 2.9 GB
            (["validate", "--ids", "1,999999"], "no row with id 999999"),                           # dropped silently
            (["validate", "diff", run_file, run_file, "--tolerance", "nan"], "--tolerance"),        # nothing "moved"
            (["goodput", "--gpus", "1024", "--mtbf-hours", "50000", "--checkpoint-cost-s", "60", "--restart-s",
              "600", "--checkpoint-interval-min", "1e9"], "no checkpoint would be taken"),          # negative goodput
            (["plan", "--params", "7e9", "--dp", "8", "--lora-rank", "16"], "LoRA adapters need"),  # ignored
            (["plan", "--params", "7e9", "--dp", "8", "--packed-doc-tokens", "100"], "needs the model's shape"),
            (base + ["--tp", "2", "--lora-rank", "100000000"], "narrowest width"),                  # 1.8 PB peak
            (["simulate", "--config", tmp_path / "dup.yaml"], "are the same option"),               # 16 won
            (["topology", "dgx-h100", "--gpus", "16", "--collective", "barrier", "--max-bytes", "4096"], "no payload"),
            (["topology", "dgx-h100", "--gpus", "16", "--collective", "all_reduce", "--max-bytes", "1e300"], "1 PB"),
    ):
        t0 = time.perf_counter()
        rc, out, err = run_cli(args)
        assert needle in assert_one_line_error(rc, err), args
        assert time.perf_counter() - t0 < 20, args
    rc, out, err = run_cli(["topology", "dgx-h100", "--gpus", "16", "--collective", "barrier", "--json"])
    assert rc == 0 and [r["size_bytes"] for r in json.loads(out)] == [0]     # one row: no payload


def test_second_hunt_inert_options_are_noted():
    import json
    rc, out, err = run_cli(["search", "--gpus", "8", "-m", "llama3-8b", "--global-batch", "16", "--seq", "2048",
                            "--tp", "8", "--packed-doc-tokens", "99999", "--no-cache", "--json"])
    assert rc == 0, err
    assert any("each sequence is one document" in n for n in json.loads(out)["notes"])    # search had no notes
    base = ["simulate", "-m", "llama3-8b", "--gpus", "8", "--global-batch", "8", "--seq", "4096", "--json"]
    for extra, needle in ((["--fail-device", "0@1e308"], "nothing fails in this step"),
                          (["--packed-doc-tokens", "4096"], "each sequence is one document"),
                          (["--sliding-window", "99999"], "spans the whole sequence"),
                          (["--lora-rank", "8", "--lora-style", "dtensor"], "at tp 1 the styles are the same")):
        rc, out, err = run_cli(base + extra)
        assert rc == 0, err
        assert any(needle in n for n in json.loads(out)["notes"]), (extra, json.loads(out)["notes"])


def test_calibration_of_another_backend_needs_its_scope_in_replay_and_topology():
    """A replay of a gloo trace with an NCCL calibration applied the NCCL fits without a word (simulate refuses
    fits of another backend); replay and topology now take --calibration-scope as simulate does."""
    h100 = ROOT / "traces" / "data" / "h100.json"
    ddp = ROOT / "traces" / "samples" / "cpu-gloo-ddp"
    rc, _, err = run_cli(["replay", ddp, "--calibration", h100])
    assert "fits are for nccl, the trace ran gloo" in assert_one_line_error(rc, err)
    rc, out, err = run_cli(["replay", ddp, "--calibration", h100, "--calibration-scope", "any"])
    assert rc == 0 and "--calibration-scope any" in out, err
    rc, _, err = run_cli(["replay", ddp, "--calibration-scope", "any"])
    assert "give --calibration too" in assert_one_line_error(rc, err)
    top = ["topology", "dgx-a100", "--gpus", "8", "--collective", "all_reduce", "--max-bytes", "4096",
           "--calibration", h100]
    rc, _, err = run_cli(top)
    assert "--calibration-scope any" in assert_one_line_error(rc, err)
    rc, out, err = run_cli(top + ["--calibration-scope", "any"])
    assert rc == 0 and "calibrated time" in out, err


def test_physical_ranges_of_link_bandwidths_and_replay_factors():
    """A 1e-300 B/s NIC made a 9e305 s step (inf in text, 1.25e308 in JSON); replay factors of 1e-300 printed
    300-digit times and 1e-320 an internal message: both are one-line errors naming the value's range."""
    ddp = ROOT / "traces" / "samples" / "cpu-gloo-ddp"
    for args, needle in ((["topology", "dgx-h100", "--gpus", "16", "--set", "nic_bandwidth=1e-300"], "1 MB/s to 1 PB/s"),
                         (["topology", "dgx-h100", "--gpus", "16", "--set", "nic_bandwidth=1e20"], "1 MB/s to 1 PB/s"),
                         (["replay", ddp, "--scale-compute", "1e-300"], "from 1e-6 to 1e6"),
                         (["replay", ddp, "--scale-bandwidth", "1e-320"], "from 1e-6 to 1e6")):
        rc, _, err = run_cli(args)
        assert needle in assert_one_line_error(rc, err), args


def test_compare_refuses_a_command_line_option_every_variant_overrides(tmp_path):
    """`compare -c FILE --tp 8` where each variant sets its own tp (and --virtual-stages beside --schedules
    without interleaved) ran without the option and without a word; --memory-limit applies to zb-auto alone."""
    import json
    (tmp_path / "c.yaml").write_text("base: {cluster: dgx-h100, gpus: 8, model: tiny, global_batch: 8}\n"
                                     "variants:\n  a: {tp: 2}\n  b: {tp: 4}\n")
    base = ["compare", "-m", "tiny", "--gpus", "8", "--pp", "2"]
    for args, needle in ((["compare", "-c", tmp_path / "c.yaml", "--tp", "8"], "every variant (a, b) sets its own tp"),
                         (base + ["--global-batch", "8", "--schedules", "1f1b,gpipe", "--virtual-stages", "2"],
                          "every other schedule with one"),
                         (base + ["--global-batch", "8", "--schedules", "interleaved", "--virtual-stages", "1"],
                          "more than one virtual stage")):
        rc, _, err = run_cli(args)
        assert needle in assert_one_line_error(rc, err), args
    rc, out, err = run_cli(["compare", "-c", tmp_path / "c.yaml", "--tp", "2", "--json"])     # a's own value: fine
    assert rc == 0, err
    rc, out, err = run_cli(base + ["--global-batch", "16", "--schedules", "zb-auto,1f1b", "--memory-limit", "40GB",
                                   "--json"])
    assert rc == 0, err
    assert [p["name"] for p in json.loads(out)["plans"]] == ["zb-auto", "1f1b"]


def test_second_hunt_messages_and_files(tmp_path):
    """A compare variant's error names it once; plan reads a cluster file as simulate does; topology's
    --concurrent with a group of every rank is refused (it ran "with 0 concurrent copies"); collect's
    --max-bytes takes units and refuses nonsense before launching anything."""
    import json
    (tmp_path / "c.yaml").write_text("base: {cluster: dgx-h100, gpus: 8, model: tiny, global_batch: 8}\n"
                                     "variants:\n  a: {tp: 2, no_such_option: 1}\n")
    rc, _, err = run_cli(["compare", "-c", tmp_path / "c.yaml"])
    line = assert_one_line_error(rc, err)
    assert line.count("variant 'a'") == 1, line
    rc, out, err = run_cli(["plan", "-m", "tiny", "--cluster", ROOT / "validation" / "clusters" / "dgx-h100-1.yaml",
                            "--gpus", "1", "--json"])
    assert rc == 0 and json.loads(out)["device_memory_bytes"] > 80e9, err
    rc, _, err = run_cli(["topology", "dgx-h100", "--gpus", "16", "--collective", "all_reduce", "--network", "flow",
                          "--concurrent"])
    assert "leaves no room for a copy" in assert_one_line_error(rc, err)
    rc, _, err = run_cli(["collect", "--bench", "collectives", "--max-bytes", "1XB", "--out", tmp_path / "b"])
    assert rc == 2 and "--max-bytes" in err and not (tmp_path / "b").exists()
    for args, needle in ((["--strategy", "ddp", "--experts", "4", "--top-k", "2"], "--experts, --top-k apply to"),
                         (["--strategy", "tp", "--microbatches", "3"], "--microbatches applies to"),
                         (["--bench", "layers", "--max-bytes", "1GB"], "--max-bytes applies to --bench collectives"),
                         (["--strategy", "ddp", "--timeout", "0"], "--timeout is the seconds"),         # "exit -9"
                         (["--bench", "collectives", "--size-factor", "1"], "at least 2"),     # after 5 header lines
                         # refused after torchrun had started (3.8 s, --out and collect.log written)
                         (["--strategy", "ddp", "--steps", "1"], "--steps must be >= 3"),
                         (["--strategy", "ddp", "--steps", "5", "--active", "4"], "--active must be in 1..steps-2")):
        rc, _, err = run_cli(["collect", *args, "--out", tmp_path / "c"])     # the manifest recorded experts: 0
        assert needle in assert_one_line_error(rc, err), args
    assert not (tmp_path / "c").exists()
    rc, _, err = run_cli(["plan", "--params", "7e9", "--dp", "8", "--hbm-gb", "1e300"])     # blamed --params
    assert "--hbm-gb must be a number of GB" in assert_one_line_error(rc, err)


def test_validate_notes_a_tp_overlap_no_selected_row_can_use():
    rc, out, err = run_cli(["validate", "--ids", "1", "--tp-comm-overlap", "--json"])     # MaxText FSDP, tp 1
    assert rc == 0 and "none of the selected rows does: it changed nothing" in err


def test_third_hunt_cluster_settings_and_models_that_cannot_be(tmp_path):
    """From a third CLI hunt: a cluster setting beyond a switch's ports ran past a minute at 4 GB (leaf_down
    1e7); empty, non-numeric or misplaced settings and an accelerator given as a mapping crashed (exit 3); an
    MoE model with no expert layer ran dense without a word; an empty --memory-limit was read as none."""
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("accelerator: {peak_bf16: 1.0e+15, hbm: 8.0e+10}\ngpus_per_node: 8\n"
                         "domain: {kind: nvswitch}\n")
    gpus_file = tmp_path / "g.yaml"
    gpus_file.write_text("accelerator: H100-SXM\ngpus_per_node: 8\ngpus: {default: 16, bogus: 1}\n"
                         "domain: {kind: nvswitch}\n")
    for args, needle in (
            (["topology", "dgx-h100", "--gpus", "64", "--set", "leaf_down=1e7"], "leaf_down must be positive and at most 4096"),
            (["topology", "dgx-h100", "--gpus", "64", "--set", "oversubscription="], "oversubscription must be a number, got nothing"),
            (["topology", "dgx-h100", "--gpus", "64", "--set", "nics_per_node="], "nics_per_node must be an integer, got nothing"),
            (["topology", "dgx-h100", "--gpus", "64", "--set", "placement=nan"], "placement must be a list of GPU indices"),
            (["topology", "dgx-h100", "--gpus", "64", "--set", "accelerator=[1]"], "accelerator must be a device preset name"),
            (["topology", "dgx-h100", "--gpus", "64", "--set", "gpus=16"], "--set gpus=...: give --gpus N"),
            (["topology", "dgx-h100", "--gpus", "64", "--set", "preset=dgx-a100"], "give the preset as the argument"),
            (["topology", str(yaml_file), "--gpus", "8"], "accelerator must be a device preset name"),
            (["topology", "dgx-h100", "--gpus", "64", "--set", "dims=[1]"], "domain dims applies to torus domains"),
            (["topology", "pcie-ethernet-lab", "--set", "sharp=true"], "domain sharp applies to nvswitch and nvl72"),
            (["topology", str(gpus_file)], "unknown gpus key(s) ['bogus']"),
            (["topology", "dgx-h100", "--gpus", "16", "--collective", "all_reduce", "--ranks", ""], "--ranks is empty"),
            (["simulate", "-m", "tiny-moe", "--gpus", "8", "--ep", "2", "--moe-layer-every", "5"], "no layer would have experts"),
            (["simulate", "-m", "tiny", "--gpus", "8", "--pp", "2", "--schedule", "zb-auto", "--memory-limit", ""],
             "--memory-limit is empty"),
    ):
        rc, _, err = run_cli(args)
        assert needle in assert_one_line_error(rc, err), args


def test_faults_that_change_nothing_are_noted():
    """A seed with nothing random, a straggler factor of 1 and a distribution of factors of 1 ran without a word."""
    for extra, needle in ((["--seed", "5"], "seed 5 draws nothing"),
                          (["--straggler", "1:1"], "straggler factor 1 on rank(s) 1"),
                          (["--straggler-dist", "lognormal:0"], "draws only factors of 1")):
        rc, out, err = run_cli(["simulate", "-m", "tiny", "--gpus", "8", "--tp", "2", "--json", *extra])
        assert rc == 0, err
        assert any(needle in n for n in json.loads(out)["notes"]), extra
    rc, out, _ = run_cli(["simulate", "-m", "tiny", "--gpus", "8", "--tp", "2", "--json", "--seed", "5", "--jitter", "0.1",
                          "--mode", "full"])
    assert rc == 0 and not any("draws nothing" in n for n in json.loads(out)["notes"])


def test_lora_adapters_wider_than_the_model_are_noted():
    rc, out, err = run_cli(["simulate", "-m", "llama3-8b", "--gpus", "8", "--seq", "4096", "--global-batch", "16",
                            "--lora-rank", "4096", "--lora-targets", "qkv,proj,fc1,fc2", "--json"])
    assert rc == 0, err
    assert any("the adapters outnumber the model's own parameters" in n for n in json.loads(out)["notes"])
