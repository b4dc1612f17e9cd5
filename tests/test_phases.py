"""--profile-phase: validation and checkpoint captures, their evidence, their bench figures and their refusals."""

import glob
import json
import os
import statistics
import subprocess
import sys

import pytest
from conftest import FEW, ROOT, TINY, load_offline_run, run_train, single_run

from steplens import scopes
from steplens.evidence import diagnosis, summarize
from steplens.evidence.attribution import Busy, save_figures
from steplens.trace import reader

# lean: the profiler's own cost stays small beside a deliberately slow save on a shared 2-CPU machine
LEAN = ["--profile-detail", "lean"]
# Far beyond a tiny CPU step, so that the save is the largest part of the step: at batch 1 a step's forward and
# backward take 0.5-1.5 s on a busy 2-CPU machine, so the 3 of a cycle stay well under one save, the cycle's only one.
SLOW_SAVE_MS = 5000
ONE = [*TINY[: TINY.index("--batch-size")], "--batch-size", "1", *TINY[TINY.index("--batch-size") + 2 :]]


def read_json(path):
    with open(path) as f:
        return json.load(f)


def traces_of(outputs):
    return sorted(glob.glob(os.path.join(outputs, "traces", "*.pt.trace.json.gz")))


@pytest.fixture(scope="module")
def validation(tmp_path_factory):
    """One tiny CPU capture of the validation phase."""
    root = tmp_path_factory.mktemp("phase-validation")
    proc = run_train(["--mode", "profile", "--profile-phase", "validation", *TINY, *LEAN, *FEW], root)
    assert proc.returncode == 0, f"validation capture failed:\n{proc.stderr[-4000:]}"
    uuid, outputs = single_run(root)
    return {"root": root, "uuid": uuid, "outputs": outputs, "proc": proc}


@pytest.fixture(scope="module")
def slow_save(tmp_path_factory):
    """One tiny CPU capture of the checkpoint phase whose saves in the capture sleep SLOW_SAVE_MS (the test hook)."""
    root = tmp_path_factory.mktemp("phase-checkpoint")
    proc = run_train(
        ["--mode", "profile", "--profile-phase", "checkpoint", *ONE, *LEAN, *FEW],
        root,
        STEPLENS_TEST_SLOW_SAVE_MS=str(SLOW_SAVE_MS),
    )
    assert proc.returncode == 0, f"checkpoint capture failed:\n{proc.stderr[-4000:]}"
    uuid, outputs = single_run(root)
    return {"root": root, "uuid": uuid, "outputs": outputs, "proc": proc}


def user_annotations(trace):
    return [e for e in reader.load_events(trace) if e.get("ph") == "X" and e.get("cat") == "user_annotation"]


def test_a_validation_capture_holds_the_eval_scopes_in_each_step_and_no_training_scope(validation):
    """Two traces; each profiled step holds eval/next_batch, eval/to_device, eval/forward once, in order."""
    traces = traces_of(validation["outputs"])
    assert [os.path.basename(t) for t in traces] == [
        "trace-cycle1-steps2-4.pt.trace.json.gz",
        "trace-cycle2-steps7-9.pt.trace.json.gz",
    ]
    for trace in traces:
        events = user_annotations(trace)
        assert not {e["name"] for e in events} & set(scopes.SCOPES), f"{trace}: a training scope in a validation step"
        steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
        assert len(steps) == 3
        for st in steps:
            inside = sorted(
                (e for e in events if e["name"] in scopes.EVAL_SCOPES and st["ts"] <= e["ts"] < st["ts"] + st["dur"]),
                key=lambda e: e["ts"],
            )
            assert [e["name"] for e in inside] == list(scopes.EVAL_SCOPES), [e["name"] for e in inside]


