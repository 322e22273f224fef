"""What a short ``clustersim simulate`` run pays for at start-up and exit (clustersim.startup, cli.exit_process,
run_experiment's collector pause): only the packages it needs, SimPy without its metadata lookup, the
cyclic collector back as it was."""
import gc
import json
import subprocess
import sys

SMALL = ["simulate", "--cluster", "dgx-h100", "--gpus", "64", "--model", "llama3-8b", "--tp", "8", "--pp", "2",
         "--dp", "4", "--global-batch", "32", "--network", "flow"]


def _python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_simulate_imports_only_what_it_needs():
    """The simulate command imports no pandas, matplotlib, networkx or scipy, no importlib.metadata
    (SimPy's version lookup) and no numpy.ma (``np.unique`` without an index output imports it: ~20 ms), for
    the table and for --json."""
    code = f"""
import contextlib, io, json, sys
from clustersim.cli import main
for extra in ([], ["--json"]):
    with contextlib.redirect_stdout(io.StringIO()):
        assert main({SMALL!r} + extra) == 0
print(json.dumps(sorted(m for m in ("pandas", "matplotlib", "networkx", "scipy", "importlib.metadata",
                                   "numpy.ma") if m in sys.modules)))
"""
    assert json.loads(_python(code)) == []


def test_import_simpy_skips_the_metadata_and_keeps_the_version():
    code = """
import importlib, json, sys
from clustersim.startup import import_simpy
simpy = import_simpy()
clean = "importlib.metadata" not in sys.modules and "metadata" not in vars(importlib)
env = simpy.Environment()
env.timeout(1.5)
env.run()
version = simpy.__version__                      # read from the metadata on first access
import importlib.metadata as md
try:
    simpy.no_such_thing
    missing = False
except AttributeError:
    missing = True
print(json.dumps([clean, env.now, version == md.version("simpy"), missing]))
"""
    assert json.loads(_python(code)) == [True, 1.5, True, True]


def test_import_simpy_is_the_plain_import_once_metadata_is_loaded():
    code = """
import importlib.metadata, json, sys
from clustersim.startup import import_simpy
simpy = import_simpy()
print(json.dumps([simpy.__dict__.get("__version__") == importlib.metadata.version("simpy"),
                  sys.modules["importlib.metadata"] is importlib.metadata]))
"""
    assert json.loads(_python(code)) == [True, True]


def test_run_experiment_restores_the_collector():
    from clustersim.experiment import experiment_from_options, run_experiment
    from clustersim.simulate import simulate
    ctx = simulate.make_context("simulate", SMALL[1:])
    opts = {k: v for k, v in ctx.params.items() if k not in ("out", "as_json", "breakdown", "force")}
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            out = run_experiment(experiment_from_options(**opts))
            assert gc.isenabled() is enabled and out.metrics.step_time_s > 0
    finally:
        (gc.enable if was else gc.disable)()


def test_console_entry_exits_with_the_commands_code():
    """``python -m clustersim`` (as the console script) exits with main()'s code after freezing the heap."""
    ok = subprocess.run([sys.executable, "-m", "clustersim", *SMALL, "--json"], capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0 and json.loads(ok.stdout)["step_time_s"] > 0
    bad = subprocess.run([sys.executable, "-m", "clustersim", "simulate", "--gpus", "-3"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error:")


def test_console_entry_pauses_the_collector_for_imports_and_symmetric_runs_only(tmp_path):
    """Under the console entry, imports run with the collector paused, the command with it running, a
    symmetric run leaves it paused to the exit (but where a report folder's plots follow); full mode's
    engine run keeps it."""
    code = """
import atexit, gc, json, sys
import simulator.engine as engine
seen = []
real = engine.run
def run(*a, **k):
    seen.append(["engine", gc.isenabled()])
    return real(*a, **k)
engine.run = run
atexit.register(lambda: sys.stderr.write("STATES " + json.dumps(seen + [["exit", gc.isenabled()]]) + "\\n"))
import clustersim.cli as cli
real_get = cli._LazyGroup.get_command
def get_command(self, ctx, name):
    seen.append(["before import", gc.isenabled()])
    return real_get(self, ctx, name)
cli._LazyGroup.get_command = get_command
sys.argv = ["clustersim"] + sys.argv[1:]
cli.entry()
"""
    for mode, extra, states in (
            ("symmetric", ["--json"], [["before import", False], ["engine", False], ["exit", False]]),
            ("full", ["--json"], [["before import", False], ["engine", True], ["exit", True]]),
            ("symmetric", ["--out", str(tmp_path / "r")], [["before import", False], ["engine", False], ["exit", True]])):
        out = subprocess.run([sys.executable, "-c", code, *SMALL, "--mode", mode, *extra], capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        line = [ln for ln in out.stderr.splitlines() if ln.startswith("STATES ")][0]
        assert json.loads(line[len("STATES "):]) == states, mode


def test_commands_that_run_many_simulations_keep_the_collector_between_them():
    """Under the console entry, only a single-simulation command (simulate) leaves the collector paused
    after a symmetric run; a search running its plans in one process finds it running at every plan after
    the first's end (it once stayed paused and a search's garbage cycles grew a worker to 12 GB)."""
    code = """
import atexit, gc, json, sys
import clustersim.experiment as experiment
seen = []
real = experiment.run_experiment
def run_experiment(*a, **k):
    out = real(*a, **k)
    seen.append(gc.isenabled())
    return out
experiment.run_experiment = run_experiment
atexit.register(lambda: sys.stderr.write("STATES " + json.dumps(seen) + "\\n"))
import clustersim.cli as cli
sys.argv = ["clustersim"] + sys.argv[1:]
cli.entry()
"""
    args = ["search", "--gpus", "8", "-m", "tiny", "--global-batch", "16", "--seq", "128", "--workers", "1",
            "--no-cache", "--json", "--top-k", "3", "--cp", "1"]
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    states = json.loads([ln for ln in out.stderr.splitlines() if ln.startswith("STATES ")][0][len("STATES "):])
    assert len(states) >= 3 and all(states), states
