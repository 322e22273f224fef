"""``clustersim compare``: run several plans on the same model and cluster and show why one beats another.

Variants come from the command line (``--schedules gpipe,1f1b,interleaved,zb`` beside any ``simulate``
option) or from a YAML file (``-c compare.yaml``)::

    title: Llama-3 8B on 32 H100s, pp=4        # optional
    base:                                      # options shared by every variant (``simulate`` keys)
      cluster: dgx-h100
      gpus: 32
      model: llama3-8b
      tp: 8
      pp: 4
      global_batch: 64
    variants:                                  # a list of {name, options...}, or a mapping name -> options
      - {name: gpipe, schedule: gpipe}
      - {name: 1f1b, schedule: 1f1b}
      - {name: interleaved, schedule: interleaved, virtual_stages: 2}

Options given on the command line override the file's ``base``; a variant's own options override both.
``--schedules`` with a file that has variants runs every variant with every schedule ("variant/schedule").
A ``-c`` file without ``base``/``variants`` is an ordinary experiment file used as the base.

Outputs (``--out DIR``): gantt / memory / breakdown pictures (PNG and SVG), ``metrics.csv`` and
``metrics.json`` (the engine's metrics, one row per plan), one Perfetto JSON per plan; ``--report FILE``
writes a self-contained HTML report (``clustersim.report``).

Measured runs (``--trace PATH``): one profiled step of a Kineto trace (``trace_timeline``) is drawn next to
its replay (``replay_timeline``, the trace's own ops re-run by the engine) and the simulated plans, with
the same metrics computed from each timeline (``timeline_metrics``): ``measured.png`` and ``measured.csv``.
"""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import click
import numpy as np
import pandas as pd

from clustersim.paths import NonEmptyPath
from clustersim.runs import PlanRun, formatted_table, metrics_table, plan_runs  # noqa: F401  (plan_runs: API)
from simulator.errors import ConfigError, OutputError


# ---------------------------------------------------------------------------------------------- variants
def _split_list(text: str, what: str) -> list[str]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        raise ConfigError(f"--{what}: give a comma-separated list, e.g. gpipe,1f1b,interleaved,zb")
    dup = sorted({s for s in items if items.count(s) > 1})
    if dup:
        raise ConfigError(f"--{what}: {', '.join(dup)} given twice")
    return items


def schedule_variants(schedules: str, virtual_stages: int | None = None,
                      memory_limit=None) -> list[tuple[str, dict]]:
    """(name, overrides) per schedule of ``--schedules``. Interleaved gets ``virtual_stages`` (2 if not
    given above 1); the other schedules run with one model chunk per stage, as they must; zb-auto's
    ``--memory-limit`` applies to zb-auto alone."""
    from clustersim.experiment import SCHEDULES
    out = []
    for s in _split_list(schedules, "schedules"):
        if s not in SCHEDULES:
            raise ConfigError(f"--schedules: unknown schedule {s!r}; choose from {', '.join(SCHEDULES)}")
        v = (virtual_stages if virtual_stages and virtual_stages > 1 else 2) if s == "interleaved" else 1
        drop = {"memory_limit": None} if memory_limit is not None and s != "zb-auto" else {}
        out.append((s, {"schedule": s, "virtual_stages": v, **drop}))
    return out


def _check_overridden(given: dict, variants: list[tuple[str, dict]], schedules: bool = False) -> None:
    """A command-line option that every variant sets to another value would change nothing: a ConfigError
    naming it (``compare -c FILE --tp 8`` where each variant sets its own tp ran without a word)."""
    if not variants:
        return
    for key, value in given.items():       # (a file's variants are spelled with underscores: load_compare_file)
        if key == "faults":
            continue
        if all(key in o and o[key] != value for _, o in variants):
            names = ", ".join(n for n, _ in variants[:4]) + (", ..." if len(variants) > 4 else "")
            flag = f"--{key.replace('_', '-')} {value}"
            if schedules and key == "virtual_stages":
                raise ConfigError(f"{flag} changes nothing here: --schedules runs interleaved with more than one "
                                  f"virtual stage (2 unless given above 1) and every other schedule with one")
            if schedules and key == "memory_limit":
                raise ConfigError(f"{flag} changes nothing here: --schedules applies it to zb-auto alone")
            raise ConfigError(f"{flag} changes nothing: every variant ({names}) sets its own {key}; drop the "
                              f"option, or leave {key} out of the variants")


