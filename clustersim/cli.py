"""The ``clustersim`` command line. Registers the commands (one module of this package each)
and ends every run in one line: a ``ClusterSimError`` (bad input) or ``OSError`` is
``error: ...`` and exit code 2; anything else is an internal error: exit code 3 and a crash file holding the
traceback (``--debug`` prints tracebacks instead)."""
from __future__ import annotations

import gc
import importlib
import os
import sys

import click

from simulator.errors import ClusterSimError

# (module, attribute) of every subcommand: one file of the application package owns each command.
COMMANDS = [
    ("clustersim.simulate", "simulate"),
    ("clustersim.compare", "compare"),
    ("clustersim.topology", "topology"),
    ("clustersim.plan", "plan"),
    ("clustersim.collect", "collect"),
    ("clustersim.calibrate", "calibrate"),
    ("clustersim.replay", "replay"),
    ("clustersim.search", "search"),
    ("clustersim.goodput", "goodput"),
    ("clustersim.chakra", "chakra"),
    ("clustersim.validate", "validate"),
]


_DEBUG = {"on": False}


class _LazyGroup(click.Group):
    """Imports a command's module only when that command runs (or help lists it): a run pays for its own
    imports (pandas, matplotlib ... where it needs them), not for every command's."""

    def list_commands(self, ctx) -> list[str]:
        return sorted(set(self.commands) | {attr for _, attr in COMMANDS})

    def get_command(self, ctx, name: str):
        if name not in self.commands:
            for module, attr in COMMANDS:
                if attr == name:
                    self.add_command(getattr(importlib.import_module(module), attr))
            _resume_collector()
        return self.commands.get(name)

    def format_commands(self, ctx, formatter) -> None:
        """``clustersim --help``'s command list, as click writes it, from each command's source (its
        docstring or ``help=``) instead of importing every command (numpy, pandas ...: ~1 s)."""
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.commands.get(name) or _described(name) or self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd))
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            with formatter.section("Commands"):
                formatter.write_dl([(name, cmd.get_short_help_str(limit)) for name, cmd in rows])


def _resume_collector() -> None:
    """In a process that ends after its command (``entry``), imports run with the cyclic collector paused:
    what they made lives to the end, so it is frozen out of the collector's reach and the collector resumes
    for the command itself."""
    from clustersim.startup import process_ends_after_command
    if process_ends_after_command() and not gc.isenabled():
        gc.freeze()
        gc.enable()


def _described(name: str) -> click.Command | None:
    """A stand-in command holding only the help of command ``name``, read from its module's source with
    ``ast`` (None where it cannot be read: the caller imports the module)."""
    import ast
    import importlib.util
    for module, attr in COMMANDS:
        if attr != name:
            continue
        try:
            spec = importlib.util.find_spec(module)
            with open(spec.origin, encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (OSError, SyntaxError, AttributeError, TypeError, ValueError, ImportError):
            return None
        for node in ast.walk(tree):             # the function the command decorator wraps (maybe nested)
            if not (isinstance(node, ast.FunctionDef) and node.name == attr):
                continue
            made = [d for d in node.decorator_list if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute)
                    and d.func.attr in ("command", "group")]
            if made:
                kw = {k.arg: k.value.value for d in made for k in d.keywords
                      if k.arg in ("help", "short_help", "hidden", "deprecated") and isinstance(k.value, ast.Constant)}
                return click.Command(name, help=kw.get("help", ast.get_docstring(node)),
                                     short_help=kw.get("short_help"), hidden=bool(kw.get("hidden", False)),
                                     deprecated=kw.get("deprecated", False))
    return None


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="clustersim")
@click.option("--debug", is_flag=True, envvar="CLUSTERSIM_DEBUG",
              help="Print Python tracebacks of errors (also CLUSTERSIM_DEBUG=1).")
