"""The learning check: the learnable set, the learning-rate rule, the bench window's loss (read after the
window, with no synchronization inside it) and steplens compare's mark on a group whose loss is worse."""

import json
import os
import signal

import numpy as np
import pytest
import torch
from conftest import load_offline_run, run_train

import train
from steplens.job import data, distributed, learning, stopping
from steplens.job import device as device_module
from steplens.job.settings import parse_settings
from steplens.project import compare, comparison, runs

# Small enough for a CPU test. A batch of 32 keeps BatchNorm's batch statistics steady enough to learn
# within a few steps (at 4 to 16 the loss wanders); --scale-lr gives it lr 0.1 x 32 / 128 = 0.025.
LEARNING = [
    "--mode",
    "bench",
    "--device",
    "cpu",
    "--data",
    "learnable",
    "--batch-size",
    "32",
    "--warmup-steps",
    "1",
    "--bench-steps",
    "14",
    "--scale-lr",
    # a ramp over the warm-up step and the window's first 4: test_a_real_run_ramps_its_rate reads it from the same runs
    "--lr-warmup-steps",
    "5",
]


def read_json(path):
    with open(path) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def learning_runs(tmp_path_factory):
    """Two real CPU bench runs in one offline root: the learning rate the rule gives (after a 5-step ramp), and lr 0."""
    root = tmp_path_factory.mktemp("learning")
    runs = {}
    for lr in ("0.1", "0"):
        proc = run_train([*LEARNING, "--lr", lr], root)
        assert proc.returncode == 0, f"--lr {lr} failed:\n{proc.stderr[-3000:]}"
        out = [line for line in proc.stderr.splitlines() if line.startswith("outputs: ")][0][len("outputs: ") :]
        uuid = os.path.basename(os.path.dirname(out))
        runs[lr] = {
            "uuid": uuid,
            "record": read_json(os.path.join(out, "run.json")),
            "run": load_offline_run(root, uuid),
            "proc": proc,
        }
    return root, runs


