"""polyaxonfile-ddp.yaml (kind: pytorchjob) through Polyaxon's own parser, compiler and PyTorchJob converter."""

import os
import subprocess

import pytest
from polyaxon_support import POLYAXONFILE_DDP, kubernetes_pytorchjob, polyaxon_check, quiet

from steplens.job.settings import build_parser, parse_settings

# What the Kubeflow training operator sets in the second worker pod (pod index 2).
OPERATOR_ENV = {"RANK": "2", "WORLD_SIZE": "3", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"}


def compile_ddp(params):
    """Compiled with one runtime context per replica, as Polyaxon resolves a distributed run."""
    quiet()
    from polyaxon.polyaxonfile import CompiledOperationSpecification, OperationSpecification, check_polyaxonfile

    op = check_polyaxonfile(polyaxonfile=POLYAXONFILE_DDP, params=params, is_cli=False, verbose=False)
    compiled = OperationSpecification.compile_operation(op)
    compiled = CompiledOperationSpecification.apply_params(compiled, params=op.params)
    compiled = CompiledOperationSpecification.apply_operation_contexts(compiled)
    context = {"globals": {"run_artifacts_path": "/plx-context/artifacts/RUN"}}
    return CompiledOperationSpecification.apply_runtime_contexts(
        compiled, contexts={"master": context, "worker": context}
    )


def torchrun_argv(script, env=OPERATOR_ENV):
    """The torchrun argv of the container script's exec line, expanded by bash with the operator's variables."""
    lines = [line.strip() for line in script.splitlines() if line.strip().startswith("exec torchrun ")]
    assert len(lines) == 1, f"expected one 'exec torchrun' line in:\n{script}"
    show = "torchrun() { printf '%s\\n' \"$@\"; }; set -eu; " + lines[0][len("exec ") :]
    proc = subprocess.run(
        ["bash", "-c", show], env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def parse_train(argv, world_size, monkeypatch):
    """train.py's parser, in a process torchrun started (it refuses --ddp elsewhere)."""
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world_size)}.items():
        monkeypatch.setenv(k, v)
    return parse_settings(argv)


def parse_torchrun(argv):
    from torch.distributed.run import get_args_parser

    return get_args_parser().parse_args(argv)


@pytest.mark.parametrize(
    "params,nnodes,nproc",
    [
        ({"mode": "profile"}, 2, 1),
        ({"mode": "bench", "replicas": 3, "nproc_per_node": 2, "workers": 4, "batch_size": 256}, 4, 2),
        (
            {
                "mode": "profile",
                "replicas": 1,
                "slow_rank": 1,
                "slow_input_ms": 200,
                "data": "synthetic",
                "profile_detail": "lean",
            },
            2,
            1,
        ),
        ({"mode": "bench", "replicas": 0, "gpu_input": True, "compile": "default", "amp": "bf16"}, 1, 1),
        ({"mode": "bench", "replicas": 1, "data": "learnable", "lr": 0.2, "scale_lr": True}, 2, 1),
        ({"mode": "bench", "replicas": 1, "data": "learnable", "scale_lr": True, "lr_warmup_steps": 30}, 2, 1),
    ],
    ids=["defaults", "4x2", "straggler", "master-only", "learning-check", "lr-warm-up"],
)
def test_each_replica_runs_torchrun_then_train_py_with_ddp(params, nnodes, nproc, monkeypatch):
    """torchrun's own parser reads the resolved command: nnodes = replicas + 1, node rank = the pod's RANK,
    the master's address and port; train.py's parser reads the rest as the -P values, with --ddp."""
    compiled = compile_ddp({k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in params.items()})
    assert type(compiled.run).__name__ == "V1PytorchJob"
    assert compiled.run.master.replicas == 1 and compiled.run.worker.replicas == params.get("replicas", 1)
    for replica in (compiled.run.master, compiled.run.worker):
        container = replica.container
        assert container.command == ["/bin/bash", "-c"] and container.args[0].startswith("set -eu\n")
        assert container.working_dir == "/plx-context/artifacts/RUN/uploads"
        launch = parse_torchrun(torchrun_argv(container.args[0]))
        assert (launch.nnodes, launch.nproc_per_node, launch.node_rank) == (str(nnodes), str(nproc), 2)
        assert (launch.master_addr, launch.master_port) == ("job-master-0", 23456)
        assert launch.training_script == "train.py"
        settings = parse_train(launch.training_script_args, nnodes * nproc, monkeypatch)
        expected = {
            "ddp": True,
            "workers": 0,
            "batch_size": 128,
            "device": "cuda",
            "slow_rank": None,
            "slow_input_ms": 0.0,
            "ddp_backend": "auto",
            "profile_detail": "full",
            "lr": 0.1,
            "scale_lr": False,
            "lr_warmup_steps": 0,
            **params,
        }
        for key, value in expected.items():
            if key in ("replicas", "nproc_per_node"):
                continue
            assert getattr(settings, key) == value, f"{key}: {getattr(settings, key)!r} != {value!r}"
    assert compiled.plugins.shm is True


