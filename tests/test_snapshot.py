"""--memory-snapshot and steplens snapshot: the summary of a made snapshot in torch's format, the CLI, the refusals."""

import argparse
import inspect
import json
import os
import pickle
from collections import OrderedDict

import pytest
from conftest import TINY, run_train

from steplens.errors import UserError
from steplens.evidence import snapshot
from steplens.job import memory_snapshot, settings

MB = 1_000_000
SITE = "/venv/lib/python3.11/site-packages/"


def frame(path, line, name):
    return {"filename": path, "line": line, "name": name}


# Stacks as torch records them, innermost frame first (Python frames only).
PARAMS = [
    frame(SITE + "torch/nn/modules/module.py", 1340, "convert"),
    frame(SITE + "torch/nn/modules/module.py", 930, "_apply"),
    frame(SITE + "torch/nn/modules/module.py", 1355, "to"),
    frame("/work/train.py", 150, "build_step"),
]
MOMENTUM = [
    frame(SITE + "torch/optim/sgd.py", 120, "_init_group"),
    frame(SITE + "torch/optim/sgd.py", 90, "step"),
    frame(SITE + "torch/optim/optimizer.py", 500, "wrapper"),
    frame("/work/train.py", 145, "step"),
]
INPUT = [frame("/work/steplens/speedups/options.py", 171, "to_device"), frame("/work/train.py", 135, "step")]


def conv(resnet_line):
    """An activation: a convolution's output, asked for by torchvision's ResNet at resnet_line."""
    return [
        frame(SITE + "torch/nn/modules/conv.py", 549, "_conv_forward"),
        frame(SITE + "torch/nn/modules/conv.py", 554, "forward"),
        frame(SITE + "torch/nn/modules/module.py", 1784, "_call_impl"),
        frame(SITE + "torchvision/models/resnet.py", resnet_line, "_forward_impl"),
        frame(SITE + "torch/nn/modules/module.py", 1784, "_call_impl"),
        frame("/work/train.py", 139, "step"),
    ]


def ev(action, addr, size, frames=(), t=0):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": list(frames), "time_us": t}


def freed(addr, size, t):
    return [ev("free_requested", addr, size, t=t), ev("free_completed", addr, size, t=t)]


def block(addr, size, frames, state="active_allocated"):
    return {"address": addr, "size": size, "requested_size": size, "state": state, "frames": frames}


def made_history():
    """The recorded steps (MB): X (1, made before the history) is freed in it; the input 0.6 and three activations
    (10 and 5 at ResNet line 268, 10 at line 269) come and go; a gradient of 4 has no Python stack (autograd's
    thread). The peak: params 4 + momentum 4 + input 0.6 + 25 + gradient 4 = 37.6 MB, after the gradient's alloc."""
    return [
        ev("alloc", 0x4000, 600_000, INPUT, t=10),
        ev("alloc", 0x5000, 10 * MB, conv(268), t=20),
        ev("alloc", 0x6000, 10 * MB, conv(269), t=30),
        ev("alloc", 0x7000, 5 * MB, conv(268), t=40),
        *freed(0x3000, 1 * MB, 50),
        ev("segment_alloc", 0xB000, 20 * MB, t=55),
        ev("alloc", 0x8000, 4 * MB, [], t=60),  # the peak
        *freed(0x5000, 10 * MB, 70),
        *freed(0x6000, 10 * MB, 71),
        *freed(0x7000, 5 * MB, 72),
        ev("alloc", 0x9000, 2 * MB, MOMENTUM[1:], t=80),  # an optimizer temporary
        *freed(0x9000, 2 * MB, 90),
        *freed(0x4000, 600_000, 95),
        {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "frames": [], "time_us": 100},
    ]


def made_snapshot(history=None):
    """torch.cuda.memory._snapshot()'s dict: at its end parameters, momentum and the gradient are in use;
    a 50 MB inactive block is cached, not in use."""
    blocks = [
        block(0x1000, 4 * MB, PARAMS),
        block(0x2000, 4 * MB, MOMENTUM),
        block(0x8000, 4 * MB, []),
        block(0xA000, 50 * MB, [], state="inactive"),
    ]
    segment = {
        "device": 0,
        "address": 0x1000,
        "total_size": 64 * MB,
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "allocated_size": 12 * MB,
        "active_size": 12 * MB,
        "requested_size": 12 * MB,
        "blocks": blocks,
    }
    return {"segments": [segment], "device_traces": [made_history() if history is None else history]}


