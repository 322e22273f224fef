"""Copy the published end-to-end training rows the simulator has presets for into published_runs.csv.

    python validation/build_published_runs.py [SHARED_CSV]

Reads the shared collection (default ../shared/validation/training_throughput.csv next to the repository;
see its README for every column and source) and keeps the pre-training rows whose model and hardware map
to a preset (clustersim.validate.MODEL_PRESETS, hardware_class). Every column is kept as published,
``source`` included; an ``id`` column numbers the rows. Prints how many rows were left out and why.
"""
from __future__ import annotations

import csv
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from clustersim.validate import MODEL_PRESETS, PUBLISHED, hardware_class  # noqa: E402

DEFAULT = HERE.parent.parent.parent / "shared" / "validation" / "training_throughput.csv"


def main(src: str | None = None) -> None:
    path = Path(src) if src else DEFAULT
    if not path.is_file():
        path = Path("/work/shared/validation/training_throughput.csv")
    with path.open(newline="") as f:
        lines = [ln for ln in f if not ln.startswith("#")]
    rows = list(csv.DictReader(lines))
    kept, left = [], Counter()
    for r in rows:
        if r["task"] != "pretrain":
            left[f"task {r['task']}"] += 1
        elif r["model"] not in MODEL_PRESETS:
            left["no model preset"] += 1
        elif hardware_class(r["hardware"]) is None:
            left["no hardware preset (B300, GB300, unnamed Hopper SKU)"] += 1
        else:
            kept.append(r)
    cols = ["id"] + list(rows[0].keys())
    with PUBLISHED.open("w", newline="") as f:
        f.write("# Published end-to-end training runs the simulator has presets for: a verbatim copy of the rows of\n"
                "# the project's shared collection training_throughput.csv (columns and sources: its README; every\n"
                "# row keeps its `source`). Validation only: nothing is fitted to these rows.\n"
                "# Made by validation/build_published_runs.py.\n")
        w = csv.DictWriter(f, fieldnames=cols, lineterminator="\n")
        w.writeheader()
        for i, r in enumerate(kept, 1):
            w.writerow({"id": i, **r})
    print(f"{len(kept)} of {len(rows)} rows copied to {PUBLISHED}")
    for reason, n in left.most_common():
        print(f"  left out {n:4d}: {reason}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
