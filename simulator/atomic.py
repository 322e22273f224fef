"""Atomic output files: every file clustersim writes goes through here.

A file is written to a temporary file in the same folder and renamed over the target only once it is
complete (``os.replace`` is atomic on POSIX), so a crash, ``kill -9`` or a full disk never leaves a truncated
file that looks valid. The rename replaces a symlink planted at the target instead of writing through it.
A write that fails (``ENOSPC``, permissions) raises ``OutputError`` naming the file and removes the
temporary file.
"""
from __future__ import annotations

import contextlib
import shutil
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from simulator.errors import OutputError

TMP_PREFIX = ".clustersim-tmp-"
_UMASK = os.umask(0)
os.umask(_UMASK)


def _fail(path: Path, e: OSError) -> OutputError:
    return OutputError(f"cannot write {path}: {e.strerror or e}")


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; write it completely, and on success it is renamed to ``path``.

    For writers that want a file name (``DataFrame.to_parquet``, ``Figure.savefig``). The folder must exist."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=path.suffix, dir=path.parent)
        os.close(fd)
    except OSError as e:
        raise _fail(path, e) from None
    tmp = Path(tmp)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except OSError as e:
        raise _fail(path, e) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", encoding: str | None = "utf-8"):
    """``open`` for writing, atomically (``mode`` "w" or "wb")."""
    with atomic_path(path) as tmp:
        try:
            f = open(tmp, mode, encoding=None if "b" in mode else encoding)
        except OSError as e:
            raise _fail(Path(path), e) from None
        with f:
            try:
                yield f
            except OSError as e:
                raise _fail(Path(path), e) from None


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns the path."""
    with atomic_open(path, "w") as f:
        f.write(text)
    return Path(path)


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path."""
    with atomic_open(path, "wb") as f:
        f.write(data)
    return Path(path)


def write_with(path: str | Path, writer: Callable[[Path], object]) -> Path:
    """Call ``writer(tmp_path)`` and rename the result to ``path`` atomically; returns the path."""
    with atomic_path(path) as tmp:
        writer(tmp)
    return Path(path)




# ---------------------------------------------------------------------------------------------- --out folders
MARKER = ".clustersim-run.json"


def new_run_id() -> str:
    """A unique id for one run: UTC time and random hex (``20261130T203000Z-1a2b3c4d``)."""
    import time
    import uuid
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


class OutputFolder:
    """The ``--out`` folder of one run: every file in it belongs to this run.

    Opening it removes the files an earlier clustersim run recorded in the folder's marker
    (``.clustersim-run.json``), so no stale file survives beside the new ones; a non-empty folder that no
    clustersim run wrote is refused unless ``force`` (its foreign files are then left alone). The marker says
    ``"complete": false`` until ``finish()``, so a run killed half way is recognisable; ``run_id`` goes into
    the files that can carry it."""

    def __init__(self, out: str | Path, force: bool = False, command: str = ""):
        import json
        self.out, self.command, self.run_id = Path(out), command, new_run_id()
        self.files: list[str] = []
        old = self.check(self.out, force)
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _fail(self.out, e) from None
        leftovers = [p.name for p in self.out.iterdir() if p.name.startswith(TMP_PREFIX)]  # a killed run's
        for name in old + leftovers:
            with contextlib.suppress(OSError):
                stale = self.out / name
                if stale.is_dir() and not stale.is_symlink():
                    shutil.rmtree(stale)             # a sub-folder this tool wrote (e.g. traces/)
                else:
                    stale.unlink()                   # unlink removes a planted link, never its target
        self._json = json
        self._write_marker(False)

    @classmethod
    def check(cls, out: str | Path, force: bool = False, name: str = "--out") -> list[str]:
        """Raise OutputError unless ``out`` can take a run (absent, empty, an earlier run's folder, or
        ``force``); returns the earlier run's files. Cheap: commands call it before simulating. ``name``: how
        messages call the folder (the option that gave it)."""
        out = Path(out)
        if out.exists() and not out.is_dir():
            raise OutputError(f"{name} {out} exists and is not a folder")
        try:
            entries = list(out.iterdir()) if out.is_dir() else []
        except OSError as e:
            raise _fail(out, e) from None
        if all(p.name.startswith(TMP_PREFIX) for p in entries):
            return []
        old = cls._previous_files(out)
        if old is None and not force:
            raise OutputError(f"{name} {out} is not empty and holds no earlier clustersim run; choose an empty "
                              f"folder or pass --force")
        return old or []

    @staticmethod
    def _previous_files(out: Path) -> list[str] | None:
        import json
        m = out / MARKER
        if not m.is_file() or m.is_symlink():
            return None
        try:
            with open(m, "rb") as f:
                data = json.loads(f.read(1 << 20))
        except (OSError, ValueError, RecursionError):
            return None
        files = data.get("files") if isinstance(data, dict) else None
        if not isinstance(files, list):
            return None
        return [f for f in files if isinstance(f, str) and _plain_relative(f)]

    def _write_marker(self, complete: bool) -> None:
        write_text(self.out / MARKER, self._json.dumps(
            {"format": "clustersim-run", "run_id": self.run_id, "command": self.command, "complete": complete,
             "files": self.files}, indent=1) + "\n")

    def path(self, name: str) -> Path:
        """The path of output ``name`` (recorded as a file of this run)."""
        if not _plain_relative(name):
            raise OutputError(f"bad output name {name!r}")
        if name not in self.files:
            self.files.append(name)
            self._write_marker(False)
        return self.out / name

    def record(self, names) -> None:
        """Record many outputs ``names`` at once (one marker write: an export of 16k rank files)."""
        known = set(self.files)
        new = [n for n in dict.fromkeys(names) if n not in known]
        bad = [n for n in new if not _plain_relative(n)]
        if bad:
            raise OutputError(f"bad output name {bad[0]!r}")
        self.files.extend(new)
        self._write_marker(False)

    def subfolder(self, name: str) -> Path:
        """A sub-folder ``name`` of this run (recorded like a file; a link planted there is removed, so
        writes never go through it)."""
        path = self.path(name)
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            path.unlink()
        try:
            path.mkdir(exist_ok=True)
        except OSError as e:
            raise _fail(path, e) from None
        return path

    def finish(self) -> None:
        """Mark the run complete."""
        self._write_marker(True)


def _plain_relative(name: str) -> bool:
    p = Path(name)
    return bool(name) and not p.is_absolute() and ".." not in p.parts and name != MARKER