GROUPS = {  # (class, line): (MB, blocks) at the peak
    ("activations", "torchvision/models/resnet.py:268 _forward_impl"): (15, 2),
    ("activations", "torchvision/models/resnet.py:269 _forward_impl"): (10, 1),
    ("parameters", "train.py:150 build_step"): (4, 1),
    ("optimizer state", "train.py:145 step"): (4, 1),
    ("backward", snapshot.NO_STACK): (4, 1),
    ("the input", "steplens/speedups/options.py:171 to_device"): (0.6, 1),
}


def groups_of(device):
    return {(g["class"], g["line"]): (g["bytes"] / MB, g["blocks"]) for g in device["groups"]}


def test_the_peak_and_the_groups_at_it_are_the_made_sizes():
    """The peak is the sum of the blocks in use after the gradient's alloc; each line's group sums its blocks."""
    (d,) = snapshot.summarize(made_snapshot())["devices"]
    assert d["peak_bytes"] == 37_600_000 and d["peak_time_us"] == 60
    assert groups_of(d) == GROUPS
    assert d["by_class"] == {
        "parameters": 4 * MB,
        "optimizer state": 4 * MB,
        "activations": 25 * MB,
        "the input": 600_000,
        "backward": 4 * MB,
    }
    assert sum(g["bytes"] for g in d["groups"]) + d["rest"]["bytes"] == d["peak_bytes"], "groups sum to the peak"
    assert sum(d["by_class"].values()) == d["peak_bytes"], "classes sum to the peak"
    big = next(g for g in d["groups"] if g["line"].endswith("resnet.py:268 _forward_impl"))
    assert big["largest_block_bytes"] == 10 * MB


def test_the_history_s_start_and_end_agree_with_the_end_state():
    """X (freed in the history) was in use at its start; the replay ends on exactly the blocks the segments hold."""
    (d,) = snapshot.summarize(made_snapshot())["devices"]
    assert d["start_bytes"] == 4 * MB + 4 * MB + 1 * MB  # parameters, momentum and X
    assert d["end_bytes"] == d["end_state_bytes"] == 12 * MB and d["mismatches"] == 0
    assert d["reserved_at_end_bytes"] == 64 * MB and d["events"] == 12 and d["history_ms"] == pytest.approx(0.085)


def test_a_history_whose_oldest_entries_were_dropped_keeps_its_peak():
    """The ring buffer dropped the input's and the first activation's allocs: both were then in use from the
    history's start, with no stack; the peak and its total are unchanged."""
    (d,) = snapshot.summarize(made_snapshot(made_history()[2:]))["devices"]
    assert d["peak_bytes"] == 37_600_000 and d["mismatches"] == 0
    lost = {(g["class"], g["line"]): g["bytes"] for g in d["groups"] if g["line"] == snapshot.BEFORE_HISTORY}
    assert lost == {("other", snapshot.BEFORE_HISTORY): 10_600_000}  # X was freed before the peak


def test_a_history_that_contradicts_the_end_state_is_counted():
    """An alloc whose block is not in the end state, and never freed (a gap in the history), is a mismatch,
    said in the text."""
    history = made_history() + [ev("alloc", 0xC000, 4 * MB, PARAMS, t=200)]
    (d,) = snapshot.summarize(made_snapshot(history))["devices"]
    assert d["mismatches"] == 1
    assert "1 events do not match the end state" in snapshot.format_summary({"devices": [d]}, "x")


def test_top_keeps_the_largest_groups_and_the_rest_sums_the_others():
    (d,) = snapshot.summarize(made_snapshot(), top=2)["devices"]
    assert [g["bytes"] for g in d["groups"]] == [15 * MB, 10 * MB]
    assert d["rest"] == {"groups": 4, "bytes": 12_600_000, "blocks": 4}


