"""The answer at a glance: the verdict sentence, and the picture of each profiled cycle."""

import glob
import json
import os
import struct
import sys

import pytest
from conftest import ROOT

from steplens.evidence import attribution, cycle_evidence, diagnosis, formatting, picture, summarize
from steplens.project import compare, ranks
from steplens.scopes import NEXT_BATCH, SCOPES

sys.path.insert(0, os.path.join(ROOT, "scripts"))
from steplens.project import report


def stored_trace(**want):
    """The smallest trace of the stored H200 profile runs whose settings match want (either cycle: some stored runs
    keep only one)."""
    found = []
    for path in glob.glob(os.path.join(ROOT, "results", "**", "outputs", "run.json"), recursive=True):
        with open(path) as f:
            run = json.load(f)
        s = run.get("settings") or {}
        if run.get("mode") == "profile" and all(s.get(k) == v for k, v in want.items()):
            found += glob.glob(os.path.join(os.path.dirname(path), "traces", "trace-cycle*.pt.trace.json*"))
    if not found:
        pytest.fail(f"no stored profile run with {want} under results/")
    return min(found, key=os.path.getsize)


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def test_workers0_gpu_trace_is_held_by_waiting_for_input():
    """An H200 trace at workers=0: the GPU sits idle while input/next_batch runs for most of the step."""
    ev = summarize.summarize_file(stored_trace(workers=0, cuda_graph=False))
    v, w = ev["verdict"], ev["window"]
    assert v["stage"] == "waiting for input", v["sentence"]
    assert v["share"] == pytest.approx(w["input_gap_us"] / w["pace_us"]), "the share is the input gap over the step"
    assert v["share"] > 0.5 and f"{100 * v['share']:.0f}%" in v["sentence"]
    assert "workers" in v["next"]


def test_best_set_trace_is_held_by_gpu_compute():
    """The best option set (CUDA graphs, bf16): the GPU is busy for most of its own timeline."""
    ev = summarize.summarize_file(stored_trace(cuda_graph=True, amp="bf16"))
    v, w = ev["verdict"], ev["window"]
    assert v["stage"] == "GPU compute", v["sentence"]
    assert v["share"] == pytest.approx(w["gpu_busy_us"] / w["pace_us"])
    assert diagnosis.GPU_BOUND_AT <= v["share"] <= 1.0


def test_the_parts_a_verdict_weighs_add_up_to_the_step():
    """Busy time plus the GPU's waits (per scope) plus its idle with work queued is the whole step."""
    for want in ({"workers": 0, "cuda_graph": False}, {"cuda_graph": True, "amp": "bf16"}):
        ev = summarize.summarize_file(stored_trace(**want))
        for part in ev["steps"] + [ev["window"]]:
            if part.get("gpu_busy_us") is None:
                continue
            waits = sum(part["waits_by_scope_us"].values())
            assert waits == pytest.approx(part["host_wait_us"], abs=0.05)
            queued = part["gpu_idle_us"] - part["host_wait_us"]
            assert queued >= -0.05, "the GPU cannot wait for the host longer than it idles"
            assert part["gpu_busy_us"] + waits + queued == pytest.approx(part["pace_us"], abs=0.05)


def figures(scopes=SCOPES, **over):
    waits = {
        NEXT_BATCH: 150.0,
        "input/to_device": 0.0,
        "train/forward_backward": 40.0,
        "train/optimizer": 10.0,
        attribution.OUTSIDE_SCOPES: 0.0,
    }
    waits.update(over.pop("waits", {}))
    part = {
        "steps": 3,
        "wall_us": 300.0,
        "pace_us": 300.0,
        "gpu_busy_us": 60.0,
        "gpu_idle_us": 240.0,
        "host_wait_us": 200.0,
        "gpu_null_reason": None,
        "input_gap_us": waits[NEXT_BATCH],
        "scopes_cpu_us": {n: 75.0 if n in scopes else None for n in SCOPES},
        "waits_by_scope_us": waits,
    }
    part.update(over)
    return {
        "has_gpu": True,
        "window": part,
        "scopes_present": list(scopes),
        "input_source": {"name": NEXT_BATCH, "kind": "scope", "null_reason": None},
    }


