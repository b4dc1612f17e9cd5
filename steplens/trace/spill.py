"""Records read back in sorted order with bounded memory: sorted chunks spilled to a temp file, then merged.

A big trace has millions of complete events. The checks that need them sorted (Perfetto's nesting rule, the
slices that cross on a thread, the events written twice) keep one fixed-width record per event here. Up to
CHUNK records stay in memory; each full chunk is sorted and written to an unnamed temp file as a run (8 bytes
a number). Reading merges at most FAN_IN runs at a time, BUFFER records of each at a time; more runs are first
merged into longer ones on the same file. Memory stays near CHUNK records plus FAN_IN buffers, whatever the
trace's size; the disk holds the records about twice.

The sorting and merging run in C (sorted, list.sort on a few sorted pieces, array's bytes): Python touches a
record only where it is added and where it is read.

The temp file goes to $STEPLENS_SPILL_DIR where set, else to the system's temp folder (tempfile.gettempdir);
where that folder is a RAM disk (tmpfs), a line on stderr says so once. The file has no name (removed as it is
made), so it is gone once closed, or once the process ends however it ends. A write that fails or stops short (a
full disk: ENOSPC) raises SpillError, a TraceError: one line, never a silently shorter result."""

import heapq
import os
import sys
import tempfile
from array import array
from bisect import bisect_right
from collections.abc import Iterator
from itertools import chain, compress, islice
from operator import ge
from typing import Any

from steplens.trace.reader import TraceError

CHUNK = 1 << 15  # records sorted in memory at a time (a list of tuples: about 4.5 MB for 32k records of three numbers)
FAN_IN = 128  # runs merged at once (a 1 GB trace sorts about 115 runs of complete events: one merge)
BUFFER = 1 << 9  # records read from a run at a time
SPILL_DIR = "STEPLENS_SPILL_DIR"  # the environment variable that names the temp file's folder


class SpillError(TraceError):
    """The temp file could not be written whole (a full disk, a quota, an I/O error)."""


_WHERE = f"{SPILL_DIR} picks another folder"  # said with every error of the temp file


def spill_dir() -> str:
    """The folder the temp files go to: $STEPLENS_SPILL_DIR where set, else the system's temp folder."""
    return os.environ.get(SPILL_DIR) or tempfile.gettempdir()


def file_system(path: str, mounts_file: str = "/proc/mounts") -> str | None:
    """The type of the file system that holds path (the mount table's longest mount point above it), or None."""
    try:
        with open(mounts_file) as f:
            mounts = [line.split()[1:3] for line in f]
    except OSError:
        return None
    path = os.path.realpath(path)
    above = (m for m in mounts if len(m) == 2 and (path == m[0] or path.startswith(m[0].rstrip("/") + "/")))
    best = max(above, key=lambda m: len(m[0]), default=None)  # the longest mount point; the last of equal ones
    return best[1] if best else None


_told: set[str] = set()  # the RAM-disk folders already named on stderr


def _temp_file():
    """The unnamed temp file of a spill, in spill_dir(); where that is a RAM disk, a line on stderr says so once."""
    folder = spill_dir()
    if folder not in _told and file_system(folder) == "tmpfs":
        _told.add(folder)
        print(
            f"steplens: sorting through a temp file in {folder}, a RAM disk (tmpfs): it holds 32 to 56 bytes per "
            f"trace event in memory; set {SPILL_DIR} to a folder on disk for a trace larger than memory",
            file=sys.stderr,
        )
    try:
        return tempfile.TemporaryFile(prefix="steplens-spill-", dir=folder)
    except OSError as e:
        raise SpillError(f"cannot make the sort's temp file in {folder} ({_WHERE}): {e.strerror}") from e