def test_learnable_set_is_fixed_and_each_class_has_its_tint():
    """The same images whatever the run; each image's mean colour is its class's tint; CIFAR's transforms."""
    a = data.LearnableCIFAR10(data.build_transform(), size=200)
    b = data.LearnableCIFAR10(data.build_transform(), size=200)
    assert (a.data == b.data).all() and a.targets == b.targets and a.tints == b.tints
    assert len({tuple(t) for t in a.tints}) == 10, "ten distinct tints"
    means = a.data.reshape(200, -1, 3).mean(axis=1)
    tints = np.array(a.tints)[a.targets] - 0.5  # the noise is drawn from [-64, +63]
    assert np.abs(means - tints).max() < 8, "an image's mean colour is its class's tint"
    image, target = a[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32 and 0 <= target < 10


def test_learnable_set_shards_and_goes_to_the_device_input():
    """--gpu-input and DDP read data and targets: each rank's shard keeps every image's own label."""
    ds = data.LearnableCIFAR10(None, size=64)
    shard = distributed.Shard(ds, 1, 2)
    assert len(shard) == 32 and (shard.data == ds.data[1::2]).all() and shard.targets == ds.targets[1::2]
    from steplens.speedups.gpu_input import DeviceBatches

    batches = DeviceBatches(shard, 8, torch.device("cpu"), 0, data.CIFAR10_MEAN, data.CIFAR10_STD)
    images, targets = next(batches)
    assert images.shape == (8, 3, 32, 32) and set(targets.tolist()) <= set(range(10))


def test_the_loss_falls_and_is_recorded(learning_runs):
    """--data learnable at the rule's learning rate: the window's final loss (mean of its last 10 steps)
    is clearly below its first; run.json, the outputs and the metric window_loss say the same."""
    root, runs = learning_runs
    r = runs["0.1"]["record"]["results"]
    assert len(r["window_losses"]) == 14 and r["loss_first"] == r["window_losses"][0]
    assert r["loss_final"] == pytest.approx(sum(r["window_losses"][-10:]) / 10)
    assert r["loss_final"] < 0.7 * r["loss_first"], f"the loss did not fall: {r['window_losses']}"
    out = runs["0.1"]["run"]["outputs"]
    assert out["loss_first"] == pytest.approx(r["loss_first"]) and out["loss_final"] == pytest.approx(r["loss_final"])
    with open(os.path.join(root, "runs", runs["0.1"]["uuid"], "events", "metric", "window_loss.plx")) as f:
        lines = f.read().strip().splitlines()[1:]  # "step|timestamp|metric"
    assert [int(line.split("|")[0]) for line in lines] == list(range(1, 15))
    assert [float(line.split("|")[2]) for line in lines] == pytest.approx(r["window_losses"])


def test_scale_lr_records_the_linear_rule(learning_runs):
    """--scale-lr at batch 32: lr 0.1 x 32 / 128, in run.json and as the output effective_lr."""
    _, runs = learning_runs
    rate = runs["0.1"]["record"]["learning_rate"]
    assert rate["effective_lr"] == pytest.approx(0.1 * 32 / 128) and rate["scale_lr"] is True
    assert rate["global_batch"] == 32 and "linear scaling" in rate["rule"]
    assert runs["0.1"]["run"]["outputs"]["effective_lr"] == pytest.approx(0.025)
    plain = learning.learning_rate(parse_settings(["--mode", "bench", "--batch-size", "512"]), 1)
    assert plain["effective_lr"] == 0.1 and plain["rule"] == "as given by --lr"
    ddp = learning.learning_rate(parse_settings(["--mode", "bench", "--batch-size", "256", "--scale-lr"]), 4)
    assert ddp["effective_lr"] == pytest.approx(0.1 * 1024 / 128), "the global batch sets the rate"


def test_lr_zero_leaves_the_loss_flat_and_compare_marks_it(learning_runs, tmp_path):
    """lr 0 trains nothing: the loss stays where it started, and steplens compare marks its group against the
    learning baseline in the table, the verdict, the CSV and the JSON."""
    root, runs = learning_runs
    flat, learned = runs["0"]["record"]["results"], runs["0.1"]["record"]["results"]
    assert runs["0"]["record"]["learning_rate"]["effective_lr"] == 0
    assert flat["loss_final"] == pytest.approx(flat["loss_first"], rel=0.25), flat["window_losses"]
    assert flat["loss_final"] > learned["loss_final"] + 0.3
    assert compare.main(["--offline", str(root), "--out", str(tmp_path), "--baseline", "lr=0.1"]) == 0
    result = read_json(tmp_path / "comparison.json")
    by_group = {g["group"]: g for g in result["tables"][0]["groups"]}
    assert not by_group["lr=0.1"]["loss"]["worse_than_baseline"]
    assert by_group["lr=0.0"]["loss"]["worse_than_baseline"]
    assert by_group["lr=0.0"]["verdict"].endswith("; loss worse than baseline")
    assert by_group["lr=0.0"]["loss"]["final"] == pytest.approx(flat["loss_final"])
    row = [line for line in (tmp_path / "comparison.md").read_text().splitlines() if line.startswith("| lr=0.0 ")][0]
    assert f"{flat['loss_final']:.3f} (loss worse than baseline)" in row
    csv = (tmp_path / "comparison.csv").read_text().splitlines()
    header = csv[0].split(",")
    assert "final_loss" in header and "loss_worse_than_baseline" in header


def test_bad_lr_exits_2_in_one_line(tmp_path):
    for bad in ("-0.1", "abc"):
        proc = run_train(["--mode", "bench", "--lr", bad], tmp_path / "offline", timeout=60)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and "--lr" in lines[0], proc.stderr
    assert not (tmp_path / "offline").exists()


@pytest.mark.parametrize("batch", [128, 256, 512, 1024])
def test_the_study_s_flag_sets_parse(batch):
    """The best option set on --data learnable with --scale-lr, and max-autotune-no-cudagraphs beside --cuda-graph."""
    best = (
        "--workers 0 --gpu-input --cuda-graph --compile default --amp bf16 --channels-last --fused-sgd "
        "--cudnn-benchmark"
    ).split()
    args = parse_settings(["--mode", "bench", "--data", "learnable", "--batch-size", str(batch), "--scale-lr", *best])
    assert learning.learning_rate(args, 1)["effective_lr"] == pytest.approx(0.1 * batch / 128)
    args = parse_settings(["--mode", "bench", "--data", "learnable", *best, "--compile", "max-autotune-no-cudagraphs"])
    assert args.compile == "max-autotune-no-cudagraphs" and args.cuda_graph


def test_the_loss_read_adds_no_synchronization_inside_the_window(monkeypatch):
    """run_bench synchronizes at the window's two edges only, as before; each step's loss is copied on the
    device and the buffer is read once, after the closing synchronization."""
    events, returned = [], []
    real_sync, real_values = train.synchronize, learning.LossCurve.values

    def sync(device):
        events.append("sync")
        real_sync(device)

    def values(self):
        events.append("read")
        return real_values(self)

    monkeypatch.setattr(train, "synchronize", sync)
    monkeypatch.setattr(device_module, "synchronize", sync)  # WindowPeak's, at the window's opening edge
    monkeypatch.setattr(learning.LossCurve, "values", values)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: events.append("cuda sync"))
    args = parse_settings(
        ["--mode", "bench", "--device", "cpu", "--batch-size", "4", "--bench-steps", "5", "--data", "learnable"]
    )
    loader = torch.utils.data.DataLoader(
        data.LearnableCIFAR10(data.build_transform(), size=40), batch_size=4, drop_last=True
    )
    batches = data.Batches(loader)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = train.make_step(
        batches,
        model,
        torch.nn.CrossEntropyLoss(),
        optimizer,
        lambda x, y: (x, y),
        __import__("contextlib").nullcontext,
    )

    def counted_step():
        events.append("step")
        loss = step()
        returned.append(loss.detach().clone())
        return loss

    handlers = {s: signal.getsignal(s) for s in stopping.SIGNALS}
    try:
        results = train.run_bench(
            counted_step, torch.device("cpu"), batches, args, stopping.Stopper(), distributed.World()
        )
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    assert events == ["sync"] + ["step"] * 5 + ["sync", "read"], events
    assert results["window_losses"] == pytest.approx([t.item() for t in returned])


