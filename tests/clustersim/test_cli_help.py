"""``clustersim --help`` lists the commands from their sources (no command module imported), exactly as
click lists the imported commands."""
import importlib
import subprocess
import sys

import click

from clustersim import cli


def _listing(group: click.Group) -> str:
    ctx = click.Context(group, info_name="clustersim")
    formatter = ctx.make_formatter()
    group.format_commands(ctx, formatter)
    return formatter.getvalue()


def test_help_lists_what_the_imported_commands_say():
    imported = click.Group(name="clustersim", commands=[getattr(importlib.import_module(m), a) for m, a in cli.COMMANDS])
    lazy = _listing(cli._LazyGroup(name="clustersim"))
    assert lazy == _listing(imported)
    assert all(f"  {a} " in lazy for _, a in cli.COMMANDS)


def test_help_imports_no_command_module():
    code = ("import sys; from clustersim.cli import main; sys.argv = ['clustersim', '--help']; main(); "
            "print(sorted(m for m in sys.modules if m in ('numpy', 'pandas', 'networkx', 'clustersim.simulate')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "[]"
    assert "simulate" in out
