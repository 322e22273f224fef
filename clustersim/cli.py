"""The ``clustersim`` command line: registers the commands (one module of this package each) and turns
every ``ClusterSimError`` into a one-line message and exit code 2."""
from __future__ import annotations

import importlib
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
    ("clustersim.validate", "validate"),
]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="clustersim")
def cli() -> None:
    """clustersim: discrete-event simulator of LLM training clusters."""


def _register() -> None:
    for module, attr in COMMANDS:
        cli.add_command(getattr(importlib.import_module(module), attr))


_register()


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI; user errors become ``error: ...`` on stderr and exit code 2."""
    try:
        cli.main(args=argv, prog_name="clustersim", standalone_mode=False)
    except ClusterSimError as e:
        click.echo(f"error: {e}", err=True)
        return 2
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as e:
        e.show()
        return 2
    except click.exceptions.Exit as e:
        return e.exit_code
    except OSError as e:
        where = f" {e.filename}" if getattr(e, "filename", None) else ""
        click.echo(f"error: cannot read or write{where}: {e.strerror or e}", err=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())


def entry() -> None:
    """Console-script wrapper: exit with main()'s code."""
    sys.exit(main())
