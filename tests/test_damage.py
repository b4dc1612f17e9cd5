"""A damaged trace says so: the corpus of tests/damage.py, each damage with its stated outcome.

Outcomes: "same" (the undamaged trace's figures and verdict, plus one damage line naming what was done),
"kept" (the undamaged trace's verdict, the damage named), "named" (a verdict given, the damage named beside it: a
sound loop can look like this), "withheld" (the figures are read, the verdict is withheld with the reason) or
"error" (one line, exit 1).
Never a traceback, never a verdict that differs from the undamaged trace's without a damage line."""

import copy
import glob
import gzip
import json
import math
import os
import shutil
import subprocess
import sys

import damage as D
import pytest

from steplens.evidence import picture, summarize
from steplens.trace import reader, timeline
from steplens.trace.damage import KINDS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EAGER = os.path.join(
    ROOT,
    "results/h200-reprofile/eager/runs/5ad75ecce38942bb8a82409565c94b80/outputs/traces",
    "trace-cycle1-steps2-4.pt.trace.json.gz",
)

CPU_CASES = {
    "written twice": (D.written_twice, "same", ["duplicate", "duplicate_memory"]),
    "a third written twice": (D.some_written_twice, "same", "duplicate"),
    "python slices without a name": (D.nameless(D.cat("python_function")), "same", "missing_field"),
    "scopes without a name": (D.nameless(D.named("input/next_batch")), "withheld", "missing_field"),
    "negative durations of the input": (D.negative_dur(D.named("input/next_batch")), "withheld", "negative_duration"),
    "entries that are no objects": (D.non_objects, "same", "non_object"),
    "timestamps as strings": (D.ts_as_strings(D.cat("cpu_op")), "same", "string_number"),
    "a step with a NaN start": (D.nan_ts(D.named("ProfilerStep#3")), "withheld", "non_finite"),
    "every step with a NaN start": (D.nan_ts(lambda ev: ev["name"].startswith("ProfilerStep#")), "error", None),
    "infinite scope durations": (D.infinite_dur(D.named("train/optimizer")), "withheld", "non_finite"),
    "operators far outside the trace": (D.moved_far(D.cat("cpu_op")), "same", "far_outside"),
    "a scope far outside the trace": (D.moved_far(D.named("train/optimizer"), 1), "withheld", "far_outside"),
    "operators without ts": (D.no_ts(D.cat("cpu_op"), 40), "same", "missing_field"),
    "timestamps as lists": (D.ts_as_list(D.cat("cpu_op"), 3), "same", "non_numeric"),
    "args as a list": (D.args_as_list(D.cat("python_function"), 10), "same", "wrong_type"),
    "a step number on two slices": (D.repeated_step, "withheld", ["repeated_step", "step_past_capture"]),
    "overlapping steps": (D.overlapping_steps, "withheld", "overlapping_steps"),
}

