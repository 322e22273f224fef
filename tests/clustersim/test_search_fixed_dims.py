"""Issue 18 item 10: search accepts fixed dimensions (--tp 8, --pp 16)."""
from clustersim.cli import main
from clustersim.experiment import Experiment, resolve_model
from clustersim.search import SearchSpace, enumerate_candidates


def test_fixed_tp_and_pp_restrict_the_candidates():
    base = Experiment(cluster="dgx-h100", gpus=256, model="llama3-70b", global_batch=256, seq=4096)
    model = resolve_model(base)
    free = enumerate_candidates(base, model, 256, SearchSpace())
    fixed = enumerate_candidates(base, model, 256, SearchSpace(tp=(8,), pp=(16,)))
    assert fixed and {(e.tp, e.pp) for e in fixed} == {(8, 16)}
    assert {e.tp for e in free} > {8} and set(map(id, fixed)).isdisjoint(map(id, free))
    assert len(fixed) == sum(1 for e in free if (e.tp, e.pp) == (8, 16))
    odd = enumerate_candidates(base, model, 256, SearchSpace(tp=(8,), pp=(32,)))   # above the default max_pp
    assert odd and {e.pp for e in odd} == {32}


def test_cli_rejects_fixed_degrees_that_do_not_divide(capsys):
    assert main(["search", "--cluster", "dgx-h100", "--gpus", "64", "--model", "llama3-8b", "--global-batch", "64",
                 "--tp", "7", "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --tp:") and "Traceback" not in err


def test_cli_rejects_empty_lists(capsys):
    """An empty --schedules or --recompute had searched nothing and blamed the cluster ("try more GPUs"); an
    empty --tp / --pp / --ep had been read as unset while an empty --cp was an error."""
    base = ["search", "--cluster", "dgx-h100", "--gpus", "16", "--model", "llama3-8b", "--global-batch", "16",
            "--no-cache"]
    for opt, value, said in (("--schedules", "", "--schedules: no value given"),
                             ("--recompute", ",", "--recompute: no value given"),
                             ("--tp", "", "--tp: expected integers"), ("--ep", " ", "--ep: expected integers")):
        assert main(base + [opt, value]) == 2
        assert said in capsys.readouterr().err


def test_repeated_list_values_count_once(capsys):
    """--micro-batches 1,1 listed every plan twice (60 candidates, each twice in the top k)."""
    base = ["search", "--cluster", "dgx-h100", "--gpus", "8", "--model", "llama3-8b", "--global-batch", "16",
            "--seq", "1024", "--no-cache", "--workers", "1", "--cp", "1", "--zero", "1", "--json"]
    import json
    assert main(base + ["--micro-batches", "1", "--schedules", "1f1b"]) == 0
    once = json.loads(capsys.readouterr().out)
    assert main(base + ["--micro-batches", "1,1", "--schedules", "1f1b,1f1b", "--zero", "1,1"]) == 0
    twice = json.loads(capsys.readouterr().out)
    assert twice["stats"]["candidates"] == once["stats"]["candidates"] == 30 and twice["stats"]["cached"] == 0
    assert [r["step_time_s"] for r in twice["top"]] == [r["step_time_s"] for r in once["top"]]


def test_small_things_search_and_topology_say(capsys):
    """The top-k title said 'top 100000 plans' over 30; a tiny memory fraction read '0 GB (0% of the device's)';
    topology --list --draw drew nothing without a word."""
    base = ["search", "--cluster", "dgx-h100", "--gpus", "8", "--model", "llama3-8b", "--global-batch", "16",
            "--seq", "1024", "--no-cache", "--workers", "1"]
    assert main(base + ["--top-k", "100000", "--cp", "1", "--zero", "1", "--micro-batches", "1",
                        "--schedules", "1f1b"]) == 0
    assert "top 30 plans" in capsys.readouterr().out
    assert main(base + ["--max-memory-fraction", "1e-9"]) == 2
    assert "do not fit in 8.55e-08 GB (1e-09 of the device's memory)" in capsys.readouterr().err
    assert main(["topology", "--list", "--draw", "x.png"]) == 2
    assert "--list lists the presets and draws nothing" in capsys.readouterr().err
