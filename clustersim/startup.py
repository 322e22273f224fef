"""Start-up costs of a command: what a short run (a 16k-GPU symmetric simulation takes well under a second)
should not pay for.

``import_simpy`` imports SimPy without its ``importlib.metadata`` version lookup: ``simpy/__init__.py``
sets ``__version__`` from the installed distribution's metadata, and importing ``importlib.metadata``
(email, zipfile, csv, pathlib ...) costs ~25 ms, a tenth of everything else a simulation imports.
``simpy.__version__`` is still there, read from the metadata on first access.

A process that ends after its command (the console script, ``python -m clustersim``: ``ending_process``)
imports with the cyclic collector paused. When that command runs a single simulation (``simulate``, ``chakra
export``: ``single_simulation``), the collector stays paused after a symmetric simulation without a timeline
(``clustersim.experiment.run_experiment``): the heap is frozen at exit (``cli.exit_process``), so collecting
what the run built would only cost time. Commands that run many simulations in one process (``search`` and
its workers, ``validate``, ``compare``) keep the collector running between them, else every run's garbage
cycles pile up (a DeepSeek-V3 search on 576 GB200 grew to 12 GB and the OOM killer took its worker).
Library callers and tests never set either.
"""
from __future__ import annotations

import importlib
import sys
import types


_PROCESS = {"ends_after_command": False, "one_simulation": False}


def ending_process() -> None:
    """Mark this process as one that ends when the current command returns (see the module doc)."""
    _PROCESS["ends_after_command"] = True


def process_ends_after_command() -> bool:
    return _PROCESS["ends_after_command"]


def single_simulation() -> None:
    """Mark the current command as one that runs a single simulation (see the module doc)."""
    _PROCESS["one_simulation"] = True


def process_runs_one_simulation() -> bool:
    """The process ends after a command that runs one simulation: what the run builds lives to the end."""
    return _PROCESS["ends_after_command"] and _PROCESS["one_simulation"]


def import_simpy():
    """``import simpy``, without reading its version from the installed metadata (see the module doc).
    Where ``importlib.metadata`` is already imported, or SimPy is, this is the plain import."""
    if "simpy" in sys.modules or "importlib.metadata" in sys.modules:
        import simpy
        return simpy
    stub = types.ModuleType("importlib.metadata")

    class PackageNotFoundError(ModuleNotFoundError):
        pass

    def version(name: str) -> str:              # simpy catches this and leaves __version__ unset
        raise PackageNotFoundError(name)

    stub.PackageNotFoundError, stub.version = PackageNotFoundError, version
    missing = object()
    before = importlib.__dict__.get("metadata", missing)
    sys.modules["importlib.metadata"] = stub
    importlib.metadata = stub                   # ``import importlib.metadata`` reads the attribute
    try:
        import simpy
    finally:
        del sys.modules["importlib.metadata"]
        if before is missing:
            del importlib.metadata
        else:
            importlib.metadata = before
    if "__version__" not in simpy.__dict__:
        simpy.__getattr__ = _simpy_version       # PEP 562: looked up only for missing attributes
    return simpy


def _simpy_version(name: str):
    simpy = sys.modules["simpy"]
    if name != "__version__":
        raise AttributeError(f"module 'simpy' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version
    try:
        simpy.__version__ = version("simpy")
    except PackageNotFoundError:
        raise AttributeError("module 'simpy' has no attribute '__version__'") from None
    return simpy.__version__