def load_compare_file(path) -> tuple[dict, list[tuple[str, dict]], str | None]:
    """(base options, [(variant name, overrides)], title) of a compare YAML file; a plain experiment file
    gives (its options, [], None)."""
    from clustersim.experiment import load_yaml
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with 'base' and 'variants'")
    from clustersim.experiment import option_keys
    if "base" not in data and "variants" not in data:
        return option_keys(data, str(path)), [], None
    unknown = set(data) - {"base", "variants", "title"}
    if unknown:
        raise ConfigError(f"{path}: unknown top-level key(s) {sorted(unknown)}; a compare file has base, variants "
                          f"and title (put experiment options under base)")
    base = data.get("base") or {}
    if not isinstance(base, dict):
        raise ConfigError(f"{path}: base must be a mapping of simulate options")
    raw = data.get("variants") or []
    variants: list[tuple[str, dict]] = []
    if isinstance(raw, dict):
        for name, opts in raw.items():
            if opts is not None and not isinstance(opts, dict):
                raise ConfigError(f"{path}: variant {name!r} must be a mapping of options")
            variants.append((str(name), dict(opts or {})))
    elif isinstance(raw, list):
        for i, item in enumerate(raw):
            if not isinstance(item, dict):
                raise ConfigError(f"{path}: variant #{i + 1} must be a mapping like {{name: 1f1b, schedule: 1f1b}}")
            item = dict(item)
            name = item.pop("name", None)
            if name is None:
                name = ", ".join(f"{k}={v}" for k, v in item.items()) or f"variant {i + 1}"
            variants.append((str(name), item))
    else:
        raise ConfigError(f"{path}: variants must be a list of mappings or a mapping name -> options")
    names = [n for n, _ in variants]
    if any(not n.strip() for n in names):
        raise ConfigError(f"{path}: a variant has an empty name; names label the plots, the table and the files")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"{path}: variant name(s) {dup} used twice; names label the plots, make them unique")
    keyed = [(n, option_keys(o, f"{path}: variant {n!r}")) for n, o in variants]
    seen: dict = {}
    for n, o in keyed:
        same = seen.setdefault(repr(sorted(o.items(), key=lambda kv: kv[0])), n)
        if same != n:
            raise ConfigError(f"{path}: variants {same!r} and {n!r} set the same options: they would run one plan "
                              f"twice; drop one or tell them apart")
    title = data.get("title")
    return option_keys(base, f"{path}: base"), keyed, (str(title) if title is not None else None)


def build_variants(config: str | None, schedules: str | None, options: dict,
                   single_ok: bool = False) -> tuple[list[tuple[str, dict]], str | None]:
    """[(name, full experiment options)] from a compare file, ``--schedules`` and command-line options.
    ``single_ok``: without variants, run the base options as one plan named "simulated"."""
    from clustersim.experiment import OPTION_KEYS
    base, variants, title = ({}, [], None) if not config else load_compare_file(config)
    given = {k: v for k, v in options.items() if k in OPTION_KEYS and v is not None}
    from clustersim.faults import FAULT_OPTION_KEYS, faults_from_options
    fault_flags = {k: options.get(k) for k in FAULT_OPTION_KEYS}
    if any(v not in (None, (), []) for v in fault_flags.values()):
        # the fault options as `simulate` reads them (validated here: bad ones are errors before any run)
        yaml_faults = base.get("faults")
        if yaml_faults is not None and not isinstance(yaml_faults, dict):
            raise ConfigError(f"{config}: faults: expected a mapping (stragglers, jitter, seed, ...)")
        given["faults"] = faults_from_options(yaml_faults, **fault_flags)
    merged_base = {**base, **given}
    flags_given = "faults" in given and any(v not in (None, (), []) for v in fault_flags.values())
    if flags_given:
        # a variant's own faults meet the command-line fault options as a file's do in `simulate` (they were
        # replaced: `--straggler 1:3` gave a variant with `faults: {jitter: 0}` no straggler, without a word)
        for name, over in variants:
            if over.get("faults") is not None:
                if not isinstance(over["faults"], dict):
                    raise ConfigError(f"variant {name!r}: faults: expected a mapping (stragglers, jitter, seed, ...)")
                over["faults"] = faults_from_options(over["faults"], **fault_flags)
    if schedules:
        own = [n for n, o in variants if "schedule" in o]
        if own:
            raise ConfigError(f"--schedules runs every variant with each of its schedules, but variant(s) "
                              f"{', '.join(own[:4])} set their own schedule, which it would replace: drop "
                              f"--schedules or the variants' schedule")
        vs = merged_base.get("virtual_stages")          # (base keys spelled with underscores)
        svars = schedule_variants(schedules, vs, merged_base.get("memory_limit"))
        if variants:
            variants = [(f"{n}/{sn}", {**o, **so}) for n, o in variants for sn, so in svars]
        else:
            variants = svars
    _check_overridden(given, variants, schedules=bool(schedules))
    if not variants and single_ok:
        variants = [("simulated", {})]
    if not variants:
        raise ConfigError("nothing to compare: give --schedules a,b,... or a compare file (-c) with variants")
    from clustersim.experiment import MODEL_FIELDS
    out = []
    for name, over in variants:
        opts = {**merged_base, **over}
        if "model" not in opts and any(opts.get(k) is not None for k in MODEL_FIELDS):
            opts["model"] = None          # a custom model from its fields, as `simulate` does
        out.append((name, opts))
    return out, title


