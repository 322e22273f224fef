"""The input boundary: bounded reads, bounded parsing and value checks for every file and value users give.

Everything a user hands clustersim (calibration and manifest JSON, YAML experiment / cluster / model files,
CLI values) passes through these helpers before use, so that bad input ends as one ``ClusterSimError`` naming
the file and the field, never as a traceback, a hang or a memory blow-up:

- ``read_bytes`` reads at most ``limit`` bytes (``/dev/zero`` or ``/dev/urandom`` cannot fill memory);
- ``load_json`` parses in linear time with a linear duplicate-key check, and turns deep nesting
  (``RecursionError``), 5,000-digit numbers (``ValueError``) and bad UTF-8 into the caller's error class;
- ``check_size`` bounds the expanded size of a parsed document (a YAML alias "billion laughs" is a small DAG
  in memory but exponential to walk or ``repr``);
- ``number`` / ``integer`` accept real numbers only (no booleans, strings, ``None``, NaN or infinities)
  inside a range;
- ``brief`` is a bounded ``repr`` for error messages.
"""
from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

from simulator.errors import ClusterSimError, ConfigError

MiB = 1 << 20
JSON_LIMIT_BYTES = 16 * MiB        # calibration / manifest JSON (the shipped calibrations are ~10 kB each)
YAML_LIMIT_BYTES = 4 * MiB         # experiment, cluster and model files are a few kB
CSV_LIMIT_BYTES = 64 * MiB         # published-data CSVs (validation/, shared/validation) are < 1 MB
MAX_NODES = 1_000_000              # containers + scalars of one parsed document, aliases expanded
#: the largest byte count taken as real (1 PB): a message, a tensor or a device memory beyond it is a typo
MAX_BYTES = 1e15


def brief(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to about ``limit`` characters, in time bounded by ``limit`` (never walks a whole
    nested or aliased structure)."""
    out: list[str] = []
    budget = [limit]

    def emit(s: str) -> bool:
        out.append(s[: max(budget[0], 0)])
        budget[0] -= len(s)
        return budget[0] > 0

    def walk(v: Any) -> bool:
        if isinstance(v, dict):
            if not emit("{"):
                return False
            for i, (k, x) in enumerate(v.items()):
                if (i and not emit(", ")) or not walk(k) or not emit(": ") or not walk(x):
                    return False
            return emit("}")
        if isinstance(v, (list, tuple)):
            if not emit("["):
                return False
            for i, x in enumerate(v):
                if (i and not emit(", ")) or not walk(x):
                    return False
            return emit("]")
        if isinstance(v, str):
            return emit(repr(v[:limit]))
        if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 4 * limit:
            return emit(f"<integer of ~{int(v.bit_length() * 0.30103)} digits>")
        return emit(repr(v)[: limit + 1])

    done = walk(value)
    s = "".join(out)
    return s if done else s + "..."


def check_size(obj: Any, where: str, max_nodes: int = MAX_NODES, err=ConfigError) -> Any:
    """Raise ``err`` when ``obj`` expands (aliases followed) to more than ``max_nodes`` values; else ``obj``.
    Work is bounded by ``max_nodes`` whatever the input."""
    count = 0
    stack = [obj]
    while stack:
        v = stack.pop()
        count += 1
        if count > max_nodes:
            raise err(f"{where}: document too large or nested (more than {max_nodes:,} values once YAML "
                      f"aliases are expanded)")
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return obj


def read_bytes(path: str | Path, what: str, limit: int, err=ConfigError) -> bytes:
    """The bytes of ``path``, reading at most ``limit`` of them; ``err`` names the file if it is missing, a
    folder, unreadable or larger than ``limit``."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            st = os.fstat(f.fileno())
            too_big = stat.S_ISREG(st.st_mode) and st.st_size > limit      # refused without reading it
            data = b"" if too_big else f.read(limit + 1)
    except FileNotFoundError:
        raise err(f"{what} {p} does not exist") from None
    except IsADirectoryError:
        raise err(f"{what} {p} is a folder, expected a file") from None
    except OSError as e:
        raise err(f"{what} {p} cannot be read: {e.strerror or e}") from None
    if too_big or len(data) > limit:
        raise err(f"{what} {p} is larger than {limit // MiB} MiB; is it the right file?")
    return data


def read_text(path: str | Path, what: str, limit: int, err=ConfigError) -> str:
    """``read_bytes`` decoded as UTF-8."""
    data = read_bytes(path, what, limit, err)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise err(f"{what} {path} is not UTF-8 text (byte {e.start}); is it the right file?") from None


def _unique_pairs(where: str, err):
    def hook(pairs):
        d = dict(pairs)
        if len(d) != len(pairs):                     # linear: only then look for the first duplicate
            seen = set()
            for k, _ in pairs:
                if k in seen:
                    raise err(f"{where}: duplicate key {brief(k)}")
                seen.add(k)
        return d
    return hook


def parse_json(text: str | bytes, where: str, err=ConfigError) -> Any:
    """Parse JSON text; duplicate keys, deep nesting, huge numbers and bad syntax raise ``err``."""
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs(where, err))
    except ClusterSimError:
        raise
    except RecursionError:
        raise err(f"{where}: JSON nested too deeply") from None
    except json.JSONDecodeError as e:
        what = e.msg[:-3] if e.msg.endswith(" at") else e.msg      # ("Unterminated string starting at")
        raise err(f"{where}: not valid JSON: {what} at line {e.lineno} column {e.colno}") from None
    except (ValueError, OverflowError) as e:        # 5,000-digit integers, bad UTF-8
        raise err(f"{where}: not valid JSON: {brief(str(e), 120)}") from None


