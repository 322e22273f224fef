"""Issue 18 item 3: compare reads (or rejects) every simulate option as simulate does, fault options included,
and its report's command line shows only options that were given."""
import json

from clustersim.cli import main

BASE = ["--cluster", "dgx-h100", "--gpus", "16", "--model", "tiny", "--tp", "8", "--pp", "2", "--mode", "full"]


def _json(capsys, argv):
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_compare_applies_fault_options_like_simulate(capsys):
    sim = _json(capsys, ["simulate", *BASE, "--straggler", "5:1.5"])
    clean = _json(capsys, ["simulate", *BASE])
    cmp = _json(capsys, ["compare", *BASE, "--schedules", "1f1b", "--straggler", "5:1.5"])
    (plan,) = cmp["plans"]
    assert plan["metrics"]["step_time_s"] == sim["step_time_s"] != clean["step_time_s"]
    assert plan["definition"]["faults"]["stragglers"] == {"5": 1.5} or plan["definition"]["faults"]["stragglers"] == {5: 1.5}
    assert plan["definition"]["model_params"] > 0


def test_compare_rejects_bad_fault_options_like_simulate(capsys):
    for bad in (["--straggler", "garbage"], ["--jitter", "-1"], ["--fail-link", "nowhere"]):
        assert main(["simulate", *BASE, *bad]) == 2
        err_sim = capsys.readouterr().err
        assert main(["compare", *BASE, "--schedules", "1f1b", *bad]) == 2
        err_cmp = capsys.readouterr().err
        assert err_cmp.startswith("error: ") and "Traceback" not in err_cmp
        assert err_cmp.split(": ", 1)[1].removeprefix("variant '1f1b': ") == err_sim.split(": ", 1)[1]


def test_report_command_line_shows_only_given_options(tmp_path, capsys):
    report = tmp_path / "r.html"
    assert main(["compare", *BASE, "--schedules", "1f1b", "--straggler", "5:1.5", "--straggler", "3:1.2",
                 "--report", str(report)]) == 0
    html = report.read_text()
    assert "--straggler 5:1.5 --straggler 3:1.2" in html
    assert "()" not in html.split("clustersim compare", 1)[1].split("<", 1)[0]
    assert "params (B)" in html


def test_a_variants_own_faults_meet_the_fault_options(tmp_path, capsys):
    """A variant with its own faults (even a jitter of 0) lost the command line's --straggler without a word;
    now they merge as simulate merges a file's faults with its flags."""
    f = tmp_path / "cmp.yaml"
    f.write_text("variants:\n  plain: {}\n  jit: {faults: {jitter: 0.0}}\n")
    out = _json(capsys, ["compare", "-c", str(f), *BASE, "--straggler", "5:1.5"])
    sim = _json(capsys, ["simulate", *BASE, "--straggler", "5:1.5"])
    steps = {p["name"]: p["metrics"]["step_time_s"] for p in out["plans"]}
    assert steps["plain"] == steps["jit"] == sim["step_time_s"]


def test_schedules_do_not_silently_replace_a_variants_schedule(tmp_path, capsys):
    f = tmp_path / "cmp.yaml"
    f.write_text("variants:\n  a: {schedule: gpipe}\n  b: {schedule: 1f1b}\n")
    assert main(["compare", "-c", str(f), *BASE, "--schedules", "zb-h1,zb-h2"]) == 2
    assert "variant(s) a, b set their own schedule" in capsys.readouterr().err
