"""clustersim validate diff: rows matched by id, moved rows, groups whose statistics changed, bad files."""
import copy
import json

import pytest

from clustersim.cli import main
from clustersim.validate import error_stats
from clustersim.validate_diff import diff_runs, load_run
from simulator.errors import ConfigError


def _run(tmp_path, name, rows):
    p = tmp_path / name
    p.write_text(json.dumps({"rows": rows, "summary": []}))
    return str(p)


def _row(i, group, pub, pred, model="llama3-8b"):
    return {"id": i, "group": group, "model": model, "published_tokens_per_s_per_gpu": pub,
            "predicted_tokens_per_s_per_gpu": pred, "error": pred / pub - 1.0}


ROWS = [_row("1", "H100 BF16 dense", 1000.0, 1100.0), _row("2", "H100 BF16 dense", 2000.0, 1900.0),
        _row("10", "A100 BF16 dense", 500.0, 520.0), _row("M1", "A100 BF16 dense", 400.0, 380.0)]


def test_identical_runs_move_nothing(tmp_path):
    a = _run(tmp_path, "a.json", ROWS)
    d = diff_runs(load_run(a), load_run(a))
    assert d == {"only_before": [], "only_after": [], "moved": [], "groups": [], "unchanged": 4}


def test_a_moved_row_and_its_group(tmp_path):
    after = copy.deepcopy(ROWS)
    after[1] = _row("2", "H100 BF16 dense", 2000.0, 2100.0)
    after.append(_row("3", "H100 FP8 dense", 100.0, 90.0))
    d = diff_runs(load_run(_run(tmp_path, "a.json", ROWS)), load_run(_run(tmp_path, "b.json", after[1:])))
    assert d["only_before"] == ["1"] and d["only_after"] == ["3"] and d["unchanged"] == 2
    (m,) = d["moved"]
    assert (m["id"], m["predicted_before"], m["predicted_after"]) == ("2", 1900.0, 2100.0)
    assert m["error_before"] == pytest.approx(-0.05) and m["error_after"] == pytest.approx(0.05)
    by = {g["group"]: g for g in d["groups"]}
    assert set(by) == {"H100 BF16 dense", "H100 FP8 dense"}            # A100's rows did not change
    assert by["H100 BF16 dense"]["before"] == error_stats([ROWS[0]["error"], ROWS[1]["error"]])
    assert by["H100 BF16 dense"]["after"] == error_stats([after[1]["error"]])
    assert by["H100 FP8 dense"]["before"] is None


def test_tolerance_and_the_command(tmp_path, capsys):
    after = copy.deepcopy(ROWS)
    after[2] = _row("10", "A100 BF16 dense", 500.0, 520.0 * (1 + 1e-6))
    a, b = _run(tmp_path, "a.json", ROWS), _run(tmp_path, "b.json", after)
    assert len(diff_runs(load_run(a), load_run(b))["moved"]) == 1
    assert diff_runs(load_run(a), load_run(b), tolerance=1e-3)["moved"] == []
    assert main(["validate", "diff", a, b]) == 0
    out = capsys.readouterr().out
    assert "3 rows unchanged, 1 moved" in out and "A100 BF16 dense: 2 rows" in out and "+4.0% -> +4.0%" in out
    assert main(["validate", "diff", a, b, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["moved"][0]["id"] == "10"


@pytest.mark.parametrize("doc, match", [({"summary": []}, "not a validate run"),
                                        ({"rows": [{"id": "1"}]}, "lacks one of"),
                                        ({"rows": [{**_row("1", "g", 1.0, 1.0),
                                                    "published_tokens_per_s_per_gpu": 0.0}]}, "must be > 0"),
                                        ({"rows": [{**_row("1", "g", 1.0, 1.0), "error": "x"}]}, "finite number"),
                                        # a prediction of -5 had been diffed with its row's old error beside it
                                        ({"rows": [{**_row("1", "g", 1.0, 1.0),
                                                    "predicted_tokens_per_s_per_gpu": -5.0}]},
                                         "predicted_tokens_per_s_per_gpu must be > 0"),
                                        ({"rows": [{**_row("1", "g", 1.0, 1.0), "error": 0.5}]},
                                         "is not predicted / published - 1"),
                                        ({"rows": [{**_row("1", "g", 1.0, 1.0), "group": 3}]}, "group a string"),
                                        ({"rows": [_row("1", "g", 1.0, 1.0)] * 2}, "appears twice")])
def test_files_that_are_not_validate_runs_are_clear_errors(tmp_path, doc, match, capsys):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=match):
        load_run(str(p))
    assert main(["validate", "diff", str(p), str(p)]) == 2
    assert match in capsys.readouterr().err
