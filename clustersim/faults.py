"""Fault-injection options of the application: the click options of ``simulate`` / ``compare`` and the
parsing of their strings into a ``topologies.faults.FaultSpec`` (the spec and the cost-model wrapper live in
``topologies.faults``, next to the cost model they wrap)."""
from __future__ import annotations

from typing import Iterable

import click

from simulator.errors import ConfigError
from topologies.faults import CLI_OPTION, FaultSpec, faults_from_dict, node_label, parse_rank


def _rank_value_pairs(items: Iterable[str], sep: str, flag: str, form: str) -> dict:
    """{rank: value string} from CLI items like '5:1.2' (values are checked later by FaultSpec)."""
    out: dict = {}
    for s in items or ():
        parts = str(s).split(sep)
        if len(parts) != 2:
            raise ConfigError(f"{flag} {s!r}: expected {form}")
        rank = parse_rank(parts[0].strip(), f"{flag} {s!r}")
        if rank in out:
            raise ConfigError(f"{flag}: rank {rank} given twice")
        out[rank] = parts[1]
    return out


def parse_fault_options(stragglers: Iterable[str] = (), straggler_dist: str | None = None,
                        jitter: float | str | None = None, fail_links: Iterable[str] = (),
                        degrade_links: Iterable[str] = (), fail_devices: Iterable[str] = (),
                        seed: int | str | None = None) -> FaultSpec:
    """A FaultSpec from CLI strings: ``--straggler 5:1.2``, ``--straggler-dist lognormal:0.05``,
    ``--jitter 0.02``, ``--fail-link A:B``, ``--degrade-link A:B:0.5``, ``--fail-device RANK@TIME_S``,
    ``--seed N``."""
    strag = _rank_value_pairs(stragglers, ":", "--straggler", "RANK:FACTOR, e.g. 5:1.2")
    deg: dict = {}
    for s in degrade_links or ():
        parts = str(s).split(":")
        if len(parts) != 3:
            raise ConfigError(f"--degrade-link {s!r}: expected NODE_A:NODE_B:FACTOR, e.g. leaf.0:spine.0.0:0.5")
        key = f"{parts[0]}:{parts[1]}"
        if key in deg:
            raise ConfigError(f"--degrade-link: link {key} is given twice (factors {deg[key]} and {parts[2]}); "
                              f"give each link once")
        deg[key] = parts[2]
    dev = _rank_value_pairs(fail_devices, "@", "--fail-device", "RANK@TIME_S, e.g. 17@0.25")
    if seed is None:
        seed_v = 0
    else:
        try:
            seed_v = int(seed)
        except (TypeError, ValueError):
            raise ConfigError(f"--seed: expected an integer, got {seed!r}") from None
    try:
        return FaultSpec(stragglers=strag, straggler_distribution=straggler_dist,
                         jitter=0.0 if jitter is None else jitter, link_failures=tuple(fail_links or ()),
                         link_degradation=deg, device_failures=dev, seed=seed_v)
    except ConfigError as e:        # named by the options given, not the YAML fields they fill
        raise ConfigError(_as_options(str(e))) from None


def _as_options(message: str) -> str:
    """A FaultSpec message with its ``faults.<field>`` names spelled as the command-line options."""
    import re
    return re.sub(r"faults\.(\w+)", lambda m: CLI_OPTION.get(m.group(1), m.group(0)), message)


# ---------------------------------------------------------------------------------------------- click options
FAULT_OPTION_KEYS = ("straggler", "straggler_dist", "jitter", "fail_link", "degrade_link", "fail_device", "seed")


def fault_options(f):
    """Add the fault-injection options to a click command (``simulate``, ``compare`` ...); read them back
    with ``faults_from_options(yaml_faults, **options)``."""
    opts = [
        click.option("--straggler", multiple=True, metavar="RANK:FACTOR",
                     help="Slow device: compute on RANK takes FACTOR times longer (repeatable), e.g. 5:1.2."),
        click.option("--straggler-dist", metavar="DIST",
                     help="Draw a slowdown per rank: lognormal:SIGMA or fraction:P:FACTOR (seeded)."),
        click.option("--jitter", type=float, help="Coefficient of variation of every compute op's time (seeded)."),
        click.option("--fail-link", multiple=True, metavar="A:B",
                     help="Link down, traffic re-routed (repeatable); nodes like leaf.0, spine.0.1, or a GPU index."),
        click.option("--degrade-link", multiple=True, metavar="A:B:FACTOR",
                     help="Link bandwidth times FACTOR in (0, 1] (repeatable)."),
        click.option("--fail-device", multiple=True, metavar="RANK@TIME_S",
                     help="Device RANK dies TIME_S seconds into the step (repeatable)."),
        click.option("--seed", type=int, help="Seed of every random draw (stragglers, jitter)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def faults_from_options(yaml_faults: dict | None = None, **options) -> dict:
    """The YAML ``faults:`` mapping with the command-line fault options applied on top (validated;
    returns the mapping form ``faults_from_dict`` reads, empty when there is no fault)."""
    base = faults_from_dict(yaml_faults or {})
    given = {k: options.get(k) for k in FAULT_OPTION_KEYS}
    if not any(v not in (None, (), []) for v in given.values()):
        return base.to_dict() if not base.empty else ({"seed": base.seed} if base.seed else {})
    cli = parse_fault_options(given["straggler"] or (), given["straggler_dist"], given["jitter"],
                              given["fail_link"] or (), given["degrade_link"] or (), given["fail_device"] or (),
                              given["seed"])
    merged = base.to_dict()
    # a link the command line names replaces what the file says of it, whichever way round either writes it
    cli_links = {frozenset(link) for link in list(cli.link_failures) + list(cli.link_degradation)}
    if cli_links:
        file_links = {frozenset(link): f"{node_label(link[0])}:{node_label(link[1])}"
                      for link in list(base.link_failures) + list(base.link_degradation)}
        dropped = {name for key, name in file_links.items() if key in cli_links}
        if "link_failures" in merged:
            merged["link_failures"] = [x for x in merged["link_failures"] if x not in dropped]
        if "link_degradation" in merged:
            merged["link_degradation"] = {k: v for k, v in merged["link_degradation"].items() if k not in dropped}
    for key, value in cli.to_dict().items():
        if key == "seed" and given["seed"] is None:
            continue
        if isinstance(value, dict):
            merged[key] = {**merged.get(key, {}), **value}
        elif isinstance(value, list) and key == "link_failures":
            merged[key] = list(dict.fromkeys(merged.get(key, []) + value))
        else:
            merged[key] = value
    return faults_from_dict(merged).to_dict()