def run_variants(variants: list[tuple[str, dict]], progress=None) -> list[PlanRun]:
    """Run each variant's experiment; errors name the variant."""
    from clustersim.experiment import experiment_from_dict, run_experiment
    from simulator.errors import ClusterSimError
    runs = []
    for name, opts in variants:
        try:
            exp = experiment_from_dict(dict(opts), where=f"variant {name!r}")
            exp.name = name
            out = run_experiment(exp)
        except ClusterSimError as e:         # same error class, message naming the variant
            if str(e).startswith(f"variant {name!r}"):
                raise                        # it names it already (experiment_from_dict's `where`)
            try:
                named = type(e)(f"variant {name!r}: {e}")
            except TypeError:
                named = ConfigError(f"variant {name!r}: {e}")
            raise named from e
        definition = out.experiment.to_dict()
        if hasattr(out.model, "param_count"):
            definition["model_params"] = out.model.param_count()
        plan = getattr(out, "plan", None)
        if plan is not None and hasattr(plan, "to_dict"):
            definition["resolved_plan"] = plan.to_dict()
        runs.append(PlanRun(name, out.result, out.metrics, definition, list(out.notes), out.evidence()))
        if progress is not None:
            progress(name)
    return runs


# ---------------------------------------------------------------------------------------------- outputs
def slug(name: str) -> str:
    """A file-name-safe form of a plan name."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")
    return s or "plan"


def figures(runs: list[PlanRun], title: str | None = None, max_lanes: int | None = None) -> dict:
    """{"gantt", "memory", "breakdown"}: the comparison's matplotlib figures (``max_lanes``: lane budget
    per Gantt panel, default ``clustersim.plots.DEFAULT_MAX_LANES``)."""
    from clustersim import plots
    results = {r.name: r.result for r in runs}
    metrics = {r.name: r.metrics for r in runs}
    return {
        "gantt": plots.gantt(results, metrics=metrics, title=title, max_lanes=max_lanes or plots.DEFAULT_MAX_LANES),
        "breakdown": plots.breakdown_bars(results, metrics=metrics),
        "memory": plots.memory_over_time(results, max_ranks=4),
    }


def report_files_dir(report: Path) -> Path:
    """Where a report's pictures and traces go without ``--out``: ``<stem>_files`` beside it."""
    return report.with_name(report.stem + "_files")


def _check_report_paths(report: Path, files_dir: Path | None, force: bool) -> None:
    """Before any simulation: refuse to write ``--report`` over a file no clustersim report wrote, or its
    pictures into ``files_dir`` (the report's ``<stem>_files`` folder, without ``--out``) where that folder holds
    what no clustersim run wrote; ``force`` allows both."""
    from clustersim.report import REPORT_HEAD
    from simulator.atomic import OutputFolder
    if report.is_dir():
        raise ConfigError(f"--report {report} is a folder; give the path of an HTML file")
    if report.exists() and not force:
        try:
            with open(report, "rb") as f:
                head = f.read(len(REPORT_HEAD)).decode("utf-8", "replace")
        except OSError as e:
            raise ConfigError(f"--report {report}: cannot read it ({e.strerror or e})") from None
        if head != REPORT_HEAD:
            raise ConfigError(f"--report {report} exists and is no clustersim report; choose another path or pass "
                              f"--force")
    if files_dir is not None:
        OutputFolder.check(files_dir, force, name=f"--report {report}: its picture folder:")


def write_outputs(runs: list[PlanRun], out: Path | None = None, report: Path | None = None,
                  title: str | None = None, svg: bool = True, trace=None, trace_step: int | None = None,
                  replay: bool = True, max_lanes: int | None = None, measured=None,
                  command: str | None = None, force: bool = False) -> list[Path]:
    """Write pictures, metrics tables and Perfetto traces into ``out`` and the HTML report to ``report``.
    With a parsed ``trace`` also the measured-vs-simulated view (``measured.png``, ``measured.csv``);
    ``measured``: its panels if already built (``measured_panels``)."""
    import io

    from clustersim import plots
    written: list[Path] = []
    figs = figures(runs, title, max_lanes) if runs else {}
    mtab = None
    if trace is not None:
        figs["measured"], mtab = measured_vs_simulated(trace, runs, trace_step, replay, panels=measured)
    pngs = {}
    for key, fig in figs.items():          # render each picture once: file and report share the bytes
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=fig.dpi, bbox_inches="tight")
        pngs[key] = buf.getvalue()
    perfetto: dict[str, str] = {}
    if out is not None:
        # one run per folder: an earlier run's files go, every write is atomic, metrics.json (with the run
        # id) comes last and the folder's marker says when the run is complete
        from simulator.atomic import OutputFolder, write_bytes, write_text, write_with
        folder = OutputFolder(out, force=force, command="compare")
        for key, fig in figs.items():
            written.append(write_bytes(folder.path(f"{key}.png"), pngs[key]))
            if svg:
                written.append(plots.save(fig, folder.path(f"{key}.svg")))
        table = metrics_table(runs)
        written.append(write_with(folder.path("metrics.csv"), lambda tmp: table.to_csv(tmp, index_label="plan")))
        written += _write_traces(runs, folder, perfetto)
        if mtab is not None:
            written.append(write_with(folder.path("measured.csv"), lambda tmp: mtab.to_csv(tmp, index_label="run")))
        written.append(write_text(folder.path("metrics.json"), json.dumps(
            {**summary(runs), "run_id": folder.run_id}, indent=1, default=str) + "\n"))
        folder.finish()
    for fig in figs.values():
        plots.close(fig)
    if report is not None:
        from clustersim.report import write_report
        extra = [("Measured vs simulated: metrics", measured_section(mtab))] if mtab is not None else None
        written.append(write_report(report, runs, pngs, title=title, perfetto_files=perfetto, extra_sections=extra,
                                    command=command))
    return written