def test_the_validation_evidence_reads_the_eval_scopes_with_eval_next_batch_as_its_input(validation):
    """Each cycle's evidence is read by the validation phase's scopes; its input source is eval/next_batch;
    the verdict names an eval scope; run.json records the held-out set."""
    record = read_json(os.path.join(validation["outputs"], "run.json"))
    for c in record["results"]["cycles"]:
        ev = read_json(c["evidence_json"])
        assert ev["scope_set"] == list(scopes.EVAL_SCOPES)
        assert ev["scopes_present"] == list(scopes.EVAL_SCOPES)
        assert ev["input_source"] == {"name": scopes.EVAL_NEXT_BATCH, "kind": "scope", "null_reason": None}
        assert set(ev["window"]["scopes_cpu_us"]) == set(scopes.EVAL_SCOPES)
        with open(c["evidence_txt"]) as f:
            text = f.read()
        assert "cpu eval/forward ms" in text and "input read from eval/next_batch (scope)" in text
        assert "input/next_batch" not in text.split("note:")[0], "the table names a training scope"
    verdict = record["results"]["evidence"]["verdict"]
    assert verdict["part"] in ("input", scopes.EVAL_TO_DEVICE, scopes.EVAL_FORWARD), verdict
    assert any(n in verdict["sentence"] for n in scopes.EVAL_SCOPES), verdict["sentence"]
    assert record["phase"]["phase"] == "validation"
    held = record["phase"]["held_out"]
    assert held["name"] == "synthetic held-out" and held["images"] == 10_000 and "RandomCrop" not in held["transform"]
    assert load_offline_run(validation["root"], validation["uuid"])["inputs"]["profile_phase"] == "validation"


def test_a_slow_save_is_named_as_what_holds_the_step(slow_save):
    """With every save slowed on purpose, the verdict names checkpoint/save and the longest save: its step, its
    share of that step; each cycle's trace holds a save, and the checkpoint was renamed into place."""
    record = read_json(os.path.join(slow_save["outputs"], "run.json"))
    verdict = record["results"]["evidence"]["verdict"]
    assert verdict["part"] == scopes.SAVE and verdict["stage"] == "saving a checkpoint", verdict["sentence"]
    assert "checkpoint/save" in verdict["sentence"] and "The longest save, in ProfilerStep#" in verdict["sentence"]
    save = verdict["save"]
    assert save["step"] in (3, 7, 9) and 0 < save["share_of_step"] <= 1
    assert len(traces_of(slow_save["outputs"])) == 2
    for c in record["results"]["cycles"]:
        ev = read_json(c["evidence_json"])
        assert ev["scope_set"] == list(scopes.PHASES["checkpoint"])
        # every 2nd step saves: ProfilerStep#3 in cycle 1, #7 and #9 in cycle 2
        assert [s["step"] for s in ev["saves"]] == ([3] if c["cycle"] == 1 else [7, 9])
        for s in ev["saves"]:
            step = next(x for x in ev["steps"] if x["step"] == s["step"])
            assert s["save_us"] <= step["wall_us"] and s["share_of_step"] == pytest.approx(
                s["save_us"] / step["wall_us"]
            )
            assert s["gpu_idle_us"] is None and "CPU-only" in s["gpu_idle_null_reason"]
        with open(c["evidence_txt"]) as f:
            assert f"checkpoint/save in ProfilerStep#{ev['saves'][0]['step']}" in f.read()
    facts = record["phase"]["checkpoint"]
    assert facts["every"] == scopes.CHECKPOINT_EVERY and os.path.getsize(facts["path"]) == facts["bytes"] > 0
    assert not glob.glob(os.path.join(slow_save["outputs"], "checkpoints", ".partial-*"))