GPU_CASES = {
    "kernels written twice": (D.some_written_twice, "same", "duplicate"),
    "kernels without ts": (D.no_ts(D.cat("kernel"), 5), "withheld", "missing_field"),
    "launches without a name": (D.nameless(D.cat("cuda_runtime"), 5), "withheld", "missing_field"),
    "copies with NaN durations": (D.nan_ts(D.cat("gpu_memcpy"), 1), "withheld", "non_finite"),
    "the last 40% of the events lost": (D.tail_lost(0.4), "withheld", "capture_missing"),
    "a step of zero length": (D.zero_length_step, "withheld", "empty_step"),
    "a NUL in a step's name": (D.step_name_with("\x003"), "withheld", "unreadable_step"),
    "an escape sequence in a step's name": (D.step_name_with("\x1b[2J3"), "withheld", "unreadable_step"),
    "a kernel 10^12 us long": (D.kernel_lasting(1e12), "withheld", "gpu_outside_capture"),
    "control characters in kernel names": (D.kernels_named("\x07\x1b[2J"), "kept", "unprintable_name"),
    "a lone surrogate in kernel names": (D.kernels_named("\udc80"), "kept", "unprintable_name"),
    "a capture that ends mid-step": (
        D.capture_ends_mid_step,
        "withheld",
        ["step_past_capture", "gpu_outside_capture"],
    ),
    "launches lost from the middle of the last step": (
        D.launches_lost_from_middle_of_last_step,
        "withheld",
        ["capture_cut", "thin_step"],
    ),
    "a step that lost most of its launches": (D.launches_lost_in_step(1, 0.3), "named", "thin_step"),
    "GPU events lost from the middle of the last step": (
        D.gpu_events_lost_from_middle_of_last_step,
        "withheld",
        "gpu_stops_early",
    ),
    "every GPU event lost": (D.gpu_events_all_lost, "withheld", "gpu_stops_early"),
    "no steps, an operator 10^9 us long": (D.without_steps(D.op_lasting(1e9)), "error", "window_past_capture"),
    "a middle step's length in ns": (D.step_in_ns(1), "named", "step_in_ns"),
    "the last step's length in ns": (D.step_in_ns(-1), "named", "step_in_ns"),
    "a tenth of the kernels again, 1 us later": (D.kernels_again_shifted(0.1), "withheld", "repeated_gpu_record"),
    "kernels without correlation ids": (D.without_correlation(D.cat("kernel")), "withheld", "no_correlation"),
    "a second capture appended": (D.second_capture, "error", "several_captures"),
    "a second process's events merged in": (D.second_process, "error", "several_processes"),
    "no steps, a kernel 10^12 us long": (D.without_steps(D.kernel_lasting(1e12)), "error", "gpu_outside_capture"),
}

FILES = {  # what cannot be read at all: one line, exit 1
    "empty": b"",
    "not JSON": b"\x89PNG\r\n\x1a\n binary",
    "cut short": b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}, {"ph": "X", "na',
    "traceEvents not a list": b'{"traceEvents": {"ph": "X"}}',
    "nested too deep": b'{"traceEvents": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}",
    "a number too large": b'{"traceEvents": [{"ph": "X", "name": "ProfilerStep#1", "ts": 1e999, "dur": 1}]}',
}


def strip(ev):
    return {k: v for k, v in ev.items() if k not in ("damage", "damage_withheld", "trace")}


