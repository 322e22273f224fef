"""Cluster presets: YAML files in ``topologies/presets/`` turned into ``Cluster`` objects.

Schema (all sizes SI)::

    name: dgx-h100
    description: ...
    accelerator: H100-SXM                  # topologies.specs name or alias
    gpus: {default: 1024, multiple_of: 8, min: 8, max: 32768}    # or a plain int in a user file
    gpus_per_node: 8
    domain: {kind: nvswitch|nvl72|pcie|torus|optical, size: 8, sharp: true, bandwidth: <bytes/s>,
             dims: [4, 4, 4] | auto, wrap: true, direct: false, slice_size: null, latency: <s>}
    fabric: {tiers: 3, leaf_down: 32, oversubscription: 1, rail_optimised: true, link: ib|ethernet,
             bandwidth: <bytes/s>, nics_per_node: 8, latency: <s>, pxn: true,
             sharp: false}   # omit for a single domain; sharp: in-network reduction (SHARP, NCCL CollNet)

Domain bandwidth defaults to the accelerator's scale-up bandwidth (per torus link for a torus: the
per-chip figure over 2·dims links), fabric bandwidth to its NIC bandwidth.
"""
from __future__ import annotations

import math
from pathlib import Path

from simulator.errors import ConfigError, TopologyError, UnknownPresetError
from simulator.yamlio import load_yaml
from topologies.cluster import Cluster, DomainSpec, FabricSpec
from topologies.specs import get_accelerator

PRESET_DIR = Path(__file__).parent / "presets"

_DOMAIN_KEYS = {"kind", "size", "sharp", "bandwidth", "dims", "wrap", "direct", "slice_size", "latency"}
_FABRIC_KEYS = {"tiers", "leaf_down", "oversubscription", "rail_optimised", "link", "bandwidth", "nics_per_node",
                "latency", "pxn", "sharp"}
_TOP_KEYS = {"name", "description", "accelerator", "gpus", "gpus_per_node", "domain", "fabric", "placement",
             "preset"}
# flat override names -> (section, key)
_FLAT = {"tiers": ("fabric", "tiers"), "leaf_down": ("fabric", "leaf_down"),
         "oversubscription": ("fabric", "oversubscription"), "rail_optimised": ("fabric", "rail_optimised"),
         "rail_optimized": ("fabric", "rail_optimised"), "nics_per_node": ("fabric", "nics_per_node"),
         "nic_bandwidth": ("fabric", "bandwidth"), "fabric_link": ("fabric", "link"), "pxn": ("fabric", "pxn"),
         "domain_kind": ("domain", "kind"), "domain_size": ("domain", "size"), "dims": ("domain", "dims"),
         "wrap": ("domain", "wrap"), "sharp": ("domain", "sharp"), "direct": ("domain", "direct"),
         "slice_size": ("domain", "slice_size"), "scale_up_bandwidth": ("domain", "bandwidth"),
         "fabric_sharp": ("fabric", "sharp")}