def cli(debug: bool) -> None:
    """clustersim: discrete-event simulator of LLM training clusters."""
    _DEBUG["on"] = debug


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI. Bad input: ``error: ...`` on stderr, exit 2; an internal error: one line
    naming a crash file with the traceback, exit 3 (``--debug`` prints it); Ctrl-C: exit 130."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _DEBUG["on"] = "--debug" in argv[:1] or os.environ.get("CLUSTERSIM_DEBUG", "") not in ("", "0")
    try:
        cli.main(args=argv, prog_name="clustersim", standalone_mode=False)
    except ClusterSimError as e:
        return _user_error(str(e))
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as e:          # bad options: one line too, with where to find the right ones
        ctx = getattr(e, "ctx", None)
        where = f" ({' '.join(['clustersim', *ctx.command_path.split()[1:], '--help'])})" if ctx else ""
        return _user_error(f"{e.format_message()}{where}")
    except click.exceptions.Exit as e:
        return e.exit_code
    except OSError as e:
        where = f" {e.filename}" if getattr(e, "filename", None) else ""
        return _user_error(f"cannot read or write{where}: {e.strerror or e}")
    except MemoryError:
        return _internal_error(argv, "out of memory (the input is too large for this machine's memory)")
    except Exception as e:                     # noqa: BLE001 - the last line of defence: never a traceback
        return _internal_error(argv, f"{type(e).__name__}: {e}")
    return 0


def _one_line(msg: str, limit: int = 2000) -> str:
    """``msg`` on one line (its lines joined by " | ", runs of whitespace made one space), cut after ``limit``
    characters with a note saying how much was left out (a plan's or a deadlock's report can name
    thousands of ranks; ``--debug`` prints the whole message with its traceback)."""
    line = " | ".join(part for part in (" ".join(x.split()) for x in str(msg).splitlines()) if part)
    if len(line) <= limit:
        return line
    return f"{line[:limit]} ... ({len(line) - limit:,} more characters; --debug prints them)"


def _user_error(msg: str) -> int:
    if _DEBUG["on"]:
        import traceback
        traceback.print_exc()
    click.echo(f"error: {_one_line(msg)}", err=True)
    return 2


def _internal_error(argv: list[str], what: str) -> int:
    """Write the traceback to a crash file and say where in one line; exit code 3."""
    import traceback
    tb = traceback.format_exc()
    if _DEBUG["on"]:
        sys.stderr.write(tb)
    path = crash_file(argv, tb)
    where = f"; details in {path}" if path else ""
    click.echo(f"error: internal error ({_one_line(what, 200)}){where}. This is a bug in clustersim: please "
               f"report it with that file (--debug prints the traceback)", err=True)
    return 3


def crash_file(argv: list[str], tb: str) -> str | None:
    """Write a crash report (command line, versions, traceback) to a new file in the temp folder; its path,
    or None when even that fails."""
    import platform
    import tempfile
    import time
    try:
        from importlib.metadata import version
        ver = version("clustersim")
    except Exception:                      # noqa: BLE001 - not installed as a package
        ver = "unknown"
    try:
        fd, path = tempfile.mkstemp(prefix=time.strftime("clustersim-crash-%Y%m%dT%H%M%SZ-", time.gmtime()),
                                    suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(f"clustersim {ver}, Python {platform.python_version()}, {platform.platform()}\n"
                    f"command: clustersim {' '.join(argv)}\n\n{tb}")
        return path
    except OSError:
        return None


def entry() -> None:
    """Console-script wrapper: exit with main()'s code. The process ends after the command, so imports
    run with the cyclic collector paused (``_LazyGroup.get_command`` freezes what they made and resumes
    it) and a symmetric run leaves it paused (``clustersim.startup``)."""
    from clustersim.startup import ending_process
    ending_process()
    gc.disable()
    exit_process(main())


def exit_process(code: int) -> None:
    """End the process with ``code``. What the command built (cluster tables, programs, the engine's
    state) is first moved out of the cyclic collector's reach (``gc.freeze``): interpreter shutdown
    would otherwise walk all of it in one last full collection (~0.1 s after a 16k-GPU run) only to
    free memory the OS takes back anyway. Objects are still released (and finalised) as usual."""
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry()