def test_a_verdict_is_never_given_where_its_figure_is_null():
    """No GPU idle figure (the reason given), no step, or a trace without the scopes or delays: no stage named."""
    v = diagnosis.verdict(figures(gpu_idle_us=None, gpu_null_reason="no GPU work was launched inside the window"))
    assert v["stage"] is None and v["share"] is None
    assert v["sentence"].startswith("Cannot tell") and "no GPU work was launched" in v["sentence"]
    v = diagnosis.verdict(figures(steps=0))
    assert v["stage"] is None and v["sentence"].startswith("Too short")
    ev = figures(scopes=(), input_gap_us=None, host_wait_us=200.0)
    ev["input_source"] = {"name": None, "kind": None, "null_reason": attribution.NO_INPUT}
    v = diagnosis.verdict(ev)
    assert v["stage"] is None and "labels none of the step" in v["sentence"] and attribution.NO_INPUT in v["sentence"]
    v = diagnosis.verdict(figures())
    assert v["stage"] == "waiting for input" and v["share"] == pytest.approx(0.5)


def test_a_close_runner_up_is_named_and_a_busy_gpu_wins_from_half_the_step():
    v = diagnosis.verdict(
        figures(waits={NEXT_BATCH: 100.0, "train/forward_backward": 90.0, "train/optimizer": 0.0}, host_wait_us=190.0)
    )
    assert v["stage"] == "waiting for input" and v["runner_up"]["stage"] == "host-side launch overhead"
    assert "closely followed by host-side launch overhead" in v["sentence"]
    v = diagnosis.verdict(
        figures(
            gpu_busy_us=150.0,
            gpu_idle_us=150.0,
            host_wait_us=150.0,
            waits={NEXT_BATCH: 150.0, "train/forward_backward": 0.0, "train/optimizer": 0.0},
        )
    )
    assert v["stage"] == "GPU compute" and v["share"] == pytest.approx(0.5)