def _write_traces(runs: list[PlanRun], folder, names: dict[str, str]) -> list[Path]:
    try:
        from simulator.export import lane_ranks, write_perfetto
    except ImportError:        # exports not built: no traces, said so in the report
        return []
    paths = []
    used = set()
    for run in runs:
        base = slug(run.name)
        fname, k = f"{base}.perfetto.json", 2
        while fname in used:
            fname, k = f"{base}-{k}.perfetto.json", k + 1
        used.add(fname)
        paths.append(write_perfetto(run.result, folder.path(fname), ranks=lane_ranks(run.result)))
        names[run.name] = fname
    return paths


def summary(runs: list[PlanRun]) -> dict:
    """The ``--json`` object: one entry per plan with its metrics and definition."""
    return {"plans": [{"name": r.name, "metrics": r.metrics.to_dict(), "definition": r.definition,
                       "notes": r.notes, "evidence": r.evidence} for r in runs]}


def print_table(runs: list[PlanRun], title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table
    t = formatted_table(runs)
    table = Table(title=title or "clustersim compare", title_justify="left")
    table.add_column("plan", style="bold")
    for c in t.columns:
        table.add_column(c, justify="right")
    for name, row in t.iterrows():
        table.add_row(str(name), *[str(v) for v in row])
    Console().print(table)
    from clustersim.evidence import evidence_line
    kinds: dict[str, list[str]] = {}       # one evidence line per kind of prediction, naming its plans
    for r in runs:
        if r.evidence is not None:
            kinds.setdefault(evidence_line(r.evidence), []).append(r.name)
    for line, names in kinds.items():
        who = "" if len(kinds) == 1 else f" ({', '.join(names)})"
        Console().print(f"[cyan]evidence (clustersim validate){who}:[/cyan] {line}", highlight=False)
    for r in runs:
        for n in r.notes:
            Console().print(f"[yellow]note ({r.name}):[/yellow] {n}")


def print_measured(table: pd.DataFrame) -> None:
    from rich.console import Console
    from rich.table import Table
    t = Table(title="measured vs simulated", title_justify="left")
    for c in ("run", "step time (s)", "bubble", "exposed comm", "overlap", "compute"):
        t.add_column(c, justify="left" if c == "run" else "right")
    for name, row in table.iterrows():
        t.add_row(str(name), f"{row['step_time_s']:.4g}", *[f"{row[c]:.1%}" for c in MEASURED_COLUMNS[1:]])
    Console().print(t)


def _command_line(ctx: click.Context) -> str:
    """The options a command ran with, as a command line (defaults left out)."""
    words = ["clustersim", ctx.info_name or "compare"]
    names = {p.name: p.opts[-1] if p.opts[-1].startswith("--") else p.opts[0] for p in ctx.command.params}
    for name, value in ctx.params.items():
        if value is None or value is False or value == ():
            continue
        flag = names.get(name, "--" + name.replace("_", "-"))
        for v in (value if isinstance(value, tuple) else (value,)):      # repeatable options: once per value
            words.append(flag)
            if v is not True:
                words.append(str(v))
    return " ".join(shlex.quote(w) for w in words)


def _compare_command():
    from clustersim.experiment import simulate_options

    @click.command("compare")
    @simulate_options
    @click.option("--schedules", help="Comma-separated pipeline schedules to compare, e.g. "
                  "1f1b,interleaved,zb-h1,zb-v,zb-auto,dualpipe.")
    @click.option("--out", type=NonEmptyPath(file_okay=False), help="Folder for pictures, metrics and Perfetto JSON.")
    @click.option("--report", type=NonEmptyPath(dir_okay=False), help="Self-contained HTML report to write.")
    @click.option("--title", help="Title of the pictures and the report.")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON object with every plan's metrics.")
    @click.option("--trace", "trace_path", type=NonEmptyPath(exists=True),
                  help="A measured Kineto trace (file or folder of per-rank files) to show next to the plans.")
    @click.option("--trace-step", type=int, help="ProfilerStep#N of --trace to show (default: the last on all ranks).")
    @click.option("--max-lanes", type=click.IntRange(2, 400),
                  help="Lane budget per Gantt panel (default 48); tighter budgets share send/recv lanes.")
    @click.option("--force", is_flag=True, help="Write into a non-empty --out that no clustersim run wrote.")
    def compare(config, schedules, out, report, title, as_json, trace_path, trace_step, max_lanes, force,
                **options):
        """Run several plans or schedules on the same model and cluster; write Gantt timelines, memory over
        time, time breakdowns, a metrics table and an HTML report.

        -c FILE is a compare YAML (base + variants) or a plain experiment file used as the base. With
        --trace, the measured step is drawn next to the simulated plans (one plan from the simulate options
        when no variants are given)."""
        from simulator.atomic import OutputFolder
        from simulator.inputs import json_safe
        for misplaced, why in (
                (trace_step is not None and not trace_path, "--trace-step picks a step of --trace: give that option too"),
                ((max_lanes is not None or title is not None) and not (out or report),
                 "--max-lanes and --title shape the pictures of --out / --report: give that option too"),
                (force and not (out or report),
                 "--force lets --out / --report write over what no clustersim run wrote: give one of them too"),
                (schedules and options.get("schedule"),
                 "--schedules compares schedules; --schedule sets one: give one or the other")):
            if misplaced:
                raise ConfigError(why)
        if out:
            OutputFolder.check(out, force)           # before any simulation
        if report:
            _check_report_paths(Path(report), None if out else report_files_dir(Path(report)), force)
        trace = None
        if trace_path:
            from traces.parse import load_trace
            trace = load_trace(trace_path)
        given = any(v not in (None, (), []) for v in options.values())
        if trace is not None and not (config or schedules or given):
            variants, file_title = [], None         # the measured step and its replay only
        else:
            variants, file_title = build_variants(config, schedules, options, single_ok=trace is not None)
        title = title or file_title
        runs = run_variants(variants)
        out_dir = Path(out) if out else None
        if report and out_dir is None:
            out_dir = report_files_dir(Path(report))
        measured = measured_panels(trace, runs, trace_step) if trace is not None else None
        try:
            files = write_outputs(runs, out_dir, Path(report) if report else None, title=title, trace=trace,
                                  trace_step=trace_step, max_lanes=max_lanes, measured=measured,
                                  command=_command_line(click.get_current_context()), force=force) \
                if (out_dir or report) else []
        except OSError as e:
            raise ConfigError(f"cannot write the outputs: {e.strerror or e}: {e.filename}; check --out / --report "
                              f"(an existing writable folder or a new path)") from None
        except OutputError as e:
            raise ConfigError(f"cannot write the outputs: {e}; check --out / --report") from None
        mtable = _rows_table(measured[1]) if measured is not None else None
        if as_json:
            out_json = summary(runs)
            if mtable is not None:
                out_json["measured"] = {str(k): v for k, v in mtable.to_dict(orient="index").items()}
            click.echo(json.dumps(json_safe(out_json), sort_keys=True, default=str, allow_nan=False))
        else:
            if runs:
                print_table(runs, title)
            if mtable is not None:
                print_measured(mtable)
            if files:
                click.echo(f"wrote {len(files)} files" + (f" in {out_dir}" if out_dir else "")
                           + (f"; report {report}" if report else ""))

    return compare


try:
    compare = _compare_command()
except ImportError:        # clustersim.experiment not there: the library functions above still work
    compare = None


# ---------------------------------------------------------------------------------------------- measured runs
def _phase_of_cpu_ops(cpu: pd.DataFrame) -> pd.Series:
    """Phase of every CPU op row: backward inside autograd's backward functions (and DDP's reducer),
    optimizer inside ``Optimizer.step`` / ``zero_grad``, forward otherwise (a child inherits its ancestors'
    phase)."""
    names = cpu["name"].astype(str)
    own = np.full(len(cpu), None, dtype=object)
    own[names.str.startswith("autograd::engine::evaluate_function").to_numpy()
        | names.str.contains(r"Backward\d*$|_backward|ddp\.reducer", regex=True).to_numpy()] = "backward"
    own[names.str.startswith("Optimizer.").to_numpy()] = "optimizer"
    phase = pd.Series(own, index=cpu.index)
    parent = cpu["parent"]
    for d in sorted(cpu["depth"].unique()):
        rows = cpu.index[(cpu["depth"] == d).to_numpy()]
        par = parent.loc[rows]
        inherit = phase.loc[rows].isna() & (par >= 0)
        idx = rows[inherit.to_numpy()]
        if len(idx):
            phase.loc[idx] = phase.reindex(par.loc[idx].to_numpy()).to_numpy()
    return phase.fillna("forward")


def trace_timeline(trace, step: int | None = None) -> pd.DataFrame:
    """One measured step of a parsed trace (``traces.parse.load_trace``) as a timeline DataFrame like the
    engine's (rank, stream, kind, name, start_s, end_s, collective, size_bytes, phase, microbatch), times in
    seconds from the step's start on the earliest rank.

    GPU traces: compute kernels on their CUDA stream (phase from the launching CPU op's ancestry), NCCL
    collectives from the trace's collectives on their stream. CPU traces: the outermost CPU ops of every
    thread, collectives on a lane of their own. ``step``: a ``ProfilerStep#N`` number (default: the last
    step every rank recorded)."""
    steps = trace.steps
    if steps.empty:
        raise ConfigError(f"{trace.path}: the trace has no ProfilerStep#N annotations; cannot pick a step")
    ranks = sorted(int(r) for r in steps["rank"].unique())
    common = set.intersection(*(set(steps.loc[steps["rank"] == r, "step"]) for r in ranks))
    if step is None:
        if not common:
            raise ConfigError(f"{trace.path}: no ProfilerStep is recorded by every rank")
        step = max(common)
    elif step not in common:
        raise ConfigError(f"{trace.path}: step {step} is not recorded by every rank; steps: {sorted(common)}")
    st = steps[steps["step"] == step]
    t0 = float(st["ts"].min())
    rows = []
    colls = trace.collectives
    colls = colls[colls["step"] == step] if len(colls) else colls
    cpu = trace.cpu_ops
    if trace.has_gpu:
        k = trace.kernels
        k = k[(k["step"] == step) & ~k["is_comm"].astype(bool)]
        phase = _phase_of_cpu_ops(cpu)
        ph = phase.reindex(k["op"].to_numpy()).fillna("forward").to_numpy()
        rows.append(pd.DataFrame({"rank": k["rank"].to_numpy(), "stream": "cuda:" + k["stream"].astype(str),
                                  "kind": "compute", "name": k["name"].to_numpy(), "start_s": k["ts"].to_numpy(),
                                  "end_s": k["end"].to_numpy(), "phase": ph}))
    else:
        c = cpu[(cpu["step"] == step) & (cpu["cat"] == "cpu_op")]
        is_cpu_op = (cpu["cat"] == "cpu_op")
        outer = c[~is_cpu_op.reindex(c["parent"].to_numpy()).fillna(False).to_numpy().astype(bool)]
        comm_ops = set(colls["op"].to_numpy().tolist()) if len(colls) else set()
        outer = outer[~outer.index.isin(comm_ops)]
        phase = _phase_of_cpu_ops(cpu)
        rows.append(pd.DataFrame({"rank": outer["rank"].to_numpy(), "stream": "cpu:" + outer["tid"].astype(str),
                                  "kind": "compute", "name": outer["name"].to_numpy(),
                                  "start_s": outer["ts"].to_numpy(), "end_s": outer["end"].to_numpy(),
                                  "phase": phase.loc[outer.index].to_numpy()}))
    if len(colls):
        kind = colls["kind"].astype(str)
        p2p = kind.isin(["send", "recv"])
        compute_lanes = set(zip(rows[0]["rank"], rows[0]["stream"])) if rows else set()
        streams = [s if (r, s) not in compute_lanes else f"{s} comm" for r, s in zip(colls["rank"], colls["stream"])]
        rows.append(pd.DataFrame({"rank": colls["rank"].to_numpy(), "stream": streams,
                                  "kind": np.where(p2p, kind, "collective"), "name": colls["name"].to_numpy(),
                                  "start_s": peer_ready_starts(colls, trace), "end_s": colls["end"].to_numpy(),
                                  "collective": np.where(p2p, None, kind), "size_bytes": colls["size_bytes"].to_numpy(),
                                  "phase": None}))
    df = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=["rank", "stream", "kind"])
    for col in ("collective", "size_bytes", "microbatch"):
        if col not in df.columns:
            df[col] = None
    df["start_s"] = df["start_s"].astype(float) - t0
    df["end_s"] = df["end_s"].astype(float) - t0
    df["microbatch"] = pd.array([pd.NA] * len(df), dtype="Int64")
    df["rank"] = df["rank"].astype(int)
    df = df.sort_values(["rank", "start_s"], kind="stable").reset_index(drop=True)
    ends = st["end"].to_numpy(dtype=float)
    if "gpu_end" in st.columns:
        ends = np.fmax(ends, st["gpu_end"].to_numpy(dtype=float))
    df.attrs["step_time_s"] = max(float(np.nanmax(ends)) - t0, float(df["end_s"].max()) if len(df) else 0.0)
    df.attrs["step"] = int(step)
    return df


