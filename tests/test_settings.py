"""train.py's settings in this process (no torch, no subprocess): the defaults, the help that states them, each
refusal on either side of its limit, and the checks made before heavy work (workers, places to write)."""

import argparse
import os
import re

import pytest

from steplens.errors import UserError
from steplens.job import checks, settings
from steplens.job.paths import DEFAULT_DATA_DIR

# The defaults of the settings this module declares, written out from the README's flag list
DEFAULTS = {
    "mode": "bench",
    "workers": 0,
    "batch_size": 128,
    "warmup_steps": 20,
    "bench_steps": 100,
    "data": "cifar10",
    "data_dir": DEFAULT_DATA_DIR,
    "device": "auto",
    "seed": 0,
    "lr": 0.1,
    "scale_lr": False,
    "lr_warmup_steps": 0,
    "momentum": 0.9,
    "weight_decay": 5e-4,
    "profile_detail": "full",
    "trace_format": "json.gz",
    "output_dir": None,
    "force_workers": False,
    "repeat": None,
}


def refused(argv, capsys):
    """The one line a refused argv prints, after checking the exit status is 2."""
    with pytest.raises(SystemExit) as e:
        settings.parse_settings(argv)
    assert e.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: error: ") and lines[0].endswith(" (see --help)")
    return lines[0]


def test_the_defaults():
    args = vars(settings.parse_settings(["--mode", "bench"]))
    assert {k: args[k] for k in DEFAULTS} == DEFAULTS


def test_every_flag_s_help_states_its_default_or_that_it_is_required():
    parser = settings.build_parser()
    for action in parser._actions:
        if action.dest in DEFAULTS:
            assert action.help.endswith(")") and ("(default: " in action.help or action.help.endswith("(required)"))
    said = {a.dest: a.help.rsplit("(default: ", 1)[-1].rstrip(")") for a in parser._actions if a.dest in DEFAULTS}
    for dest in ("workers", "batch_size", "warmup_steps", "bench_steps", "seed", "lr", "momentum"):
        assert said[dest] == f"{DEFAULTS[dest]:g}", dest
    assert float(said["weight_decay"]) == DEFAULTS["weight_decay"]
    for dest in ("data", "device", "profile_detail", "trace_format"):
        assert said[dest] == DEFAULTS[dest], dest
    assert parser.prog == "train.py" and parser.description.startswith("Profile a slow PyTorch training run")


@pytest.mark.parametrize(
    "flag,ok,bad,words",
    [
        ("--workers", "0", "-1", "argument --workers: must be >= 0, got -1"),
        ("--batch-size", "1", "0", "must be >= 1, got 0"),
        ("--bench-steps", "1", "0", "must be >= 1, got 0"),
        ("--warmup-steps", "0", "-1", "must be >= 0, got -1"),
        ("--seed", "0", "x", "argument --seed: invalid integer >= 0 value: 'x'"),
        ("--lr", "0", "x", "argument --lr: invalid number >= 0 value: 'x'"),
        ("--lr", "0", "-0.1", "must be >= 0, got -0.1"),
        ("--lr", "0.5", "inf", "must be >= 0, got inf"),
        ("--weight-decay", "0", "nan", "must be >= 0, got nan"),
        ("--momentum", "0.99", "1", "argument --momentum: must be < 1, got 1.0"),
        ("--repeat", "0", "-3", "must be >= 0, got -3"),
        ("--data", "learnable", "imagenet", "argument --data: invalid choice: 'imagenet'"),
        ("--mode", "profile", "weird", "argument --mode: invalid choice: 'weird'"),
    ],
)
def test_each_limit_is_refused_just_past_it_in_one_line(capsys, flag, ok, bad, words):
    base = ["--mode", "bench"] if flag != "--mode" else []
    assert settings.parse_settings([*base, flag, ok]) is not None
    line = refused([*base, flag, bad], capsys)
    assert words in line and flag in line, line


def test_the_type_names_the_rule_and_a_bad_value_is_an_argparse_error():
    convert = settings.number(int, lambda v: v % 2 == 0, "even")
    assert convert.__name__ == "integer even" and convert("4") == 4
    with pytest.raises(argparse.ArgumentTypeError, match="must be even, got 3"):
        convert("3")
    assert settings.number(float, lambda v: True, "any").__name__ == "number any"
    assert settings.non_negative_float("0") == 0.0 and settings.positive_int("1") == 1


