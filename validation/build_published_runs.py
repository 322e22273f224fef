"""Copy every row of the shared end-to-end training collection into published_runs.csv.

    python validation/build_published_runs.py [SHARED_CSV]

Reads the shared collection (default ../shared/validation/training_throughput.csv next to the repository;
see its README for every column and source) and copies every row, ``source`` included, verbatim, with an
``id`` column. Ids are stable: a row already in published_runs.csv keeps its id, a new one takes the next
free number. ``clustersim validate`` simulates the rows it can express and lists every other one with the
reason (no model preset, no cluster preset for the hardware, a fine-tuning task, an unmodelled precision...),
so no row is dropped silently. Prints how many rows the simulator has presets for and why the others lack one.
"""
from __future__ import annotations

import csv
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from clustersim.validate import MODEL_PRESETS, PUBLISHED, hardware_class, load_runs  # noqa: E402

DEFAULT = HERE.parent.parent.parent / "shared" / "validation" / "training_throughput.csv"
HEADER = ("# Published end-to-end training runs: a verbatim copy of every row of the project's shared collection\n"
          "# training_throughput.csv (columns and sources: its README; every row keeps its `source`), with a stable\n"
          "# `id`. Validation only: nothing is fitted to these rows. `clustersim validate` simulates the rows it can\n"
          "# express and lists the others with the reason. Made by validation/build_published_runs.py.\n")


def main(src: str | None = None) -> None:
    path = Path(src) if src else DEFAULT
    if not path.is_file():
        path = Path("/work/shared/validation/training_throughput.csv")
    with path.open(newline="") as f:
        lines = [ln for ln in f if not ln.startswith("#")]
    rows = list(csv.DictReader(lines))
    cols = list(rows[0].keys())
    known = {}
    if PUBLISHED.is_file():
        known = {tuple(r.get(c, "") for c in cols): int(r["id"]) for r in load_runs(PUBLISHED)}
    next_id = max(known.values(), default=0) + 1
    out, new, reasons = [], 0, Counter()
    for r in rows:
        rid = known.get(tuple(r[c] for c in cols))
        if rid is None:
            rid, next_id, new = next_id, next_id + 1, new + 1
        out.append((rid, r))
        if r["task"] != "pretrain":
            reasons[f"task {r['task']}"] += 1
        elif r["model"] not in MODEL_PRESETS:
            reasons["no model preset"] += 1
        elif hardware_class(r["hardware"]) is None:
            reasons["no hardware preset (an unnamed Hopper SKU)"] += 1
    out.sort(key=lambda x: x[0])
    with PUBLISHED.open("w", newline="") as f:
        f.write(HEADER)
        w = csv.DictWriter(f, fieldnames=["id"] + cols, lineterminator="\n")
        w.writeheader()
        for rid, r in out:
            w.writerow({"id": rid, **r})
    print(f"{len(out)} rows in {PUBLISHED} ({new} new); {len(out) - sum(reasons.values())} with model and hardware "
          f"presets")
    for reason, n in reasons.most_common():
        print(f"  {n:4d}: {reason}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