def peer_ready_starts(colls: pd.DataFrame, trace) -> np.ndarray:
    """Start of each measured communication under the simulator's rule (``simulator.metrics``): when its last
    peer reaches it. A collective kernel that waits for late peers is not communicating, so that wait counts
    as bubble, in a measured trace as in a simulation. Instances whose members are not all in the trace (or
    traces without a shared clock) keep their recorded start."""
    ts = colls["ts"].to_numpy(dtype=float).copy()
    if not trace.shared_clock or colls.empty:
        return ts
    pos = pd.Series(np.arange(len(colls)), index=colls.index)
    kind = colls["kind"].astype(str)
    present = set(trace.ranks)
    coll = colls[~kind.isin(["send", "recv"])]
    if len(coll):
        gkey = coll["pg"].fillna("").astype(str) + "|" + coll["group_ranks"].astype(str)
        for _, g in coll.groupby([gkey, coll["seq"]], sort=False):
            members = set(g["group_ranks"].iloc[0]) if g["group_ranks"].iloc[0] is not None else set(g["rank"])
            if len(g) > 1 and members <= set(g["rank"]) and members <= present:
                ts[pos[g.index].to_numpy()] = float(g["ts"].max())
    snd = colls[kind.eq("send")].assign(src=lambda d: d["rank"], dst=lambda d: d["peer"])
    rcv = colls[kind.eq("recv")].assign(src=lambda d: d["peer"], dst=lambda d: d["rank"])
    if len(snd) and len(rcv):       # the k-th send src->dst meets the k-th recv at dst from src
        snd = snd.assign(k=snd.groupby(["src", "dst"]).cumcount(), i=pos[snd.index].to_numpy())
        rcv = rcv.assign(k=rcv.groupby(["src", "dst"]).cumcount(), i=pos[rcv.index].to_numpy())
        m = snd.merge(rcv, on=["src", "dst", "k"], suffixes=("_s", "_r"))
        both = np.maximum(m["ts_s"].to_numpy(float), m["ts_r"].to_numpy(float))
        ts[m["i_s"].to_numpy()] = both
        ts[m["i_r"].to_numpy()] = both
    return np.minimum(ts, colls["end"].to_numpy(dtype=float))


