import json

import pytest

from clustersim.cli import main
from clustersim.topology import parse_ranks, tile_group


def run(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_describe(capsys):
    code, out, _ = run(capsys, "topology", "dgx-h100", "--gpus", "64")
    assert code == 0 and "64 x H100-SXM" in out and "bisection" in out and "1,600.0 GB/s" in out
    code, out, _ = run(capsys, "topology", "tpu-v5p", "--gpus", "64", "--json")
    d = json.loads(out)
    assert d["domain"]["dims"] == [4, 4, 4] and d["devices"] == 64


def test_bandwidth_table_json_follows_nccl_tests(capsys):
    code, out, _ = run(capsys, "topology", "dgx-h100", "--gpus", "16", "--collective", "all_reduce",
                       "--ranks", "0-7", "--json")
    rows = json.loads(out)
    assert code == 0 and rows[0]["size_bytes"] == 1024 and rows[-1]["size_bytes"] == 4 * 1024**3
    assert len(rows) == 23
    for r in rows:
        assert set(r) == {"size_bytes", "time_s", "algbw_GBps", "busbw_GBps", "algorithm", "protocol"}
        assert r["algbw_GBps"] == pytest.approx(r["size_bytes"] / r["time_s"] / 1e9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 2 * 7 / 8)
    code, out, _ = run(capsys, "topology", "dgx-h100", "--gpus", "16", "--collective", "all_gather",
                       "--ranks", "0-7", "--json", "--network", "flow", "--max-bytes", "65536")
    for r in json.loads(out):
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 7 / 8)


def test_nccl_version_lets_that_release_pick(capsys):
    """6 of 8 B200 at 4 GiB: NCCL 2.27.7's tuner picks NVLS (as the published GPU-count sweep says it did); the
    newest model picks the ring."""
    args = ["topology", "dgx-b200", "--gpus", "8", "--collective", "all_reduce", "--ranks", "0-5", "--json",
            "--min-bytes", str(4 * 2**30), "--max-bytes", str(4 * 2**30)]
    _, newest, _ = run(capsys, *args)
    _, old, _ = run(capsys, *args, "--nccl-version", "2.27.7")
    assert json.loads(newest)[0]["algorithm"] == "ring" and json.loads(old)[0]["algorithm"] == "nvls"


def test_sizes_take_units_and_forced_algorithms_say_where_they_do_not_apply(capsys):
    """--min-bytes / --max-bytes read 4KiB, 1MB, 1e6 (SI units: 1 MB = 1e6 B); a forced algorithm that cannot run
    the group (NVLS across two nodes, a tree all-gather) is noted, not silently replaced; a point-to-point
    transfer refuses --algorithm and --protocol."""
    base = ["topology", "dgx-h100", "--gpus", "16", "--collective", "all_gather", "--json"]
    _, out, _ = run(capsys, *base, "--min-bytes", "4KiB", "--max-bytes", "1e6")
    sizes = [r["size_bytes"] for r in json.loads(out)]
    assert sizes[0] == 4096 and sizes[-1] <= 1e6 and sizes[-1] * 2 > 1e6
    _, out, _ = run(capsys, *base, "--min-bytes", "1MB", "--max-bytes", "1MB")
    assert [r["size_bytes"] for r in json.loads(out)] == [10**6]
    _, out, _ = run(capsys, *base, "--min-bytes", "4.1MB", "--max-bytes", "999999999999999")
    rows = json.loads(out)
    assert rows[0]["size_bytes"] == 4_100_000 and rows[-1]["size_bytes"] <= 999999999999999
    for bad in ("1.5B", "4XB", "-1KB", "0"):
        code, _, err = run(capsys, *base, "--max-bytes", bad)
        assert code == 2 and "--max-bytes" in err
    code, out, err = run(capsys, *base, "--algorithm", "tree", "--max-bytes", "65536")
    assert code == 0 and json.loads(out)[0]["algorithm"] == "ring"
    assert "--algorithm tree applies to none of this run's collectives (all_gather)" in err
    code, out, _ = run(capsys, "topology", "dgx-h100", "--gpus", "16", "--collective", "all_reduce",
                       "--algorithm", "nvls", "--max-bytes", "65536")
    assert code == 0 and "note: --algorithm nvls applies to none" in out
    code, out, _ = run(capsys, "topology", "dgx-h100", "--gpus", "16", "--collective", "all_reduce", "--ranks",
                       "0-7", "--algorithm", "nvls", "--max-bytes", "65536")
    assert code == 0 and "note:" not in out and "nvls" in out
    for forced in (["--algorithm", "ring"], ["--protocol", "ll"]):
        code, _, err = run(capsys, "topology", "dgx-h100", "--gpus", "16", "--collective", "p2p", "--ranks", "0,8",
                           *forced)
        assert code == 2 and "point-to-point transfer has neither" in err


