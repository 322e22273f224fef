"""Chakra ET reader/writer and ``clustersim chakra`` against ASTRA-sim's own outputs and our simulate."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.cli import main
from simulator.errors import TraceError
from traces.chakra import schema as S
from traces.chakra.reader import load_programs, parse_et
from traces.chakra.wire import decode, delimited, encode

DATA = Path(__file__).resolve().parents[3] / "shared" / "chakra"
if not DATA.is_dir():
    DATA = Path("/work/shared/chakra")
EX = DATA / "astra-sim-examples"
needs_data = pytest.mark.skipif(not EX.is_dir(), reason="shared Chakra test data not present")


def _rows():
    if not (DATA / "astra_sim_reference.csv").is_file():
        return []
    with open(DATA / "astra_sim_reference.csv") as f:
        return list(csv.DictReader(f))


def _cli_json(capsys, args) -> dict:
    rc = main(args + ["--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    return json.loads(out)


@needs_data
@pytest.mark.parametrize("row", _rows(), ids=lambda r: f"{r['collective']}-{r['npus']}-{r['network_file']}")
def test_astra_sim_reference_row(row, capsys):
    """Each microbenchmark ET on its network/system reproduces ASTRA-sim's printed cycles (1 cycle = 1 ns)."""
    c, n = row["collective"], row["npus"]
    prefix = EX / "microbenchmarks" / c / f"{n}npus_1MB" / c
    res = _cli_json(capsys, ["chakra", "run", str(prefix), "--network", str(EX / "network" / row["network_file"]),
                             "--system", str(EX / "system" / row["system_file"])])
    ref_ns = int(row["astra_sim_step_ns"])
    assert res["world_size"] == int(n)
    assert abs(res["step_time_s"] * 1e9 - ref_ns) <= 0.01 * ref_ns
    assert round(res["step_time_s"] * 1e9) == ref_ns          # in fact tick-exact
    assert res["exposed_comm_fraction"] == pytest.approx(1.0)
    # flow mode: a collective alone takes its analytical time
    flow = _cli_json(capsys, ["chakra", "run", str(prefix), "--network", str(EX / "network" / row["network_file"]),
                              "--system", str(EX / "system" / row["system_file"]), "--network-mode", "flow"])
    assert flow["step_time_s"] == pytest.approx(res["step_time_s"], rel=1e-9) and flow["network_mode"] == "flow"