def timeline_metrics(df: pd.DataFrame, step_time_s: float | None = None) -> dict:
    """Step time, bubble, exposed communication, overlap and compute fractions of a timeline DataFrame
    (measured or simulated) with the definitions of ``simulator.metrics`` (means over ranks, weighted by
    ``represents`` when present). ``step_time_s`` defaults to ``df.attrs["step_time_s"]`` (set by
    ``trace_timeline``: the measured step's span), else the latest end."""
    from clustersim.plots import idle_spans, merge_intervals
    if step_time_s is None:
        step_time_s = df.attrs.get("step_time_s", float(df["end_s"].max()) if len(df) else 0.0)
    T = float(step_time_s)
    fr = {"bubble": [], "exposed": [], "compute": []}
    comm_tot = overlap_tot = 0.0
    weights = []
    for r, sub in df.groupby("rank", sort=True):
        w = float(sub["represents"].iloc[0]) if "represents" in sub.columns else 1.0
        comp = sub["kind"] == "compute"
        c = merge_intervals(sub.loc[comp, "start_s"], sub.loc[comp, "end_s"])
        m = merge_intervals(sub.loc[~comp, "start_s"], sub.loc[~comp, "end_s"])
        spans = idle_spans(sub, T)
        cs, ms = float((c[1] - c[0]).sum()), float((m[1] - m[0]).sum())
        ex = float((spans["exposed"][1] - spans["exposed"][0]).sum())
        fr["bubble"].append(float((spans["bubble"][1] - spans["bubble"][0]).sum()) / T if T else 0.0)
        fr["exposed"].append(ex / T if T else 0.0)
        fr["compute"].append(cs / T if T else 0.0)
        comm_tot += w * ms
        overlap_tot += w * (ms - ex)
        weights.append(w)
    wsum = sum(weights) or 1.0

    def mean(xs):
        return sum(w * x for w, x in zip(weights, xs)) / wsum

    return {"step_time_s": T, "bubble_fraction": mean(fr["bubble"]), "exposed_comm_fraction": mean(fr["exposed"]),
            "overlap_fraction": overlap_tot / comm_tot if comm_tot > 0 else 0.0,
            "compute_fraction": mean(fr["compute"])}