def test_the_command_writes_the_summary_beside_the_snapshot(tmp_path, capsys):
    path = tmp_path / "memory-snapshot.pickle"
    path.write_bytes(pickle.dumps(made_snapshot()))
    assert snapshot.main([str(path)]) == 0
    out = capsys.readouterr().out
    beside = tmp_path / "memory-snapshot.summary.txt"
    assert beside.read_text() == out
    assert "cuda:0: peak in use 37.6 MB" in out and "activations 25.0 MB" in out
    assert "     15.0      2       10.0  activations      torchvision/models/resnet.py:268 _forward_impl" in out
    assert snapshot.main([str(path), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["devices"][0]["peak_bytes"] == 37_600_000
    assert [p for p in os.listdir(tmp_path) if p.startswith(".partial")] == []


def test_a_gzip_compressed_snapshot_reads_the_same_and_a_cut_one_is_refused(tmp_path, capsys):
    import gzip

    plain = tmp_path / "memory-snapshot.pickle"
    plain.write_bytes(pickle.dumps(made_snapshot()))
    assert snapshot.main([str(plain), "--json"]) == 0
    expected = capsys.readouterr().out
    packed = tmp_path / "packed" / "memory-snapshot.pickle.gz"
    packed.parent.mkdir()
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert snapshot.main([str(packed), "--json"]) == 0
    assert capsys.readouterr().out == expected
    assert sorted(os.listdir(packed.parent)) == ["memory-snapshot.pickle.gz", "memory-snapshot.summary.txt"]
    packed.write_bytes(packed.read_bytes()[:-40])
    assert snapshot.main([str(packed)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a readable pickle" in err[0], err


@pytest.mark.parametrize(
    "content,words",
    [
        (b"not a pickle at all", "is not a readable pickle"),
        (pickle.dumps(OrderedDict(segments=[])), "is no memory snapshot: it names collections.OrderedDict"),
        (pickle.dumps({"device_traces": []}), "no list of segments"),
        (pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "addr": "x"}]]}), "integer addr"),
        (pickle.dumps({"segments": [{"device": 0, "blocks": [{"state": "active_allocated"}]}]}), "lacks a field"),
    ],
)
def test_what_is_no_snapshot_is_refused_in_one_line(tmp_path, capsys, content, words):
    """A file that is not a snapshot: one line, exit 1, no summary written; a class in the pickle is never loaded."""
    path = tmp_path / "bad.pickle"
    path.write_bytes(content)
    assert snapshot.main([str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("steplens snapshot: error: ") and words in err[0], err
    assert not (tmp_path / "bad.summary.txt").exists()


def test_a_missing_file_and_a_bad_top_exit_2(tmp_path, capsys):
    assert snapshot.main([str(tmp_path / "none.pickle")]) == 2
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(made_snapshot()))
    assert snapshot.main([str(path), "--top", "0"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 2


def test_classes_follow_the_innermost_frame_a_rule_knows():
    assert snapshot.class_of(PARAMS) == "parameters"
    assert snapshot.class_of(MOMENTUM) == "optimizer state"
    assert snapshot.class_of(conv(268)) == "activations"
    assert snapshot.class_of(INPUT) == "the input"
    backward = [frame(SITE + "torch/autograd/__init__.py", 350, "backward"), frame("/work/train.py", 141, "step")]
    assert snapshot.class_of(backward) == "backward"
    assert snapshot.class_of([]) == "backward", "no Python stack: autograd's own thread, on a GPU"
    assert snapshot.class_of(None) == "other", "allocated before the history: nothing says what it is"
    assert snapshot.class_of([frame("/work/other.py", 3, "f")]) == "other"
    assert snapshot.line_of([frame("/work/other.py", 3, "f")]) == "other.py:3 f"
    assert snapshot.line_of([]) == snapshot.NO_STACK and snapshot.line_of(None) == snapshot.BEFORE_HISTORY


def test_recording_uses_only_keywords_every_torch_since_2_1_takes(monkeypatch):
    """enabled, context, stacks and max_entries: in this torch's signature too; stacks are Python's alone."""
    import torch

    accepted = set(inspect.signature(torch.cuda.memory._record_memory_history).parameters)
    calls = []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda **kw: calls.append(kw))
    memory_snapshot.record_history("state", context="state")
    memory_snapshot.record_history("all", context=memory_snapshot.CONTEXT, max_entries=memory_snapshot.MAX_ENTRIES)
    memory_snapshot.record_history(None)
    assert calls == [
        {"enabled": "state", "context": "state", "stacks": "python"},
        {"enabled": "all", "context": "alloc", "stacks": "python", "max_entries": 100_000},
        {"enabled": None},
    ]
    assert set().union(*calls) <= accepted


def test_off_it_does_nothing_and_on_the_cpu_it_is_refused():
    import torch

    assert memory_snapshot.SnapshotPhase.start(argparse.Namespace(memory_snapshot=False), torch.device("cpu")) is None
    with pytest.raises(UserError, match="needs a CUDA device; this run's device is the CPU"):
        memory_snapshot.SnapshotPhase.start(argparse.Namespace(memory_snapshot=True), torch.device("cpu"))


def test_run_json_s_entry_holds_both_timings_and_their_ratio():
    recorded = {"wall_seconds": 0.03, "step_seconds": [0.01, 0.01, 0.01]}
    plain = {"wall_seconds": 0.025, "step_seconds": [0.008, 0.008, 0.009]}
    figures = snapshot.summarize(made_snapshot())
    out = memory_snapshot.describe("s.pickle", "s.summary.txt", figures, recorded, plain, 37_000_000, 0)
    assert out["recorded"] == recorded and out["unrecorded"] == plain and out["recorded_over_unrecorded"] == 1.2
    assert out["peak_bytes"] == 37_600_000 and out["torch_peak_allocated_bytes"] == 37_000_000
    assert out["history_entries"] == len(made_history()) and out["history_full"] is False
    assert out["by_class_bytes"]["activations"] == 25 * MB


def test_with_device_cpu_the_flag_is_refused_before_torch_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        settings.parse_settings(["--mode", "bench", "--memory-snapshot", "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "--memory-snapshot" in err[0] and "needs a CUDA device" in err[0]
    assert settings.parse_settings(["--mode", "bench", "--memory-snapshot"]).memory_snapshot is True


def test_train_py_refuses_it_on_the_cpu_before_any_run_exists(tmp_path):
    """--device cpu: refused by the parser; --device auto on a machine without CUDA: right after the device is
    resolved, before the Polyaxon run starts. One error line, exit 2, no run recorded."""
    import torch

    cases = [["--device", "cpu"]] + ([] if torch.cuda.is_available() else [["--device", "auto"]])
    for device in cases:
        argv = ["--mode", "bench", "--memory-snapshot", *[a for a in TINY if a not in ("--device", "cpu")], *device]
        proc = run_train(argv, tmp_path / "offline", timeout=120)
        errors = [line for line in proc.stderr.splitlines() if "error" in line]
        assert proc.returncode == 2 and len(errors) == 1 and "--memory-snapshot" in errors[0], proc.stderr
        assert not (tmp_path / "offline" / "runs").exists()


class FakeLaps:
    """capture.Laps on the host clock (the phase's CUDA events have no device here)."""

    def __init__(self, cuda):
        self.marks = 0

    def lap(self):
        self.marks += 1

    def seconds(self):
        return [0.01] * (self.marks - 1)


class FakeRecord:
    """RunRecord's part the phase uses; each file must exist, whole, when it is logged."""

    def __init__(self, out_dir):
        self.out_dir, self.logged = out_dir, []

    def log_file(self, path, name):
        assert os.path.isfile(path) and not os.path.basename(path).startswith(".partial"), path
        self.logged.append((name, os.path.basename(path)))


def test_the_phase_records_snapshots_stops_then_times_and_logs_each_file_once_it_exists(tmp_path, monkeypatch):
    """The phase's order, torch's calls faked: history on; 3 steps; the snapshot; history off; 3 more steps;
    the pickle (the snapshot torch gave), then its summary, each logged after it exists."""
    import torch

    from steplens.job.stopping import Stopper

    calls, steps = [], []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda **kw: calls.append(("history", kw)))
    monkeypatch.setattr(
        torch.cuda.memory, "_snapshot", lambda: calls.append(("snapshot", len(steps))) or made_snapshot()
    )
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append(("reset", len(steps))))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 37_000_000)
    monkeypatch.setattr(memory_snapshot, "Laps", FakeLaps)
    monkeypatch.setattr(memory_snapshot, "synchronize", lambda device: None)
    record = FakeRecord(str(tmp_path))
    phase = memory_snapshot.SnapshotPhase()
    world = argparse.Namespace(active=False, rank=0)
    out = phase.run(lambda: steps.append(1), torch.device("cuda", 0), record, Stopper(), world)
    assert [c[0] for c in calls] == ["reset", "history", "snapshot", "history"]
    assert calls[1][1]["enabled"] == "all" and calls[2] == ("snapshot", 3) and calls[3][1] == {"enabled": None}
    assert len(steps) == 6 and out["recorded"]["step_seconds"] == out["unrecorded"]["step_seconds"] == [0.01] * 3
    assert record.logged == [
        ("memory-snapshot", "memory-snapshot.pickle"),
        ("memory-snapshot-summary", "memory-snapshot.summary.txt"),
    ]
    with open(out["file"], "rb") as f:
        assert pickle.load(f) == made_snapshot()
    assert out["peak_bytes"] == 37_600_000 and out["summary_error"] is None
    assert sorted(os.listdir(tmp_path)) == ["memory-snapshot.pickle", "memory-snapshot.summary.txt"]


def test_a_failing_step_still_stops_the_recording(tmp_path, monkeypatch):
    import torch

    from steplens.job.stopping import Stopper

    calls = []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda **kw: calls.append(kw))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: None)
    monkeypatch.setattr(memory_snapshot, "Laps", FakeLaps)
    monkeypatch.setattr(memory_snapshot, "synchronize", lambda device: None)

    def step():
        raise RuntimeError("out of memory")

    world = argparse.Namespace(active=True, rank=1)
    with pytest.raises(RuntimeError):
        memory_snapshot.SnapshotPhase().run(step, torch.device("cuda", 0), FakeRecord(str(tmp_path)), Stopper(), world)
    assert calls[-1] == {"enabled": None} and os.listdir(tmp_path) == []