def test_a_batch_larger_than_a_generated_set_is_refused_and_cifar10_is_not(capsys):
    assert settings.parse_settings(["--mode", "bench", "--data", "synthetic", "--batch-size", "50000"])
    line = refused(["--mode", "bench", "--data", "learnable", "--batch-size", "50001"], capsys)
    assert "argument --batch-size: 50001 is more than the learnable set's 50000 images" in line
    assert settings.parse_settings(["--mode", "bench", "--batch-size", "50001"]).batch_size == 50001


def test_a_cuda_graph_ramp_must_end_inside_the_warm_up(capsys):
    graph = ["--mode", "bench", "--cuda-graph", "--gpu-input", "--compile", "default"]
    assert settings.parse_settings([*graph, "--warmup-steps", "3", "--lr-warmup-steps", "2"])
    line = refused([*graph, "--warmup-steps", "3", "--lr-warmup-steps", "3"], capsys)
    assert "argument --lr-warmup-steps:" in line and "give --lr-warmup-steps < --warmup-steps (3), not 3" in line
    assert settings.parse_settings(["--mode", "bench", "--lr-warmup-steps", "50"]).lr_warmup_steps == 50


BUDGET = {"cpus": 2.0, "source": "affinity"}


def workers(n, force=False):
    return argparse.Namespace(workers=n, force_workers=force)


def test_workers_up_to_the_budget_are_quiet_above_it_said_and_past_4x_refused(capsys):
    assert checks.check_workers(workers(2), BUDGET) is None and capsys.readouterr().err == ""
    note = checks.check_workers(workers(3), BUDGET)
    assert note == (
        "--workers 3 is above the CPU budget (2 CPUs, affinity): the workers and the training thread will share CPUs"
    )
    assert capsys.readouterr().err == f"train.py: warning: {note}\n"
    assert checks.check_workers(workers(8), BUDGET) is not None, "4x the budget is allowed"
    with pytest.raises(UserError) as e:
        checks.check_workers(workers(9), BUDGET)
    assert str(e.value) == (
        "--workers 9 is more than 4x the CPU budget (2 CPUs, affinity): each worker is a process holding batches; "
        "use at most 8, or add --force-workers"
    )
    assert "above the CPU budget" in checks.check_workers(workers(9, force=True), BUDGET)


def test_the_bound_is_at_least_4_and_rounds_a_fraction_of_a_cpu_up():
    half = {"cpus": 0.5, "source": "cgroup"}
    assert checks.check_workers(workers(4), half) is not None
    with pytest.raises(UserError, match="use at most 4,"):
        checks.check_workers(workers(5), half)
    odd = {"cpus": 1.3, "source": "cgroup"}
    assert checks.check_workers(workers(6), odd)  # ceil(5.2) = 6
    with pytest.raises(UserError, match=r"\(1.3 CPUs, cgroup\): .* use at most 6,"):
        checks.check_workers(workers(7), odd)


def test_writable_dirs_makes_the_folders_and_probes_them_without_leaving_a_file(tmp_path):
    checks.writable_dirs([(str(tmp_path / "a" / "b"), "--output-dir"), (str(tmp_path), "--data-dir")])
    assert os.listdir(tmp_path / "a" / "b") == [] and sorted(os.listdir(tmp_path)) == ["a"]


def test_a_refused_place_names_its_flag_and_removes_every_folder_made(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError) as e:
        checks.writable_dirs([(str(tmp_path / "new" / "deep"), "--output-dir"), (str(tmp_path / "file"), "--data-dir")])
    assert str(e.value) == f"--data-dir {tmp_path / 'file'} is a file, not a folder"
    assert sorted(os.listdir(tmp_path)) == ["file"], "new/ and new/deep/ are removed again"
    with pytest.raises(UserError) as e:
        checks.writable_dirs([(str(tmp_path / "made"), "--output-dir"), (str(tmp_path / "file" / "sub"), "--x")])
    assert str(e.value).startswith(f"--x {tmp_path / 'file' / 'sub'} is not a writable folder (")
    assert sorted(os.listdir(tmp_path)) == ["file"]


