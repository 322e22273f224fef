"""The floors stay true: no package imports a package above it, at module level or inside a function.

The table below is the one in ARCHITECTURE.md ("Floors and what each may import"). A module of package P may
import a module M of ours only if M's package (or, for ``simulator``, the contract module itself) is listed
for P. Imports are read from the source with ``ast``, so function-local imports count too.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = ("clustersim", "simulator", "topologies", "schedules", "traces")

#: the contract modules (and the package's __init__) that topologies/ and schedules/ may import from simulator/
CONTRACT = {"simulator", "simulator.program", "simulator.costs", "simulator.calibration", "simulator.errors",
            "simulator.kernels", "simulator.yamlio", "simulator.inputs", "simulator.atomic"}

#: package -> (packages it may import any module of, single modules it may import besides)
ALLOWED = {
    "simulator": ({"simulator"}, set()),
    "topologies": ({"topologies"}, CONTRACT),
    "schedules": ({"schedules"}, CONTRACT),
    "traces": ({"simulator", "topologies", "schedules", "traces"}, set()),
    "clustersim": ({"simulator", "topologies", "schedules", "traces", "clustersim"}, set()),
}


def _is_module(dotted: str) -> bool:
    path = ROOT / dotted.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imported_modules(source: str) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in ``source``, wherever it stands (module level or inside a
    function); ``from a.b import c`` yields ``a.b`` and, when c is itself a module of ours, ``a.b.c``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                    if _is_module(f"{node.module}.{a.name}")]
    return sorted(out)


def upward_imports(package: str, source: str) -> list[str]:
    """The imports of ours in ``source`` (a module of ``package``) that the table does not allow."""
    packages, modules = ALLOWED[package]
    bad = []
    for line, module in imported_modules(source):
        top = module.split(".")[0]
        if top in OURS and top not in packages and module not in modules:
            bad.append(f"line {line}: {module}")
    return bad


def _modules():
    for package in OURS:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield package, path


@pytest.mark.parametrize("package,path", list(_modules()), ids=lambda x: str(x).split("/work/")[-1])
def test_no_upward_import(package, path):
    bad = upward_imports(package, path.read_text(encoding="utf-8"))
    assert not bad, f"{path.relative_to(ROOT)} ({package}) imports above its floor: {bad}"


def test_a_planted_upward_import_is_caught():
    """The check fails on the imports it exists to catch, hidden in a function or not."""
    planted_engine = "def f():\n    from clustersim.experiment import run_experiment\n    return run_experiment\n"
    assert upward_imports("simulator", planted_engine) == ["line 2: clustersim.experiment"]
    assert upward_imports("topologies", "import schedules.models\n") == ["line 1: schedules.models"]
    assert upward_imports("schedules", "from simulator.engine import run\n")
    assert upward_imports("schedules", "from simulator import engine\n") == ["line 1: simulator.engine"]
    assert upward_imports("traces", "from clustersim import cli\n")
    # and passes on the allowed ones
    assert upward_imports("topologies", "from simulator.program import Op\nfrom simulator import errors\n") == []
    assert upward_imports("traces", "from simulator.engine import run\nfrom schedules.models import custom_model\n") == []
    assert upward_imports("clustersim", "from traces.replay import replay\n") == []


def test_simulator_imports_nothing_of_the_other_packages():
    """The issue's own wording: simulator/ has no import of topologies, schedules, traces or the application."""
    for path in sorted((ROOT / "simulator").rglob("*.py")):
        tops = {m.split(".")[0] for _, m in imported_modules(path.read_text(encoding="utf-8"))}
        assert not tops & {"clustersim", "topologies", "schedules", "traces"}, path