def test_a_block_freed_but_pending_on_another_stream_is_in_use_under_the_name_torch_writes():
    """torch's allocator writes "active_pending_free" for a block freed while another stream still uses it
    (record_stream): the gradient's block in that state is still in use, so the peak and the groups are unchanged
    and the history agrees with the end state (no mismatch)."""
    made = made_snapshot()
    made["segments"][0]["blocks"][2]["state"] = "active_pending_free"
    (d,) = snapshot.summarize(made)["devices"]
    assert d["peak_bytes"] == 37_600_000 and groups_of(d) == GROUPS
    assert d["mismatches"] == 0


def test_blocks_count_the_bytes_asked_for_and_a_free_waiting_on_a_stream_is_named_at_the_peak():
    """The allocator's history records each tensor's requested size, and the end state's blocks are larger (rounded
    up, or not split): every figure counts the requested bytes, so the replay's end equals the end state's; the
    blocks' own bytes are given apart (torch's max_memory_allocated counts those). A block whose free was requested
    but waits on another stream at the peak is still in use there, and its bytes are named."""
    made = made_snapshot()
    grown = {0x1000: 4 * MB + 512, 0x2000: 4 * MB + 700_000, 0x8000: 4 * MB + 300}  # block sizes > requested
    for b in made["segments"][0]["blocks"]:
        if b["address"] in grown:
            b["size"] = grown[b["address"]]
    history = made["device_traces"][0]
    at = next(i for i, e in enumerate(history) if e["addr"] == 0x8000)  # the gradient's alloc: the peak
    history.insert(at, ev("free_requested", 0x7000, 5 * MB, t=58))  # requested early, completed after the peak
    history[:] = [
        e
        for i, e in enumerate(history)
        if not (e["action"] == "free_requested" and e["addr"] == 0x7000 and e["time_us"] == 72)
    ]
    (d,) = snapshot.summarize(made)["devices"]
    assert d["peak_bytes"] == 37_600_000 and d["pending_free_at_peak_bytes"] == 5 * MB
    assert d["end_bytes"] == d["end_state_bytes"] == 12 * MB
    assert d["end_state_block_bytes"] == 12 * MB + 512 + 700_000 + 300


def test_a_free_requested_before_the_history_is_pending_until_it_completes():
    """A block whose free was requested before the recording began, and completes in it after the peak: torch
    had already taken it off its count, so it is named among the frees waiting at the peak."""
    made = made_snapshot()
    history = made["device_traces"][0]
    history.insert(0, ev("alloc", 0xC000, 3 * MB, conv(270), t=1))  # a block made early, freed in the history
    made["device_traces"][0] = history[1:]  # ...but the history starts after its alloc
    at = next(i for i, e in enumerate(history) if e["action"] == "alloc" and e["addr"] == 0x9000)
    made["device_traces"][0].insert(at, ev("free_completed", 0xC000, 3 * MB, t=75))  # after the peak (t=60)
    (d,) = snapshot.summarize(made)["devices"]
    assert d["mismatches"] == 0 and d["start_bytes"] == (4 + 4 + 1 + 3) * MB  # parameters, momentum, X, this block
    assert d["peak_bytes"] == 37_600_000 + 3 * MB and d["pending_free_at_peak_bytes"] == 3 * MB
    assert d["events"] == sum(e["action"] in ("alloc", "free_completed") for e in history)