def test_existing_part_is_the_nearest_folder_that_exists(tmp_path):
    assert checks.existing_part(str(tmp_path / "a" / "b" / "c")) == str(tmp_path)
    assert checks.existing_part(str(tmp_path)) == str(tmp_path)
    assert checks.existing_part("relative-missing-folder") == os.getcwd()


def places(monkeypatch, tmp_path, argv, managed=False):
    seen = []
    monkeypatch.setattr(checks, "writable_dirs", lambda p: seen.extend(p))
    monkeypatch.setenv("POLYAXON_OFFLINE_ROOT", str(tmp_path / "offline"))
    monkeypatch.delenv("POLYAXON_RUN_INSTANCE", raising=False)
    monkeypatch.setenv("POLYAXON_IS_MANAGED", "true" if managed else "false")
    checks.check_places(settings.parse_settings(["--mode", "bench", *argv]))
    return seen


def test_check_places_lists_each_place_the_run_writes(monkeypatch, tmp_path):
    seen = places(monkeypatch, tmp_path, ["--output-dir", str(tmp_path / "o"), "--data-dir", str(tmp_path / "d" / "e")])
    assert seen == [
        (str(tmp_path / "o"), "--output-dir"),
        (str(tmp_path), "--data-dir"),
        (str(tmp_path / "offline"), "POLYAXON_OFFLINE_ROOT"),
    ]
    assert places(monkeypatch, tmp_path, ["--data", "synthetic"], managed=True) == []
    monkeypatch.delenv("POLYAXON_OFFLINE_ROOT")
    monkeypatch.setenv("POLYAXON_IS_MANAGED", "false")
    monkeypatch.setattr(checks, "DEFAULT_OFFLINE_ROOT", str(tmp_path / "default"))
    seen = []
    monkeypatch.setattr(checks, "writable_dirs", lambda p: seen.extend(p))
    checks.check_places(settings.parse_settings(["--mode", "bench", "--data", "synthetic"]))
    assert seen == [(str(tmp_path / "default"), "POLYAXON_OFFLINE_ROOT")]


CHOICES = {
    "mode": ["profile", "bench"],
    "data": ["cifar10", "synthetic", "learnable"],
    "device": ["auto", "cuda", "cpu"],
    "trace_format": ["json.gz", "json"],
    "profile_detail": ["full", "lean"],
}


def test_each_choice_is_offered_and_taken_and_mode_is_required(capsys):
    offered = {a.dest: a.choices for a in settings.build_parser()._actions if a.dest in CHOICES}
    assert offered == CHOICES
    for dest, values in CHOICES.items():
        for value in values:
            argv = ["--mode", value] if dest == "mode" else ["--mode", "bench", f"--{dest.replace('_', '-')}", value]
            assert getattr(settings.parse_settings(argv), dest) == value
    assert "the following arguments are required: --mode" in refused([], capsys)


def test_the_other_modules_refusals_and_types_reach_the_parser(capsys):
    assert "--gpu-input" in refused(["--mode", "bench", "--gpu-input", "--workers", "3"], capsys)
    assert "need --ddp" in refused(["--mode", "bench", "--slow-rank", "1"], capsys)
    assert "argument --slow-rank: invalid integer >= 0 value: 'x'" in refused(
        ["--mode", "bench", "--slow-rank", "x"], capsys
    )
    assert "argument --slow-input-ms: must be >= 0, got -1" in refused(
        ["--mode", "bench", "--slow-input-ms", "-1"], capsys
    )
    line = refused(["--mode", "bench", "--workers", "2", "--prefetch-factor", "x"], capsys)
    assert "argument --prefetch-factor: invalid integer >= 1 value: 'x'" in line, "the candidate fixes' own types"
    line = refused(["--mode", "bench", "--data", "synthetic", "--batch-size", "50001"], capsys)
    assert "the synthetic set's 50000 images" in line


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_folder_no_file_can_be_made_in_is_refused_with_the_system_s_words():
    """/proc exists and is a folder, but not even root can make a file there: the probe is made in the folder."""
    with pytest.raises(UserError) as e:
        checks.writable_dirs([("/proc", "--output-dir")])
    said = str(e.value)
    assert said.startswith("--output-dir /proc is not a writable folder (") and "[Errno" not in said, said


