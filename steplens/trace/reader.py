"""Reading a Chrome trace as a stream of events: memory follows the events kept, not the file's size.

The events of `traceEvents` are read from 1 MiB chunks (plain or gzipped JSON), and parsed in runs of whole
events of at most RUN characters (an event longer than that alone), each as one JSON array: with orjson where it
is installed, else with the standard library's json, which reads them exactly as one raw_decode per event would.
Where asked (Events.lists(structs=True): the one-pass read) and msgspec is installed, a run whose events hold only
the profiler's keys comes as Event objects instead, and any other run as msgspec's dicts. Anything else (the
document's head and tail, an event cut by the chunk's end, a run that does not parse as an array) is read one
value at a time."""

import codecs
import gzip
import json
import re
from collections.abc import Iterator
from itertools import chain
from typing import Any

try:  # about 1.5 times as fast as json on a trace's events; optional (pyproject.toml's dependencies)
    import orjson
except ImportError:
    orjson = None
try:  # the one-pass read's events as Event objects (below); optional too
    import msgspec
except ImportError:
    msgspec = None


class TraceError(Exception):
    pass


class _Unset:
    """A key the event does not have (an Event's field left at its default)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = msgspec.UNSET if msgspec else _Unset()
# The keys of the events PyTorch's profiler writes (complete, instant, flow and metadata events)
FIELDS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id", "bp", "s")
STRUCTS = msgspec is not None  # whether Events.lists(structs=True) gives Event objects where it can
STRUCT_MISSES = 8  # runs in a row that do not read as Events, after which a trace's are read as dicts only


if msgspec is not None:

    class Event(msgspec.Struct, forbid_unknown_fields=True, gc=False):
        """An event as its FIELDS, each left UNSET where the event lacks it: lighter than a dict (a field is read
        faster than a dict's key, and the object is freed faster). Its name is a string, its pid and tid an
        integer, a string or null, its args an object; the other fields any JSON value. An event with any other
        key, or another type there, is not one: the run of events that holds it is read as dicts (the reader of
        Events need not check those types again). msgspec reads every JSON value as json does (an integer past
        64 bits whole), and refuses what json reads and orjson refuses (NaN, lone surrogates)."""

        ph: Any = UNSET
        cat: Any = UNSET
        name: str | msgspec.UnsetType = UNSET
        pid: int | str | None | msgspec.UnsetType = UNSET
        tid: int | str | None | msgspec.UnsetType = UNSET
        ts: Any = UNSET
        dur: Any = UNSET
        args: dict | msgspec.UnsetType = UNSET
        id: Any = UNSET
        bp: Any = UNSET
        s: Any = UNSET

    _EVENTS = msgspec.json.Decoder(list[Event]).decode
    _GENERIC = msgspec.json.Decoder().decode
    _asdict = msgspec.structs.asdict  # every field, set or not
else:

    class Event:  # never made: the reader gives dicts where msgspec is missing
        pass


def as_dict(ev: Any) -> dict[str, Any]:
    """The dict an Event stands for: its keys in FIELDS' order (not the file's), the unset ones left out."""
    d = _asdict(ev)
    for key in FIELDS:
        if d[key] is UNSET:
            del d[key]
    return d


_SPACE = re.compile(r"[ \t\n\r]*")
RUN = 1 << 15  # characters of events parsed at once: a quarter MiB took over a quarter longer (results/reader-speed/)
# Where one event ends and the next begins: the text up to the last of these parses as whole events, or not at all
# (a cut inside a string or inside an event leaves the array unclosed).
_BOUNDARY = "},"
_NEXT_OBJECT = re.compile(r"[ \t\n\r]*\{")
# An integer past 64 bits, which orjson reads as a float and json as an int, has 19 digits or more.
_DIGITS = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_RUN = b"0" * 19
_RUN_END = re.compile(rb"0*")
_U64, _I64 = (1 << 64) - 1, 1 << 63


def wide_integer(data: bytes, before: bytes = b"") -> bool:
    """Whether data (after the bytes before it) may hold an integer that 64 bits do not hold. Only runs of 19
    digits or more are looked at: one after a '.' is a fraction, which both parsers read alike; one that fits
    (baseTimeNanoseconds, say) is read alike too; any other answers True, even inside a string. data is looked at
    alone (but for a run at its start, which may go on from before), then where it meets before: never copied
    whole. It answers as one look at before + data would."""
    return _wide(data, 1) or _wide(before + data[: len(_LONG_RUN) + 2], 0)


def _wide(raw: bytes, start: int) -> bool:
    """wide_integer of the runs in raw that start at or after start (a run at raw's start: nothing before it)."""
    text = raw.translate(_DIGITS)
    i = text.find(_LONG_RUN)
    while i >= 0:
        end = _RUN_END.match(text, i).end()
        sign = raw[i - 1 : i] if i else b""
        if i >= start and sign != b".":
            if sign in (b"e", b"E", b"+") or end - i > 20:
                return True
            if int(raw[i:end]) > (_I64 if sign == b"-" else _U64):
                return True
        i = text.find(_LONG_RUN, end)
    return False


class _Stream:
    """A text stream read in chunks: runs of whole events parsed as one array, anything else one JSON value at a
    time with json's raw_decode.

    Only the current chunk and the value being decoded are held: memory is bounded by the
    chunk size plus the largest single value (one trace event), not by the file.
    """

    def __init__(self, f, chunk=1 << 20, structs=False):
        self.f, self.chunk, self.buf, self.pos, self.eof = f, chunk, "", 0, False
        self.decode = json.JSONDecoder().raw_decode
        self.text = codecs.getincrementaldecoder("utf-8")()
        self.tail = b""  # the last bytes read, for a run of digits that a chunk's end cuts
        # Events where asked and msgspec is at hand, else dicts: from msgspec (which reads wide integers as json
        # does), or orjson until a wide integer may come (wide_integer), else json
        self.events = _EVENTS if structs and STRUCTS else None
        self.loads = _GENERIC if self.events else orjson.loads if orjson else json.loads
        self.misses = 0  # runs in a row not read as Events
        self.slow_until = 0  # a run of events that failed to parse as one array: read one by one up to here

    def _more(self):
        data = self.f.read(self.chunk)
        if not data:
            self.eof = True
            text = self.text.decode(b"", final=True)
            if not text:
                return False
        else:
            if orjson and self.loads is orjson.loads and wide_integer(data, self.tail):
                self.loads = json.loads  # from here on: what is already read was checked
            self.tail = data[-32:]
            text = self.text.decode(data)
        self.buf = self.buf[self.pos :] + text
        self.slow_until -= self.pos
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
        """The elements of the array that starts here, as lists: whole runs of events at once where they parse as
        one array (_run), else one at a time."""
        self.take("[")
        if self.char() == "]":
            self.pos += 1
            return
        while True:
            events = self._run()
            if events is not None:
                yield events
                continue
            yield [self.value()]
            c = self.char()
            if c == "]":
                self.pos += 1
                return
            if c != ",":
                raise ValueError(f"expected ',' or ']' between trace events, found {c or 'the end of the file'!r}")
            self.pos += 1

    def _boundary(self, before: int) -> int:
        """The last '},' before `before` that a '{' follows (blanks between): an event's end, unless inside a
        string or an array of objects, which _run's parse then refuses; -1 where there is none."""
        buf, cut = self.buf, before
        while True:
            cut = buf.rfind(_BOUNDARY, self.pos, cut)
            if cut < 0 or _NEXT_OBJECT.match(buf, cut + len(_BOUNDARY)):
                return cut
            cut += 1  # rfind's end is exclusive: the next search ends before this '},'

    def _boundary_after(self, at: int) -> int:
        """The first '},' at or after `at` that a '{' follows (blanks between); -1 where the buffer has none."""
        buf = self.buf
        while True:
            at = buf.find(_BOUNDARY, at)
            if at < 0 or _NEXT_OBJECT.match(buf, at + len(_BOUNDARY)):
                return at
            at += 1

    def _run(self):
        """The events from here to the last event boundary within RUN characters (a quarter chunk at most), or to
        the first after it where none ends within, parsed as one array (then the stream stands after that
        boundary's comma), or None: no boundary, or text that does not parse whole, which is then read one value
        at a time (json's own errors, or values json reads and orjson refuses: NaN, lone surrogates)."""
        if self.pos < self.slow_until:
            return None
        if len(self.buf) - self.pos < self.chunk // 2 and not self.eof:
            self._more()
        if self.char() != "{":
            return None
        # RUN characters of events at a time (a quarter chunk at most): their objects, alive at once, cost several
        # times their text, and a parse of a few tens of kB of text at once is the fastest
        limit = self.pos + min(RUN, self.chunk // 4)
        cut = self._boundary(limit)
        if cut < 0:  # no event ends within the limit: up to the first that ends after it (a long event, alone)
            cut = self._boundary_after(max(self.pos, limit - 1))
        if cut < 0:
            return None
        text = "[" + self.buf[self.pos : cut + 1] + "]"
        try:
            events = None
            if self.events:
                try:
                    events = self.events(text)
                    self.misses = 0
                except (ValueError, RecursionError):  # a key beyond FIELDS, an element not an object, ...: as dicts
                    self.misses += 1
                    if self.misses == STRUCT_MISSES:  # a trace of other keys: not tried again
                        self.events = None
            if events is None:
                events = self.loads(text)
        except (ValueError, RecursionError):  # orjson.JSONDecodeError, msgspec's and json's are ValueErrors
            self.slow_until = cut + 1
            return None
        self.pos = cut + len(_BOUNDARY)
        return events


# The top-level values kept beside the events when asked (iter_events' meta): small, and read by the roofline.
META_KEYS = ("deviceProperties",)


class Events:
    """A trace's events, read as they are iterated (once per iteration): one by one, or as the lists of events
    that the reader parses at once (lists(): about a hundred events, RUN characters of them at most, or one
    longer event alone)."""

    def __init__(self, path: str, chunk: int, meta: dict[str, Any] | None):
        self.path, self.chunk, self.meta = path, chunk, meta
        self._it: Iterator[Any] | None = None

    def lists(self, structs: bool = False) -> Iterator[list[Any]]:
        """structs: a run read whole may come as a list of Event (where msgspec is at hand), not of dicts."""
        return _event_lists(self.path, self.chunk, self.meta, structs)

    def __iter__(self) -> Iterator[Any]:
        return chain.from_iterable(self.lists())

    def __next__(self) -> Any:
        if self._it is None:
            self._it = iter(self)
        return next(self._it)


def iter_events(path: str, chunk: int = 1 << 20, meta: dict[str, Any] | None = None) -> Events:
    """The trace's events one by one, from a {"traceEvents": [...], ...} object or a bare array (Events).

    meta: where given, the top-level values named in META_KEYS are stored in it as the stream passes them,
    wherever they stand in the file; every other top-level value is skipped."""
    return Events(path, chunk, meta)


def _event_lists(path: str, chunk: int, meta: dict[str, Any] | None, structs: bool = False) -> Iterator[list[Any]]:
    """iter_events' events, as the lists _Stream.array gives them."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            stream = _Stream(f, chunk, structs)
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
