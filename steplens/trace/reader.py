"""Reading a Chrome trace as a stream of events: memory follows the events kept, not the file's size.

The events of `traceEvents` are parsed one at a time from 1 MiB chunks (plain or gzipped JSON)."""

import gzip
import json
import re
from collections.abc import Iterator
from typing import Any


class TraceError(Exception):
    pass


_SPACE = re.compile(r"[ \t\n\r]*")


class _Stream:
    """A text stream read in chunks, decoded one JSON value at a time with json's raw_decode.

    Only the current chunk and the value being decoded are held: memory is bounded by the
    chunk size plus the largest single value (one trace event), not by the file.
    """

    def __init__(self, f, chunk=1 << 20):
        self.f, self.chunk, self.buf, self.pos, self.eof = f, chunk, "", 0, False
        self.decode = json.JSONDecoder().raw_decode

    def _more(self):
        data = self.f.read(self.chunk)
        if not data:
            self.eof = True
            return False
        self.buf = self.buf[self.pos :] + data
        self.pos = 0
        return True

    def char(self):
        """The next non-blank character (not consumed), or '' at the end."""
        while True:
            self.pos = _SPACE.match(self.buf, self.pos).end()
            if self.pos < len(self.buf) or not self._more():
                return self.buf[self.pos : self.pos + 1]

    def take(self, expected):
        c = self.char()
        if c != expected:
            raise ValueError(f"expected {expected!r} at a JSON position, found {c or 'the end of the file'!r}")
        self.pos += 1

    def end(self):
        """Nothing but blanks after the document: text after it (a second gzip member, which gzip reads on, or
        anything appended) is neither read nor ignored, but refused."""
        c = self.char()
        if c:
            raise ValueError(
                f"more after the trace's JSON document, from {self.buf[self.pos : self.pos + 40]!r} (a second "
                "gzip member, or data appended to the file): none of it is read"
            )

    def value(self):
        """The next JSON value. A value that ends exactly at the buffer's end may be cut (a number): read on."""
        self.char()
        while True:
            try:
                obj, end = self.decode(self.buf, self.pos)
                if end < len(self.buf) or self.eof:
                    self.pos = end
                    return obj
            except json.JSONDecodeError:
                if self.eof:
                    raise
            if not self._more():
                obj, self.pos = self.decode(self.buf, self.pos)
                return obj

    def array(self):
        """The elements of the array that starts here, one at a time."""
        self.take("[")
        if self.char() == "]":
            self.pos += 1
            return
        while True:
            yield self.value()
            c = self.char()
            if c == "]":
                self.pos += 1
                return
            if c != ",":
                raise ValueError(f"expected ',' or ']' between trace events, found {c or 'the end of the file'!r}")
            self.pos += 1


# The top-level values kept beside the events when asked (iter_events' meta): small, and read by the roofline.
META_KEYS = ("deviceProperties",)


def iter_events(path: str, chunk: int = 1 << 20, meta: dict[str, Any] | None = None) -> Iterator[Any]:
    """The trace's events one by one, from a {"traceEvents": [...], ...} object or a bare array.

    meta: where given, the top-level values named in META_KEYS are stored in it as the stream passes them,
    wherever they stand in the file; every other top-level value is skipped."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            stream = _Stream(f, chunk)
            first = stream.char()
            if first == "[":
                yield from stream.array()
                stream.end()
                return
            if first != "{":
                raise ValueError(f"a Chrome trace starts with '{{' or '[', this file with {first or 'nothing'!r}")
            stream.take("{")
            found = False
            while stream.char() != "}":
                key = stream.value()
                stream.take(":")
                if key == "traceEvents" and stream.char() == "[":
                    found = True
                    yield from stream.array()
                elif meta is not None and key in META_KEYS:
                    meta[key] = stream.value()
                else:
                    stream.value()  # metadata (baseTimeNanoseconds, ...): not needed
                if stream.char() == ",":
                    stream.pos += 1
            stream.take("}")
            stream.end()
            if not found:
                raise TraceError(f"{path}: no traceEvents list: not a PyTorch profiler trace")
    except (OSError, EOFError, ValueError, UnicodeDecodeError, RecursionError) as e:  # JSONDecodeError: a ValueError
        raise TraceError(f"{path}: not a readable Chrome trace ({type(e).__name__}: {e})") from e


def load_events(path: str) -> list[Any]:
    """The whole event list at once (json.load): the reference the streaming reader is checked against."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise TraceError(f"{path}: not a readable Chrome trace ({type(e).__name__}: {e})") from e
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise TraceError(f"{path}: no traceEvents list: not a PyTorch profiler trace")
    return events
