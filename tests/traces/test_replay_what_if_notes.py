"""Issue 18 item 4: a communication what-if on a trace whose collectives have no peers says it changes
nothing, and what-if output calls the difference a change, not an error."""
from pathlib import Path

from click.testing import CliRunner

from clustersim.replay import replay as replay_cmd
from traces.replay import replay

DDP = Path(__file__).resolve().parents[2] / "traces" / "samples" / "cpu-gloo-ddp"


def test_peerless_what_if_says_it_changes_nothing():
    one = replay(DDP / "rank0.json.gz", scale_bandwidth=2.0)
    assert one["predicted_step_time_s"] == one["measured_step_time_s"]
    assert any("no peers in the trace (1 of 2 ranks recorded)" in n for n in one["notes"])
    assert any("changes nothing" in n for n in one["notes"])
    both = replay(DDP, scale_bandwidth=2.0)
    assert both["predicted_step_time_s"] < both["measured_step_time_s"] and both["notes"] == []
    plain = replay(DDP / "rank0.json.gz")          # no what-if: the measured times are the point
    assert not any("changes nothing" in n for n in plain["notes"])


def test_cli_column_is_change_in_what_if_mode_and_error_otherwise():
    r = CliRunner().invoke(replay_cmd, [str(DDP / "rank0.json.gz"), "--scale-bandwidth", "2"])
    assert r.exit_code == 0, r.output
    header = next(line for line in r.output.splitlines() if "measured (ms)" in line)
    assert header.split()[-1] == "change" and "note: the communication what-if changes nothing" in r.output
    r = CliRunner().invoke(replay_cmd, [str(DDP)])
    header = next(line for line in r.output.splitlines() if "measured (ms)" in line)
    assert header.split()[-1] == "error"


def test_negative_durations_are_counted_in_the_notes(tmp_path):
    """A negative "dur" (clock glitch, edited file) is read as 0 s, and replay says so instead of silently
    replaying the repaired trace."""
    import gzip
    import json
    for name in ("manifest.json", "rank0.json.gz", "rank1.json.gz"):
        data = (DDP / name).read_bytes()
        if name == "rank1.json.gz":
            trace = json.loads(gzip.decompress(data))
            kernels = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("dur", 0) > 0
                       and not str(e.get("name", "")).startswith("ProfilerStep")]
            for e in kernels[:3]:
                e["dur"] = -e["dur"]
            data = gzip.compress(json.dumps(trace).encode())
        (tmp_path / name).write_bytes(data)
    notes = replay(tmp_path)["notes"]
    assert any("3 event(s) with a negative or unreadable duration read as 0 s (rank1.json.gz: 3)" in n
               for n in notes), notes
    assert not any("negative duration" in n for n in replay(DDP)["notes"])


REAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces" / "real-gpu"


def test_a_compute_what_if_that_cannot_move_a_host_bound_step_says_why():
    """One rank of an 8-GPU recommendation job (HTA's test data): its kernels run far shorter than the CPU's
    launch and framework time, so 100x faster kernels leave the step as it was; the replay says so."""
    import pytest
    trace = REAL / "a100_recsys_rank3_of8.json.gz"
    if not trace.exists():
        pytest.skip("../shared/traces/real-gpu is not beside this checkout")
    fast = replay(trace, scale_compute=100.0)
    assert abs(fast["error"]) < 0.005
    assert any("ran 100x faster, yet the replayed step moved by less than 0.5%" in n for n in fast["notes"])
    for other in (replay(trace), replay(trace, scale_compute=0.5),      # no what-if; slower kernels
                  replay(DDP, scale_compute=2.0)):                      # a CPU trace's compute is the step
        assert not any("GPU kernels ran" in n for n in other["notes"])