def list_presets() -> list[str]:
    """Names of the bundled cluster presets."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def _read_yaml(path: Path, where: str) -> dict:
    data = load_yaml(path, "cluster file")
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping at top level")
    return data


def preset_config(preset: str) -> dict:
    """The raw YAML mapping of a bundled preset; UnknownPresetError lists the known ones."""
    path = PRESET_DIR / f"{preset}.yaml"
    if not isinstance(preset, str) or not path.is_file():
        raise UnknownPresetError("cluster", str(preset), list_presets())
    return _read_yaml(path, f"preset {preset!r}")


def load_cluster(preset: str, gpus: int | None = None, **overrides) -> Cluster:
    """Build a bundled preset with ``gpus`` devices (default: the preset's). ``overrides``: top-level keys
    (accelerator, gpus_per_node, placement, name), ``domain={...}`` / ``fabric={...}`` (merged; ``fabric=None``
    drops the fabric), or flat names (oversubscription, rail_optimised, tiers, leaf_down, nic_bandwidth,
    dims, sharp, scale_up_bandwidth, ...)."""
    cfg = preset_config(preset)
    return build_from_config(_apply_overrides(cfg, overrides, f"preset {preset!r}"), gpus, f"preset {preset!r}")


def load_cluster_file(path: str | Path, gpus: int | None = None) -> Cluster:
    """Build a cluster from a user YAML file (same schema as the presets, or ``preset: NAME`` plus
    overrides)."""
    p = Path(path)
    cfg = _read_yaml(p, str(p))
    if "preset" in cfg:
        base = preset_config(cfg["preset"])
        over = {k: v for k, v in cfg.items() if k != "preset"}
        if gpus is None and isinstance(over.get("gpus"), int):
            gpus = over.pop("gpus")
        cfg = _apply_overrides(base, over, str(p))
    return build_from_config(cfg, gpus, str(p))


def _apply_overrides(cfg: dict, overrides: dict, where: str) -> dict:
    cfg = {k: (dict(v) if isinstance(v, dict) else v) for k, v in cfg.items()}
    for key, val in overrides.items():
        if key in ("domain", "fabric"):
            if val is None:
                cfg[key] = None
            elif isinstance(val, dict):
                cfg[key] = {**(cfg.get(key) or {}), **val}
            else:
                raise ConfigError(f"{where}: override {key!r} must be a mapping or None")
        elif key in _FLAT:
            section, sub = _FLAT[key]
            if cfg.get(section) is None:
                raise ConfigError(f"{where}: override {key!r} needs a {section} section, which this cluster has not")
            cfg[section][sub] = val
        elif key in _TOP_KEYS:
            cfg[key] = val
        else:
            known = sorted(set(_FLAT) | _TOP_KEYS)
            raise ConfigError(f"{where}: unknown override {key!r}; known: {', '.join(known)}")
    return cfg


def _gpus(cfg: dict, gpus, where: str) -> int:
    rule = cfg.get("gpus", {})
    if isinstance(rule, int):
        rule = {"default": rule}
    if not isinstance(rule, dict):
        raise ConfigError(f"{where}: 'gpus' must be an int or a mapping (default, multiple_of, min, max)")
    unknown = sorted(set(rule) - {"default", "multiple_of", "min", "max"})
    if unknown:
        raise ConfigError(f"{where}: unknown gpus key(s) {unknown}; known: default, max, min, multiple_of")
    n = rule.get("default") if gpus is None else gpus
    if n is None:
        raise ConfigError(f"{where}: say how many GPUs (--gpus N)")
    if isinstance(n, bool) or not isinstance(n, int):
        raise ConfigError(f"{where}: gpus must be an integer, got {n!r}")
    mult, lo, hi = rule.get("multiple_of", 1), rule.get("min", 1), rule.get("max")
    for key, v in (("multiple_of", mult), ("min", lo), ("max", hi)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"{where}: gpus.{key} must be a positive integer, got {v!r}")
    if hi is not None and hi < lo:
        raise ConfigError(f"{where}: gpus.max ({hi}) is below gpus.min ({lo})")
    if n < lo or (hi is not None and n > hi) or n % mult:
        allowed = f"a multiple of {mult} from {lo}" + (f" to {hi}" if hi is not None else "")
        raise ConfigError(f"{where} takes {allowed} GPUs; got {n}")
    return n


def _auto_dims(n: int, where: str) -> tuple[int, int, int]:
    """Most cubic 3D shape of 4x4x4 cubes holding n chips (TPU v5p slices)."""
    if n % 64:
        raise ConfigError(f"{where}: a v5p-style torus needs a multiple of 64 chips, got {n}")
    m, best = n // 64, None
    for a in range(1, m + 1):
        if m % a:
            continue
        for b in range(a, m // a + 1):
            if (m // a) % b:
                continue
            c = m // a // b
            if c < b:
                continue
            score = c / a
            if best is None or score < best[0]:
                best = (score, (4 * a, 4 * b, 4 * c))
    return best[1]


def build_from_config(cfg: dict, gpus: int | None, where: str) -> Cluster:
    """Validate a preset-style mapping and build the Cluster."""
    unknown = set(cfg) - _TOP_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(_TOP_KEYS)}")
    for k in ("accelerator", "gpus_per_node", "domain"):
        if cfg.get(k) is None:
            raise ConfigError(f"{where}: missing required key {k!r}")
    if not isinstance(cfg["accelerator"], str):
        raise ConfigError(f"{where}: accelerator must be a device preset name (e.g. H100-SXM), got "
                          f"{cfg['accelerator']!r}")
    acc = get_accelerator(cfg["accelerator"])
    n = _gpus(cfg, gpus, where)
    gpn = cfg["gpus_per_node"]
    if isinstance(gpn, bool) or not isinstance(gpn, int) or gpn < 1:       # (true is an int 1 to Python)
        raise ConfigError(f"{where}: gpus_per_node must be a positive integer, got {gpn!r}")
    if not isinstance(cfg["domain"], dict) or not (cfg.get("fabric") is None or isinstance(cfg["fabric"], dict)):
        raise ConfigError(f"{where}: domain and fabric must be mappings of their settings")
    dom = dict(cfg["domain"])
    bad = set(dom) - _DOMAIN_KEYS
    if bad:
        raise ConfigError(f"{where}: unknown domain key(s) {sorted(bad)}; known: {sorted(_DOMAIN_KEYS)}")
    kind = dom.get("kind")
    # settings of another kind of domain would be ignored (a fat tree's "dims", a PCIe switch's "sharp")
    for key, differs, kinds in (("dims", dom.get("dims") is not None, ("torus",)),
                                ("wrap", dom.get("wrap") is False, ("torus",)),
                                ("direct", dom.get("direct") is True, ("optical",)),
                                ("slice_size", dom.get("slice_size") is not None, ("optical",)),
                                ("sharp", dom.get("sharp") is True, ("nvswitch", "nvl72"))):
        if differs and kind not in kinds:
            raise ConfigError(f"{where}: domain {key} applies to {' and '.join(kinds)} domains; this domain is "
                              f"{kind}: drop it")
    dims = dom.get("dims")
    if kind == "torus":
        if dims in (None, "auto"):
            dims = _auto_dims(n, where)
        try:
            dims = tuple(int(x) for x in dims)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: torus dims must be a list of 2 or 3 integers or 'auto', got {dims!r}") from None
        size = math.prod(dims)
        bw = dom.get("bandwidth", acc.scale_up_bytes_per_s / (2 * len(dims)))
    else:
        dims = None
        size = _num(dom, "size", gpn, int, where, hi=MAX_DEVICES)
        bw = dom.get("bandwidth", acc.scale_up_bytes_per_s)
    _positive(bw, f"{where}: domain bandwidth")
    domain = DomainSpec(kind=kind, size=min(size, n) if kind != "torus" else size, bandwidth=float(bw),
                        sharp=_flag(dom, "sharp", False, where), dims=dims, wrap=_flag(dom, "wrap", True, where),
                        direct=_flag(dom, "direct", False, where),
                        slice_size=_num(dom, "slice_size", None, int, where, hi=MAX_DEVICES),
                        latency=_num(dom, "latency", None, float, where, lo=0.0, hi=MAX_LATENCY_S))
    fabric = None
    fab = cfg.get("fabric")
    if fab is not None:
        bad = set(fab) - _FABRIC_KEYS
        if bad:
            raise ConfigError(f"{where}: unknown fabric key(s) {sorted(bad)}; known: {sorted(_FABRIC_KEYS)}")
        fbw = fab.get("bandwidth", acc.nic_bytes_per_s)
        _positive(fbw, f"{where}: fabric bandwidth")
        link = str(fab.get("link", "ib"))
        if link not in ("ib", "ethernet"):
            raise ConfigError(f"{where}: fabric link must be ib or ethernet, got {link!r}")
        fabric = FabricSpec(tiers=_num(fab, "tiers", 3, int, where),
                            leaf_down=_num(fab, "leaf_down", 32, int, where, hi=MAX_SWITCH_PORTS),
                            oversubscription=_num(fab, "oversubscription", 1.0, float, where, hi=MAX_SWITCH_PORTS),
                            rail_optimised=_flag(fab, "rail_optimised", True, where), bandwidth=float(fbw),
                            nics_per_node=_num(fab, "nics_per_node", gpn, int, where, hi=MAX_SWITCH_PORTS), link=link,
                            latency=_num(fab, "latency", None, float, where, lo=0.0, hi=MAX_LATENCY_S),
                            pxn=_flag(fab, "pxn", True, where),
                            sharp=_flag(fab, "sharp", False, where))
    if "name" in cfg and not (isinstance(cfg["name"], str) and cfg["name"].strip()):
        raise ConfigError(f"{where}: name must be a non-empty string, got {cfg['name']!r:.60}")
    if not isinstance(cfg.get("description", ""), str):
        raise ConfigError(f"{where}: description must be a string, got {cfg['description']!r:.60}")
    return Cluster(cfg.get("name", "custom"), acc, n, gpn, domain, fabric, placement=cfg.get("placement"),
                   description=cfg.get("description", ""))


#: physical bounds on cluster settings (a switch's ports, a scale-up domain's devices, a latency): beyond them a
#: value is a typo, and building its graph would not end (leaf_down 1e7 ran past a minute at 4 GB)
MAX_SWITCH_PORTS = 4096
MAX_DEVICES = 1 << 20
MAX_LATENCY_S = 1.0


def _num(d: dict, key: str, default, typ, where: str, lo: float | None = None, hi: float | None = None):
    """d[key] as int/float (default when missing; None where the setting is optional); ConfigError naming the
    key when it is not a finite number (an empty value too, where the setting has a default), below ``lo``
    (default: above 0) or above ``hi``."""
    v = d.get(key, default)
    if v is None:
        if key in d and default is not None:
            raise ConfigError(f"{where}: {key} must be {'an integer' if typ is int else 'a number'}, got nothing")
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (typ is int and int(v) != v):
        raise ConfigError(f"{where}: {key} must be {'an integer' if typ is int else 'a number'}, got {v!r}")
    if (v < lo if lo is not None else v <= 0) or (hi is not None and v > hi):
        bound = f"at least {lo:g}" if lo is not None else "positive"
        raise ConfigError(f"{where}: {key} must be {bound}" + (f" and at most {hi:g}" if hi is not None else "")
                          + f", got {v!r}")
    return typ(v)


def _flag(d: dict, key: str, default: bool, where: str) -> bool:
    v = d.get(key, default)
    if not isinstance(v, bool):
        raise ConfigError(f"{where}: {key} must be true or false, got {v!r}")
    return v


def _positive(x, what: str) -> None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not x > 0 or not math.isfinite(x):
        raise TopologyError(f"{what} must be a positive number of bytes/s, got {x!r}")