@needs_data
def test_real_pytorch_chakra_et_loads_and_simulates(capsys):
    """The ET converted from a PyTorch trace (Chakra's feeder test data): node counts by type, then a run."""
    programs, report = load_programs(DATA / "chakra-tests" / "feeder_chakra")
    assert report.node_types["COMP_NODE"] == 3643
    assert report.node_types["COMM_COLL_NODE"] == 21
    assert report.node_types["COMM_COLL_NODE without comm_type (replayed as measured)"] == 14
    assert report.version == "1.0.1"
    kinds = {}
    for op in programs.ops[0]:
        kinds[(op.kind, op.stream)] = kinds.get((op.kind, op.stream), 0) + 1
    assert kinds == {("compute", "cpu"): 2448, ("compute", "gpu"): 1209, ("collective", "comm"): 7}
    assert report.cycle_deps > 0 and report.missing_deps > 0      # the trace's own inconsistencies, reported
    rc = main(["chakra", "run", str(DATA / "chakra-tests" / "feeder_chakra"), "--network",
               str(EX / "network" / "HGX-H100-validated.yml"), "--system", str(EX / "system" / "HGX-H100-validated.json"),
               "--replicate"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "COMP_NODE 3643" in out and "COMM_COLL_NODE 21" in out
    gpu_busy = sum(op.duration_s or 0 for op in programs.ops[0] if op.stream == "gpu")
    step = float(out.split("step time")[1].split("(")[1].split(" s)")[0])
    assert step >= gpu_busy     # one GPU op at a time: the step holds at least the summed GPU durations


@needs_data
def test_identical_rank_files_form_one_class(tmp_path, capsys):
    """Byte-identical rank files are one symmetric class; the run equals the full run."""
    src = EX / "microbenchmarks" / "all_reduce" / "4npus_1MB" / "all_reduce.0.et"
    data = src.read_bytes()
    for r in range(16):
        (tmp_path / f"w.{r}.et").write_bytes(data)
    (tmp_path / "net.yml").write_text("topology: [ Ring, Switch ]\nnpus_count: [ 4, 4 ]\n"
                                      "bandwidth: [ 50.0, 25.0 ]\nlatency: [ 500.0, 700.0 ]\n")
    programs, report = load_programs(tmp_path / "w", dims=(4, 4))
    assert report.classes == 1 and programs.classes == {0: tuple(range(16))}
    sym = _cli_json(capsys, ["chakra", "run", str(tmp_path / "w"), "--network", str(tmp_path / "net.yml"),
                             "--system", str(EX / "system" / "Ring_4chunks.json")])
    assert sym["mode"] == "symmetric" and sym["events_simulated"] == 1
    out = tmp_path / "report"
    assert main(["chakra", "run", str(tmp_path / "w"), "--network", str(tmp_path / "net.yml"), "--out", str(out)]) == 0
    capsys.readouterr()
    assert {"result.json", "timeline.csv", "trace.json"} <= {p.name for p in out.iterdir()}
    assert json.loads((out / "trace.json").read_text())
    from simulator.engine import run
    from topologies.astra import load_network, load_system
    from topologies.multidim import MultiDimCostModel
    full, _ = load_programs(tmp_path / "w", dims=(4, 4), symmetric=False)
    cost = MultiDimCostModel(load_network(tmp_path / "net.yml"), load_system(EX / "system" / "Ring_4chunks.json"))
    assert run(full, cost).step_time_s == pytest.approx(sym["step_time_s"], rel=1e-12)


@pytest.mark.parametrize("flags", [
    ["--model", "tiny", "--cluster", "dgx-h100", "--gpus", "8"],                                   # DP
    ["--model", "tiny", "--cluster", "dgx-h100", "--gpus", "16", "--tp", "2", "--pp", "2"],         # TP+PP
    ["--model", "tiny-moe", "--cluster", "dgx-h100", "--gpus", "8", "--ep", "4"],                   # EP
], ids=["dp", "tp-pp", "ep"])
def test_export_then_import_gives_simulate_step_time(flags, tmp_path, capsys):
    from simulator.engine import run
    from clustersim.experiment import build_cost_model, experiment_from_options, load_cluster_for, run_experiment
    from click.testing import CliRunner
    from clustersim.cli import cli
    res = CliRunner().invoke(cli, ["chakra", "export", *flags, "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "network.yml").is_file() and (tmp_path / "system.json").is_file()
    # the simulate figure, computed independently
    sim = json.loads(CliRunner().invoke(cli, ["simulate", *flags, "--json"]).output)
    from traces.chakra.writer import load_comm_groups
    programs, report = load_programs(tmp_path / "workload", comm_groups=load_comm_groups(tmp_path / "comm_groups.json"))
    assert not report.unknown_attributes
    opts = dict(zip([f.lstrip("-").replace("-", "_") for f in flags[::2]], flags[1::2]))
    exp = experiment_from_options(**{k: (int(v) if v.isdigit() else v) for k, v in opts.items()})
    cost = build_cost_model(exp, load_cluster_for(exp))
    if hasattr(cost, "bind"):
        cost = cost.bind(programs)
    t = run(programs, cost).step_time_s
    assert t == pytest.approx(sim["step_time_s"], rel=1e-9)
    # the ASTRA-sim configurations it wrote are readable by our loader
    out = capsys.readouterr()
    from topologies.astra import load_network, load_system
    net = load_network(tmp_path / "network.yml")
    assert net.world_size == programs.world_size
    assert load_system(tmp_path / "system.json").roofline_enabled


_attr = st.one_of(
    st.builds(lambda n, v: {"name": n, "int64_val": v}, st.text(max_size=8), st.integers(-2**63, 2**63 - 1)),
    st.builds(lambda n, v: {"name": n, "double_val": v}, st.text(max_size=8), st.floats(allow_nan=False)),
    st.builds(lambda n, v: {"name": n, "bool_list": {"values": v}}, st.text(max_size=8), st.lists(st.booleans(), min_size=1)),
    st.builds(lambda n, v: {"name": n, "string_val": v}, st.text(max_size=8), st.text(min_size=1, max_size=20)),
    st.builds(lambda n, v: {"name": n, "sint64_val": v}, st.text(max_size=8), st.integers(-2**63, 2**63 - 1)),
)
_node = st.fixed_dictionaries({"id": st.integers(1, 2**64 - 1), "name": st.text(min_size=1, max_size=10),
                               "type": st.integers(1, 10), "ctrl_deps": st.lists(st.integers(1, 2**64 - 1), min_size=1),
                               "duration_micros": st.integers(1, 2**40), "attr": st.lists(_attr, min_size=1, max_size=4)})


@settings(max_examples=150, deadline=None)
@given(_node)
def test_wire_round_trip(node):
    """encode then decode is the identity on Node messages (our codec both ways)."""
    assert decode(encode(node, S.SCHEMA, "Node"), S.SCHEMA, "Node") == node


def test_wire_decodes_known_bytes():
    """Hand-assembled protobuf bytes (field 1 varint 150 -> 08 96 01, the protobuf docs' example)."""
    assert decode(bytes([0x08, 0x96, 0x01]), S.SCHEMA, "Node") == {"id": 150}
    # packed repeated ctrl_deps [3, 270]: 22 03 03 8e 02
    assert decode(bytes([0x22, 0x03, 0x03, 0x8E, 0x02]), S.SCHEMA, "Node") == {"ctrl_deps": [3, 270]}
    # an unknown field (number 15, varint) is kept as a number, not dropped
    assert decode(bytes([0x78, 0x01]), S.SCHEMA, "Node") == {"_unknown": [15]}


def test_corrupt_and_truncated_files_name_file_and_node(tmp_path):
    good = delimited(encode({"version": "0.0.4"}, S.SCHEMA, "GlobalMetadata")) + \
        delimited(encode({"id": 1, "name": "a", "type": 4}, S.SCHEMA, "Node"))
    with pytest.raises(TraceError, match=r"x\.et: .*claims"):
        parse_et(good[:-2], "x.et")
    bad = good + delimited(bytes([0x0B]))       # wire type 3 (groups): unsupported
    with pytest.raises(TraceError, match=r"x\.et: node #1"):
        parse_et(bad, "x.et")
    (tmp_path / "w.0.et").write_bytes(good)
    (tmp_path / "w.2.et").write_bytes(good)
    with pytest.raises(TraceError, match="rank 1 is missing"):
        load_programs(tmp_path / "w")
    # two files for one rank (w.2.et and w.02.et) were read as one, whichever the folder listed last
    (tmp_path / "w.1.et").write_bytes(good)
    (tmp_path / "w.02.et").write_bytes(good)
    with pytest.raises(TraceError, match=r"w\.02\.et and w\.2\.et both name rank 2"):
        load_programs(tmp_path / "w")


def test_unknown_attribute_is_reported(tmp_path):
    body = delimited(encode({"version": "0.0.4"}, S.SCHEMA, "GlobalMetadata")) + delimited(encode(
        {"id": 1, "name": "k", "type": 4, "duration_micros": 5, "attr": [S.make_attr("mystery", 3)]}, S.SCHEMA, "Node"))
    (tmp_path / "w.0.et").write_bytes(body)
    body += delimited(encode({"id": 2, "name": "future", "type": 42, "duration_micros": 7}, S.SCHEMA, "Node"))
    (tmp_path / "w.0.et").write_bytes(body)
    programs, report = load_programs(tmp_path / "w")
    assert report.unknown_attributes == {"mystery": 1}
    assert report.node_types["unknown node type 42 (replayed as measured)"] == 1
    assert programs.ops[0][1].duration_s == pytest.approx(7e-6)
    assert any("mystery" in line for line in report.lines())
    assert programs.ops[0][0].duration_s == pytest.approx(5e-6)


@needs_data
@settings(max_examples=120, deadline=None)
@given(st.data())
def test_fuzzed_et_bytes_exit_2_with_one_line(tmp_path_factory, data):
    """Mutated ET bytes: a clean run or ``error: ...`` on one line with exit 2, never a traceback or hang."""
    import contextlib
    import io
    src = (EX / "microbenchmarks" / "all_reduce" / "4npus_1MB" / "all_reduce.0.et").read_bytes()
    blob = bytearray(src)
    for _ in range(data.draw(st.integers(1, 6))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        pos = data.draw(st.integers(0, max(0, len(blob) - 1)))
        if op == "flip" and blob:
            blob[pos] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del blob[pos:]
        else:
            blob[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
    d = tmp_path_factory.mktemp("fz")
    for r in range(4):
        (d / f"w.{r}.et").write_bytes(bytes(blob) if r == 0 else src)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["chakra", "run", str(d / "w"), "--network", str(EX / "network" / "Ring_4npus.yml")])
    msg = err.getvalue()
    assert rc in (0, 2)
    if rc == 2:
        assert msg.startswith("error: ") and msg.count("\n") == 1, msg
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("attr, value", [("cs_duration_s", 1e300), ("cs_flops", 1e308), ("num_ops", 1e30),
                                         ("tensor_size", 1e308), ("duration_micros", 2 ** 62)])
def test_node_figures_beyond_any_real_node_are_refused(tmp_path, attr, value):
    """A node's duration, FLOPs or bytes beyond physical bounds is corrupt: refused naming the attribute (a
    1e300 s duration printed an infinite step and crashed writing the trace)."""
    node = {"id": 1, "name": "k", "type": 4}
    if attr == "duration_micros":
        node["duration_micros"] = int(value)
    else:
        node["attr"] = [S.make_attr(attr, value)]
    body = delimited(encode({"version": "0.0.4"}, S.SCHEMA, "GlobalMetadata")) + \
        delimited(encode(node, S.SCHEMA, "Node"))
    (tmp_path / "w.0.et").write_bytes(body)
    with pytest.raises(TraceError, match=f"{attr} is .*beyond any real node"):
        load_programs(tmp_path / "w")


def test_files_of_headers_alone_are_refused(tmp_path):
    """ETs holding only their GlobalMetadata gave "step time 0 ns" as a result."""
    for r in range(2):
        (tmp_path / f"w.{r}.et").write_bytes(delimited(encode({"version": "0.0.4"}, S.SCHEMA, "GlobalMetadata")))
    with pytest.raises(TraceError, match="no rank file holds a node"):
        load_programs(tmp_path / "w")


def test_replicate_reads_communicator_groups_as_the_npus_it_stands_for(tmp_path, capsys):
    """One rank file of `chakra export` (collectives on named communicators) replicated over the network's NPUs:
    the groups name those NPUs (they had been checked against the one file's rank count and refused), and the
    run equals the run of every rank's file. A communicator that does not hold every NPU cannot be replicated
    (each copy would name it): refused, naming it."""
    def export(gpus, dp, out):
        assert main(["chakra", "export", "--cluster", "dgx-h100", "--gpus", str(gpus), "--model", "llama3-8b",
                     "--tp", "8", "--dp", str(dp), "--seq", "1024", "--global-batch", str(dp), "--layers", "2",
                     "--out", str(out)]) == 0
        capsys.readouterr()
        (out / "one").mkdir()
        shutil.copy(out / "workload.0.et", out / "one" / "w.0.et")
        return ["--network", str(out / "network.yml"), "--system", str(out / "system.json"),
                "--comm-group", str(out / "comm_groups.json")]

    opts = export(8, 1, tmp_path / "tp8")
    every = _cli_json(capsys, ["chakra", "run", str(tmp_path / "tp8" / "workload"), *opts])
    one = _cli_json(capsys, ["chakra", "run", str(tmp_path / "tp8" / "one" / "w"), *opts, "--replicate"])
    assert one["step_time_s"] == every["step_time_s"] and one["world_size"] == 8
    opts = export(16, 2, tmp_path / "tp8dp2")
    assert main(["chakra", "run", str(tmp_path / "tp8dp2" / "one" / "w"), *opts, "--replicate"]) == 2
    assert "runs on communicator '1' [0, 1, 2, 3, 4, 5, 6, 7], which does not hold all 16 NPUs" in \
        capsys.readouterr().err


def test_chakra_outputs_do_not_write_over_a_folder_no_run_wrote(tmp_path, capsys):
    """chakra export and chakra run --out replaced files of a folder no clustersim run wrote (simulate and
    compare refuse it); they now refuse it too unless --force, and take back their own earlier outputs."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "network.yml").write_text("precious")
    export = ["chakra", "export", "--layers", "2", "--hidden", "256", "--heads", "4", "--gpus", "8", "--tp", "2"]
    assert main(export + ["--out", str(mine)]) == 2
    assert "is not empty and holds no earlier clustersim run" in capsys.readouterr().err
    assert (mine / "network.yml").read_text() == "precious"
    ets = tmp_path / "ets"
    assert main(export + ["--out", str(ets)]) == 0 and main(export + ["--out", str(ets), "--prefix", "w"]) == 0
    assert not list(ets.glob("workload.*")) and len(list(ets.glob("w.*.et"))) == 8    # the first export's files went
    run = ["chakra", "run", str(ets / "w"), "--network", str(ets / "network.yml"), "--comm-group",
           str(ets / "comm_groups.json")]
    assert main(run + ["--out", str(mine)]) == 2
    capsys.readouterr()
    assert main(run + ["--out", str(tmp_path / "res")]) == 0 and main(run + ["--out", str(tmp_path / "res")]) == 0
    assert main(run + ["--out", str(mine), "--force"]) == 0 and (mine / "result.json").is_file()
    # results written into the export's own folder would have removed the export (its recorded files)
    assert main(run + ["--out", str(ets)]) == 2
    assert "holds this run's inputs" in capsys.readouterr().err and len(list(ets.glob("w.*.et"))) == 8


def test_an_empty_prefix_or_a_folder_is_said_so(tmp_path):
    """'' and a folder had read "no Chakra ET files ..<rank>.et found"; a folder now names the prefix it holds."""
    from traces.chakra.reader import rank_files
    with pytest.raises(TraceError, match="the Chakra ET prefix is empty"):
        rank_files("")
    (tmp_path / "work.0.et").write_bytes(b"")
    with pytest.raises(TraceError, match=rf"is a folder; give the path before .<rank>.et, e.g. .*work$"):
        rank_files(tmp_path)
