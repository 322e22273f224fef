"""``clustersim collect``: run the trace collector (traces.collect) under torchrun (traces.launch) and say
where its traces went. Does not import torch."""
from __future__ import annotations

from pathlib import Path

import click

from clustersim.paths import ByteSize, NonEmptyPath
from traces.launch import STRATEGIES, launch, schedule_problem


@click.command("collect")
@click.option("--strategy", type=click.Choice(STRATEGIES), default="ddp", show_default=True,
              help="parallel strategy to train with")
@click.option("--nproc-per-node", "nproc", type=int, default=2, show_default=True, help="ranks (processes)")
@click.option("--steps", type=int, default=5, show_default=True, help="training steps (the last ones profiled)")
@click.option("--active", type=int, default=0, help="profiled steps (0: min(3, steps - 2))")
@click.option("--layers", type=int, default=4, show_default=True)
@click.option("--hidden", type=int, default=128, show_default=True)
@click.option("--heads", type=int, default=4, show_default=True)
@click.option("--seq", type=int, default=64, show_default=True)
@click.option("--batch", type=int, default=8, show_default=True, help="samples per data-parallel rank per step")
@click.option("--vocab", type=int, default=512, show_default=True)
@click.option("--ffn", type=int, default=0, help="SwiGLU width (0: 8/3 hidden)")
@click.option("--bucket-cap-mb", type=float, default=25.0, show_default=True, help="DDP/ZeRO-1 bucket (MiB)")
@click.option("--microbatches", type=int, default=4, show_default=True, help="pipeline micro-batches (pp)")
@click.option("--experts", type=int, default=0, help="experts per layer (ep; 0: 2 x ranks)")
@click.option("--top-k", type=int, default=1, show_default=True, help="experts per token (ep)")
@click.option("--capacity-factor", type=float, default=1.0, show_default=True, help="expert capacity factor (ep)")
@click.option("--dtype", type=click.Choice(("auto", "float32", "bfloat16")), default="auto", show_default=True)
@click.option("--backend", type=click.Choice(("auto", "gloo", "nccl")), default="auto", show_default=True,
              help="auto: nccl with GPUs, gloo on CPU")
@click.option("--bench", type=click.Choice(("collectives", "layers")), default=None,
              help="instead of training: the collective benchmark, or one block's forward / backward times "
                   "at a grid of shapes (the model shape, its TP shards, micro-batches up to --batch)")
@click.option("--max-bytes", type=ByteSize(allow_zero=True), default=0,
              help="benchmark: largest size in bytes, or with a unit (1GB, 256MiB; 0: automatic)")
@click.option("--size-factor", type=int, default=2, show_default=True, help="benchmark: ratio of successive sizes")
@click.option("--timeout", "timeout_s", type=float, default=900.0, show_default=True,
              help="seconds before the run is killed")
@click.option("--out", "out", type=NonEmptyPath(file_okay=False), required=True, help="output directory")
def collect(strategy, nproc, steps, active, layers, hidden, heads, seq, batch, vocab, ffn, bucket_cap_mb,
            microbatches, experts, top_k, capacity_factor, dtype, backend, bench, max_bytes, size_factor, timeout_s, out):
    """Train a small Llama-style model with STRATEGY under torch.profiler (or benchmark collectives or
    layers) on NPROC local ranks; write per-rank Kineto traces and manifest.json to OUT."""
    from simulator.errors import ConfigError
    ctx = click.get_current_context()
    given = {p.name for p in ctx.command.params
             if ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE}
    if not 0 < timeout_s < float("inf"):
        raise ConfigError(f"--timeout is the seconds before the run is killed: a positive number, got {timeout_s}")
    if not bench and (problem := schedule_problem(steps, active)):       # before torchrun starts, not after
        raise ConfigError(problem)
    if size_factor < 2:
        raise ConfigError(f"--size-factor is the ratio of successive benchmark sizes: at least 2, got {size_factor}")
    # options of one strategy given to another (or to a benchmark) would be recorded and ignored
    for names, applies, target in ((("experts", "top_k", "capacity_factor"), strategy == "ep" and not bench,
                                    "training with --strategy ep"),
                                   (("microbatches",), strategy == "pp" and not bench, "training with --strategy pp"),
                                   (("max_bytes", "size_factor"), bench == "collectives", "--bench collectives")):
        misplaced = sorted(n for n in names if n in given)
        if misplaced and not applies:
            flags = ", ".join("--" + n.replace("_", "-") for n in misplaced)
            run = f"--bench {bench}" if bench else f"--strategy {strategy}"
            raise ConfigError(f"{flags} {'apply' if len(misplaced) > 1 else 'applies'} to {target} only; this run "
                              f"({run}) would ignore {'them' if len(misplaced) > 1 else 'it'}")
    args = ["--strategy", strategy, "--steps", str(steps), "--active", str(active), "--layers", str(layers),
            "--hidden", str(hidden), "--heads", str(heads), "--seq", str(seq), "--batch", str(batch),
            "--vocab", str(vocab), "--ffn", str(ffn), "--bucket-cap-mb", str(bucket_cap_mb),
            "--microbatches", str(microbatches), "--experts", str(experts), "--top-k", str(top_k),
            "--capacity-factor", str(capacity_factor), "--dtype", dtype,
            "--backend", backend, "--max-bytes", str(max_bytes), "--size-factor", str(size_factor), "--out", str(Path(out).resolve())]
    if bench:
        args += ["--bench", bench]
    launch(nproc, args, timeout_s=timeout_s)