def test_summarize_and_its_table_open_with_the_verdict(capsys):
    trace = stored_trace(workers=0, cuda_graph=False)
    assert summarize.main([trace, "--full"]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("verdict: The GPU idles for ") and "waiting for input is its largest wait" in first
    share_line = next(line for line in out.splitlines() if line.startswith("input gap ms"))
    ev = summarize.summarize_file(trace)
    assert f"{ev['window']['input_gap_us'] / ev['window']['pace_us']:.1%}" in share_line


def test_the_drawn_lanes_are_summarize_figures(tmp_path):
    """Each drawn GPU lane adds up to the step's basis span and each CPU lane is the step's wall time."""
    for want in ({"workers": 0, "cuda_graph": False}, {"cuda_graph": True, "amp": "bf16"}):
        ev = summarize.summarize_file(stored_trace(**want), lanes=True)
        rows = picture.draw(ev, str(tmp_path / "p.png"), "test")
        png_size(tmp_path / "p.png")
        for row, step in zip(rows, ev["steps"]):
            assert row["cpu_ms"] == pytest.approx(step["wall_us"] / 1e3)
            assert all(0 <= a and a + w <= row["cpu_ms"] + 1e-6 for _, a, w in row["cpu"])
            if step.get("gpu_busy_us") is None:
                assert row["gpu_ms"] is None
                continue
            assert row["gpu_ms"] == pytest.approx(step["pace_us"] / 1e3)
            drawn = {
                k: sum(w for kind, _, w in row["gpu"] if kind == k)
                for k in ("busy", "input gap", "waiting for the host", "other idle")
            }
            assert sum(drawn.values()) == pytest.approx(row["gpu_ms"], abs=1e-4)
            assert drawn["busy"] == pytest.approx(step["gpu_busy_us"] / 1e3, abs=1e-4)
            assert drawn["input gap"] == pytest.approx(step["input_gap_us"] / 1e3, abs=1e-4)
            host = step["host_wait_us"] - step["input_gap_us"]
            assert drawn["waiting for the host"] == pytest.approx(host / 1e3, abs=1e-4)


def test_without_matplotlib_no_picture_is_drawn_and_the_reason_is_given(tmp_path, monkeypatch):
    ev = summarize.summarize_file(stored_trace(cuda_graph=True, amp="bf16"), lanes=True)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    cycle = {"cycle": 1, "profiler_steps": [2, 4], "trace": str(tmp_path / "trace-cycle1-steps2-4.pt.trace.json.gz")}
    path, why = cycle_evidence.draw_cycle(cycle, ev)
    assert path is None and why == picture.NO_MATPLOTLIB
    assert not os.listdir(tmp_path), "nothing is left behind"


def test_a_cpu_profile_run_draws_and_logs_one_picture_per_cycle(profile_run):
    """The CPU run: verdict in run.json, the evidence text and the log; one PNG per cycle under outputs/,
    logged as Polyaxon images (the offline run's events/image and assets/image)."""
    with open(os.path.join(profile_run["outputs"], "run.json")) as f:
        run = json.load(f)
    v = run["results"]["evidence"]["verdict"]
    assert v["stage"].startswith("CPU compute") or v["stage"] == "waiting for input", v
    assert f"profile: verdict: {v['sentence']}" in profile_run["proc"].stderr
    cycles = run["results"]["cycles"]
    assert len(cycles) == 2
    base = os.path.join(str(profile_run["root"]), "runs", profile_run["uuid"])
    for c in cycles:
        assert c["picture"].startswith(profile_run["outputs"]) and png_size(c["picture"])[0] > 500
        with open(c["evidence_txt"]) as f:
            assert f.readline().startswith("verdict: ")
        name = f"steps-cycle{c['cycle']}"
        assert os.path.exists(os.path.join(base, "events", "image", f"{name}.plx"))
        assert glob.glob(os.path.join(base, "assets", "image", f"{name}*.png"))
    with open(os.path.join(base, "run.plx.json")) as f:
        assert json.load(f)["outputs"]["verdict"] == v["sentence"]


def test_the_end_report_leads_with_the_verdicts_and_the_workers_ratio(tmp_path):
    def make(uuid, settings, run_json, outputs=None):
        b = tmp_path / "runs" / uuid
        (b / "outputs").mkdir(parents=True)
        (b / "run.plx.json").write_text(
            json.dumps(
                {
                    "status": "succeeded",
                    "inputs": settings,
                    "created_at": "2026-12-03T10:00:00+00:00",
                    "outputs": outputs or {},
                }
            )
        )
        (b / "outputs" / "run.json").write_text(json.dumps({"settings": settings, **run_json}))

    said = "Waiting for input holds the step: ..."
    make(
        "p" * 32,
        {"mode": "profile", "workers": 0},
        {
            "device": "cpu",
            "results": {
                "evidence": {"verdict": {"sentence": said}, "input_cpu_share": 0.014, "headline_cycles": [1, 2]},
                "cycles": [{"picture": "/nowhere/outputs/traces/picture-cycle1.png"}],
            },
        },
    )
    for uuid, w, rate in (("a" * 32, 0, 100.0), ("b" * 32, 4, 91.0)):
        make(
            uuid,
            {"mode": "bench", "workers": w},
            {"device": "cpu", "cpu_budget": {"cpus": 2}, "results": {"samples_per_sec": rate}},
        )
    out = report.report(report.load_runs(str(tmp_path)))
    lines = out.splitlines()
    assert lines[0] == "the answer"
    assert said in lines[1]
    ratio = next(line for line in lines if "workers=4 ran at" in line)
    assert "0.91x" in ratio and "first look" in ratio and "2 CPUs, fewer than 4 workers" in ratio
    assert "spent 1% of its time fetching input" in ratio, "the workers=0 profile says how much workers can save"
    assert "(cycles 1 and 2)" in lines[1]
    assert "picture-cycle1.png" in out
    assert "per GPU" not in out


def test_compare_names_each_group_s_verdict_and_links_its_step_pictures(tmp_path):
    """steplens compare's evidence section: the matching profile run's verdict and its pictures, found under the
    offline run's own folder when run.json recorded them on another machine."""

    env = {"hostname": "h", "gpu": "NVIDIA H200", "driver": "1", "torch": "2.11", "cuda": "13"}

    def make(uuid, minute, settings, outputs, results):
        b = tmp_path / "runs" / uuid
        (b / "outputs" / "traces").mkdir(parents=True)
        (b / "run.plx.json").write_text(
            json.dumps(
                {
                    "name": uuid,
                    "status": "succeeded",
                    "inputs": settings,
                    "created_at": f"2026-12-03T10:{minute:02d}:00+00:00",
                    "outputs": outputs,
                }
            )
        )
        (b / "outputs" / "run.json").write_text(
            json.dumps({"settings": settings, "environment": env, "cpu_budget": {"cpus": 4}, "results": results})
        )
        return b

    minute = 0
    for repeat in range(1, 4):
        for w, rate in ((0, 3000.0 + repeat), (4, 10000.0 + repeat)):
            minute += 1
            make(
                f"b{w}{repeat}" + "0" * 29,
                minute,
                {"mode": "bench", "workers": w, "repeat": repeat},
                {"samples_per_sec": rate},
                {"samples_per_sec": rate},
            )
    said = "Waiting for input holds the step: the GPU sits idle while input/next_batch runs for 84% of the step."
    uuid = "p" * 32
    recorded = f"/elsewhere/runs/{uuid}/outputs/traces/picture-cycle1-steps2-4.png"
    b = make(
        uuid,
        30,
        {"mode": "profile", "workers": 0},
        {"profiled_step_ms": 130.0, "verdict": said},
        {"cycles": [{"picture": recorded}]},
    )
    (b / "outputs" / "traces" / "picture-cycle1-steps2-4.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    out = tmp_path / "cmp"
    assert compare.main(["--offline", str(tmp_path), "--out", str(out)]) == 0
    text = (out / "comparison.md").read_text()
    line = next(x for x in text.splitlines() if x.startswith("- workers=0:"))
    assert said in line
    linked = os.path.join(str(b), "outputs", "traces", "picture-cycle1-steps2-4.png")
    assert f"]({os.path.relpath(linked, str(out))})" in line, "links open from comparison.md's own folder"


def test_a_cpu_bench_never_speaks_of_a_gpu_rate(bench_run):
    out = bench_run["proc"].stdout + bench_run["proc"].stderr
    assert "TFLOP/s on the CPU" in out and "per GPU" not in out, out


def test_a_ddp_profile_draws_every_rank_in_one_picture_per_cycle(ddp_profile):
    """Rank 0 draws one lane pair per rank and step, saves it under outputs/traces and logs it as an image."""
    with open(os.path.join(ddp_profile["outputs"], "run.json")) as f:
        run = json.load(f)
    pictures = run["results"]["across_ranks"]["pictures"]
    assert [os.path.basename(p) for p in pictures] == ["picture-ranks-cycle1.png", "picture-ranks-cycle2.png"]
    base = os.path.join(str(ddp_profile["root"]), "runs", ddp_profile["uuid"])
    for k, path in enumerate(pictures, start=1):
        assert path.startswith(ddp_profile["outputs"]) and png_size(path)[1] > 600, "two ranks: a taller picture"
        assert os.path.exists(os.path.join(base, "events", "image", f"steps-ranks-cycle{k}.plx"))


def test_rank_figures_carry_the_rows_each_rank_draws(tmp_path):
    """The rows a rank sends to rank 0 are stepview's rows of its own traces, one entry per cycle."""
    trace = stored_trace(cuda_graph=True, amp="bf16")
    fig = ranks.rank_figures([trace], rank=0)
    assert len(fig["drawn"]) == 1 and fig["drawn"][0]["has_gpu"]
    ev = summarize.summarize_file(trace, lanes=True)
    rows = fig["drawn"][0]["rows"]
    assert [r["step"] for r in rows] == [s["step"] for s in ev["steps"]] and len(rows) == 3
    assert sum(s["pace_us"] is not None for s in ev["steps"]) >= 2, "the GPU lanes are checked on two steps or more"
    for r, s in zip(rows, ev["steps"]):  # worked out from the step's own figures, not from picture.lanes_of
        assert r["cpu_ms"] == pytest.approx(s["wall_us"] / 1e3)
        assert [n for n, _, _ in r["cpu"]] == [n for n, _, _ in s["lanes"]["cpu"]]
        assert [length for _, _, length in r["cpu"]] == pytest.approx([(b - a) / 1e3 for _, a, b in s["lanes"]["cpu"]])
        assert all(0 <= start <= r["cpu_ms"] for _, start, _ in r["cpu"])
        if s["pace_us"] is None:  # a step whose GPU slot is open: no GPU lane
            assert r["gpu_ms"] is None and r["gpu"] == []
            continue
        assert r["gpu_ms"] == pytest.approx(s["pace_us"] / 1e3)
        ends = [start + length for _, start, length in r["gpu"]]
        assert r["gpu"][0][1] == 0 and [start for _, start, _ in r["gpu"][1:]] == pytest.approx(ends[:-1])
        assert ends[-1] == pytest.approx(r["gpu_ms"]), "the GPU lane fills the step's GPU pace"
        assert sum(n for k, _, n in r["gpu"] if k == "busy") == pytest.approx(s["gpu_busy_us"] / 1e3)
    picture.draw_groups(
        [("rank 0 ", fig["drawn"][0]["rows"]), ("rank 1 ", fig["drawn"][0]["rows"])],
        str(tmp_path / "r.png"),
        "two ranks",
        "said",
        True,
        True,
    )
    one = tmp_path / "one.png"
    picture.draw_groups([("rank 0 ", fig["drawn"][0]["rows"])], str(one), "one rank", "said", True, True)
    assert png_size(tmp_path / "r.png")[1] > png_size(one)[1], "a lane pair per rank and step"


def own_loop_trace(tmp_path, workers=0, loader=True, delay_s=0.1):
    """A trace of a reader's own training loop: no four scopes, the profiler's schedule, a small model."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 10_000

        def __getitem__(self, i):
            time.sleep(delay_s)  # a slow transform
            return torch.randn(8), i % 2

    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = iter(torch.utils.data.DataLoader(Slow(), batch_size=2, num_workers=workers)) if loader else None
    path = str(tmp_path / f"own-{workers}-{loader}.pt.trace.json")
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=3),
        on_trace_ready=lambda p: p.export_chrome_trace(path),
    ) as prof:
        for _ in range(5):
            x, y = next(batches) if loader else (torch.randn(2, 8), torch.tensor([0, 1]))
            if not loader:
                time.sleep(2 * delay_s)  # work that is no input
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    return path


def test_a_loop_without_the_scopes_reads_its_input_from_the_dataloader_annotation(tmp_path):
    """A slow single-process loader in the reader's own loop: the input comes out high, from the DataLoader's
    own annotation, and the output says so; absent scopes read n/a, never 0."""
    ev = summarize.summarize_file(own_loop_trace(tmp_path))
    assert ev["input_source"]["kind"] == "DataLoader annotation" and ev["scopes_present"] == []
    w = ev["window"]
    assert w["input_cpu_us"] / w["wall_us"] > 0.5, "two 100 ms items a step dominate a tiny model's step"
    assert all(v is None for v in w["scopes_cpu_us"].values()), "an absent scope is null, never 0"
    assert ev["verdict"]["stage"] == "waiting for input" and "DataLoader" in ev["verdict"]["sentence"]
    text = formatting.format_table([ev])
    assert "input read from enumerate(DataLoader)#" in text
    assert next(line for line in text.splitlines() if line.startswith("cpu input/next_batch ms")).split()[-1] == "n/a"


def test_a_multiprocess_loader_is_found_too(tmp_path):
    ev = summarize.summarize_file(own_loop_trace(tmp_path, workers=1, delay_s=0.002))
    assert ev["input_source"]["kind"] == "DataLoader annotation" and ev["window"]["input_cpu_us"] is not None


def test_a_loop_without_a_dataloader_gets_null_input_figures_with_the_reason(tmp_path):
    path = own_loop_trace(tmp_path, loader=False)
    ev = summarize.summarize_file(path)
    assert ev["input_source"]["null_reason"] == attribution.NO_INPUT
    assert ev["window"]["input_cpu_us"] is None and ev["verdict"]["stage"] is None
    assert "cannot be told" in ev["verdict"]["sentence"]
    named = summarize.summarize_file(path, input_scope="no such scope")
    assert "no user annotation named 'no such scope'" in named["input_source"]["null_reason"]


def test_a_wait_the_profiler_may_have_made_gives_no_stage():
    """workers=4 as on the H200: in the profiled steps the launch wait is the largest, but the GPU's busy time
    would fill over half the unprofiled step, so the stage is withheld and both readings said. Where the
    slow-down's interval holds 1, the verdict stands."""
    ev = figures(
        gpu_busy_us=3 * 6920.0,
        pace_us=3 * 20000.0,
        wall_us=3 * 20000.0,
        gpu_idle_us=3 * 13080.0,
        host_wait_us=3 * 11000.0,
        waits={NEXT_BATCH: 300.0, "train/forward_backward": 3 * 9000.0, "train/optimizer": 0.0},
    )
    v = diagnosis.verdict(ev)
    assert v["stage"] == "host-side launch overhead"
    head = {
        "profiler_distortion": 1.80,
        "profiler_distortion_se": 0.18,
        "profiler_distortion_df": 15,
        "unprofiled_step_ms": 11.30,
    }
    out = cycle_evidence.profiler_caveat(dict(v), [ev["window"]], head)
    assert out["stage"] is None and out["profiled_stage"] == "host-side launch overhead"
    assert out["unprofiled_busy_share"] == pytest.approx(6.92 / 11.30)
    assert out["sentence"].startswith("Uncertain") and "61%" in out["sentence"]
    unsure = cycle_evidence.profiler_caveat(dict(v), [ev["window"]], {**head, "profiler_distortion_se": 0.5})
    assert unsure["stage"] == "host-side launch overhead", "an interval holding 1 changes nothing"
    slow_gpu = cycle_evidence.profiler_caveat(dict(v), [ev["window"]], {**head, "unprofiled_step_ms": 16.0})
    assert slow_gpu["stage"] == "host-side launch overhead" and "1.80x" in slow_gpu["sentence"]


def test_the_end_report_compares_medians_when_settings_were_repeated(tmp_path):
    for i, (w, rate) in enumerate([(0, 100.0), (4, 150.0), (0, 120.0), (4, 90.0), (0, 80.0), (4, 200.0)]):
        b = tmp_path / "runs" / f"{i}{'r' * 31}"
        (b / "outputs").mkdir(parents=True)
        (b / "run.plx.json").write_text(
            json.dumps(
                {
                    "status": "succeeded",
                    "created_at": f"2026-12-03T10:0{i}:00",
                    "inputs": {"mode": "bench", "workers": w, "repeat": i // 2},
                }
            )
        )
        (b / "outputs" / "run.json").write_text(
            json.dumps(
                {
                    "settings": {"mode": "bench", "workers": w, "repeat": i // 2},
                    "device": "cpu",
                    "results": {"samples_per_sec": rate},
                }
            )
        )
    out = report.report(report.load_runs(str(tmp_path)))
    line = next(x for x in out.splitlines() if "workers=4 ran at" in x)
    assert "1.50x" in line and "medians of 3 and 3 jobs" in line and "paired test" in line


def test_the_next_step_of_a_gpu_bound_run_names_only_the_options_not_yet_on():
    v = diagnosis.verdict(
        figures(
            gpu_busy_us=270.0,
            gpu_idle_us=30.0,
            host_wait_us=0.0,
            waits={NEXT_BATCH: 0.0, "train/forward_backward": 0.0, "train/optimizer": 0.0},
        )
    )
    assert v["stage"] == "GPU compute"
    best = cycle_evidence.tailor_next(v, {"amp": "bf16", "channels_last": True, "compile": "default"})
    assert "(a larger --batch-size)" in best["sentence"] and "--amp" not in best["sentence"]
    plain = cycle_evidence.tailor_next(v, {"amp": "off", "channels_last": False, "compile": "off"})
    assert "--amp bf16, --channels-last, --compile default, a larger --batch-size" in plain["next"]
    # --compile alone, whose convolutions the kernels show in NHWC (Inductor lays them out itself): the advice
    # names neither what the flags have on nor what the kernels show, and agrees with the "Left out" sentence
    shown = {**v, "applied": ["channels_last", "compile"]}
    shown["sentence"] += " Left out: channels-last and torch.compile, which the kernels show applied (...)."
    compiled = cycle_evidence.tailor_next(shown, {"amp": "off", "channels_last": False, "compile": "default"})
    assert "(--amp bf16, a larger --batch-size)" in compiled["sentence"], compiled["sentence"]
    assert compiled["sentence"].endswith(
        "Left out: channels-last and torch.compile, which the kernels show applied (...)."
    )


def test_communication_kernels_are_no_gpu_compute():
    """A rank whose GPU spends the step in an all-reduce waiting for the others: communication, not compute."""
    cpu, gpu = {"pid": 1, "tid": 1}, {"pid": 0, "tid": 7}
    events = [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": 1000 * n, "dur": 1000, **cpu}
        for n in (1, 2)
    ]
    for n in (1, 2):
        t0 = 1000 * n
        events += [
            {"ph": "X", "cat": "user_annotation", "name": scope, "ts": t0 + a, "dur": d, **cpu}
            for scope, a, d in zip(SCOPES, (0, 10, 20, 900), (10, 10, 880, 90))
        ]
        events += [
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "ts": t0 + 21 + i,
                "dur": 1,
                "args": {"correlation": 10 * n + i},
                **cpu,
            }
            for i in range(2)
        ]
        events += [
            {
                "ph": "X",
                "cat": "kernel",
                "name": "void conv_kernel",
                "ts": t0 + 30,
                "dur": 200,
                "args": {"correlation": 10 * n, "stream": 7},
                **gpu,
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                "ts": t0 + 230,
                "dur": 700,
                "args": {"correlation": 10 * n + 1, "stream": 7},
                **gpu,
            },
        ]
    ev = summarize.summarize_events(events)
    w = ev["window"]
    assert w["gpu_comm_only_us"] == pytest.approx(1400) and w["gpu_busy_us"] == pytest.approx(1800)
    v = ev["verdict"]
    assert v["stage"] == "communication between ranks" and v["share"] == pytest.approx(0.7), v["sentence"]


def test_an_uncertain_verdict_says_so_in_the_run_description():
    from steplens.job import overview

    path = os.path.join(ROOT, "results", "h200-pictures", "workers4", "run.json")
    with open(path) as f:
        data = json.load(f)
    assert data["results"]["evidence"]["verdict"]["stage"] is None, "the stored workers=4 run is the uncertain one"
    description, readme = overview.succeeded(data, os.path.dirname(path))
    assert description.endswith("uncertain (host-side launch overhead only in the profiled steps)")
    assert "Uncertain: in the profiled steps" in readme


@pytest.mark.parametrize("runner_up_us,named", [(70.6, True), (69.4, False)])
def test_the_runner_up_window_is_ten_percent_of_the_step_on_either_side(runner_up_us, named):
    """Input waits 100 of a 300 us step (33.3%); a launch wait 0.6 us inside diagnosis.CLOSE (98 of 100 per mille
    behind) is named beside it, one 0.6 us outside (102 per mille behind) is not."""
    assert diagnosis.CLOSE == 0.10, "the window these cases sit on either side of"
    waits = {NEXT_BATCH: 100.0, "train/forward_backward": runner_up_us, "train/optimizer": 0.0}
    idle = 100.0 + runner_up_us  # every idle microsecond waits for the host: nothing is queued on the GPU
    v = diagnosis.verdict(figures(waits=waits, host_wait_us=idle, gpu_idle_us=idle, gpu_busy_us=300.0 - idle))
    assert v["stage"] == "waiting for input"
    assert (v["runner_up"] is not None) == named, v
    assert ("closely followed by" in v["sentence"]) == named, v["sentence"]


def test_advice_on_a_trace_of_another_loop_names_no_flag_of_train_py():
    """The four scopes mark the companion's own trace: only there does the advice name train.py's flags."""
    own = diagnosis.verdict(figures())
    assert own["stage"] == "waiting for input" and "--workers 4" in own["next"]
    other = figures(scopes=(), host_wait_us=150.0)
    other["input_source"] = {"name": "my/fetch", "kind": "--input-scope", "null_reason": None}
    with_loader = diagnosis.verdict({**other, "input_source": {**other["input_source"], "dataloader_in_trace": True}})
    assert with_loader["stage"] == "waiting for input" and "--" not in with_loader["next"]
    assert "num_workers" in with_loader["next"] and "-P " not in with_loader["sentence"]
    no_loader = diagnosis.verdict({**other, "input_source": {**other["input_source"], "dataloader_in_trace": False}})
    assert "DataLoader worker processes (num_workers)" not in no_loader["next"]
    assert no_loader["next"].startswith("prepare the next batch while the step runs") and "--" not in no_loader["next"]
    busy = diagnosis.verdict({**figures(scopes=(), gpu_busy_us=200.0, gpu_idle_us=100.0, host_wait_us=100.0)})
    assert busy["stage"] == "GPU compute" and "--" not in busy["next"] and "torch.compile" in busy["next"]


@pytest.mark.parametrize("input_us,named", [(135.3, True), (134.7, False)])
def test_a_cpu_only_trace_names_a_runner_up_within_ten_percent(input_us, named):
    """A CPU-only trace of another loop, a 300 us step: the rest of the step leads the input. The input is named
    beside it when at most 10% of the step (30 us) behind: 135.3 us is 29.4 us behind, 134.7 us 30.6 us."""
    ev = figures(scopes=())
    ev["has_gpu"] = False
    ev["window"].update(wall_us=300.0, input_cpu_us=input_us)
    ev["input_source"] = {"name": "my/fetch", "kind": "--input-scope", "null_reason": None}
    v = diagnosis.verdict(ev)
    assert v["part"] == attribution.OUTSIDE_SCOPES and v["share"] == pytest.approx((300.0 - input_us) / 300.0)
    assert (v["runner_up"] is not None) == named, v
    assert ("closely followed by the input (my/fetch)" in v["sentence"]) == named, v["sentence"]
    assert "--" not in v["next"]