MEASURED_COLUMNS = ("step_time_s", "bubble_fraction", "exposed_comm_fraction", "overlap_fraction", "compute_fraction")


_ABSENT = re.compile(r"^(\w+) \(peers? .*absent\)$")


def replay_timeline(trace, step: int | None = None) -> pd.DataFrame:
    """The replay (``traces.replay.build_programs``: the trace's own ops with measured durations, re-run
    by the engine) of one step, as a timeline DataFrame in the frame of ``trace_timeline``: trace ranks,
    t = 0 at the step's start, ``attrs["step_time_s"]`` the replayed step.

    The k-th replayed op named N on a (rank, stream) is the k-th measured one over all profiled steps: it
    takes that op's phase and step, so the replayed step holds the same kernels and collectives as the
    measured one (GPU work that runs after the CPU's step boundary included); ops with no measured match
    (CPU pieces, p2p) belong to the step whose CPU markers enclose their start. Drawn like the measurement:
    on GPU traces the CPU stream is left out; zero-length markers and launch-lag ("delay") ops too;
    collectives replayed with a measured duration because their peers are absent from the trace are
    drawn as the collectives they are."""
    from simulator.costs import SimpleCostModel
    from simulator.engine import run
    from traces.replay import build_programs as replay_programs
    step = trace_timeline(trace, step).attrs["step"]
    steps = trace.steps
    common = sorted(set.intersection(*(set(steps.loc[steps["rank"] == r, "step"]) for r in steps["rank"].unique())))
    key = ["rank", "stream", "_name", "_k"]
    measured = []
    for s in common:
        m = trace_timeline(trace, s)
        measured.append(m.assign(_step=s))
    m = pd.concat(measured, ignore_index=True).assign(_name=lambda d: d["name"].astype(str).str[:80])
    m = m.sort_values(["rank", "_step", "start_s"], kind="stable")
    m = m.assign(_k=m.groupby(["rank", "stream", "_name"]).cumcount())[key + ["phase", "_step"]]

    plan = replay_programs(trace)
    res = run(plan.programs, SimpleCostModel())
    inv = {v: k for k, v in plan.rank_map.items()}
    windows = {}
    for sim_rank, marks in plan.markers.items():
        for k, mark in enumerate(marks):       # (step, start marker, end marker) or (step, start marker)
            if mark[0] == step:
                end_op = mark[2] if len(mark) > 2 else marks[k + 1][1]
                windows[inv.get(sim_rank, sim_rank)] = (res.start_s[sim_rank][mark[1]], res.start_s[sim_rank][end_op])
    if not windows:
        raise ConfigError(f"{trace.path}: the replay has no step {step}")
    tl = res.timeline
    tl = tl.assign(rank=tl["rank"].map(lambda r: inv.get(r, r)), _name=tl["name"].astype(str).str[:80])
    tl = tl.drop(columns=["phase"]).sort_values(["rank", "start_s"], kind="stable")
    tl = tl.assign(_k=tl.groupby(["rank", "stream", "_name"]).cumcount()).merge(m, on=key, how="left")
    a = tl["rank"].map(lambda r: windows.get(r, (np.nan, np.nan))[0])
    b = tl["rank"].map(lambda r: windows.get(r, (np.nan, np.nan))[1])
    mine = (tl["_step"] == step) | (tl["_step"].isna() & (tl["start_s"] >= a - 1e-12) & (tl["start_s"] < b))
    df = tl[mine & (tl["end_s"] > tl["start_s"]) & (tl["name"] != "delay")].drop(columns=["_name", "_k", "_step"])
    if trace.has_gpu:
        df = df[df["stream"] != "cpu"]
    absent = df["name"].astype(str).str.extract(_ABSENT)[0]
    coll = absent.notna() & (df["kind"] == "compute")
    df.loc[coll & absent.isin(["send", "recv"]), "kind"] = absent
    df.loc[coll & ~absent.isin(["send", "recv"]), "kind"] = "collective"
    df.loc[coll & ~absent.isin(["send", "recv"]), "collective"] = absent
    df["phase"] = df["phase"].where(df["kind"] == "compute")
    t0 = min(w[0] for w in windows.values())
    df = df.assign(start_s=df["start_s"] - t0, end_s=df["end_s"] - t0)
    df = df.sort_values(["rank", "start_s"], kind="stable").reset_index(drop=True)
    df.attrs["step_time_s"] = max(max(w[1] for w in windows.values()) - t0, float(df["end_s"].max()) if len(df) else 0.0)
    df.attrs["step"] = step
    return df