def rec(uuid, index, loss, lr="0.1", **outputs):
    settings = {"mode": "bench", "batch_size": 128, "data": "learnable", "repeat": index, "lr": float(lr)}
    out = {"samples_per_sec": 1000.0 + index, **({} if loss is None else {"loss_final": loss}), **outputs}
    return runs.record_from(
        uuid,
        uuid,
        f"2026-12-03T10:00:{index:02d}",
        "succeeded",
        settings,
        out,
        {"settings": settings, "environment": {"hostname": "h", "gpu": "cpu"}},
    )


def test_compare_tolerance_floor_old_runs_and_divergence():
    """Worse means above baseline + max(0.10 x baseline, 0.05); groups or baselines without a loss get '-'
    and no mark; a diverged run counts as worse than any."""

    def groups(records, **kw):
        result = comparison.compare_records(records, baseline="lr=0.1", **kw)
        return {g["group"]: g for g in result["tables"][0]["groups"]}, compare.markdown(result)

    near_zero = [rec("a", 1, 0.002), rec("b", 2, 0.04, lr="0.2")]
    g, _ = groups(near_zero)
    assert not g["lr=0.2"]["loss"]["worse_than_baseline"], "within the floor of 0.05"
    g, _ = groups(near_zero, loss_floor=0.01)
    assert g["lr=0.2"]["loss"]["worse_than_baseline"]
    g, _ = groups([rec("a", 1, 1.0), rec("b", 2, 1.09, lr="0.2"), rec("c", 3, 1.11, lr="0.3")])
    assert [g[k]["loss"]["worse_than_baseline"] for k in ("lr=0.2", "lr=0.3")] == [False, True]
    g, text = groups([rec("a", 1, 1.0), rec("b", 2, None, lr="0.2")])
    assert g["lr=0.2"]["loss"] is None and "loss worse" not in g["lr=0.2"]["verdict"]
    assert [line for line in text.splitlines() if line.startswith("| lr=0.2 ")][0].split(" | ")[3] == "-"
    g, _ = groups([rec("a", 1, None), rec("b", 2, 5.0, lr="0.2")])
    assert not g["lr=0.2"]["loss"]["worse_than_baseline"], "no baseline loss: nothing to compare with"
    g, text = groups([rec("a", 1, 1.0), rec("b", 2, None, lr="0.2", loss_diverged_step=3)])
    assert g["lr=0.2"]["loss"]["final"] is None and g["lr=0.2"]["loss"]["worse_than_baseline"]
    assert "diverged (loss worse than baseline)" in text


