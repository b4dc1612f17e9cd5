"""Profile mode's CPU use and host memory per cycle (steplens/job/capture.py CycleEdges), and the step pictures'
titles that name the run (steplens/evidence/formatting.py run_label)."""

import json

from steplens.evidence import cycle_evidence, picture
from steplens.evidence.formatting import run_label
from steplens.job import capture
from steplens.scopes import PROFILE_STEPS, SCHEDULE


class Writer:
    before_dump = None


class FakeBatches:
    def worker_pids(self):
        return []


def test_the_reads_fall_at_each_cycle_s_edges(monkeypatch):
    """The CPU counters as the first recorded step begins and as the last ends; memory as the warm-up step before
    the cycle begins (a whole step before the cycle, to refill the GPU's queue) and when the profiler hands the
    cycle over: never between a cycle's recorded steps, never just before its first."""
    seen, state = [], {"step": 0, "where": None}
    monkeypatch.setattr(capture.cpu_use, "edge_snapshot", lambda pids: seen.append(("cpu", state["where"])) or {})
    monkeypatch.setattr(capture.host_memory, "read", lambda pids: seen.append(("memory", state["where"])) or {})
    monkeypatch.setattr(capture.cpu_use, "window_use", lambda a, b, budget: {"budget": budget})
    monkeypatch.setattr(capture.host_memory, "peak", lambda reads: {"reads": len(reads)})
    writer = Writer()
    edges = capture.CycleEdges(FakeBatches(), writer)
    span = SCHEDULE["wait"] + SCHEDULE["warmup"] + SCHEDULE["active"]
    for i in range(PROFILE_STEPS):
        state["where"] = f"start {i}"
        edges.before_step()
        state["where"] = f"end {i}"
        edges.after_step()
        if i % span == span - 1:  # profiler.step() closes the cycle and calls on_trace_ready
            state["where"] = f"dump after {i}"
            writer.before_dump()
    assert seen == [
        ("memory", "start 1"),
        ("cpu", "start 2"),
        ("cpu", "end 4"),
        ("memory", "dump after 4"),
        ("memory", "start 6"),
        ("cpu", "start 7"),
        ("cpu", "end 9"),
        ("memory", "dump after 9"),
    ]
    for n in (1, 2):
        cpu, memory = edges.figures(n)
        assert len(cpu["read_ms"]) == 2 and memory["reads"] == 2 and len(memory["read_ms"]) == 2
    assert edges.figures(3) == (None, None)


def test_a_cycle_cut_short_has_no_figures():
    """A stop inside a cycle: its end was never read, so it gets no figures (not a half window)."""
    edges = capture.CycleEdges(FakeBatches(), Writer())
    for _ in range(3):  # the wait step, the warm-up step, the first recorded step
        edges.before_step()
        edges.after_step()
    assert edges.figures(1) == (None, None)


def test_the_run_label_names_workers_batch_and_the_fixes_on():
    assert run_label({"workers": 4, "batch_size": 128, "amp": "off", "fused_sgd": False}) == "workers=4, batch 128"
    phase = {"workers": 4, "batch_size": 128, "profile_phase": "train"}
    assert run_label(phase) == "workers=4, batch 128", "the training phase is the default: not named"
    assert run_label({**phase, "profile_phase": "validation"}) == "workers=4, batch 128, --profile-phase validation"
    assert (
        run_label({"workers": 0, "batch_size": 512, "profile_detail": "lean", "amp": "bf16", "channels_last": True})
        == "workers=0, batch 512, lean capture, --amp bf16 --channels-last"
    )
    assert run_label({"workers": 4, "batch_size": 128, "gpu_input": True}) == "batch 128, --gpu-input"


def test_each_cycle_s_picture_title_names_its_run(monkeypatch, tmp_path):
    """Two pictures side by side say which is which: the title opens on the setting that differs."""
    titles = []
    monkeypatch.setattr(picture, "draw", lambda evidence, path, title: titles.append(title))
    cycle = {"cycle": 1, "profiler_steps": [2, 4], "trace": str(tmp_path / "trace-cycle1-steps2-4.pt.trace.json")}
    for workers in (0, 4):
        path, note = cycle_evidence.draw_cycle(cycle, {}, run_label({"workers": workers, "batch_size": 128}))
        assert path.endswith("picture-cycle1-steps2-4.png") and note is None
    assert titles == [
        "workers=0, batch 128: cycle 1, ProfilerStep#2-4",
        "workers=4, batch 128: cycle 1, ProfilerStep#2-4",
    ]


def test_steplens_picture_names_the_run_from_the_run_json_above_the_trace(tmp_path):
    """A trace in a train.py run's outputs/traces/ (or traces/rankR/) is titled by that run's settings."""
    (tmp_path / "traces" / "rank1").mkdir(parents=True)
    (tmp_path / "run.json").write_text(json.dumps({"settings": {"workers": 2, "batch_size": 64}}))
    assert picture.nearby_label(str(tmp_path / "traces" / "t.pt.trace.json")) == "workers=2, batch 64"
    assert picture.nearby_label(str(tmp_path / "traces" / "rank1" / "t.pt.trace.json")) == "workers=2, batch 64"
    assert picture.nearby_label(str(tmp_path / "elsewhere.json")) is None


def test_the_usage_line_names_whose_memory_it_sums():
    """PSS is the main process's alone without workers, and always printed to one decimal."""
    cpu = {"cpu_sentence": "0.94 of the budget's 2 CPUs used", "workers_cpu_s": {}}
    line = cycle_evidence.usage_line(cpu, {"pss_peak_mb": 1215.0, "shm_peak_mb": None})
    assert line.endswith("PSS 1215.0 MB (main process)"), line
    with_workers = cycle_evidence.usage_line({**cpu, "workers_cpu_s": {"7": 0.1}}, {"pss_peak_mb": 1287.25})
    assert "PSS 1287.2 MB (main process and workers)" in with_workers, with_workers
