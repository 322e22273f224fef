"""``clustersim validate diff BEFORE AFTER``: what moved between two validate runs.

Both files are a validate run's rows as ``clustersim validate --json`` prints them or ``benchmarks/validate.py``
writes them (``validate.json``). Rows are matched by id; a row *moved* when its predicted tokens/s per GPU
changed by more than ``--tolerance`` (relative; 0: any change at all). Printed: rows only in one run, every
moved row (published, predicted before and after, error before and after), and the summary groups whose
statistics changed (rows, median and 90th-percentile absolute error, mean signed error, before → after).
The check a change to the model or to a row's mapping is read against: nothing here fits anything.
"""
from __future__ import annotations

import json
import math

import click

from clustersim.paths import NonEmptyPath
from simulator.errors import ConfigError
from simulator.inputs import load_json

RUN_LIMIT_BYTES = 256 * 2**20        # a whole run's JSON is ~1.6 MB today
ROW_FIELDS = ("id", "group", "model", "published_tokens_per_s_per_gpu", "predicted_tokens_per_s_per_gpu", "error")


def load_run(path: str) -> dict[str, dict]:
    """A validate run's rows by id; a file that is not one is a ConfigError naming what is wrong."""
    doc = load_json(path, "validate run", RUN_LIMIT_BYTES)
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        raise ConfigError(f"{path}: not a validate run (expected an object with a 'rows' list, as "
                          "`clustersim validate --json` prints and benchmarks/validate.py writes)")
    out: dict[str, dict] = {}
    for n, r in enumerate(rows):
        if not isinstance(r, dict) or any(k not in r for k in ROW_FIELDS):
            raise ConfigError(f"{path}: row {n} lacks one of {', '.join(ROW_FIELDS)}")
        if isinstance(r["id"], bool) or not isinstance(r["id"], (str, int)) or not isinstance(r["group"], str):
            raise ConfigError(f"{path}: row {n}: id must be a string or integer and group a string")
        for k in ("published_tokens_per_s_per_gpu", "predicted_tokens_per_s_per_gpu", "error"):
            v = r[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(f"{path}: row {r['id']!r}: {k} must be a finite number, got {v!r}")
        for k in ("published_tokens_per_s_per_gpu", "predicted_tokens_per_s_per_gpu"):
            if r[k] <= 0:
                raise ConfigError(f"{path}: row {r['id']!r}: {k} must be > 0, got {r[k]!r}")
        implied = r["predicted_tokens_per_s_per_gpu"] / r["published_tokens_per_s_per_gpu"] - 1
        if abs(implied - r["error"]) > 1e-6 * max(1.0, abs(implied)):
            raise ConfigError(f"{path}: row {r['id']!r}: error {r['error']!r} is not predicted / published - 1 "
                              f"({implied:.6g}): the file was edited or is not a validate run")
        if str(r["id"]) in out:
            raise ConfigError(f"{path}: row id {r['id']!r} appears twice")
        out[str(r["id"])] = r
    return out


def diff_runs(before: dict[str, dict], after: dict[str, dict], tolerance: float = 0.0) -> dict:
    """{only_before, only_after: [ids], moved: [{id, model, group, published, predicted_before, predicted_after,
    error_before, error_after}], groups: [{group, before: stats, after: stats}] for the groups whose statistics
    changed (over each run's own rows of the group), unchanged: number of common rows that did not move}."""
    from clustersim.validate import error_stats

    common = [i for i in before if i in after]
    moved = []
    for i in common:
        b, a = before[i], after[i]
        pb, pa = b["predicted_tokens_per_s_per_gpu"], a["predicted_tokens_per_s_per_gpu"]
        if pa != pb and (tolerance == 0 or not pb or abs(pa / pb - 1.0) > tolerance):
            moved.append({"id": i, "model": a["model"], "group": a["group"],
                          "published": a["published_tokens_per_s_per_gpu"], "predicted_before": pb,
                          "predicted_after": pa, "error_before": b["error"], "error_after": a["error"]})
    errors: dict[str, tuple[list, list]] = {}        # group -> (errors before, errors after)
    for side, run in enumerate((before, after)):
        for r in run.values():
            errors.setdefault(r["group"], ([], []))[side].append(r["error"])
    groups = []
    for g in sorted(errors):
        st_b, st_a = (error_stats(e) if e else None for e in errors[g])
        if st_b != st_a:
            groups.append({"group": g, "before": st_b, "after": st_a})
    return {"only_before": sorted(set(before) - set(after), key=_id_key),
            "only_after": sorted(set(after) - set(before), key=_id_key),
            "moved": moved, "groups": groups, "unchanged": len(common) - len(moved)}


def _id_key(i: str) -> tuple:
    """Row ids in reading order: 2 before 10, numbers before names such as M1."""
    return (0, int(i), "") if i.isdigit() else (1, 0, i)


def _stats_text(s: dict | None) -> str:
    if s is None:
        return "(none)"
    return (f"{s['rows']} rows {s['median_abs_error']:.1%} / {s['p90_abs_error']:.1%} / "
            f"{s['mean_signed_error']:+.1%}")


@click.command("diff")
@click.argument("before", type=NonEmptyPath(dir_okay=False))
@click.argument("after", type=NonEmptyPath(dir_okay=False))
@click.option("--tolerance", type=click.FloatRange(min=0.0, max=1e6), default=0.0, show_default=True,
              help="A row moved when its prediction changed by more than this (relative; 0: any change).")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
def diff_command(before: str, after: str, tolerance: float, as_json: bool) -> None:
    """What moved between two validate runs (`clustersim validate --json` output or benchmarks/validate.py's
    validate.json): rows only in one, every row whose prediction changed, and the groups whose median /
    p90 absolute / mean signed error changed."""
    if tolerance != tolerance:        # NaN passes click's range check and would call every change "unmoved"
        raise ConfigError("--tolerance must be a number from 0 to 1e6 (a relative change), got nan")
    d = diff_runs(load_run(before), load_run(after), tolerance)
    if as_json:
        click.echo(json.dumps(d, indent=1))
        return
    click.echo(f"{d['unchanged']} rows unchanged, {len(d['moved'])} moved"
               + (f" (by more than {tolerance:.2%})" if tolerance else "")
               + f"; only in {before}: {len(d['only_before'])}, only in {after}: {len(d['only_after'])}")
    for key, where in (("only_before", before), ("only_after", after)):
        if d[key]:
            click.echo(f"only in {where}: {', '.join(d[key][:40])}{' ...' if len(d[key]) > 40 else ''}")
    if d["moved"]:
        click.echo("\nrow     group                  model                      published   predicted before -> after"
                   "        error before -> after")
        for m in sorted(d["moved"], key=lambda m: -abs(m["error_after"] - m["error_before"])):
            click.echo(f"{m['id']:<7} {m['group'][:22]:<22} {str(m['model'])[:26]:<26} {m['published']:>10,.0f}"
                       f"   {m['predicted_before']:>10,.0f} -> {m['predicted_after']:<10,.0f}"
                       f"   {m['error_before']:+7.1%} -> {m['error_after']:+.1%}")
    if d["groups"]:
        click.echo("\ngroups (rows, median / p90 absolute / mean signed error), before -> after:")
        for g in d["groups"]:
            click.echo(f"  {g['group']}: {_stats_text(g['before'])} -> {_stats_text(g['after'])}")
    else:
        click.echo("every group's statistics unchanged")
