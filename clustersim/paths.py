"""The click path type every command's file and folder options use: ``click.Path`` that refuses an empty
string (``--out ''`` was taken as no ``--out`` at all, and the run wrote nothing without a word)."""
from __future__ import annotations

import click


class NonEmptyPath(click.Path):
    """``click.Path`` refusing an empty or blank value with a usage error naming the option."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            self.fail("empty path: give a file or folder name", param, ctx)
        return super().convert(value, param, ctx)