def test_a_memory_snapshot_needs_cuda_and_is_a_plain_switch(capsys):
    """--memory-snapshot takes no value; with --device cpu it is refused in one line naming both flags, while
    --device cuda and auto pass the parser (auto is judged once the device is known)."""
    for device in ("cuda", "auto"):
        args = settings.parse_settings(["--mode", "bench", "--memory-snapshot", "--device", device])
        assert args.memory_snapshot is True and args.device == device
    assert settings.parse_settings(["--mode", "bench", "--device", "cpu"]).memory_snapshot is False
    line = refused(["--mode", "bench", "--memory-snapshot", "--device", "cpu"], capsys)
    assert (
        line.startswith("train.py: error: argument --memory-snapshot: ") and "not --device cpu (see --help)" in line
    ), line
    assert settings.parse_settings(["--mode", "profile", "--memory-snapshot"]).memory_snapshot is True


def test_checkpoint_every_takes_a_positive_count(capsys):
    """--checkpoint-every N is an integer of at least 1: 0 and a word are refused in one line."""
    args = settings.parse_settings(["--mode", "profile", "--profile-phase", "checkpoint", "--checkpoint-every", "3"])
    assert args.checkpoint_every == 3
    for bad, words in (("0", "must be >= 1, got 0"), ("x", "invalid")):
        line = refused(["--mode", "profile", "--profile-phase", "checkpoint", "--checkpoint-every", bad], capsys)
        assert "--checkpoint-every" in line and words in line, line


def test_unprofiled_steps_takes_three_or_more_and_whole_rounds_of_saves(capsys):
    """--unprofiled-steps N: 10 by default; fewer than 3 (a block may drop its first step and keep two for its
    spread) or a word is refused. In the checkpoint phase each block saves on the same schedule as the profiled
    steps: N must be a multiple of --checkpoint-every, and the default is the multiple of it just below 10."""
    assert settings.parse_settings(["--mode", "profile"]).unprofiled_steps == 10
    assert settings.parse_settings(["--mode", "profile", "--unprofiled-steps", "3"]).unprofiled_steps == 3
    for bad, words in (("2", "must be >= 3"), ("0", "must be >= 3"), ("x", "invalid")):
        line = refused(["--mode", "profile", "--unprofiled-steps", bad], capsys)
        assert "--unprofiled-steps" in line and words in line, line
    checkpoint = ["--mode", "profile", "--profile-phase", "checkpoint"]
    assert settings.parse_settings(checkpoint).unprofiled_steps == 10
    assert settings.parse_settings([*checkpoint, "--checkpoint-every", "3"]).unprofiled_steps == 9
    six = settings.parse_settings([*checkpoint, "--checkpoint-every", "3", "--unprofiled-steps", "6"])
    assert six.unprofiled_steps == 6
    line = refused([*checkpoint, "--unprofiled-steps", "5"], capsys)
    assert "--unprofiled-steps 5" in line and "a multiple of --checkpoint-every 2" in line, line
    bench = settings.parse_settings(["--mode", "bench", "--profile-phase", "checkpoint", "--unprofiled-steps", "5"])
    assert bench.unprofiled_steps == 5, "bench mode times no unprofiled blocks: nothing to refuse"
    plain = settings.parse_settings(["--mode", "bench", "--profile-phase", "checkpoint", "--checkpoint-every", "7"])
    assert plain.unprofiled_steps == 10, "bench mode keeps the default: no block saves there"


NAMES = ("CIFAR", "CUDA", "CPU", "SGD", "DataLoader", "Python", "Chrome", "Perfetto", "Polyaxon", "PyTorch")


def test_the_help_spells_the_names_it_uses_as_they_are_written():
    """Each flag's help writes CUDA, CIFAR, SGD, DataLoader, ... in their own spelling, never lower- or upper-cased
    (a value typed as a flag's argument, such as --device cuda, aside): a reader searches the docs for them."""
    for action in settings.build_parser()._actions:
        for name in NAMES:
            for found in re.finditer(rf"(?i)(?<![\w-]){name}(?![a-z0-9])", action.help or ""):
                after, before = action.help[found.end() : found.end() + 1], action.help[: found.start()]
                if after in (":", ".") or before.endswith("--device "):
                    continue  # a value as it is typed ("cuda: fail without it", "--device cpu") or a web address
                assert found.group(0) == name, f"{action.option_strings}: {found.group(0)!r} in {action.help!r}"