def test_bench_times_the_held_out_window_and_the_saves(tmp_path):
    """bench --profile-phase validation: the held-out window's rate is its samples over its seconds; checkpoint:
    each save's MB/s is its size over its seconds, the median of three; both reach Polyaxon's outputs."""
    root = tmp_path / "v"
    proc = run_train(["--mode", "bench", "--bench-steps", "3", "--profile-phase", "validation", *TINY], root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    uuid, outputs = single_run(root)
    v = read_json(os.path.join(outputs, "run.json"))["results"]["validation"]
    assert v["window_steps"] == 3 and v["window_samples"] == 3 * 4 and v["epoch_restarts_in_window"] == 0
    assert v["samples_per_sec"] == pytest.approx(v["window_samples"] / v["window_seconds"])
    out = load_offline_run(root, uuid)["outputs"]
    assert out["validation_samples_per_sec"] == pytest.approx(v["samples_per_sec"])
    assert "bench: validation:" in proc.stdout

    root = tmp_path / "c"
    proc = run_train(["--mode", "bench", "--bench-steps", "3", "--profile-phase", "checkpoint", *TINY], root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    uuid, outputs = single_run(root)
    c = read_json(os.path.join(outputs, "run.json"))["results"]["checkpoint"]
    assert c["saves"] == 3 and len(c["save_seconds_each"]) == 3
    for s, rate in zip(c["save_seconds_each"], c["save_mb_per_sec_each"]):
        assert rate * s == pytest.approx(c["checkpoint_mb"])  # the same state each time: one size
    assert c["save_seconds"] == statistics.median(c["save_seconds_each"])
    assert c["save_mb_per_sec"] == pytest.approx(c["checkpoint_mb"] / c["save_seconds"])
    out = load_offline_run(root, uuid)["outputs"]
    assert out["checkpoint_save_mb_per_sec"] == pytest.approx(c["save_mb_per_sec"])
    assert os.path.getsize(os.path.join(outputs, "checkpoints", "checkpoint.pt")) == pytest.approx(
        c["checkpoint_mb"] * 1e6
    )


REFUSED = [
    (["--profile-phase", "validation", "--ddp"], "drop --ddp"),
    (["--profile-phase", "checkpoint", "--ddp"], "drop --ddp"),
    (["--profile-phase", "validation", "--gpu-input"], "--gpu-input"),
    (["--profile-phase", "validation", "--batch-size", "20000", "--data", "synthetic"], "held-out set"),
    (["--profile-phase", "checkpoint", "--checkpoint-every", "4"], "--checkpoint-every 4"),
    (["--checkpoint-every", "2"], "add --profile-phase checkpoint"),
    (["--profile-phase", "test"], "--profile-phase"),
]


@pytest.mark.parametrize("argv,said", REFUSED, ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_a_phase_that_cannot_run_is_refused_in_one_line_before_torch(argv, said):
    """Exit 2 with one line naming the problem, and torch never imported."""
    code = (
        "import sys, train\n"
        f"try:\n    train.main(['--mode', 'profile', *{argv!r}])\nexcept SystemExit as e:\n"
        "    print(e.code, 'torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["2", "False"], proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: error:") and said in lines[0], proc.stderr


def test_bench_takes_a_checkpoint_interval_longer_than_a_cycle():
    """Only a capture needs a save in each cycle of three: bench mode saves on its own schedule."""
    from steplens.job.settings import parse_settings

    args = parse_settings(["--mode", "bench", "--profile-phase", "checkpoint", "--checkpoint-every", "5"])
    assert args.checkpoint_every == 5
    assert parse_settings(["--mode", "profile", "--profile-phase", "checkpoint"]).checkpoint_every == 2


def test_a_trace_is_read_by_the_scopes_of_its_phase():
    """The scope set follows the scopes present: the save's, eval's where no training scope is, else training's."""
    assert scopes.scope_set(set(scopes.SCOPES) | {scopes.SAVE}) == scopes.SCOPES + (scopes.SAVE,)
    assert scopes.scope_set(set(scopes.EVAL_SCOPES)) == scopes.EVAL_SCOPES
    assert scopes.scope_set(set(scopes.EVAL_SCOPES) | {scopes.NEXT_BATCH}) == scopes.SCOPES
    assert scopes.scope_set(set()) == scopes.SCOPES  # someone else's loop: as before


def made_checkpoint_trace(save_ms, busy_during_save_ms):
    """Three 20 ms steps of the four scopes; step 1 ends with a save of save_ms, during which the GPU runs a kernel
    of busy_during_save_ms; each step launches a 10 ms kernel from train/forward_backward."""
    events, t = [], 0.0
    for num in range(3):
        wall = 20_000.0 + (save_ms * 1e3 if num == 1 else 0.0)
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{num}", "ts": t, "dur": wall})
        for name, a, d in zip(scopes.SCOPES, (0, 2_000, 4_000, 16_000), (2_000, 2_000, 12_000, 4_000)):
            events.append(
                {"ph": "X", "cat": "user_annotation", "name": name, "ts": t + a, "dur": d, "pid": 1, "tid": 1}
            )
        corr = 100 + num
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t + 5_000, "dur": 10.0,
                       "args": {"correlation": corr}})  # fmt: skip
        events.append({"ph": "X", "cat": "kernel", "name": "k", "ts": t + 5_100, "dur": 10_000.0,
                       "args": {"correlation": corr, "stream": 7}})  # fmt: skip
        if num == 1:
            s = t + 20_000
            events.append({"ph": "X", "cat": "user_annotation", "name": scopes.SAVE, "ts": s, "dur": save_ms * 1e3,
                           "pid": 1, "tid": 1})  # fmt: skip
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": s + 10, "dur": 10.0,
                           "args": {"correlation": 200}})  # fmt: skip
            events.append({"ph": "X", "cat": "kernel", "name": "k", "ts": s + 100, "dur": busy_during_save_ms * 1e3,
                           "args": {"correlation": 200, "stream": 7}})  # fmt: skip
        t += wall
    return events


