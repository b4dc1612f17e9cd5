"""The sort's temp file as a file system client: short writes completed, a full disk a one-line error, the file
closed on every way out, its folder chosen by STEPLENS_SPILL_DIR, a RAM disk named."""

import errno
import json
import os
import random

import pytest

from steplens.evidence import summarize
from steplens.trace import spill


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def python_trace(tmp_path, slices=3000):
    """One step holding `slices` Python slices side by side: past a 64-record chunk many times over."""
    events = [
        {"ph": "X", "name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0.0, "dur": 1e6, "pid": 1, "tid": 1}
    ]
    for i in range(slices):
        events.append(
            {"ph": "X", "name": f"f{i % 7}", "cat": "python_function", "ts": 10.0 + i, "dur": 0.5, "pid": 1, "tid": 1}
        )
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return str(path)


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(spill, "CHUNK", 64)
    monkeypatch.setattr(spill, "FAN_IN", 4)


def test_short_writes_are_completed_and_the_records_come_back_whole(monkeypatch, small_chunks):
    """A pwrite that writes at most 7 bytes a call (as a full pipe or a signal can make it): every record comes
    back, sorted, as sorted() gives them."""
    real = os.pwrite
    monkeypatch.setattr(spill.os, "pwrite", lambda fd, data, offset: real(fd, bytes(data[:7]), offset))
    rng = random.Random(5)
    records = [(rng.randrange(50), rng.random(), -rng.random()) for _ in range(1000)]
    kept = spill.SortedRecords("d", 3)
    for r in records:
        kept.add(r)
    assert len(kept.runs) > kept.fan_in, "the test must reach a merge pass"
    assert list(kept) == sorted(records), "a short write lost or changed records"


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(OSError(errno.ENOSPC, "No space left on device"), id="disk full"),
        pytest.param(0, id="no byte written"),
    ],
)
def test_a_failed_write_is_a_one_line_error_and_leaves_no_file_open(tmp_path, monkeypatch, capsys, small_chunks, fault):
    """summarize on a trace that spills, its writes failing: exit 1, one line on stderr that names the folder and
    the cause, nothing on stdout, and every temp file closed (an unnamed file is gone once closed)."""
    trace = python_trace(tmp_path)

    def pwrite(fd, data, offset):
        if isinstance(fault, Exception):
            raise fault
        return fault

    monkeypatch.setattr(spill.os, "pwrite", pwrite)
    before = open_fds()
    code = summarize.main([trace])
    out, err = capsys.readouterr()
    assert code == 1 and out == "", out
    assert err.count("\n") == 1 and "sort's temp file" in err and spill.SPILL_DIR in err, err
    assert ("No space left on device" in err) == isinstance(fault, Exception), err
    assert open_fds() == before, "a temp file stayed open"


def test_an_interrupt_while_spilling_leaves_no_file_open(tmp_path, monkeypatch, small_chunks):
    """Ctrl-C (KeyboardInterrupt) in the middle of a write goes on up, and the temp file is closed on its way."""
    trace = python_trace(tmp_path)
    calls = {"n": 0}
    real = os.pwrite

    def pwrite(fd, data, offset):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(fd, data, offset)

    monkeypatch.setattr(spill.os, "pwrite", pwrite)
    before = open_fds()
    with pytest.raises(KeyboardInterrupt):
        summarize.summarize_file(trace)
    assert open_fds() == before, "a temp file stayed open"


def test_the_spill_goes_to_its_folder_and_a_ram_disk_is_named_once(tmp_path, monkeypatch, capsys, small_chunks):
    """STEPLENS_SPILL_DIR picks the folder; where the folder is a RAM disk (tmpfs), one line on stderr says so,
    once however many sorts spill; the figures are the same wherever the file goes."""
    trace = python_trace(tmp_path)
    plain = summarize.summarize_file(trace)
    folder = tmp_path / "spill"
    folder.mkdir()
    made = []
    real = spill.tempfile.TemporaryFile
    monkeypatch.setattr(spill.tempfile, "TemporaryFile", lambda **kw: made.append(kw["dir"]) or real(**kw))
    monkeypatch.setattr(spill, "file_system", lambda path: "tmpfs")
    monkeypatch.setattr(spill, "_told", set())
    monkeypatch.setenv(spill.SPILL_DIR, str(folder))
    capsys.readouterr()
    assert summarize.summarize_file(trace) == plain
    assert made and set(made) == {str(folder)}, made
    err = capsys.readouterr().err
    assert err.count("RAM disk (tmpfs)") == 1 and str(folder) in err, err


def test_the_file_system_of_a_folder_is_read_from_the_mounts(tmp_path):
    """/proc is a proc file system; a path under it is too. The longest mount point above a path wins, wherever
    it stands in the table: /dev/shm is a RAM disk inside /dev (devtmpfs)."""
    assert spill.file_system("/proc") == "proc"
    assert spill.file_system("/proc/self") == "proc"
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/vda / ext4 rw 0 0\ndevtmpfs /dev devtmpfs rw 0 0\ntmpfs /dev/shm tmpfs rw 0 0\ntmpfs /run tmpfs rw 0 0\n"
    )
    assert spill.file_system("/dev/shm/steplens", str(mounts)) == "tmpfs"
    assert spill.file_system("/dev/null", str(mounts)) == "devtmpfs"
    assert spill.file_system("/home/me", str(mounts)) == "ext4"
    assert spill.file_system("/runner", str(mounts)) == "ext4"  # not under /run
