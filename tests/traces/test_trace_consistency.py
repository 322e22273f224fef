"""Traces whose metadata or step events cannot be one run's are refused naming the file (the replay of them
printed predictions off by 10^13 %): a clock base on some ranks only, a step of infinite length, one step
profiled twice, a manifest whose world size the traces contradict, ranks whose clocks disagree."""
import gzip
import json
import re
from pathlib import Path

import pytest

from simulator.errors import TraceError
from traces.replay import replay

DDP = Path(__file__).resolve().parents[2] / "traces" / "samples" / "cpu-gloo-ddp"


def _copy(tmp_path, edit_rank1=None, manifest=None):
    for name in ("manifest.json", "rank0.json.gz", "rank1.json.gz"):
        data = (DDP / name).read_bytes()
        if name == "rank1.json.gz" and edit_rank1:
            trace = json.loads(gzip.decompress(data))
            edit_rank1(trace)
            data = gzip.compress(json.dumps(trace).encode())
        if name == "manifest.json" and manifest:
            m = json.loads(data)
            m.update(manifest)
            data = json.dumps(m).encode()
        (tmp_path / name).write_bytes(data)
    return tmp_path


def _steps(trace):
    return [e for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep")
            and e.get("ph") == "X"]


def test_a_clock_base_on_some_ranks_only_is_refused(tmp_path):
    def drop_base(t):
        t.pop("baseTimeNanoseconds", None)
    with pytest.raises(TraceError, match=r"rank1\.json\.gz: no valid baseTimeNanoseconds"):
        replay(_copy(tmp_path, drop_base))


def test_a_step_of_infinite_length_is_refused(tmp_path):
    def endless(t):
        _steps(t)[0]["dur"] = 1e308
    with pytest.raises(TraceError, match=r"rank1\.json\.gz: step event 'ProfilerStep#\d+' has no usable duration"):
        replay(_copy(tmp_path, endless))


def test_one_step_profiled_twice_is_refused(tmp_path):
    def twice(t):
        s = _steps(t)
        s[1]["name"] = s[0]["name"]
    with pytest.raises(TraceError, match=r"two ProfilerStep#\d+ events on one rank"):
        replay(_copy(tmp_path, twice))


def test_a_manifest_the_traces_contradict_is_refused(tmp_path):
    with pytest.raises(TraceError, match="manifest.json says world_size 3 but the traces' distributedInfo says 2"):
        replay(_copy(tmp_path, manifest={"world_size": 3}))
    assert replay(_copy(tmp_path))["measured_step_time_s"] > 0        # the untouched copy replays


def test_a_rank_without_profiled_steps_is_noted(tmp_path):
    """A rank whose trace has no ProfilerStep events vanished from the per-rank table while the header counted
    it; the replay says so."""
    def no_steps(t):
        t["traceEvents"] = [e for e in t["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep")]
    out = replay(_copy(tmp_path, no_steps))
    assert [r["rank"] for r in out["per_rank"]] == [0]
    assert any("rank(s) 1 have no complete profiled step" in n for n in out["notes"]), out["notes"]


@pytest.mark.parametrize("shift_us", [-5e12, 1e9])
def test_ranks_whose_clocks_disagree_are_refused(tmp_path, shift_us):
    """Rank 1's timestamps moved far from rank 0's (negative, or 1,000 s later) under one clock base: the replay
    started one rank that far after the other (predictions off by 10^10 %). A skew within a step is fine."""
    def shift(t):
        for e in t["traceEvents"]:
            if "ts" in e:
                e["ts"] = e["ts"] + shift_us
    (tmp_path / "far").mkdir()
    with pytest.raises(TraceError, match=r"the ranks' clocks disagree: ProfilerStep#2 starts on rank [01] "
                                         r"[\d.e+]+ ms after rank [01], longer than the whole profiled window"):
        replay(_copy(tmp_path / "far", shift))

    def skew(t):        # a CPU running ahead of another's (asynchronous CUDA): 20 ms, more than one 15-ms step
        for e in t["traceEvents"]:
            if "ts" in e:
                e["ts"] = e["ts"] + 20000.0
    (tmp_path / "near").mkdir()
    assert replay(_copy(tmp_path / "near", skew)) is not None


@pytest.mark.parametrize("name", ["ProfilerStep#abc", "ProfilerStep#-2", "ProfilerStep"])
def test_a_step_event_without_a_number_is_refused(tmp_path, name):
    """Unnumbered step events had all become one step -1 (two of them merged, one dropped without a word)."""
    def unnumbered(t):
        for s in _steps(t):
            s["name"] = name
    with pytest.raises(TraceError, match=rf"rank1\.json\.gz: step event '{re.escape(name)}' has no step number"):
        replay(_copy(tmp_path, unnumbered))


def test_a_manifest_naming_other_profiled_steps_is_refused(tmp_path):
    """The traces hold steps 2 and 3; a manifest saying 7 and 8 were profiled is another run's (it was accepted)."""
    with pytest.raises(TraceError, match="manifest.json says steps 7-8 were profiled but the traces hold steps 2-3"):
        replay(_copy(tmp_path, manifest={"profiler": {"profiled_steps": [7, 8]}}))
    assert replay(_copy(tmp_path, manifest={"profiler": {"profiled_steps": [1, 2, 3]}})) is not None
