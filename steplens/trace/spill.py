"""Records read back in sorted order with bounded memory: sorted chunks spilled to a temp file, then merged.

A big trace has millions of complete events. The checks that need them sorted (Perfetto's nesting rule, the
slices that cross on a thread, the events written twice) keep one fixed-width record per event here. Up to
CHUNK records stay in memory; each full chunk is sorted and written to an unnamed temp file as a run (8 bytes
a number). Reading merges at most FAN_IN runs at a time, each through a small buffer; more runs are first
merged into longer ones on the same file. Memory stays near CHUNK records plus FAN_IN buffers, whatever the
trace's size; the disk holds the records about twice."""

import heapq
import os
import tempfile
from array import array
from collections.abc import Iterator
from typing import Any

CHUNK = 1 << 12  # records sorted in memory at a time (a list of tuples: under 1 MB for 4k records of five numbers)
FAN_IN = 16  # runs merged at once
BUFFER = 1 << 10  # records read from a run at a time


class SortedRecords:
    """Records of `width` numbers (array typecode `typecode`), added in any order, read once in sorted order.

    Records are tuples (plain numbers when width is 1) ordered as Python orders them; equal records come
    back in no particular order, so only what cannot tell them apart may be read from them."""

    def __init__(self, typecode: str, width: int, chunk: int | None = None, fan_in: int = FAN_IN):
        self.typecode, self.width, self.fan_in = typecode, width, fan_in
        self.chunk = chunk or CHUNK
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
        if len(self.buf) >= self.chunk * self.width:
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
        self._write_run(records, len(records))

    def _write_run(self, records, n) -> None:
        if self.file is None:
            self.file = tempfile.TemporaryFile(prefix="steplens-spill-")
        start, out = self.end, array(self.typecode)
        for record in records:
            if self.width == 1:
                out.append(record)
            else:
                out.extend(record)
            if len(out) >= BUFFER * self.width:
                self._write(out)
                out = array(self.typecode)
        self._write(out)
        self.runs.append((start, n))

    def _write(self, out: array) -> None:
        data = out.tobytes()
        os.pwrite(self.file.fileno(), data, self.end)
        self.end += len(data)
        self.spilled_bytes += len(data)

    def _run(self, offset: int, n: int) -> Iterator[Any]:
        """One run's records, read BUFFER at a time."""
        size, w, fd = array(self.typecode).itemsize * self.width, self.width, self.file.fileno()
        done = 0
        while done < n:
            k = min(BUFFER, n - done)
            part = array(self.typecode)
            part.frombytes(os.pread(fd, k * size, offset + done * size))
            done += k
            if w == 1:
                yield from part
            else:
                yield from zip(*(part[i::w] for i in range(w)))

    def __iter__(self) -> Iterator[Any]:
        """Every record, sorted. Read once: the records are released (and the temp file closed) as they go."""
        return self.read()

    def read(self, keep: bool = False) -> Iterator[Any]:
        """Every record, sorted; keep: the records stay to be read again (the temp file stays open)."""
        if self.file is None:
            records = self._sorted_buffer()
            if not keep:
                self.buf = array(self.typecode)
            yield from records
            return
        if self.buf:
            self._spill()
        while len(self.runs) > self.fan_in:  # merge the oldest runs into one longer run at the file's end
            group, self.runs = self.runs[: self.fan_in], self.runs[self.fan_in :]
            self._write_run(heapq.merge(*(self._run(*r) for r in group)), sum(n for _, n in group))
        try:
            yield from heapq.merge(*(self._run(*r) for r in self.runs))
        finally:
            if not keep:
                self.close()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def median(values: SortedRecords) -> float | None:
    """statistics.median of numbers kept as width-1 records (read once); None for none."""
    n = len(values)
    if not n:
        return None
    want, prev = n // 2, None
    for i, v in enumerate(values):
        if i == want:
            values.close()
            return v if n % 2 else (prev + v) / 2
        prev = v
    raise AssertionError("fewer records than were added")