def measured_panels(trace, runs: list[PlanRun], step: int | None = None, replay: bool = True):
    """The measured-vs-simulated panels: ({panel name: timeline DataFrame | SimResult}, {name: metrics
    row}, {name: Metrics}) for the measured step, its replay and the plans."""
    df = trace_timeline(trace, step)
    label = f"measured (step {df.attrs['step']})"
    panels = {label: df}
    rows = {label: timeline_metrics(df)}
    mets = {}
    if replay:
        try:
            rep = replay_timeline(trace, df.attrs["step"])
        except ImportError:        # traces.replay not installed: measured and simulated only
            rep = None
        if rep is not None:
            panels["replay of the trace"] = rep
            rows["replay of the trace"] = timeline_metrics(rep)
    for r in runs:
        name = r.name if r.name not in panels else f"{r.name} (simulated)"
        panels[name] = r.result
        mets[name] = r.metrics
        rows[name] = {c: getattr(r.metrics, c) for c in MEASURED_COLUMNS}
    return panels, rows, mets


def measured_table(trace, runs: list[PlanRun], step: int | None = None, replay: bool = True) -> pd.DataFrame:
    """The table of ``measured_vs_simulated`` without the picture."""
    _, rows, _ = measured_panels(trace, runs, step, replay)
    return _rows_table(rows)


def _rows_table(rows: dict) -> pd.DataFrame:
    return pd.DataFrame.from_dict(rows, orient="index", columns=list(MEASURED_COLUMNS))


def measured_vs_simulated(trace, runs: list[PlanRun], step: int | None = None, replay: bool = True,
                          max_lanes: int = 24, panels=None) -> tuple:
    """(Gantt figure, table) of one measured step of ``trace`` next to its replay (``replay_timeline``;
    left out with ``replay=False`` or when ``traces.replay`` is missing) and the simulated plans: panels on
    one time axis, and a table of step time, bubble, exposed communication, overlap and compute fractions
    (measured and replay: ``timeline_metrics`` of the drawn timelines; plans: the engine's metrics)."""
    from clustersim import plots
    panels, rows, mets = panels or measured_panels(trace, runs, step, replay)
    fig = plots.gantt(panels, metrics=mets, max_lanes=max_lanes, title=f"Measured vs simulated: {trace.path.name}")
    return fig, _rows_table(rows)


def measured_section(table: pd.DataFrame) -> str:
    """The report's HTML table for ``measured_vs_simulated``'s table."""
    from clustersim.report import html_table
    t = pd.DataFrame(index=table.index)
    t["step time (s)"] = table["step_time_s"].map(lambda v: f"{v:.4g}")
    for c, name in (("bubble_fraction", "bubble"), ("exposed_comm_fraction", "exposed comm"),
                    ("overlap_fraction", "overlap"), ("compute_fraction", "compute")):
        t[name] = table[c].map(lambda v: f"{v:.1%}")
    return html_table(t, "run")