def test_every_input_reaches_torchrun_or_train_py():
    everything = {
        "mode": "bench",
        "replicas": "2",
        "nproc_per_node": "2",
        "workers": "2",
        "repeat": "1",
        "prefetch_factor": "3",
        "persistent_workers": "true",
        "prefetch_stream": "true",
        "gpu_input": "true",
        "channels_last": "true",
        "fused_sgd": "true",
        "cudnn_benchmark": "true",
        "memory_snapshot": "true",
        "slow_rank": "3",
        "slow_input_ms": "50",
        "profile_detail": "lean",
        "unprofiled_steps": "4",
        "scale_lr": "true",
    }
    compiled = compile_ddp(everything)
    script = compiled.run.master.container.args[0]
    flags = {a.dest for a in build_parser()._actions}
    for inp in compiled.inputs:
        if inp.name in ("polyaxon_version", "install", "replicas", "nproc_per_node"):
            continue
        assert inp.name in flags, f"input {inp.name} is no train.py flag"
        assert f"--{inp.name.replace('_', '-')}" in script, f"{inp.name} not passed"
    launch = parse_torchrun(torchrun_argv(script))
    assert (launch.nnodes, launch.nproc_per_node) == ("3", "2")


def test_the_pytorchjob_manifest_has_the_replicas_resources_shm_and_command(monkeypatch):
    """Polyaxon's PyTorchJob converter: Master x1 and Worker x replicas, each pod's 'pytorch' container with
    4 CPUs and one nvidia.com/gpu per process, /dev/shm in memory, torchrun in its command, and a
    sidecar that uploads to the same run."""
    for nproc in (1, 2):
        resource, run_uuid = kubernetes_pytorchjob({"mode": "bench", "replicas": 3, "nproc_per_node": nproc})
        assert resource["kind"] == "KfJob"  # Polyaxon's operation kind for Kubeflow jobs
        spec = resource["pytorchJobSpec"]
        assert spec["cleanPodPolicy"] == "All"
        assert {k: v["replicas"] for k, v in spec["replicaSpecs"].items()} == {"Master": 1, "Worker": 3}
        for name, replica in spec["replicaSpecs"].items():
            pod = replica["template"]["spec"]
            main = next(c for c in pod["containers"] if c["name"] == "pytorch")
            for side in ("requests", "limits"):
                assert main["resources"][side] == {
                    "cpu": str(4 * nproc),
                    "memory": f"{8 * nproc}Gi",
                    "nvidia.com/gpu": str(nproc),
                }, (name, main["resources"])
            assert main["image"] == "pytorch/pytorch:2.7.1-cuda12.6-cudnn9-runtime"
            assert main["workingDir"] == f"/plx-context/artifacts/{run_uuid}/uploads"
            shm = next(m for m in main["volumeMounts"] if m["mountPath"] == "/dev/shm")
            assert next(v for v in pod["volumes"] if v["name"] == shm["name"])["emptyDir"]["medium"] == "Memory"
            launch = parse_torchrun(torchrun_argv(main["args"][0]))
            assert (launch.nnodes, launch.nproc_per_node) == ("4", str(nproc))
            assert parse_train(launch.training_script_args, 4 * nproc, monkeypatch).ddp
            env = {e["name"]: e.get("value") for e in main["env"]}
            assert env["POLYAXON_RUN_INSTANCE"] == f"acme.profiling.runs.{run_uuid}", "one run for every replica"
            assert any(c["name"] == "polyaxon-sidecar" for c in pod["containers"]), f"{name}: no sidecar"


@pytest.mark.parametrize(
    "param,message",
    [
        ("mode=weird", "Value `weird` must be one of the values"),
        ("replicas=-1", "replicas"),
        ("nproc_per_node=0", "nproc_per_node"),
        ("slow_input_ms=-5", "slow_input_ms"),
        ("workers=abc", "Cannot convert value `abc`"),
        ("lr=-1", "lr"),
        ("data=imagenet", "must be one of the values"),
    ],
)
def test_polyaxon_check_refuses_bad_params(param, message):
    base = [] if param.startswith("mode=") else ["-P", "mode=bench"]
    code, output = polyaxon_check(POLYAXONFILE_DDP, *base, "-P", param)
    assert code == 1, output
    assert "Polyaxonfile is not valid" in output and message in output, output


def test_polyaxon_check_accepts_the_documented_command():
    args = ["-P", "mode=profile", "-P", "replicas=1", "-P", "slow_rank=1", "-P", "slow_input_ms=200"]
    code, output = polyaxon_check(POLYAXONFILE_DDP, *args)
    assert code == 0 and "Polyaxonfile valid" in output, output
