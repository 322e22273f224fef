"""Click types of the commands' options: the path type every file and folder option uses (``click.Path`` that
refuses an empty string: ``--out ''`` was taken as no ``--out`` at all, and the run wrote nothing without a
word) and the byte-size type of size options (``ByteSize``: 4GB, 1e6, 64KiB)."""
from __future__ import annotations

import click


class NonEmptyPath(click.Path):
    """``click.Path`` refusing an empty or blank value with a usage error naming the option."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            self.fail("empty path: give a file or folder name", param, ctx)
        return super().convert(value, param, ctx)


class ByteSize(click.ParamType):
    """Bytes as a whole number: 1048576, 1e6 or a number with a unit (4GB, 512KB, 64KiB;
    ``simulator.inputs.byte_size``: SI units, 1 GB = 1e9 B, and binary ones). A usage error names the option.
    ``allow_zero``: 0 is a value of its own (e.g. "automatic")."""
    name = "bytes"

    def __init__(self, allow_zero: bool = False):
        self.allow_zero = allow_zero

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if self.allow_zero and isinstance(value, str) and value.strip() == "0":
            return 0
        if isinstance(value, str) and value.strip().isdigit():       # exact, however large
            if int(value) > 0:
                return int(value)
        from simulator.errors import ConfigError
        from simulator.inputs import byte_size
        try:
            b = byte_size(value, "bytes")
        except ConfigError as e:
            self.fail(str(e).removeprefix("bytes: "), param, ctx)
        whole = round(b)
        if whole < 1 or abs(b - whole) > 1e-9 * b:       # 4.1MB is 4,100,000 B, though 4.1 * 1e6 is not exact
            self.fail(f"expected a whole number of bytes, got {value!r} ({b:g} B)", param, ctx)
        return whole
