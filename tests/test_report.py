"""steplens report: what make run prints at the end, from fabricated offline run folders."""

import json

from steplens.project import report


def make_run(root, uuid, created_at, status, settings, outputs=None, run_json=None):
    base = root / "runs" / uuid
    (base / "outputs").mkdir(parents=True)
    (base / "run.plx.json").write_text(
        json.dumps(
            {
                "name": f"{settings['mode']}-{uuid}",
                "status": status,
                "created_at": created_at,
                "inputs": settings,
                "outputs": outputs or {},
            }
        )
    )
    if run_json is not None:
        (base / "outputs" / "run.json").write_text(json.dumps({"settings": settings, **run_json}))
    return base


def fabricated(root):
    make_run(
        root,
        "b" * 32,
        "2026-12-02T10:01:00+00:00",
        "succeeded",
        {"mode": "bench", "workers": 4},
        {"samples_per_sec": 42.5},
        {
            "device": "cpu",
            "results": {
                "samples_per_sec": 42.5,
                "window_steps": 5,
                "window_seconds": 1.0,
                "input": {
                    "verdict": "the 4 workers make a batch every 9.1 ms; the step asks every 8.7 ms: "
                    "the workers are the limit",
                    "cpu": {"cpu_sentence": "3.96 of the budget's 4 CPUs used: CPU-bound"},
                },
            },
        },
    )
    p = make_run(
        root,
        "p" * 32,
        "2026-12-02T10:00:00+00:00",
        "succeeded",
        {"mode": "profile", "workers": 0},
        {"profiled_step_ms": 812.5},
        {
            "device": "cpu",
            "results": {
                "gpu_tracks": False,
                "evidence": {
                    "gpu_idle_share": None,
                    "unprofiled_step_ms": 401.0,
                    "profiler_distortion": 2.026,
                    "distortion_sentence": "profiled steps take 2.03x the unprofiled ones: loading runs in ...",
                },
                "cycles": [],
            },
        },
    )
    trace = p / "outputs" / "traces" / "t.pt.trace.json.gz"
    trace.parent.mkdir()
    trace.write_bytes(b"")
    record = json.loads((p / "outputs" / "run.json").read_text())
    record["results"]["cycles"] = [{"trace": f"/elsewhere/runs/{'p' * 32}/outputs/traces/t.pt.trace.json.gz"}]
    (p / "outputs" / "run.json").write_text(json.dumps(record))
    make_run(
        root,
        "f" * 32,
        "2026-12-02T10:02:00+00:00",
        "failed",
        {"mode": "bench", "workers": 0},
        {},
        {"error": "UserError: boom"},
    )
    make_run(root, "r" * 32, "2026-12-02T10:03:00+00:00", "running", {"mode": "bench", "workers": 0})


def test_report_shows_rates_evidence_traces_and_failures(tmp_path):
    fabricated(tmp_path)
    text = report.report(report.load_runs(str(tmp_path)))
    assert "42.5" in text
    assert "n/a (CPU-only trace)" in text and "812.5" in text
    row = next(line for line in text.splitlines() if line.startswith("pppppppp"))
    assert row.split()[3] == "full" and row.split()[-3:] == ["812.5", "401.0", "2.03x"]
    assert "  pppppppp: profiled steps take 2.03x the unprofiled ones" in text
    assert str(tmp_path / "runs" / ("p" * 32) / "outputs" / "traces" / "t.pt.trace.json.gz") in text
    assert "/elsewhere" not in text, "a trace recorded on another machine is looked up under the root"
    assert "[failed] UserError: boom" in text and "[running] no run.json" in text
    assert text.index("ffffffff") < text.index("rrrrrrrr"), "rows follow the creation order"
    answer = text.split("\n\n")[0]
    assert "bench bbbbbbbb --workers 4 on cpu: input: the 4 workers make a batch every 9.1 ms" in answer, answer
    assert "the workers are the limit; 3.96 of the budget's 4 CPUs used: CPU-bound" in answer
    assert "ffffffff" not in answer, "a failed run's window says nothing of its workers"