def test_a_save_s_gpu_idle_time_and_share_obey_their_bounds_on_a_gpu_trace():
    """On a GPU trace: the save's idle time is its length less the GPU's busy time inside it, never more than the
    save; its share is of the step that holds it; a long save holds the step and the verdict names it."""
    ev = summarize.summarize_events(made_checkpoint_trace(save_ms=200, busy_during_save_ms=30))
    assert ev["scope_set"] == list(scopes.PHASES["checkpoint"])
    (save,) = ev["saves"]
    assert save["step"] == 1
    assert save["save_us"] == pytest.approx(200_000)
    assert save["gpu_idle_us"] == pytest.approx(200_000 - 30_000)
    assert 0 <= save["gpu_idle_us"] <= save["save_us"]
    step = next(s for s in ev["steps"] if s["step"] == 1)
    assert save["share_of_step"] == pytest.approx(200_000 / step["wall_us"])
    assert ev["verdict"]["part"] == scopes.SAVE, ev["verdict"]["sentence"]
    assert (
        "ProfilerStep#1" in ev["verdict"]["sentence"] and "the GPU sat idle for 170.0 ms" in ev["verdict"]["sentence"]
    )


def test_save_figures_without_a_gpu_say_why():
    steps = [(1, 0.0, 100.0), (2, 100.0, 300.0)]
    out = save_figures(steps, [[150.0, 250.0]], None)
    assert out == [
        {
            "step": 2,
            "save_us": 100.0,
            "share_of_step": 0.5,
            "gpu_idle_us": None,
            "gpu_idle_null_reason": out[0]["gpu_idle_null_reason"],
        }
    ]
    assert "CPU-only" in out[0]["gpu_idle_null_reason"]
    busy = Busy([("kernel", 140.0, 200.0, 7, 1, 0)], lambda ev: 0.0)
    assert save_figures(steps, [[150.0, 250.0]], busy)[0]["gpu_idle_us"] == pytest.approx(50.0)


def test_a_verdict_on_a_training_trace_names_no_save():
    ev = summarize.summarize_events(made_checkpoint_trace(save_ms=1, busy_during_save_ms=0.5))
    assert ev["verdict"]["part"] != scopes.SAVE and "save" not in ev["verdict"]
    assert diagnosis.save_sentence(None) == ""


def test_the_held_out_sets_are_seeded_and_apart_from_the_training_sets():
    """Synthetic and learnable held-out sets: 10,000 images, the same every time, other images than the training
    set's; the learnable one keeps the training set's class tints (what the model learns)."""
    import numpy as np

    from steplens.job import data

    ident = lambda x: x  # noqa: E731
    train = data.SyntheticCIFAR10(ident)
    held = data.SyntheticCIFAR10(ident, data.HELD_OUT_SIZE, data.HELD_OUT_SEED)
    again = data.SyntheticCIFAR10(ident, data.HELD_OUT_SIZE, data.HELD_OUT_SEED)
    assert len(held) == 10_000 and np.array_equal(held.data, again.data)
    assert not np.array_equal(held.data, train.data[: data.HELD_OUT_SIZE])
    ltrain = data.LearnableCIFAR10(ident)
    lheld = data.LearnableCIFAR10(ident, data.HELD_OUT_SIZE, images_seed=data.HELD_OUT_SEED)
    assert lheld.tints == ltrain.tints and len(lheld) == 10_000
    assert not np.array_equal(lheld.data, ltrain.data[: data.HELD_OUT_SIZE])


def test_a_profile_run_of_another_phase_never_stands_in_for_training_evidence(monkeypatch):
    """steplens compare sets a group's latest profile run beside it: a validation or save capture is not the step's."""
    from steplens.project.comparison import matching_evidence

    def run(phase, created):
        settings = {"workers": 4, **({"profile_phase": phase} if phase else {})}
        return {
            "uuid": f"{phase}-{created}",
            "mode": "profile",
            "status": "succeeded",
            "settings": settings,
            "outputs": {"profiled_step_ms": 1.0},
            "created_at": created,
        }

    monkeypatch.setattr("steplens.project.comparison.machine_key", lambda r: ())  # one machine
    records = [run(None, "1"), run("train", "2"), run("validation", "3"), run("checkpoint", "4")]
    assert matching_evidence(records, {"workers": 4, "profile_phase": "train"}, ())["uuid"] == "train-2"
    assert matching_evidence(records[2:], {"workers": 4}, ()) is None
