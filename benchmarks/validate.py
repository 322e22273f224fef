"""Validation against published training runs: the whole of validation/published_runs.csv.

    python benchmarks/validate.py [--network analytical] [--out benchmarks/results/validate] [--tp-comm-overlap]
                                  [--workers N]
                                  [--runs validation/megatron_lm_2021.csv --out benchmarks/results/validate_megatron_2021]

Writes validate.json (rows, per-group and per-group-and-framework summaries, rows not expressible),
validate.png (predicted vs published) and validate.md (both summary tables and the peak-memory comparison, as
pasted in the README); the whole set under default options also writes validation/evidence.json, the
per-group evidence `clustersim simulate` prints next to its predictions (clustersim.evidence). The rows are
validation only: nothing is fitted to them. Takes about 2 s per row on one CPU core; rows run side by side
in one process per core (``--workers``).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clustersim.evidence import write_evidence  # noqa: E402
from clustersim.validate import (CORRELATES, error_correlations, load_runs, plot, summarize,  # noqa: E402
                                 summarize_by_cuda_graphs, validate_rows)


def stats_table(keys: dict[str, str], groups: list[dict]) -> list[str]:
    """Markdown lines of ``groups``: the ``keys`` columns (heading -> field), then rows and the three errors."""
    out = ["| " + " | ".join(keys) + " | rows | median abs error | p90 abs error | mean signed error |",
           "|" + "---|" * len(keys) + "---:|---:|---:|---:|"]
    for g in groups:
        out.append("| " + " | ".join(str(g[k]) for k in keys.values()) + f" | {g['rows']} | "
                   f"{g['median_abs_error']:.1%} | {g['p90_abs_error']:.1%} | {g['mean_signed_error']:+.1%} |")
    return out


def markdown(results: list[dict], summary: list[dict], skipped: list[dict],
             by_framework: list[dict] | None = None, per_row: bool = False) -> str:
    out = stats_table({"group": "group"}, summary)
    if by_framework:
        out += [""] + stats_table({"group": "group", "framework": "framework"}, by_framework)
    if per_row:
        out += ["", "| row | model | GPUs | plan | published tokens/s/GPU | predicted | error |",
                "|---|---|---:|---|---:|---:|---:|"]
        for r in results:
            e = r["experiment"]
            plan = (f"tp{e.get('tp', 1)} pp{e.get('pp', 1)} dp{e.get('dp', 1)} mb{e.get('micro_batch')} "
                    f"gb{e.get('global_batch')}")
            out.append(f"| {r['id']} | {r['model']} | {r['gpus']} | {plan} | "
                       f"{r['published_tokens_per_s_per_gpu']:,.0f} | {r['predicted_tokens_per_s_per_gpu']:,.0f} | "
                       f"{r['error']:+.1%} |")
    graphs = summarize_by_cuda_graphs(results)
    if graphs:
        out += ["", "Megatron-Bridge rows by what their performance configs capture in CUDA graphs "
                    "(validation/bridge_cuda_graphs.csv; a diagnostic, not a fit: the model prices GPU work only):", ""]
        out += stats_table({"kind": "kind", "CUDA graphs": "cuda_graphs"}, graphs)
    corr = error_correlations(results)
    if corr:
        names = [n for n, _ in CORRELATES]
        out += ["", "Correlation of the signed error with where the predicted step goes (groups and stacks of 20+ "
                    "rows; a diagnostic, not a fit):", "",
                "| group | stack | rows | " + " | ".join(f"vs {n}" for n in names) + " |",
                "|---|---|---:|" + "---:|" * len(names)]
        for c in corr:
            cells = " | ".join("-" if c[n] is None else f"{c[n]:+.2f}" for n in names)
            out.append(f"| {c['group']} | {c['stack']} | {c['rows']} | {cells} |")
    mem = [r for r in results if r["published_peak_memory_gib"]]
    if mem:
        out += ["", "| row | model | GPUs | published peak GiB | predicted peak GiB | error |", "|---|---|---:|---:|---:|---:|"]
        for r in mem:
            out.append(f"| {r['id']} | {r['model']} ({r['framework']}) | {r['gpus']} | "
                       f"{r['published_peak_memory_gib']:.1f} | {r['predicted_peak_memory_gib']:.1f} | "
                       f"{r['peak_memory_error']:+.1%} |")
    reasons: dict[str, int] = {}
    for x in skipped:
        reasons[x["reason"]] = reasons.get(x["reason"], 0) + 1
    out += ["", f"{len(results)} rows simulated; {len(skipped)} not expressible:"]
    out += [f"- {n} × {reason}" for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1])]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--network", default="analytical", choices=("ideal", "analytical", "flow"))
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "validate"))
    ap.add_argument("--tp-comm-overlap", action="store_true",
                    help="rows whose NVIDIA recipes overlap TP communication run --tp-comm-overlap")
    ap.add_argument("--workers", type=int, default=None,
                    help="processes simulating rows side by side (default: one per CPU core, at most 8; the "
                    "results do not depend on it)")
    ap.add_argument("--runs", default=None, help="published-runs CSV (default validation/published_runs.csv); "
                    "sets of up to 50 rows get a per-row table")
    args = ap.parse_args()
    rows = load_runs(args.runs) if args.runs else load_runs()
    t0 = time.perf_counter()
    results, skipped = validate_rows(rows, network=args.network, tp_overlap=args.tp_comm_overlap,
                                     workers=args.workers,
                                     progress=lambda i, n: print(f"\r{i}/{n}", end="", file=sys.stderr))
    print(file=sys.stderr)
    summary = summarize(results)
    frameworks = summarize(results, by_framework=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps({"rows": results, "summary": summary,
                                               "summary_by_framework": frameworks,
                                               "summary_by_cuda_graphs": summarize_by_cuda_graphs(results),
                                               "not_expressible": skipped,
                                               "error_correlations": error_correlations(results),
                                               "wall_time_s": time.perf_counter() - t0}, indent=1))
    plot(results, f"{out}.png")
    if args.runs is None and not args.tp_comm_overlap and args.network == "analytical":
        # the whole set under the default model: the evidence `simulate` prints next to its predictions
        print(f"evidence: {write_evidence(results)}", file=sys.stderr)
    md = markdown(results, summary, skipped, frameworks, per_row=len(rows) <= 50)
    Path(f"{out}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
