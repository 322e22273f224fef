"""Streaming reader of Kineto / Chrome-trace JSON (plain or gzip).

``scan(path)`` yields the events of the ``traceEvents`` array one at a time and collects every other
top-level key into ``Scan.meta``, holding only one read chunk (a few MB) and one event in memory, so a
trace of hundreds of MB is read without materialising it. A bare JSON array of events (legal Chrome
trace format) is accepted too. Truncated or corrupt input raises ``TraceError`` naming the file, the
byte offset (of the decompressed text) and what is wrong.
"""
from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from pathlib import Path
from typing import Iterator

from simulator.errors import TraceError

CHUNK_CHARS = 1 << 22          # characters read per refill (4 Mi)
MAX_VALUE_CHARS = 1 << 26      # one event or top-level value (64 Mi characters); real events are < 100 k
_WS = re.compile(r"[ \t\n\r]*")


class Scan:
    """Incremental parser of one trace file. Iterate ``events()``; afterwards ``meta`` holds the other
    top-level keys (``distributedInfo``, ``deviceProperties``, ``baseTimeNanoseconds`` ...)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.meta: dict = {}
        self.saw_trace_events = False
        self._dec = json.JSONDecoder()
        self._buf = ""
        self._pos = 0
        self._consumed = 0        # characters dropped from the front of the buffer so far
        self._eof = False
        self._fh: io.TextIOBase | None = None

    # ------------------------------------------------------------------ low level
    def _open(self) -> io.TextIOBase:
        try:
            with open(self.path, "rb") as raw:
                magic = raw.read(2)
        except FileNotFoundError:
            raise TraceError(f"trace file {self.path} does not exist") from None
        except IsADirectoryError:
            raise TraceError(f"{self.path} is a directory, expected a trace file") from None
        except OSError as e:
            raise TraceError(f"cannot read trace file {self.path}: {e.strerror}") from None
        binary = gzip.open(self.path, "rb") if magic == b"\x1f\x8b" else open(self.path, "rb")
        return io.TextIOWrapper(binary, encoding="utf-8", errors="strict")

    @property
    def chars_read(self) -> int:
        """Characters of (decompressed) text parsed so far."""
        return self._consumed + self._pos

    def _where(self) -> str:
        return f"{self.path}: near character {self._consumed + self._pos}"

    def _fill(self, chars: int | None = None) -> bool:
        """Read another chunk of ``chars`` (default CHUNK_CHARS) characters; False at end of file."""
        if self._eof:
            return False
        try:
            chunk = self._fh.read(chars or CHUNK_CHARS)
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise TraceError(f"{self.path}: corrupt or truncated gzip stream ({e}); re-copy or re-export "
                             f"the trace") from None
        except UnicodeDecodeError as e:
            raise TraceError(f"{self.path}: not UTF-8 text ({e.reason}); is it a Kineto JSON trace?") from None
        if not chunk:
            self._eof = True
            return False
        if self._pos:
            self._consumed += self._pos
            self._buf = self._buf[self._pos:] + chunk
            self._pos = 0
        else:
            self._buf += chunk
        return True

    def _skip_ws(self) -> str:
        """Skip whitespace and return the next character ('' at end of file)."""
        pos = self._pos
        if pos < len(self._buf) and self._buf[pos] not in " \t\n\r":
            return self._buf[pos]
        while True:
            self._pos = _WS.match(self._buf, self._pos).end()
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._fill():
                return ""

    def _decode(self, pos: int):
        """raw_decode at ``pos``; deep nesting and huge numbers become TraceError (JSONDecodeError passes)."""
        try:
            return self._dec.raw_decode(self._buf, pos)
        except json.JSONDecodeError:
            raise
        except RecursionError:
            raise TraceError(f"{self._where()}: JSON nested too deeply; not a Kineto trace") from None
        except (ValueError, OverflowError) as e:      # 5,000-digit integers
            raise TraceError(f"{self._where()}: invalid JSON number ({str(e)[:80]})") from None

    def _value(self, what: str):
        want = CHUNK_CHARS
        while True:
            try:
                obj, end = self._decode(self._pos)
            except json.JSONDecodeError as e:
                # incomplete value: read as much again as is buffered, so a long value costs linear time
                if len(self._buf) - self._pos > MAX_VALUE_CHARS:
                    raise TraceError(f"{self._where()}: one JSON value in {what} is longer than "
                                     f"{MAX_VALUE_CHARS >> 20} Mi characters; not a Kineto trace") from None
                want = max(want, len(self._buf) - self._pos)
                if self._fill(want):
                    continue
                if "Unterminated" in e.msg or not self._buf[e.pos:].strip():
                    raise TraceError(f"{self._where()}: file is truncated inside {what} ({e.msg}); the trace "
                                     f"was probably cut off while being written - re-export it") from None
                raise TraceError(f"{self._where()}: invalid JSON in {what}: {e.msg}") from None
            if end >= len(self._buf) and not self._eof and self._fill(want):
                continue          # a number or literal may continue in the next chunk
            self._pos = end
            return obj

    def _expect(self, chars: str, what: str) -> str:
        c = self._skip_ws()
        if c == "":
            raise TraceError(f"{self._where()}: file is truncated: expected {what} but the file ends; "
                             f"the trace was probably cut off while being written - re-export it")
        if c not in chars:
            raise TraceError(f"{self._where()}: invalid JSON: expected {what}, found {c!r}")
        self._pos += 1
        return c

    # ------------------------------------------------------------------ structure
    def _array(self) -> Iterator[dict]:
        """Events of an array whose '[' was consumed."""
        self.saw_trace_events = True
        if self._skip_ws() == "]":
            self._pos += 1
            return
        while True:
            # fast path: a whole event object inside the buffer (the general path refills and reports errors)
            ev, buf, pos = None, self._buf, self._pos
            if pos < len(buf) and buf[pos] == "{":
                try:
                    ev, end = self._decode(pos)
                except json.JSONDecodeError:
                    ev = None
                else:
                    if end < len(buf):
                        self._pos = end
                    else:
                        ev = None
            if ev is None:
                self._skip_ws()
                ev = self._value("an event of traceEvents")
            if isinstance(ev, dict):
                yield ev
            buf, pos = self._buf, self._pos
            if pos + 1 < len(buf) and buf[pos] == "," and buf[pos + 1] not in " \t\n\r":
                self._pos = pos + 1
                continue
            if self._expect(",]", "',' or ']' after an event of traceEvents") == "]":
                return
            self._skip_ws()

    def events(self) -> Iterator[dict]:
        self._fh = self._open()
        try:
            c = self._skip_ws()
            if c == "":
                raise TraceError(f"{self.path}: empty file, expected a Kineto JSON trace")
            if c == "[":
                self._pos += 1
                yield from self._array()
                return
            if c != "{":
                raise TraceError(f"{self.path}: not a JSON trace (starts with {c!r}, expected '{{')")
            self._pos += 1
            if self._skip_ws() == "}":
                self._pos += 1
            else:
                while True:
                    self._skip_ws()
                    key = self._value("a top-level key")
                    if not isinstance(key, str):
                        raise TraceError(f"{self._where()}: invalid JSON: object key is not a string")
                    self._expect(":", "':' after a top-level key")
                    if key == "traceEvents":
                        self._expect("[", "'[' opening traceEvents")
                        yield from self._array()
                    else:
                        self._skip_ws()
                        self.meta[key] = self._value(f"top-level key {key!r}")
                    if self._expect(",}", "',' or '}' between top-level keys") == "}":
                        break
            if self._skip_ws() != "":
                raise TraceError(f"{self._where()}: extra data after the end of the JSON object")
            if not self.saw_trace_events:
                raise TraceError(f"{self.path}: no 'traceEvents' array: not a Kineto/Chrome trace "
                                 f"(top-level keys: {', '.join(sorted(self.meta)) or 'none'})")
        finally:
            self._fh.close()
