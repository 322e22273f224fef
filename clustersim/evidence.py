"""The evidence printed next to a prediction: how the simulator's predictions of the same kind compared with
published training runs in the latest whole ``validate`` run.

A simulation's *kind* is the summary group of ``clustersim validate`` (device × precision × dense/MoE, e.g.
"H100 BF16 dense") and, within it, the training stack whose kernels priced it (megatron, llm-foundry,
torchtitan...); where the validation set has published runs of the simulated model preset itself, their
statistics too (in its group, else on any hardware): a group can hide a model the simulator predicts worse
than its neighbours (GPT-OSS among the MoE models). ``python benchmarks/validate.py`` (the whole of validation/published_runs.csv, default
options) writes both summaries to ``validation/evidence.json`` next to benchmarks/results/validate.md.
Nothing here adjusts a prediction: it says how far predictions like it were from measured runs.
Errors are fractions: predicted / published tokens per second per GPU − 1 (positive = optimistic).
"""
from __future__ import annotations

import json
import subprocess
from datetime import date
from functools import lru_cache
from pathlib import Path

import click

from simulator import atomic

ROOT = Path(__file__).resolve().parents[1]
EVIDENCE = ROOT / "validation" / "evidence.json"

#: Accelerator preset -> the hardware name of validate's groups (clustersim.validate.group_of). Devices
#: without published runs in the set (H100 PCIe, L40S, TPU v5p, Ascend 910C) have no evidence.
HARDWARE_GROUP = {"H100-SXM": "H100", "H100-HBM2e": "H100-500W", "A100-80GB": "A100", "A100-40GB": "A100",
                  "H200": "H200", "B200": "B200", "GB200": "GB200", "B300": "B300", "GB300": "GB300"}


def group_for(accelerator: str, dtype: str, moe: bool) -> str | None:
    """validate's summary group of a simulation on ``accelerator`` (preset name) in ``dtype``; None where the
    device has no group."""
    from clustersim.validate import group_label
    hw = HARDWARE_GROUP.get(accelerator)
    return None if hw is None else group_label(hw, dtype, moe)


def _stats(errors: list[float], gpus: list[int], mfus: list[float]) -> dict:
    """error_stats, the GPU range and, where known, ``published_mfu``: [lowest, highest] MFU the published
    pre-training runs among them reached, on the simulator's FLOP count and peak (what a prediction prints)."""
    from clustersim.validate import error_stats
    out = {**error_stats(errors), "gpus": [min(gpus), max(gpus)]}
    if mfus:
        out["published_mfu"] = [min(mfus), max(mfus)]
    return out


def published_pretraining_mfu(row: dict) -> float | None:
    """A validate result row's published MFU (``published_mfu``) when it is a pre-training run; None for
    fine-tuning rows (a LoRA step's MFU counts a frozen model's FLOPs; SFT runs on fine-tuning data, packed or
    not) and rows without it."""
    if (row.get("task") or "pretrain") != "pretrain":
        return None
    return row.get("published_mfu") or None


ALL_GROUPS = "(all)"          # by_model: a preset's runs on every hardware and precision


def row_preset(row: dict) -> str | None:
    """The model preset a validate result row ran (its experiment's ``model``: a name, or a mapping whose
    ``base`` is one, e.g. a proxy with fewer layers); None where the row has no experiment."""
    m = (row.get("experiment") or {}).get("model")
    return m.get("base") if isinstance(m, dict) else m


def summarize_evidence(results: list[dict]) -> dict:
    """Per group, per (group, stack) and per (model preset, group) statistics of validate's result rows
    (``validate_rows``); ``by_model[preset]["(all)"]`` over every group; ``by_cuda_graphs[kind][capture]``
    over the Megatron-Bridge rows by what their configs capture in CUDA graphs (kind "MoE" or "dense";
    capture "full iteration", "partial" or "none": ``validate.cuda_graph_bucket``)."""
    from clustersim.validate import cuda_graph_bucket
    by_group: dict[str, tuple[list, list, list]] = {}
    by_stack: dict[str, dict[str, tuple[list, list, list]]] = {}
    by_model: dict[str, dict[str, tuple[list, list, list]]] = {}
    by_graphs: dict[str, dict[str, tuple[list, list, list]]] = {}
    for r in results:
        g, s, m = r["group"], r.get("stack") or "?", row_preset(r)
        buckets = [by_group.setdefault(g, ([], [], [])), by_stack.setdefault(g, {}).setdefault(s, ([], [], []))]
        if m:
            buckets += [by_model.setdefault(m, {}).setdefault(k, ([], [], [])) for k in (g, ALL_GROUPS)]
        graphs = cuda_graph_bucket(r)
        if graphs:
            buckets.append(by_graphs.setdefault(graphs[0], {}).setdefault(graphs[1], ([], [], [])))
        mfu = published_pretraining_mfu(r)
        for bucket in buckets:
            bucket[0].append(r["error"])
            bucket[1].append(int(r["gpus"]))
            if mfu is not None:
                bucket[2].append(mfu)
    return {"groups": {g: _stats(*v) for g, v in sorted(by_group.items())},
            "by_stack": {g: {s: _stats(*v) for s, v in sorted(d.items())} for g, d in sorted(by_stack.items())},
            "by_model": {m: {k: _stats(*v) for k, v in sorted(d.items())} for m, d in sorted(by_model.items())},
            "by_cuda_graphs": {k: {c: _stats(*v) for c, v in sorted(d.items())} for k, d in sorted(by_graphs.items())}}