def test_a_diverged_window_has_no_final_loss():
    """A loss that stops being finite: loss_final is None and loss_diverged_step says where."""
    s = learning.summary([2.3, 1.5, float("nan"), float("nan")])
    assert s["loss_final"] is None and s["loss_diverged_step"] == 3 and s["loss_first"] == 2.3
    assert s["window_losses"] == [2.3, 1.5, None, None]
    s = learning.summary([2.0] * 5 + [1.0] * 10)
    assert s["loss_final"] == 1.0 and s["loss_diverged_step"] is None and s["loss_final_steps"] == 10


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_captured_step_s_loss_is_copied_at_every_replay(tmp_path):
    """--cuda-graph returns one static loss tensor: the window's curve must hold each replay's own value
    (not the last one repeated), and on --data learnable it falls."""
    proc = run_train(
        [
            "--mode",
            "bench",
            "--device",
            "cuda",
            "--data",
            "learnable",
            "--batch-size",
            "128",
            "--warmup-steps",
            "5",
            "--bench-steps",
            "100",
            "--gpu-input",
            "--cuda-graph",
            "--amp",
            "bf16",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = [line for line in proc.stderr.splitlines() if line.startswith("outputs: ")][0][len("outputs: ") :]
    r = read_json(os.path.join(out, "run.json"))["results"]
    assert len(set(r["window_losses"])) > 90, "the captured loss was read once, not copied at each replay"
    assert r["loss_final"] < 0.5 * r["loss_first"], r["window_losses"]


def test_lr_warm_up_ramps_the_rate_then_holds_it():
    """--lr-warmup-steps 4: the k-th step runs at lr x k / 4 for k <= 4, then at lr; run.json says so."""
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias]}], lr=0.8)
    seen = []
    step = learning.ramped(lambda: seen.append([g["lr"] for g in optimizer.param_groups]), optimizer, 0.8, 4)
    for _ in range(6):
        step()
    assert seen == [[pytest.approx(0.8 * k / 4)] * 2 for k in (1, 2, 3, 4)] + [[0.8, 0.8]] * 2, seen
    plain = lambda: None  # noqa: E731
    assert learning.ramped(plain, optimizer, 0.8, 0) is plain, "no ramp: the step itself, nothing wrapped"
    args = parse_settings(
        ["--mode", "bench", "--batch-size", "1024", "--scale-lr", "--warmup-steps", "50", "--lr-warmup-steps", "80"]
    )
    rate = learning.learning_rate(args, 1)
    assert rate["ramp_steps"] == 80 and rate["ramp_steps_after_warm_up"] == 30 and "x k / 80" in rate["warmup"]
    assert "30 of the 80 --lr-warmup-steps fall after the 50 warm-up steps" in rate["ramp_note"]
    plain_rate = learning.learning_rate(parse_settings(["--mode", "bench"]), 1)
    assert plain_rate["warmup"] is None and plain_rate["ramp_note"] is None
    inside = parse_settings(["--mode", "bench", "--warmup-steps", "80", "--lr-warmup-steps", "80"])
    assert learning.learning_rate(inside, 1)["ramp_note"] is None, "a ramp that ends with the warm-up spills nothing"


def test_a_ramp_the_captured_step_would_freeze_exits_2_in_one_line(tmp_path):
    """--cuda-graph captures the rate of its capture: a ramp that outlasts the eager warm-up is refused."""
    flags = ["--mode", "bench", "--gpu-input", "--cuda-graph", "--warmup-steps", "20", "--lr-warmup-steps"]
    proc = run_train([*flags, "20"], tmp_path / "offline", timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "--lr-warmup-steps < --warmup-steps (20)" in lines[0], (
        proc.stderr
    )
    assert not (tmp_path / "offline").exists()
    assert parse_settings([*flags, "19"]).lr_warmup_steps == 19


def test_a_real_run_ramps_its_rate(learning_runs):
    """A CPU bench run with --lr-warmup-steps 5 after 1 warm-up step: run.json records the ramp, its full rate,
    and the 4 ramp steps that fell inside the timed window; stderr warns of them in one line."""
    _, runs = learning_runs
    record, proc = runs["0.1"]["record"], runs["0.1"]["proc"]
    assert record["settings"]["lr_warmup_steps"] == 5
    assert record["learning_rate"]["ramp_steps_after_warm_up"] == 4 and record["learning_rate"]["effective_lr"] == 0.025
    warnings = [line for line in proc.stderr.splitlines() if "--lr-warmup-steps fall after" in line]
    assert warnings == [f"train.py: warning: {record['learning_rate']['ramp_note']}"], proc.stderr[-3000:]


def test_compare_reads_no_ramp_as_the_older_runs_absent_setting():
    """lr_warmup_steps 0 and a run recorded before the flag existed are one group, not two."""
    old, new = rec("a", 1, 1.0), rec("b", 2, 1.0)
    new["settings"]["lr_warmup_steps"] = 0
    assert comparison.setting(old, "lr_warmup_steps") is None and comparison.setting(new, "lr_warmup_steps") is None
    ramped_rec = rec("c", 3, 1.0)
    ramped_rec["settings"]["lr_warmup_steps"] = 50
    assert comparison.setting(ramped_rec, "lr_warmup_steps") == 50
    groups = [[ramped_rec], [old, new]]
    assert comparison.baseline_groups("lr_warmup_steps=0", groups) == [1], "0 names the runs without a ramp"
    assert comparison.baseline_groups("lr_warmup_steps=off", groups) == [1]
    assert comparison.baseline_groups("lr_warmup_steps=50", groups) == [0]


class _Record(dict):
    def log_steps(self, name, values):
        self[name] = values


@pytest.mark.parametrize("data,noted", [("synthetic", True), ("learnable", False), ("cifar10", False)])
def test_the_loss_line_says_when_the_labels_are_noise(data, noted):
    """--data synthetic draws random labels: its loss cannot fall, and the bench line says so instead of
    letting a rising loss read as divergence."""
    results = {
        "window_losses": [2.3, 2.4],
        "loss_first": 2.3,
        "loss_final": 2.4,
        "loss_final_steps": 1,
        "loss_diverged_step": None,
    }
    line = learning.log_losses(_Record(settings={"data": data}), results)
    assert ("random labels" in line) == noted, line
