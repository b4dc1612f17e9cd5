"""polyaxonfile.yaml and bench-alternating.yaml, through Polyaxon's own parser, compiler and converter."""

import os
import subprocess
import sys

import pytest
from conftest import ROOT
from polyaxon_support import compile_polyaxonfile, kubernetes_pod, polyaxon_check, train_argv

from steplens.job.settings import build_parser, parse_settings

DOCUMENTED = [
    {"mode": "profile", "workers": 0},
    {"mode": "profile", "workers": 4},
    {"mode": "bench", "workers": 0},
    {"mode": "bench", "workers": 4},
    {
        "mode": "bench",
        "workers": 2,
        "batch_size": 256,
        "warmup_steps": 5,
        "bench_steps": 50,
        "data": "synthetic",
        "seed": 3,
        "repeat": 2,
        "trace_format": "json",
    },
    {
        "mode": "bench",
        "workers": 2,
        "persistent_workers": True,
        "prefetch_factor": 4,
        "prefetch_stream": True,
        "channels_last": True,
        "amp": "bf16",
        "fused_sgd": True,
        "compile": "reduce-overhead",
    },
    {"mode": "profile", "gpu_input": True, "channels_last": True},
    {"mode": "profile", "workers": 2, "profile_detail": "lean"},
    {"mode": "profile", "workers": 4, "profile_phase": "validation"},
    {"mode": "profile", "profile_phase": "checkpoint", "checkpoint_every": 3},
    {"mode": "bench", "workers": 4, "profile_phase": "validation"},
    {"mode": "bench", "workers": 4, "memory_snapshot": True},
    {
        "mode": "bench",
        "gpu_input": True,
        "cuda_graph": True,
        "cudnn_benchmark": True,
        "compile": "default",
        "amp": "bf16",
        "channels_last": True,
        "fused_sgd": True,
    },
    {
        "mode": "bench",
        "data": "learnable",
        "batch_size": 512,
        "scale_lr": True,
        "gpu_input": True,
        "cuda_graph": True,
        "compile": "max-autotune-no-cudagraphs",
    },
    {"mode": "bench", "data": "learnable", "lr": 0.0},
    {"mode": "bench", "data": "learnable", "lr": 0.05},
    {
        "mode": "bench",
        "data": "learnable",
        "batch_size": 1024,
        "scale_lr": True,
        "warmup_steps": 100,
        "lr_warmup_steps": 80,
        "gpu_input": True,
        "cuda_graph": True,
    },
]