def write(doc, path):
    # one dumps and the fastest gzip level: json.dump through gzip's text layer, at level 9, took five times as long
    with open(path, "wb") as f:
        f.write(gzip.compress(json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass"), compresslevel=1))
    return str(path)


def run_cli(main, argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def cpu_doc(profile_run):
    path = sorted(glob.glob(os.path.join(profile_run["outputs"], "traces", "*.pt.trace.json.gz")))[0]
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    return doc, summarize.summarize_file(path)


@pytest.fixture(scope="module")
def gpu_doc():
    assert os.path.exists(EAGER), "the stored H200 eager trace moved"
    with gzip.open(EAGER, "rt") as f:
        doc = json.load(f)
    return doc, summarize.summarize_file(EAGER)


def read_once(monkeypatch):
    """summarize's three outputs (--json, the default, --full) of one damaged trace from one read of it: each
    CLI call still parses its flags, renders and prints; only the read of the same file is not repeated."""
    real, seen = summarize.summarize_file, {}

    def cached(path, **kwargs):
        key = (path, tuple(sorted(kwargs.items())))
        if key not in seen:
            seen[key] = real(path, **kwargs)
        return copy.deepcopy(seen[key])

    monkeypatch.setattr(summarize, "summarize_file", cached)


def check(case, doc, base, tmp_path, capsys, monkeypatch):
    make, outcome, kind = case
    path = write(make(doc), tmp_path / "damaged.pt.trace.json.gz")
    read_once(monkeypatch)
    code, out, err = run_cli(summarize.main, [path, "--json"], capsys)
    if outcome == "error":
        assert code == 1 and err.count("\n") == 1 and "damaged" in err, err
        assert kind is None or KINDS[kind][0] in err, err
        return
    assert code == 0, err
    ev = json.loads(out)
    assert [d["kind"] for d in ev["damage"]] == (kind if isinstance(kind, list) else [kind]), ev["damage"]
    assert ev["damage"][0]["count"] > 0 and ev["damage"][0]["example"]
    if outcome == "same":
        assert ev["damage_withheld"] is None
        assert strip(ev) == strip(base)
    elif outcome == "kept":  # the damage cannot move the verdict: the undamaged trace's, said with the damage
        assert ev["damage_withheld"] is None and ev["verdict"] == base["verdict"]
    elif outcome == "named":  # gradient accumulation and validation steps look like this: named, not withheld
        assert ev["damage_withheld"] is None and ev["verdict"]["stage"] is not None
    else:
        assert ev["verdict"]["stage"] is None and ev["verdict"]["sentence"].startswith("Withheld: the trace is damaged")
        assert ev["damage"][0]["what"] in ev["verdict"]["sentence"]
        assert base["verdict"]["stage"] is not None, "the undamaged trace has a verdict to withhold"
    code, brief, err = run_cli(summarize.main, [path], capsys)
    assert code == 0 and f"damaged: {ev['damage'][0]['count']} {ev['damage'][0]['what']}" in brief
    assert all(line.isprintable() for line in brief.splitlines()), "every name is printed escaped"
    code, text, err = run_cli(summarize.main, [path, "--full"], capsys)
    assert code == 0 and f"damaged: {ev['damage'][0]['count']} {ev['damage'][0]['what']}" in text
    lines = text.splitlines()
    first_figure = next(i for i, line in enumerate(lines) if line.startswith("figure"))
    assert any("damaged: " in line for line in lines[:first_figure]), "the damage is named before the figures"
    assert all(line.isprintable() for line in lines), "every name is printed escaped"


@pytest.mark.parametrize("name", sorted(CPU_CASES))
def test_damaged_cpu_trace(name, cpu_doc, tmp_path, capsys, monkeypatch):
    check(CPU_CASES[name], *cpu_doc, tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize("name", sorted(GPU_CASES))
def test_damaged_gpu_trace(name, gpu_doc, tmp_path, capsys, monkeypatch):
    check(GPU_CASES[name], *gpu_doc, tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize("name", sorted(FILES))
def test_unreadable_files_are_one_line_and_exit_1(name, tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_bytes(FILES[name])
    for main in (summarize.main, picture.main):
        code, out, err = run_cli(main, [str(path)], capsys)
        assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, (main, err)


def test_a_trace_without_steps_is_read_as_one_window_not_refused(tmp_path, capsys):
    path = tmp_path / "window.json"
    path.write_bytes(b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 2}]}')
    code, out, err = run_cli(summarize.main, [str(path)], capsys)
    assert code == 0 and not err and "no ProfilerStep#N slices" in out and "read as one window" in out


def test_a_gzip_cut_short_is_one_line(tmp_path, capsys):
    whole = gzip.compress(b'{"traceEvents": [' + b'{"ph": "i", "name": "x", "ts": 1},' * 5000 + b"{}]}")
    path = tmp_path / "cut.pt.trace.json.gz"
    path.write_bytes(whole[: len(whole) // 2])
    code, _, err = run_cli(summarize.main, [str(path)], capsys)
    assert code == 1 and err.count("\n") == 1 and "not a readable Chrome trace" in err


def test_the_undamaged_traces_have_no_damage(cpu_doc, gpu_doc):
    for _, base in (cpu_doc, gpu_doc):
        assert base["damage"] == [] and base["damage_withheld"] is None


def test_stored_traces_have_no_damage_and_no_launch_without_its_gpu_work(stored_evidence):
    """Every stored H200 trace, both cycles: nothing damaged, every launch's GPU record present."""
    found = sorted(glob.glob(os.path.join(ROOT, "results", "**", "*.pt.trace.json.gz"), recursive=True))
    found = [p for p in found if not os.path.islink(p)]
    # 24 since 2026-12-06: results/ keeps the traces a test or a page cites
    assert len(found) >= 20, f"only {len(found)} stored traces found: did results/ move?"
    for path in found:
        ev = stored_evidence(path)
        assert ev["damage"] == [], (path, ev["damage"])
        assert ev["window"]["launches_without_gpu_work"] == 0 < ev["window"]["gpu_work_launches"], path


def test_dropped_gpu_records_are_counted_per_step_and_null_its_figures_past_the_share(gpu_doc):
    doc, base = gpu_doc
    first = base["steps"][0]["step"]
    one = summarize.summarize_events(D.dropped_gpu_records(0.0)(doc)["traceEvents"])
    lost = {s["step"]: s["launches_without_gpu_work"] for s in one["steps"]}
    assert lost == {s["step"]: (1 if s["step"] == first else 0) for s in base["steps"]}
    step = one["steps"][0]
    assert step["gpu_work_launches"] == base["steps"][0]["gpu_work_launches"] > 100
    assert step["gpu_idle_share"] is not None, "one lost record of hundreds is marked, not nulled"
    assert any("launches without their GPU work" in n and f"#{first}: 1 of" in n for n in one["notes"])
    many = summarize.summarize_events(D.dropped_gpu_records(0.3)(doc)["traceEvents"])
    step = many["steps"][0]
    assert step["launches_without_gpu_work"] > summarize.DROPPED_AT * step["gpu_work_launches"]
    assert step["gpu_idle_share"] is None and "profiler dropped" in step["gpu_null_reason"]
    assert many["steps"][1]["gpu_idle_share"] is not None, "the other steps keep their figures"
    assert many["verdict"]["stage"] is None and "profiler dropped" in many["verdict"]["sentence"]


def test_nan_in_a_copy_s_bytes_reads_as_zero_bytes(gpu_doc):
    doc, base = gpu_doc
    damaged = D._edit(doc, D.cat("gpu_memcpy"), lambda ev: ev["args"].update(bytes=math.nan))
    ev = summarize.summarize_events(damaged["traceEvents"])
    assert ev["steps"][0]["h2d"]["bytes"] == 0 and ev["steps"][0]["h2d"]["count"] == base["steps"][0]["h2d"]["count"]


def test_a_damaged_trace_s_picture_says_so(cpu_doc, tmp_path, capsys):
    doc, _ = cpu_doc
    path = write(D.overlapping_steps(doc), tmp_path / "damaged.pt.trace.json.gz")
    code, out, err = run_cli(picture.main, [path, "--out", str(tmp_path / "p.png")], capsys)
    assert code == 0 and os.path.getsize(tmp_path / "p.png") > 0
    assert "damaged: 1 ProfilerStep slices that overlap the next step" in err


def test_a_one_shot_stream_is_read_twice_through_a_list(cpu_doc):
    doc, base = cpu_doc
    events = D.written_twice(doc)["traceEvents"]
    ev = summarize.summarize_events(iter(events))
    assert strip(ev) == strip(base) and ev["damage"][0]["kind"] == "duplicate"


def test_the_streaming_reader_names_a_recursion_as_unreadable(tmp_path):
    path = tmp_path / "deep.json"
    path.write_bytes(FILES["nested too deep"])
    with pytest.raises(reader.TraceError, match="not a readable Chrome trace"):
        list(reader.iter_events(str(path)))


def test_the_class_table_refuses_gpu_damage_and_says_other_damage(gpu_doc, tmp_path):
    doc, _ = gpu_doc
    script = os.path.join(ROOT, "scripts", "class_table.py")
    cases = (
        (D.no_ts(D.cat("kernel"), 5), 1, "damaged where the classes are read: 5 complete events without a name"),
        (D.some_written_twice, 0, "warning: "),
    )
    for i, (make, rc, words) in enumerate(cases):
        path = write(make(doc), tmp_path / f"t{i}.pt.trace.json.gz")
        proc = subprocess.run([sys.executable, script, path], capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == rc and words in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_two_launches_at_one_time_and_length_are_not_duplicates(gpu_doc):
    """A launch given another's start and duration but keeping its own correlation id is a second launch."""
    doc, _ = gpu_doc
    launches = [e for e in doc["traceEvents"] if e.get("cat") == "cuda_runtime" and e.get("name") == "cudaLaunchKernel"]
    first, second = launches[:2]
    damaged = D._edit(
        doc, lambda ev: ev is not None and ev == second, lambda ev: ev.update(ts=first["ts"], dur=first["dur"])
    )
    ev = summarize.summarize_events(damaged["traceEvents"])
    assert all(d["kind"] != "duplicate" for d in ev["damage"]), ev["damage"]


@pytest.mark.parametrize(
    "damage,said",
    [
        (lambda text: text[:300], "outputs/run.json is damaged (JSONDecodeError"),
        (lambda text: json.dumps({**json.loads(text), "settings": [1, 2]}), "has settings of the wrong type"),
        (lambda text: json.dumps([json.loads(text)]), "outputs/run.json is not an object (list)"),
        (lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "environment"}), None),
    ],
)
def test_compare_reads_a_damaged_run_json_and_names_it(damage, said, tmp_path):
    """compare's reader of run.json: cut short, a part of the wrong type, not an object, a field missing: the run is
    still read from its outputs, the damage named in one line; never a traceback."""
    stored = os.path.join(ROOT, "results", "h200", "offline", "runs")
    uuids = sorted(os.listdir(stored))[:2]
    for uuid in uuids:
        shutil.copytree(os.path.join(stored, uuid), tmp_path / "runs" / uuid)
    path = tmp_path / "runs" / uuids[0] / "outputs" / "run.json"
    path.write_text(damage(path.read_text()))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "steplens",
            "compare",
            "--offline",
            str(tmp_path),
            "--per-host",
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert "Traceback" not in proc.stderr and proc.returncode in (0, 1), proc.stderr
    assert "read 2 of the 2 offline runs" in proc.stdout, proc.stdout
    if said:
        assert sum(said in line for line in proc.stderr.splitlines()) == 1, proc.stderr


def test_a_second_gzip_member_or_appended_text_is_refused_in_one_line(tmp_path, capsys):
    """gzip reads every member on: what follows the JSON document is refused, never ignored."""
    doc = b'{"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 1, "dur": 2}]}'
    cases = {
        "two.pt.trace.json.gz": gzip.compress(doc) + gzip.compress(doc),
        "appended.json": doc + b"\n{}",
        "array.json": b"[]" + b" x",
    }
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        code, out, err = run_cli(summarize.main, [str(path)], capsys)
        assert code == 1 and err.count("\n") == 1 and "more after the trace's JSON document" in err, (name, err)
    path = tmp_path / "padded.json"
    path.write_bytes(doc + b"\n \n")
    assert run_cli(summarize.main, [str(path), "--json"], capsys)[0] == 0, "blanks after the document are no data"


def test_zero_length_steps_only_are_one_line_naming_them(tmp_path, capsys):
    events = [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": 10.0 * n, "dur": 0} for n in (1, 2)
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    code, out, err = run_cli(summarize.main, [str(path)], capsys)
    assert code == 1 and err.count("\n") == 1 and "2 ProfilerStep slices of zero length" in err, err


def hand_made(steps=2, launches=3, kernels_in=(1, 2)):
    """A small GPU trace: steps of 100 us inside the capture span, each with its launches (3 by default) and the
    kernels of the steps in kernels_in (a kernel 10 us after its launch, 5 us long)."""
    events = [{"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "ts": 0.0, "dur": 100.0 * steps + 50}]
    corr = 0
    for n in range(1, steps + 1):
        a = 100.0 * n - 90
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": a, "dur": 90.0})
        for k in range(launches):
            corr += 1
            ts = a + 10 * k + 1
            args = {"correlation": corr}
            events.append(
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 2.0, "args": args}
            )
            if n in kernels_in:
                kernel = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": ts + 10, "dur": 5.0}
                events.append({**kernel, "args": {"correlation": corr, "stream": 7}})
    return events


def kinds(events):
    return dict(timeline.read(lambda: events).damage.counts)


def test_launches_after_the_gpu_s_last_event_are_counted_as_gpu_events_stopping_early():
    assert kinds(hand_made()) == {}
    assert kinds(hand_made(kernels_in=(1,))) == {"gpu_stops_early": 3}
    assert kinds(hand_made(kernels_in=())) == {"gpu_stops_early": 6}, "no GPU event left: every launch counts"


def test_a_window_read_without_steps_is_checked_against_the_capture_span():
    window = [ev for ev in hand_made() if not ev["name"].startswith("ProfilerStep")]
    op = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 20.0, "dur": 3.0}
    assert kinds(window + [op]) == {}
    assert kinds(window + [dict(op, dur=1e9)]) == {"window_past_capture": 1}
    no_span = [ev for ev in window if ev["cat"] != "Trace"]
    assert kinds(no_span + [dict(op, dur=1e9)]) == {}, "without a capture span nothing bounds the window"


def test_a_second_capture_span_or_process_is_counted_and_refused():
    one = hand_made()
    assert kinds(one) == {}
    later = [dict(ev, ts=ev["ts"] + 1000) for ev in one]
    assert kinds(one + [ev for ev in later if ev["cat"] == "Trace"]) == {"several_captures": 1}
    named_once = [dict(ev, pid=7) if ev["cat"] == "cuda_runtime" else ev for ev in one]
    assert kinds(named_once) == {}, "events without a pid are no second process"
    other = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 20.0, "dur": 5.0, "pid": 8, "tid": 1}
    assert kinds(named_once + [other]) == {"several_processes": 1}
    with pytest.raises(reader.TraceError, match="split it and read each capture alone"):
        summarize.summarize_events(named_once + [other])


def test_a_step_1000_times_its_siblings_with_events_in_us_is_left_out_as_a_length_in_ns():
    events = hand_made(steps=3, kernels_in=(1, 2, 3))
    for ev in events:
        ev["dur"] *= 1000 if ev["name"] == "ProfilerStep#3" else 1
    t = timeline.read(lambda: events)
    assert t.damage.counts == {"step_in_ns": 1} and [num for num, _, _ in t.steps] == [1, 2]
    long_save = {"ph": "X", "cat": "user_annotation", "name": "checkpoint/save", "ts": 211.0, "dur": 89_000.0}
    unbounded = [ev for ev in events if ev["cat"] != "Trace"] + [long_save]  # no capture span to end it
    t = timeline.read(lambda: unbounded)
    assert not t.damage.counts and len(t.steps) == 3, "a long step whose own events fill it is a long step"
    stall = [dict(ev, dur=ev["dur"] + 100_000.0) if ev["cat"] == "Trace" else ev for ev in events]
    t = timeline.read(lambda: stall)  # the capture goes on past the long last step: the host stalled in it
    assert not t.damage.counts and len(t.steps) == 3, "a last step that ends inside the capture is a long step"


def test_a_kernel_recorded_twice_under_one_launch_is_counted_but_a_graph_s_kernels_are_not():
    events = hand_made()
    kernel = next(ev for ev in events if ev["cat"] == "kernel")
    assert kinds(events + [dict(kernel, ts=kernel["ts"] + 1)]) == {"repeated_gpu_record": 1}
    for ev in events:
        ev["name"] = "cudaGraphLaunch" if ev["name"] == "cudaLaunchKernel" else ev["name"]
    assert kinds(events + [dict(kernel, ts=kernel["ts"] + 1)]) == {}, "a graph launch's id is on all its kernels"


def test_gpu_events_without_correlation_ids_are_named_so_not_as_dropped_records():
    events = hand_made(kernels_in=(1, 2))
    for ev in events:
        if ev["cat"] == "kernel":
            ev["args"].pop("correlation")
    ev = summarize.summarize_events(events)
    assert {d["kind"]: d["count"] for d in ev["damage"]} == {"no_correlation": 6}
    reasons = [s["gpu_null_reason"] for s in ev["steps"]] + ev["notes"]
    assert all("profiler dropped" not in r for r in reasons if r), reasons
    assert any("lack correlation ids" in r for r in reasons if r), reasons
    assert ev["damage_withheld"] and ev["verdict"]["stage"] is None
    no_launches = [e for e in events if e["cat"] != "cuda_runtime"]
    ev = summarize.summarize_events(no_launches)
    assert ev["damage"][0]["kind"] == "no_correlation" and ev["damage_withheld"] is None, "no launch to match: clock"