def load_json(path: str | Path, what: str, limit: int = JSON_LIMIT_BYTES, err=ConfigError) -> Any:
    """Read (at most ``limit`` bytes) and parse a JSON file; every problem is ``err`` naming the file."""
    return parse_json(read_bytes(path, what, limit, err), f"{what} {path}", err)


def load_csv(path: str | Path, what: str, required=(), limit: int = CSV_LIMIT_BYTES, err=ConfigError) -> list[dict]:
    """Rows of a CSV file (``#`` comment lines skipped) as dicts of strings ('' for missing fields). The read
    is size-limited, the text must be UTF-8 and CSV, and the header must name every ``required`` column;
    every problem is ``err`` naming the file."""
    import csv
    import io

    text = read_text(path, what, limit, err)
    lines = [ln for ln in io.StringIO(text, newline="") if not ln.startswith("#")]
    try:
        reader = csv.DictReader(lines, restval="")
        rows = [dict(r) for r in reader]
    except csv.Error as e:
        raise err(f"{what} {path}: not a valid CSV file: {brief(str(e), 120)}") from None
    missing = [c for c in required if c not in (reader.fieldnames or [])]
    if missing:
        raise err(f"{what} {path}: missing column(s) {', '.join(missing)}; is it the right file?")
    return rows


# ---------------------------------------------------------------------------------------------- values
def number(value: Any, where: str, *, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
           err=ConfigError) -> float:
    """``value`` as a finite float in [lo, hi] (``lo_open``: > lo); booleans, strings, None and NaN/inf are
    errors naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise err(f"{where}: expected a number, got {brief(value)}")
    try:
        v = float(value)
    except OverflowError:
        raise err(f"{where}: number out of range: {brief(value)}") from None
    if not math.isfinite(v):
        raise err(f"{where}: expected a finite number, got {v}")
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise err(f"{where}: must be {'>' if lo_open else '>='} {lo:g}, got {v:g}")
    if hi is not None and v > hi:
        raise err(f"{where}: must be <= {hi:g}, got {v:g}")
    return v


def integer(value: Any, where: str, *, lo: int | None = None, hi: int | None = None, err=ConfigError) -> int:
    """``value`` as an int in [lo, hi] (integral floats such as 8.0 accepted); anything else is ``err``."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise err(f"{where}: expected an integer, got {brief(value)}")
    if lo is not None and value < lo:
        raise err(f"{where}: must be >= {lo}, got {brief(value)}")
    if hi is not None and value > hi:
        raise err(f"{where}: must be <= {hi}, got {brief(value)}")
    return value


#: byte units ``byte_size`` reads: SI (1 kB = 1e3 B ... 1 TB = 1e12 B, the project's convention) and binary
#: (1 KiB = 1024 B ... 1 TiB = 1024**4 B), case-insensitive
BYTE_UNITS = {"b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
              "kib": 2.0 ** 10, "mib": 2.0 ** 20, "gib": 2.0 ** 30, "tib": 2.0 ** 40}
_BYTE_SIZE = re.compile(r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)")


_BITS = re.compile(r"[0-9\s][KMGT]b$")


def reads_as_bits(value: Any) -> bool:
    """Whether a size is written in bits: an upper-case prefix before a lower-case b ("40Gb": gigabits)."""
    return isinstance(value, str) and _BITS.search(value.strip()) is not None


def byte_size(value: Any, where: str, *, err=ConfigError) -> float:
    """``value`` as a positive, finite number of bytes: a number (1048576, 1e6) or a number with a unit of
    ``BYTE_UNITS`` ("40GB", "100 MB", "1.5GiB", "512kB"); anything else is ``err`` naming ``where``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        b = float(value)
    else:
        if reads_as_bits(value):
            raise err(f"{where}: {brief(value)} reads as bits (Gb: gigabits); give bytes, e.g. "
                      f"{value.strip()[:-1]}B")
        m = _BYTE_SIZE.fullmatch(value.strip().lower()) if isinstance(value, str) else None
        scale = BYTE_UNITS.get(m.group(2) or "b") if m else None
        if scale is None:
            raise err(f"{where}: expected bytes, a number with an optional unit (e.g. 40GB, 100MB, 1.5GiB, "
                      f"1e6; units B, kB, MB, GB, TB, KiB, MiB, GiB, TiB), got {brief(value)}")
        b = float(m.group(1)) * scale
    if not (math.isfinite(b) and b > 0):
        raise err(f"{where}: bytes must be positive and finite, got {brief(value)}")
    return b


def text(value: Any, where: str, *, choices=None, err=ConfigError) -> str:
    """``value`` as a non-empty string (one of ``choices`` when given)."""
    if not isinstance(value, str) or not value:
        raise err(f"{where}: expected a non-empty string, got {brief(value)}")
    if choices is not None and value not in choices:
        raise err(f"{where}: unknown value {brief(value)}; known: {', '.join(sorted(choices))}")
    return value


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, inf) replaced by None, so ``json.dumps(...,
    allow_nan=False)`` writes real JSON (``null``) instead of ``NaN``; numpy scalars become Python numbers."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and hasattr(value, "dtype") and getattr(value, "ndim", 1) == 0:
        value = value.item()                  # numpy scalar
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
