"""The timeline: one row per simulated op, as a pandas DataFrame.

Columns: rank, stream, op (index in the rank's program), kind, name, start_s, end_s, ready_s (reached on
its stream; for communication start_s - ready_s is the wait for peers), collective, size_bytes, flops,
group (process-group family), peer, layer, microbatch, phase, strategy, represents (how many ranks this
row stands for: 1 in full mode, the class size in symmetric mode).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

COLUMNS = ["rank", "stream", "op", "kind", "name", "start_s", "end_s", "ready_s", "collective", "size_bytes",
           "flops", "group", "peer", "layer", "microbatch", "phase", "strategy", "represents"]


def build_timeline(result, ranks=None) -> pd.DataFrame:
    """Timeline of ``result`` (a SimResult), optionally only for some simulated ranks."""
    p = result.programs
    rows: dict[str, list] = {c: [] for c in COLUMNS}
    groups = p.groups
    for rank in sorted(p.ops if ranks is None else ranks):
        prog = p.ops[rank]
        mult = p.multiplicity(rank)
        n = len(prog)
        rows["rank"].extend([rank] * n)
        rows["op"].extend(range(n))
        rows["start_s"].extend(result.start_s[rank])
        rows["end_s"].extend(result.end_s[rank])
        rows["ready_s"].extend(result.ready_s[rank])
        rows["represents"].extend([mult] * n)
        for op in prog:
            rows["stream"].append(op.stream)
            rows["kind"].append(op.kind)
            rows["name"].append(op.name)
            rows["collective"].append(op.collective)
            rows["size_bytes"].append(op.size_bytes)
            rows["flops"].append(op.flops)
            rows["group"].append(groups[op.group].family if op.group is not None else None)
            rows["peer"].append(op.peer)
            rows["layer"].append(op.layer)
            rows["microbatch"].append(op.microbatch)
            rows["phase"].append(op.phase)
            rows["strategy"].append(op.strategy)
    df = pd.DataFrame(rows, columns=COLUMNS)
    for c in ("rank", "op", "represents"):
        df[c] = df[c].astype(np.int64)
    for c in ("layer", "microbatch", "peer"):
        df[c] = df[c].astype("Int64")
    return df