def test_flow_concurrent_oversubscribed(capsys):
    args = ["topology", "dgx-h100", "--gpus", "64", "--collective", "all_reduce", "--ranks", "0-63:8", "--json",
            "--network", "flow", "--min-bytes", str(2**30), "--max-bytes", str(2**30), "--set", "tiers=2",
            "--set", "leaf_down=16", "--set", "rail_optimised=false", "--set", "oversubscription=4"]
    _, alone, _ = run(capsys, *args)
    _, conc, _ = run(capsys, *args, "--concurrent")
    assert json.loads(conc)[0]["time_s"] > 1.8 * json.loads(alone)[0]["time_s"]


def test_draw(capsys, tmp_path):
    png = tmp_path / "lab.png"
    code, out, _ = run(capsys, "topology", "pcie-ethernet-lab", "--draw", str(png))
    assert code == 0 and png.stat().st_size > 1000
    code, _, err = run(capsys, "topology", "dgx-h100", "--gpus", "1024", "--draw", str(tmp_path / "big.png"))
    assert code == 2 and "too many to draw" in err


@pytest.mark.parametrize("args,msg", [
    (["topology", "nope"], "known: cloudmatrix-384"),
    (["topology", "dgx-h100", "--gpus", "12"], "multiple of 8"),
    (["topology", "dgx-h100", "--gpus", "16", "--collective", "all_reduce", "--ranks", "0-20"], "leaves the world"),
    # refused before it is listed (it took 36 s and 10 GB)
    (["topology", "dgx-h100", "--gpus", "16", "--collective", "all_reduce", "--ranks", "0-100000000"],
     "range 0-100000000 leaves the world of 16 ranks"),
    (["topology", "dgx-h100", "--gpus", "16", "--collective", "all_reduce", "--ranks", "0,20"], "outside the world"),
    (["topology", "dgx-h100", "--gpus", "16", "--collective", "all_reduce", "--ranks", "0-16:8"], "leaves the world"),
    (["topology", "dgx-h100", "--gpus", "16", "--collective", "p2p", "--ranks", "0-3"], "exactly two"),
    (["topology", "dgx-h100", "--set", "nic_bandwidth=0"], "positive"),
    (["topology", "dgx-h100", "--set", "bogus=1"], "unknown override"),
    (["topology", "dgx-h100", "--set", "leaf_down=abc"], "leaf_down must be an integer"),
    (["topology", "dgx-h100", "--set", "rail_optimised=maybe"], "true or false"),
    (["topology", "tpu-v5p", "--set", "dims=[4, x]"], "torus dims"),
    (["topology", "dgx-h100", "--set", "tiers=4"], "tiers must be 2 or 3"),
    (["topology", "dgx-h100", "--collective", "all_reduce", "--nccl-version", "2.9.1"], "from 2.18 on"),
    (["topology", "dgx-h100", "--collective", "all_reduce", "--nccl-version", "latest"], "expected a release number"),
    # read loosely before (the first digits found): 'banana2.19!!' ran as 2.19
    (["topology", "dgx-h100", "--collective", "all_reduce", "--nccl-version", "banana2.19!!"],
     "expected a release number X.Y or X.Y.Z"),
    (["topology", "dgx-h100", "--collective", "all_reduce", "--nccl-version", "2.18.3.1"], "expected a release"),
    (["topology", "dgx-h100", "--collective", "all_reduce", "--nccl-version", "99.99.99"], "NCCL 2 releases"),
])
def test_errors(capsys, args, msg):
    code, _, err = run(capsys, *args)
    assert code == 2 and err.startswith("error:") and msg in err


def test_parse_ranks_and_tiling():
    assert parse_ranks("0-3,8", 16) == (0, 1, 2, 3, 8)
    assert parse_ranks("0-15:4", 16) == (0, 4, 8, 12)
    assert tile_group((0, 1, 2, 3), 16) == ((4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15))
    assert tile_group((0, 8), 16) == tuple((i, i + 8) for i in range(1, 8))


def test_list(capsys):
    code, out, _ = run(capsys, "topology", "--list")
    assert code == 0 and "dgx-h100" in out and "tpu-v5p" in out
    code, out, _ = run(capsys, "topology", "--list", "--json")
    assert [r["name"] for r in json.loads(out)][:2] == ["cloudmatrix-384", "dgx-a100"]
    code, _, err = run(capsys, "topology")
    assert code == 2 and "--list" in err