class SortedRecords:
    """Records of `width` numbers (array typecode `typecode`), added in any order, read once in sorted order.

    Records are tuples (plain numbers when width is 1) ordered as Python orders them; equal records come
    back in no particular order, so only what cannot tell them apart may be read from them."""

    def __init__(self, typecode: str, width: int, chunk: int | None = None, fan_in: int | None = None):
        self.typecode, self.width = typecode, width
        self.fan_in = fan_in or FAN_IN
        self.chunk = chunk or CHUNK
        self.limit = self.chunk * width  # numbers in the buffer when a chunk is full
        self.buf = array(typecode)
        self.file = None
        self.runs: list[tuple[int, int]] = []  # (byte offset, records) of each sorted run in the file
        self.end = 0  # bytes written
        self.count = 0
        self.spilled_bytes = 0  # every byte written to the temp file, merges included

    def add(self, record: tuple) -> None:
        """Add one record (a tuple of width numbers, or a number when width is 1)."""
        if self.width == 1:
            self.buf.append(record)
        else:
            self.buf.extend(record)
        self.count += 1
        if len(self.buf) >= self.limit:
            self._spill()

    def add_bytes(self, record: bytes) -> None:
        """Add one record given as its bytes (width numbers of the array's type, in the machine's order)."""
        self.buf.frombytes(record)
        self.count += 1
        if len(self.buf) >= self.limit:
            self._spill()

    def extend(self, numbers: array, records: int) -> None:
        """Add `records` records given flat, width numbers each (an array of the same typecode)."""
        self.buf.extend(numbers)
        self.count += records
        if len(self.buf) >= self.limit:
            self._spill()

    def __len__(self) -> int:
        return self.count

    def _sorted_buffer(self) -> list:
        w, buf = self.width, self.buf
        if w == 1:
            return sorted(buf)
        return sorted(zip(*(buf[i::w] for i in range(w))))

    def _spill(self) -> None:
        records = self._sorted_buffer()
        self.buf = array(self.typecode)
        self._write_run([records])

    def _write_run(self, blocks) -> None:
        """Write sorted blocks of records (lists) one after another as one run at the file's end."""
        try:
            if self.file is None:
                self.file = _temp_file()
            start, n = self.end, 0
            for block in blocks:
                n += len(block)
                self._write(array(self.typecode, block if self.width == 1 else chain.from_iterable(block)))
            self.runs.append((start, n))
        except BaseException:
            self.close()  # a failed write (or Ctrl-C) leaves no temp file behind
            raise

    def _write(self, out: array) -> None:
        """Write every byte of out at the file's end (_write_all)."""
        data = memoryview(out.tobytes())
        _write_all(self.file.fileno(), data, self.end)
        self.end += len(data)
        self.spilled_bytes += len(data)

    def _blocks(self, offset: int, n: int) -> Iterator[list]:
        """One run's records as sorted lists, BUFFER records at a time."""
        size, w, fd = array(self.typecode).itemsize * self.width, self.width, self.file.fileno()
        step, done = max(1, BUFFER), 0
        while done < n:
            k = min(step, n - done)
            data = os.pread(fd, k * size, offset + done * size)
            if len(data) != k * size:
                raise SpillError(f"the sort's temp file in {spill_dir()} was cut short while read")
            part = array(self.typecode)
            part.frombytes(data)
            done += k
            yield part.tolist() if w == 1 else list(zip(*(part[i::w] for i in range(w))))

    def _merged(self, runs: list[tuple[int, int]]) -> Iterator[list]:
        """The records of several runs in sorted order, as sorted lists (merged)."""
        return merged([self._blocks(*run) for run in runs])

    def __iter__(self) -> Iterator[Any]:
        """Every record, sorted. Read once: the records are released (and the temp file closed) as they go."""
        return self.read()

    def read(self, keep: bool = False) -> Iterator[Any]:
        """Every record, sorted; keep: the records stay to be read again (the temp file stays open)."""
        return chain.from_iterable(self.blocks(keep))

    def blocks(self, keep: bool = False) -> Iterator[list]:
        """Every record, sorted, as consecutive lists (of a few hundred records or more): for a reader that
        checks a whole list at once in C before it looks at its records one by one."""
        if self.file is None:
            records = self._sorted_buffer()
            if not keep:
                self.buf = array(self.typecode)
            if records:
                yield records
            return
        try:
            if self.buf:
                self._spill()
            while len(self.runs) > self.fan_in:  # merge the oldest runs into one longer run at the file's end
                group, self.runs = self.runs[: self.fan_in], self.runs[self.fan_in :]
                self._write_run(self._merged(group))
            yield from self._merged(self.runs)
        finally:
            if not keep:
                self.close()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def merged(runs: list[Iterator[list]]) -> Iterator[list]:
    """The records of several sorted runs (each given as sorted lists, a block at a time) in sorted order, as
    sorted lists: each round takes, from every started run's current block, the records up to the smallest of
    those blocks' last records (no later record of any run is smaller), and sorts them together, which for a few
    sorted pieces is a merge in C. A run joins the rounds once its first record is within the bound: runs that
    follow one another in time (a long trace's captures) cost nothing while they wait."""
    waiting = []  # (first record, place, first block, the run's other blocks) of the runs not started
    for place, blocks in enumerate(runs):
        first = next(blocks, None)
        if first:
            waiting.append((first[0], place, first, blocks))
    heapq.heapify(waiting)
    heads = []
    while heads or waiting:
        if not heads:
            _, _, first, blocks = heapq.heappop(waiting)
            heads.append([first, blocks])
        bound = min(h[0][-1] for h in heads)
        while waiting and waiting[0][0] <= bound:
            _, _, first, blocks = heapq.heappop(waiting)
            heads.append([first, blocks])
            bound = min(bound, first[-1])
        out, pieces = [], 0
        for h in heads:
            block = h[0]
            k = bisect_right(block, bound)
            if k == len(block):
                out += block
                h[0] = next(h[1], None)
            elif k:
                out += block[:k]
                h[0] = block[k:]
            pieces += k > 0
        if not pieces:  # the block that holds the bound gives at least its records up to it, unless unsorted
            raise ValueError("a run given to merged() is not sorted")
        heads = [h for h in heads if h[0]]
        if pieces > 1:  # one piece is sorted already
            out.sort()
        yield out