@pytest.mark.parametrize("params", DOCUMENTED, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_resolved_command_parses_into_the_same_settings(params):
    """Polyaxon's resolved container command, read by train.py's own parser, gives the -P values."""
    _, compiled = compile_polyaxonfile(
        {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in params.items()}
    )
    container = compiled.run.container
    assert container.command == ["/bin/bash", "-c"]
    script = container.args[0]
    assert script.startswith("set -eu\n")
    settings = parse_settings(train_argv(script))
    expected = {
        "workers": 0,
        "batch_size": 128,
        "warmup_steps": 20,
        "bench_steps": 100,
        "data": "cifar10",
        "seed": 0,
        "lr": 0.1,
        "scale_lr": False,
        "lr_warmup_steps": 0,
        "device": "cuda",
        "repeat": None,
        "trace_format": "json.gz",
        "profile_detail": "full",
        "profile_phase": "train",
        "checkpoint_every": None,
        "amp": "off",
        "compile": "off",
        "persistent_workers": False,
        "prefetch_factor": None,
        "prefetch_stream": False,
        "gpu_input": False,
        "channels_last": False,
        "fused_sgd": False,
        "cuda_graph": False,
        "cudnn_benchmark": False,
        "memory_snapshot": False,
        **params,
    }
    for key, value in expected.items():
        assert getattr(settings, key) == value, f"{key}: {getattr(settings, key)!r} != {value!r}"
    assert container.working_dir == "/plx-context/artifacts/RUN/uploads"
    assert compiled.plugins.shm is True


def test_every_input_reaches_train_py():
    """No polyaxonfile input is silently dropped: each one is a train.py flag or a set-up switch."""
    everything = {
        "mode": "bench",
        "workers": "2",
        "repeat": "1",
        "prefetch_factor": "3",
        "persistent_workers": "true",
        "prefetch_stream": "true",
        "gpu_input": "true",
        "channels_last": "true",
        "fused_sgd": "true",
        "cuda_graph": "true",
        "cudnn_benchmark": "true",
        "memory_snapshot": "true",
        "profile_detail": "lean",
        "scale_lr": "true",
        "profile_phase": "checkpoint",
        "checkpoint_every": "2",
        "unprofiled_steps": "4",
    }
    _, compiled = compile_polyaxonfile(everything)
    script = compiled.run.container.args[0]
    flags = {a.dest for a in build_parser()._actions}
    for inp in compiled.inputs:
        if inp.name in ("polyaxon_version", "install"):
            continue
        assert inp.name in flags, f"input {inp.name} is no train.py flag"
        assert f"--{inp.name.replace('_', '-')}" in script, f"{inp.name} not passed"


def test_runtime_install_and_inventory_then_exec():
    """The job installs requirements.txt with the chosen client version, prints the inventory, then execs."""
    _, compiled = compile_polyaxonfile({"mode": "bench", "polyaxon_version": "2.5.2"})
    lines = [line.strip() for line in compiled.run.container.args[0].splitlines()]
    install = next(i for i, line in enumerate(lines) if "pip install" in line)
    assert 'requirements.txt "polyaxon==2.5.2"' in lines[install]
    assert (
        install
        < lines.index("python -m pip freeze")
        < next(i for i, line in enumerate(lines) if line.startswith("exec "))
    )
    _, skipped = compile_polyaxonfile({"mode": "bench", "install": "false"})
    assert 'if [ "False" = "True" ]' in skipped.run.container.args[0]
    with open(os.path.join(ROOT, "requirements.txt")) as f:
        reqs = f.read()
    assert "torchvision==0.22.1" in reqs and "polyaxon" in reqs


@pytest.mark.parametrize(
    "param,message",
    [
        ("mode=weird", "Value `weird` must be one of the values"),
        ("workers=-1", "workers"),
        ("workers=abc", "Cannot convert value `abc`"),
        ("batch_size=0", "batch_size"),
        ("data=imagenet", "must be one of the values"),
        ("lr=-0.1", "lr"),
        ("lr=abc", "Cannot convert value `abc`"),
        ("lr_warmup_steps=-5", "lr_warmup_steps"),
        ("profile_detail=minimal", "must be one of the values"),
        ("profile_phase=test", "must be one of the values"),
        ("checkpoint_every=0", "checkpoint_every"),
    ],
)
def test_polyaxon_check_refuses_bad_params(param, message):
    """`polyaxon check` (the same parser `polyaxon run` uses) refuses a bad -P before scheduling."""
    base = [] if param.startswith("mode=") else ["-P", "mode=bench"]
    code, output = polyaxon_check(os.path.join(ROOT, "polyaxonfile.yaml"), *base, "-P", param)
    assert code == 1, output
    assert "Polyaxonfile is not valid" in output and message in output, output


def test_polyaxon_check_accepts_the_documented_commands():
    for params in ({"mode": "profile", "workers": "0"}, {"mode": "bench", "workers": "4"}):
        args = [a for k, v in params.items() for a in ("-P", f"{k}={v}")]
        proc = subprocess.run(
            [
                os.path.join(os.path.dirname(sys.executable), "polyaxon"),
                "check",
                "-f",
                os.path.join(ROOT, "polyaxonfile.yaml"),
                *args,
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "500"},
            timeout=120,
        )
        assert proc.returncode == 0 and "Polyaxonfile valid" in proc.stdout, proc.stdout


def test_kubernetes_pod_has_image_workdir_resources_and_shm():
    """Polyaxon's Kubernetes converter gives the pod the image, working dir, 4 CPU / 8Gi / 1 GPU and /dev/shm."""
    resource, run_uuid = kubernetes_pod({"mode": "bench", "workers": 4})
    pod = resource["batchJobSpec"]["template"]["spec"]
    main = next(c for c in pod["containers"] if c["name"] == "polyaxon-main")
    assert main["image"] == "pytorch/pytorch:2.7.1-cuda12.6-cudnn9-runtime"
    assert main["workingDir"] == f"/plx-context/artifacts/{run_uuid}/uploads"
    for side in ("requests", "limits"):
        assert main["resources"][side] == {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "1"}, main["resources"]
    shm = [m for m in main["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    assert shm, main["volumeMounts"]
    volume = next(v for v in pod["volumes"] if v["name"] == shm[0]["name"])
    assert volume["emptyDir"]["medium"] == "Memory"
    assert train_argv(main["args"][0])[:4] == ["--mode", "bench", "--workers", "4"]


def test_the_job_s_pod_tells_its_namespace_and_run():
    """The main container reads its namespace (POLYAXON_K8S_NAMESPACE, from the pod's own metadata) and its run
    (POLYAXON_RUN_INSTANCE): the readme's image URLs are built from them."""
    resource, run_uuid = kubernetes_pod({"mode": "profile"})
    main = next(c for c in resource["batchJobSpec"]["template"]["spec"]["containers"] if c["name"] == "polyaxon-main")
    env = {e["name"]: e for e in main["env"]}
    assert env["POLYAXON_K8S_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace", env
    assert env["POLYAXON_RUN_INSTANCE"]["value"] == f"acme.profiling.runs.{run_uuid}", env


def test_alternating_operation_runs_bench_jobs_0_4_0_4_one_at_a_time():
    """bench-alternating.yaml: a valid operation whose mapping alternates workers, tagged by repeat."""
    from polyaxon_support import quiet

    quiet()
    from polyaxon.polyaxonfile import check_polyaxonfile

    path = os.path.join(ROOT, "bench-alternating.yaml")
    op = check_polyaxonfile(polyaxonfile=path, is_cli=False, verbose=False)
    assert op.matrix.kind == "mapping" and op.matrix.concurrency == 1
    assert op.params["mode"].value == "bench"
    values = op.matrix.values
    assert [v["workers"] for v in values] == [0, 4] * 6, "6 pairs: the fewest that can give a verdict"
    assert [v["repeat"] for v in values] == [r for r in range(1, 7) for _ in (0, 4)]
    # Each matrix entry is a valid set of params for the component.
    for v in values[:2]:
        _, compiled = compile_polyaxonfile({"mode": "bench", **{k: str(x) for k, x in v.items()}})
        settings = parse_settings(train_argv(compiled.run.container.args[0]))
        assert (settings.mode, settings.workers, settings.repeat) == ("bench", v["workers"], v["repeat"])