def test_a_cluster_latency_that_nccl_priced_collectives_do_not_take_is_noted(capsys, tmp_path):
    """fabric.latency of 1 ms per hop: a point-to-point transfer across nodes takes it (two hops, > 2 ms), NCCL's
    all-reduce keeps its own tuned latency (microseconds) and says so; a forced route-level algorithm takes it."""
    path = tmp_path / "slow.yaml"
    path.write_text("name: slow\naccelerator: H100-SXM\ngpus: 16\ngpus_per_node: 8\ndomain: {kind: nvswitch}\n"
                    "fabric: {tiers: 2, latency: 0.001}\n")
    base = ["topology", str(path), "--ranks", "0,8", "--max-bytes", "1024", "--json"]
    assert main(base + ["--collective", "p2p"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)[-1]["time_s"] > 2e-3 and "note:" not in captured.err
    assert main(base + ["--collective", "all_reduce"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)[-1]["time_s"] < 1e-4
    assert "note: fabric.latency 0.001 s per hop price point-to-point transfers" in captured.err
    assert main(base[:2] + ["--ranks", "0-15"] + base[4:] + ["--collective", "all_reduce", "--algorithm",
                                                            "hierarchical"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)[-1]["time_s"] > 2e-3 and "fabric.latency" not in captured.err
    # where it cannot run (two ranks), NCCL's own choice prices the group, as without --algorithm, and the note
    # about the latency returns (it had fallen to the fastest route-level algorithm: 4 ms)
    assert main(base + ["--collective", "all_reduce", "--algorithm", "hierarchical"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)[-1]["time_s"] < 1e-4 and "note: fabric.latency" in captured.err
    # simulate notes it too; a preset (no latency of its own) does not
    assert main(["simulate", "--cluster", str(path), "--model", "llama3-8b", "--tp", "8", "--dp", "2", "--seq", "1024",
                 "--global-batch", "2", "--json"]) == 0
    assert any(n.startswith("fabric.latency 0.001 s") for n in json.loads(capsys.readouterr().out)["notes"])
    assert main(["simulate", "--cluster", "dgx-h100", "--gpus", "16", "--model", "llama3-8b", "--tp", "8", "--dp", "2",
                 "--seq", "1024", "--global-batch", "2", "--json"]) == 0
    assert not any("latency" in n for n in json.loads(capsys.readouterr().out)["notes"])


def test_a_placement_of_fewer_ranks_than_devices_is_noted(capsys, tmp_path):
    """--gpus 16 with a placement of two ranks ran two ranks without a word (the header said x 2 GPUs)."""
    path = tmp_path / "two.yaml"
    path.write_text("preset: dgx-h100\ngpus: 16\nplacement: [0, 8]\n")
    assert main(["simulate", "--cluster", str(path), "--gpus", "16", "--layers", "2", "--hidden", "256", "--heads",
                 "4", "--global-batch", "16", "--seq", "512", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["world_size"] == 2
    assert "the cluster's placement lists 2 rank(s) on its 16 devices: 2 rank(s) run" in d["notes"][0]


@pytest.mark.parametrize("value", ["", "[1,2]"])
def test_a_cluster_name_that_is_no_text_is_refused(capsys, value):
    """--set name= had printed the header 'None: DGX H100 nodes ...'."""
    assert main(["topology", "dgx-h100", "--gpus", "16", "--set", f"name={value}"]) == 2
    assert "name must be a non-empty string" in capsys.readouterr().err


def test_a_forced_algorithm_that_applies_nowhere_changes_nothing(capsys):
    """--algorithm torus on an NVSwitch cluster runs nowhere; the groups had been priced by the fastest
    route-level algorithm (a faster step than without the option) while the note said NCCL's choice priced them."""
    base = ["simulate", "-m", "llama3-8b", "--gpus", "16", "--tp", "2", "--seq", "1024", "--global-batch", "16",
            "--json"]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(base + ["--algorithm", "torus"]) == 0
    forced = json.loads(capsys.readouterr().out)
    assert forced["step_time_s"] == plain["step_time_s"]
    assert any("--algorithm torus applies to none" in n for n in forced["notes"])


def test_a_forced_algorithm_and_protocol_that_cannot_run_fall_back_together(capsys):
    """A route-level --algorithm that cannot run, beside a --protocol that cannot either, fell to the fastest
    route-level algorithm (157 us) where no --algorithm falls back to NCCL's default (242 us)."""
    base = ["topology", "pcie-ethernet-lab", "--gpus", "8", "--collective", "all_reduce", "--protocol", "ll128",
            "--min-bytes", "1MB", "--max-bytes", "1MB", "--json"]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(base + ["--algorithm", "torus"]) == 0
    assert json.loads(capsys.readouterr().out) == plain


def test_a_strided_range_whose_members_all_lie_in_the_world_is_taken(capsys):
    """0-16:15 on 16 ranks names 0 and 15 only: its end (16) is past the world, its members are not."""
    assert main(["topology", "dgx-h100", "--gpus", "16", "--collective", "all_reduce", "--ranks", "0-16:15",
                 "--max-bytes", "1024"]) == 0
    assert "over 2 ranks [0,15]" in capsys.readouterr().out