#: what a whole validate run writes itself: changes there do not make the code it ran uncommitted
RUN_OUTPUTS = ("validation/evidence.json", "benchmarks/results")
UNCOMMITTED = " with uncommitted changes"
UNKNOWN_TREE = " (uncommitted changes not checked)"


def _commit(root: Path = ROOT) -> str | None:
    """The checkout's commit, marked when tracked files other than the run's own outputs differ from it
    (the evidence then comes from code that commit does not hold)."""
    def git(*args):
        return subprocess.run(["git", "--no-optional-locks", "-C", str(root), *args], capture_output=True,
                              text=True, timeout=10)
    try:
        out = git("rev-parse", "--short", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    if out.returncode != 0 or not sha:
        return None
    try:
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ":(top)",
                      *(f":(top,exclude){p}" for p in RUN_OUTPUTS))
    except (OSError, subprocess.SubprocessError):
        changed = None
    if changed is None or changed.returncode != 0:
        return sha + UNKNOWN_TREE
    return sha + (UNCOMMITTED if changed.stdout.strip() else "")


def write_evidence(results: list[dict], path: Path = EVIDENCE, command: str = "python benchmarks/validate.py") -> Path:
    """Write the evidence file of a whole validate run (its result rows)."""
    doc = {"generated_by": command, "date": date.today().isoformat(), "commit": _commit(), "rows": len(results),
           "conditions": "published runs' plans, analytical network, no calibration; error = predicted / "
                         "published tokens/s per GPU - 1",
           **summarize_evidence(results)}
    atomic.write_text(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return path


@lru_cache(maxsize=4)
def load_evidence(path: Path = EVIDENCE) -> dict | None:
    """The committed evidence file (None when absent or unreadable: a prediction then says so)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def evidence_for(accelerator: str, dtype: str, moe: bool, stack: str | None, path: Path = EVIDENCE,
                 gpus: int | None = None, model: str | None = None) -> dict:
    """What the validation set says about predictions of this kind: the group's statistics and, where runs
    of the same stack exist, that stack's (``stack_rows`` ...). ``rows`` 0 with a ``note`` when none.
    ``gpus``: the prediction's GPU count; beyond the largest published run of its kind, ``extrapolation``
    says so (the evidence then covers smaller jobs only). ``model``: the model preset simulated; where the set
    has published runs of it, their statistics in this group, else on any hardware (``model_rows`` ...,
    ``model_scope``: the group, or "all hardware")."""
    group = group_for(accelerator, dtype, moe)
    doc = load_evidence(path)
    out: dict = {"group": group, "stack": stack}
    if doc is None:
        return {**out, "rows": 0, "note": f"no evidence file ({Path(path).name}); run python benchmarks/validate.py"}
    out["source"] = f"{doc.get('generated_by')} ({doc.get('date')}, {doc.get('commit')})"
    runs = doc.get("by_model", {}).get(model) if model else None
    if runs:
        scope = group if group in runs else ALL_GROUPS
        out["model"] = model
        out["model_scope"] = group if scope == group else "all hardware"
        out.update({f"model_{k}": v for k, v in runs[scope].items()})
    g = doc.get("groups", {}).get(group) if group else None
    if g is None:
        where = accelerator if group is None else group
        return {**out, "rows": 0, "note": f"no published run of this kind ({where}) in the validation set"}
    out.update(g)
    s = doc.get("by_stack", {}).get(group, {}).get(stack) if stack else None
    if s is not None:
        out.update({f"stack_{k}": v for k, v in s.items()})
    if gpus is not None and gpus > g["gpus"][1]:
        out["extrapolation"] = f"{gpus:,} GPUs, beyond the largest published run of this kind ({g['gpus'][1]:,})"
    graphs = doc.get("by_cuda_graphs", {}).get("MoE") if moe else None
    if graphs:      # the model prices GPU work only: MoE runs split by how much host-side work graphs hide
        out["cuda_graphs"] = graphs
    return out


def evidence_line(ev: dict) -> str:
    """One line for tables: 'vs 173 published H100 BF16 dense runs (8-2,304 GPUs): median |error| 8.6%, mean
    +9.1% (+ = predicted faster); megatron stack: 103 runs, median |error| 4.8%, mean +6.7%'."""
    own = ""
    if ev.get("model_rows"):
        own = (f"; {ev['model']} itself: {ev['model_rows']} runs ({ev['model_scope']}), median |error| "
               f"{ev['model_median_abs_error']:.1%}, mean {ev['model_mean_signed_error']:+.1%}")
        if ev.get("model_published_mfu") and ev.get("model_scope") == ev.get("group"):
            lo, hi = ev["model_published_mfu"]
            own += f", published pre-training MFU {lo:.1%}-{hi:.1%}"
    if not ev.get("rows"):
        return ev.get("note", "none") + own
    lo, hi = ev["gpus"]
    line = (f"vs {ev['rows']} published {ev['group']} runs ({lo:,}-{hi:,} GPUs): median |error| "
            f"{ev['median_abs_error']:.1%}, mean {ev['mean_signed_error']:+.1%} (+ = predicted faster)")
    if ev.get("stack_rows"):
        line += (f"; {ev['stack']} stack: {ev['stack_rows']} runs, median |error| {ev['stack_median_abs_error']:.1%}, "
                 f"mean {ev['stack_mean_signed_error']:+.1%}")
    line += own
    if ev.get("caveat"):
        line += f" (evidence {ev['caveat']})"
    if ev.get("extrapolation"):
        line += f"; this run: {ev['extrapolation']}"
    graphs = ev.get("cuda_graphs") or {}
    if graphs.get("full iteration") and graphs.get("none"):
        full, none = graphs["full iteration"], graphs["none"]
        line += (f"; Megatron-Bridge MoE runs on every GPU type, capturing whole iterations in CUDA graphs: "
                 f"{full['rows']}, median "
                 f"|error| {full['median_abs_error']:.1%}, mean {full['mean_signed_error']:+.1%}; capturing none: "
                 f"{none['rows']}, {none['median_abs_error']:.1%}, {none['mean_signed_error']:+.1%} (this "
                 f"prediction stands for a graph-captured run: host-side work is not modelled)")
    return line


def mfu_against_published(ev: dict, mfu: float) -> str | None:
    """Where a predicted ``mfu`` stands among the MFUs published pre-training runs of its kind reached (on the
    same FLOP count and peak): those of the simulated model preset in the prediction's group where the set has
    some, else those of the group (a model's runs on other hardware or precisions are another kind: an FP8 run's
    MFU on the BF16 peak can pass 100%); None where neither has any. E.g. 'MFU 54.8% against 42.2%-54.6%
    reached by published llama3-70b pre-training runs (H100 BF16 dense): 0.2 points above the highest'.
    Compared at the printed precision (tenths of a percent)."""
    if ev.get("model_published_mfu") and ev.get("model_scope") == ev.get("group"):
        (lo, hi), who = ev["model_published_mfu"], f"published {ev['model']} pre-training runs ({ev['group']})"
    elif ev.get("published_mfu"):
        (lo, hi), who = ev["published_mfu"], f"published {ev['group']} pre-training runs"
    else:
        return None
    m, lo_, hi_ = (round(1000 * x) for x in (mfu, lo, hi))
    if m > hi_:
        where = f"{(m - hi_) / 10:.1f} points above the highest"
    elif m < lo_:
        where = f"{(lo_ - m) / 10:.1f} points below the lowest"
    else:
        where = "within their range"
    return f"MFU {mfu:.1%} against {lo:.1%}-{hi:.1%} reached by {who}: {where}"


# ---------------------------------------------------------------------------------------------- command
@click.command("evidence")
@click.option("--json", "as_json", is_flag=True, help="Print the evidence file as JSON.")
def evidence_command(as_json: bool) -> None:
    """The evidence of the latest whole validate run, without simulating: per group (hardware × precision ×
    dense/MoE) and per stack, the published runs and how far predictions were from them."""
    from simulator.errors import ConfigError
    doc = load_evidence()
    if doc is None:
        raise ConfigError(f"no evidence file at {EVIDENCE}; run python benchmarks/validate.py")
    if as_json:
        click.echo(json.dumps(doc, indent=1, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"evidence: {doc.get('rows')} published runs · {doc.get('generated_by')} "
                    f"({doc.get('date')}, {doc.get('commit')})", title_justify="left")
    for c in ("group", "stack", "runs", "GPUs", "median |error|", "p90 |error|", "mean error"):
        t.add_column(c, justify="left" if c in ("group", "stack") else "right")

    def row(group: str, stack: str, s: dict) -> None:
        lo, hi = s["gpus"]
        t.add_row(group, stack, str(s["rows"]), f"{lo:,}-{hi:,}", f"{s['median_abs_error']:.1%}",
                  f"{s['p90_abs_error']:.1%}", f"{s['mean_signed_error']:+.1%}")
    for group, s in doc.get("groups", {}).items():
        stacks = doc.get("by_stack", {}).get(group, {})
        row(group, next(iter(stacks)) if len(stacks) == 1 else "(all)", s)
        if len(stacks) > 1:
            for stack, ss in stacks.items():
                row("", stack, ss)
    con = Console()
    con.width = max(con.width, 120)     # one line per row when piped
    con.print(t)
    con.print(f"{doc.get('conditions', '')}; + = predicted faster. `simulate`, `search` and `compare` print the "
              f"line of their kind.", highlight=False)
