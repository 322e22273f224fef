"""``clustersim validate``: the model against published measurements. Subcommands: ``collectives``
(clustersim.validate_collectives). Minimal group created by issue 13; the training-run validation
(issue 12) is its default."""
from __future__ import annotations

import click

from clustersim.validate_collectives import collectives


@click.group("validate", invoke_without_command=True)
@click.pass_context
def validate(ctx) -> None:
    """Compare the simulator with published measurements."""
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


validate.add_command(collectives)