class Runs:
    """Records of `width` numbers per group, added in any order, read once per group in sorted order: cheap where
    each group's records come as a few sorted runs (a trace's thread lists its operators in order, then its
    Python functions in order), since a run is written as it came and only merged.

    Each group's new records are held in one array, width numbers a record one after another: a record is added
    in one call (frombytes of a struct's pack; four appends, each parsing its number, took twice as long as one
    pack). add() gives that array; call flush() once the records pass the chunk (all groups together). flush()
    copies each group's new records into columns (array slices, in C), cuts them into sorted runs (where a record
    is smaller than the one before) and writes each run, column after column, to an unnamed temp file
    (spill_dir); a run that goes on from the group's last one is joined to it. It answers False,
    writing nothing more, once a group has more than max_runs runs: records in no order cost less to sort than to
    merge. finish() writes the rest before reading. sorted(group) gives the group's records as sorted tuples, merged
    from the file BUFFER records per run at a time. Nothing is written while the records fit one chunk."""

    def __init__(self, typecode: str, width: int, chunk: int | None = None, max_runs: int = 256):
        self.typecode, self.width = typecode, width
        self.chunk, self.max_runs = chunk or CHUNK, max_runs
        self.itemsize = array(typecode).itemsize
        self.new: list[array] = []  # each group's records not yet written, width numbers a record
        self.segments: list[list[list[tuple[int, int]]]] = []  # each group's runs: (byte offset, records) pieces
        self.tails: list[tuple | None] = []  # each group's last record written
        self.file = None
        self.end = 0

    def add(self) -> array:
        """A new group (numbered in the order made): the array its records are added to, width numbers each."""
        self.new.append(array(self.typecode))
        self.segments.append([])
        self.tails.append(None)
        return self.new[-1]

    def pending(self) -> int:
        """The records added and not yet written, all groups together."""
        return sum(map(len, self.new)) // self.width

    def _columns_of(self, records: array) -> list[array]:
        """A group's new records as width columns (copies)."""
        w = self.width
        return [records[i::w] for i in range(w)]

    def runs(self, group: int) -> int:
        """The sorted runs of the group's written records."""
        return len(self.segments[group])

    def flush(self) -> bool:
        """Write every group's new records, run by run (see the class); False where a group has too many runs."""
        try:
            if self.file is None:
                self.file = _temp_file()
            for g, records in enumerate(self.new):
                if records and not self._write(g, records):
                    return False
            return True
        except BaseException:
            self.close()
            raise

    def finish(self) -> bool:
        """Before sorted(): the records not yet written go to the file where some already are (else they are
        sorted in memory); False where a group then has too many runs."""
        return self.file is None or self.flush()

    def _write(self, g: int, records: array) -> bool:
        columns, w = self._columns_of(records), self.width
        first = columns[0]
        k = len(first)
        # one pass in C over the first numbers (where one is not below the next); where two tie, the whole records
        # decide, compared as arrays (as tuples compare: merged() bisects on them)
        cuts = [
            i
            for i in compress(range(1, k), map(ge, first, islice(first, 1, None)))
            if first[i - 1] > first[i] or records[(i - 1) * w : i * w] > records[i * w : (i + 1) * w]
        ]
        runs, tail = self.segments[g], self.tails[g]
        if len(runs) + len(cuts) > self.max_runs:
            return False
        a = 0
        for b in [*cuts, k]:
            if tail is None or tail > tuple(c[a] for c in columns):
                runs.append([])
            data = b"".join([c[a:b].tobytes() for c in columns])  # column after column
            _write_all(self.file.fileno(), memoryview(data), self.end)
            runs[-1].append((self.end, b - a))
            self.end += len(data)
            tail = tuple(c[b - 1] for c in columns)
            a = b
        self.tails[g] = tail
        del records[:]  # the same array: callers keep it
        return len(runs) <= self.max_runs

    def _blocks(self, segments: list[tuple[int, int]]) -> Iterator[list]:
        """One run's records as sorted lists of tuples, BUFFER records at a time."""
        return (list(zip(*columns)) for columns in self._columns(segments))

    def _columns(self, segments: list[tuple[int, int]]) -> Iterator[list[array]]:
        """One run's records as columns, BUFFER records at a time."""
        w, fd, size = self.width, self.file.fileno(), self.itemsize
        for offset, n in segments:
            done = 0
            while done < n:
                k = min(BUFFER, n - done)
                columns = []
                for i in range(w):  # a segment holds its records column after column
                    want = k * size
                    data = os.pread(fd, want, offset + (i * n + done) * size)
                    if len(data) != want:
                        raise SpillError(f"the sort's temp file in {spill_dir()} was cut short while read")
                    part = array(self.typecode)
                    part.frombytes(data)
                    columns.append(part)
                done += k
                yield columns

    def sorted(self, group: int) -> Iterator[tuple]:
        """The group's records as tuples, sorted (read once; after a flush() that answered True where any was
        written)."""
        records = self.new[group]
        if self.file is None:  # nothing written: sorted in memory
            return iter(sorted(zip(*self._columns_of(records))))
        if records and not self._write(group, records):
            raise ValueError(f"group {group}: more than {self.max_runs} sorted runs (see flush)")
        runs = self.segments[group]
        if len(runs) == 1:  # no merge: the tuples are made as they are read
            return chain.from_iterable(zip(*columns) for columns in self._columns(runs[0]))
        return chain.from_iterable(merged([self._blocks(run) for run in runs]))

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def _write_all(fd: int, data: memoryview, at: int) -> None:
    """Write every byte of data at offset `at`, or raise SpillError: a short write is retried for the rest, and a
    write that makes no progress is an error (never a silently shorter run)."""
    done = 0
    while done < len(data):
        try:
            wrote = os.pwrite(fd, data[done:], at + done)
        except OSError as e:
            raise SpillError(f"cannot write the sort's temp file in {spill_dir()} ({_WHERE}): {e.strerror}") from e
        if wrote <= 0:
            raise SpillError(f"cannot write the sort's temp file in {spill_dir()} ({_WHERE}): no byte written")
        done += wrote


def median(values: SortedRecords) -> float | None:
    """statistics.median of numbers kept as width-1 records (read once); None for none."""
    n = len(values)
    if not n:
        return None
    want, prev, seen = n // 2, None, 0
    for block in values.blocks():
        if seen + len(block) > want:
            i = want - seen
            v = block[i]
            before = block[i - 1] if i else prev
            values.close()
            return v if n % 2 else (before + v) / 2
        seen += len(block)
        prev = block[-1]
    raise AssertionError("fewer records than were added")