def test_report_since_and_missing_runs(tmp_path, capsys):
    fabricated(tmp_path)
    assert report.main([str(tmp_path), "--since", "2026-12-02T10:02:30+00:00"]) == 0
    out = capsys.readouterr().out
    assert "rrrrrrrr" in out and "bbbbbbbb" not in out
    assert report.main([str(tmp_path), "0" * 32]) == 0
    assert "00000000" in capsys.readouterr().out
    assert report.main([str(tmp_path / "nothing")]) == 1


def test_report_shows_the_gpu_bound_share_of_graphed_runs(tmp_path):
    """A --cuda-graph bench run's GPU-bound share is in its row (and an older run's, under its old name)."""
    make_run(
        tmp_path,
        "g" * 32,
        "2026-12-02T10:01:00+00:00",
        "succeeded",
        {"mode": "bench", "workers": 0},
        {"samples_per_sec": 51700.0},
        {"results": {"samples_per_sec": 51700.0, "gpu_bound_share": 0.999}},
    )
    make_run(
        tmp_path,
        "o" * 32,
        "2026-12-02T10:02:00+00:00",
        "succeeded",
        {"mode": "bench", "workers": 0},
        {"samples_per_sec": 18400.0},
        {"results": {"samples_per_sec": 18400.0, "share_of_gpu_limit": 1.0}},
    )
    text = report.report(report.load_runs(str(tmp_path)))
    assert "GPU-bound share 99.9%" in text and "GPU-bound share 100.0%" in text


def test_a_lean_profile_whose_cycles_were_all_refilled_says_why_its_idle_figures_are_absent(tmp_path):
    settings = {"mode": "profile", "workers": 4, "profile_detail": "lean"}
    make_run(
        tmp_path,
        "l" * 32,
        "2026-12-02T10:01:00+00:00",
        "succeeded",
        settings,
        {
            "profiled_step_ms": 15.7,
            "unprofiled_step_ms": 9.9,
            "profiler_distortion": 1.58,
            "profiler_distortion_se": 0.16,
        },
        {
            "device": "cuda",
            "environment": {"gpu": "NVIDIA H200"},
            "results": {
                "gpu_tracks": True,
                "evidence": {
                    "gpu_idle_share": None,
                    "input_gap_share": None,
                    "null_reasons": {"input_wait": "every cycle ..."},
                },
                "cycles": [],
            },
        },
    )
    row = next(
        line for line in report.report(report.load_runs(str(tmp_path))).splitlines() if line.startswith("llllllll")
    )
    assert "lean" in row.split() and row.count("n/a (refilled queues)") == 2 and row.endswith("1.58x +/- 0.16")


def test_a_zero_warm_up_ramp_is_not_shown_as_a_flag():
    """--lr-warmup-steps 0 is no ramp (runs that predate the setting read as 0): the label leaves it out,
    as it leaves out every setting that is off; a real ramp is shown."""
    assert "--lr-warmup-steps" not in report.configuration({"workers": 4, "lr_warmup_steps": 0})
    assert "--lr-warmup-steps 80" in report.configuration({"workers": 4, "lr_warmup_steps": 80})
    assert report.configuration({"workers": 4, "amp": "off", "fused_sgd": False}) == "--workers 4"


def test_a_short_id_as_the_report_prints_it_selects_its_run(tmp_path):
    """The report prints 8-character ids; given back, such a unique prefix picks the run it names."""
    fabricated(tmp_path)
    runs = report.load_runs(str(tmp_path), ["bbbbbbbb"])
    assert [r["uuid"] for r in runs] == ["b" * 32] and runs[0]["plx"]["status"] == "succeeded"
    missing = report.load_runs(str(tmp_path), ["0123abcd"])
    assert missing[0]["plx"]["status"] == "no run.plx.json", "an id that matches nothing is said to be missing"


def test_a_batch_size_other_than_the_default_tells_rows_apart():
    assert report.configuration({"workers": 4, "batch_size": 128}) == "--workers 4"
    assert report.configuration({"workers": 4, "batch_size": 512}) == "--workers 4 --batch-size 512"
