"""Test support: Polyaxon's compiler and converter offline, and a real sandbox server on 127.0.0.1.

Never product code: the sandbox has no agent that starts jobs without Kubernetes, so
execute_queued_run() does the agent's part on this machine.
"""

import json
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
import warnings

from conftest import ROOT

BIN = os.path.dirname(sys.executable)
POLYAXONFILE = os.path.join(ROOT, "polyaxonfile.yaml")
POLYAXONFILE_DDP = os.path.join(ROOT, "polyaxonfile-ddp.yaml")


def quiet():
    warnings.filterwarnings("ignore", message=".*Pydantic serializer warnings.*")
    warnings.filterwarnings("ignore", category=UserWarning, module="pydantic")


def compile_polyaxonfile(params, path=POLYAXONFILE, artifacts_path="/plx-context/artifacts/RUN"):
    """Polyaxon's own parser and compiler, params applied and contexts resolved."""
    quiet()
    from polyaxon.polyaxonfile import CompiledOperationSpecification, OperationSpecification, check_polyaxonfile

    op = check_polyaxonfile(polyaxonfile=path, params=params, is_cli=False, verbose=False)
    compiled = OperationSpecification.compile_operation(op)
    compiled = CompiledOperationSpecification.apply_params(compiled, params=op.params)
    compiled = CompiledOperationSpecification.apply_operation_contexts(compiled)
    compiled = CompiledOperationSpecification.apply_runtime_contexts(
        compiled, contexts={"globals": {"run_artifacts_path": artifacts_path}}
    )
    return op, compiled


def polyaxon_check(path, *args):
    """`polyaxon check -f path args` through the CLI's own command, in this process (a CLI process costs about
    1.5 s of CPU to import Polyaxon): its exit code and what it printed."""
    quiet()
    from click.testing import CliRunner
    from polyaxon._cli.check import check

    result = CliRunner().invoke(check, ["-f", path, *args], env={"COLUMNS": "500"})
    return result.exit_code, result.output


def train_argv(script):
    """The train.py argv of the container script's exec line."""
    lines = [line for line in script.splitlines() if line.strip().startswith("exec python train.py")]
    assert len(lines) == 1, f"expected one 'exec python train.py' line in:\n{script}"
    return shlex.split(lines[0])[3:]


def kubernetes_pod(params):
    """Polyaxon's Kubernetes converter, offline: the pod spec a cluster would receive."""
    from polyaxon._k8s.converter.converters.job import JobConverter

    return convert(params, POLYAXONFILE, JobConverter)


def kubernetes_pytorchjob(params):
    """The PyTorchJob custom resource Polyaxon's converter makes of polyaxonfile-ddp.yaml."""
    from polyaxon._k8s.converter.converters.kubeflow.pytroch_job import PytorchJobConverter  # sic, Polyaxon's name

    return convert(params, POLYAXONFILE_DDP, PytorchJobConverter)


def convert(params, path, converter):
    """Resolve a polyaxonfile as the agent would and convert it with one of Polyaxon's converters."""
    quiet()
    from kubernetes.client import ApiClient
    from polyaxon import settings
    from polyaxon._compiler.resolver import resolve
    from polyaxon.polyaxonfile import OperationSpecification, check_polyaxonfile
    from polyaxon.schemas import V1PolyaxonInitContainer, V1PolyaxonSidecarContainer

    settings.set_agent_config()
    settings.AGENT_CONFIG.set_default_artifacts_store()
    init = V1PolyaxonInitContainer(image="polyaxon/polyaxon-init", image_tag="2.18.0")
    sidecar = V1PolyaxonSidecarContainer(image="polyaxon/polyaxon-sidecar", image_tag="2.18.0")
    settings.AGENT_CONFIG.init, settings.AGENT_CONFIG.sidecar = init, sidecar
    op = check_polyaxonfile(polyaxonfile=path, params=params, is_cli=False, verbose=False)
    run_uuid = uuid.uuid4().hex
    resolver = resolve(
        owner_name="acme",
        project_name="profiling",
        project_uuid=uuid.uuid4().hex,
        run_name="job",
        run_uuid=run_uuid,
        run_path=run_uuid,
        compiled_operation=OperationSpecification.compile_operation(op),
        params=op.params,
    )
    resolver = resolver[0] if isinstance(resolver, tuple) else resolver
    store = settings.AGENT_CONFIG.artifacts_store
    resource = converter(
        owner_name="acme",
        project_name="profiling",
        run_name="job",
        run_uuid=run_uuid,
        namespace="polyaxon",
        polyaxon_init=init,
        polyaxon_sidecar=sidecar,
    ).get_resource(
        compiled_operation=resolver.compiled_operation,
        artifacts_store=store,
        connection_by_names={store.name: store},
        secrets=None,
        config_maps=None,
        default_auth=True,
    )
    return ApiClient().sanitize_for_serialization(resource), run_uuid


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sandbox:
    """`haupt sandbox` on 127.0.0.1 with its own home and store, and a CLI bound to it."""

    def __init__(self, base):
        self.base = str(base)
        self.home = os.path.join(self.base, "home")
        self.store = os.path.join(self.base, "store")
        self.context = os.path.join(self.base, "plx-context")
        for d in (self.home, self.store, self.context):
            os.makedirs(d, exist_ok=True)
        # What a pod mounts at /plx-context/artifacts: here, the server's own store.
        os.symlink(self.store, os.path.join(self.context, "artifacts"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def env(self, **extra):
        env = {k: v for k, v in os.environ.items() if not k.startswith("POLYAXON_")}
        # HOME too: the client keeps a run/project cache under ~/.polyaxon whatever POLYAXON_HOME says.
        env.update(
            HOME=self.home,
            POLYAXON_HOME=self.home,
            POLYAXON_DISABLE_ERRORS_REPORTING="true",
            POLYAXON_UI_OFFLINE="true",
            POLYAXON_UI_IN_SANDBOX="true",
            COLUMNS="500",
            POLYAXON_TRACKING_FLUSH_DELAY="0",
            OMP_NUM_THREADS="1",  # as conftest.polyaxon_env: one intra-op thread for the runs it starts
            PATH=BIN + os.pathsep + env.get("PATH", ""),
        )
        env.update(extra)
        return env

    def start(self, timeout=180):
        self.log = open(os.path.join(self.base, "sandbox.log"), "w")
        self.proc = subprocess.Popen(
            [
                os.path.join(BIN, "haupt"),
                "sandbox",
                "start",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
                "--path",
                self.store,
            ],
            env=self.env(),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"haupt sandbox exited: see {self.log.name}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            raise RuntimeError(f"haupt sandbox did not answer in {timeout}s: see {self.log.name}")
        self.cli("config", "set", f"--host={self.url}")
        return self

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
        if self.proc:
            self.log.close()

    def cli(self, *args, check=True, cwd=ROOT, timeout=300):
        for attempt in range(3):
            proc = subprocess.run(
                [os.path.join(BIN, "polyaxon"), *args],
                cwd=cwd,
                env=self.env(),
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            # The sandbox now and then answers a write with 405 (Method Not Allowed): ask again.
            if proc.returncode == 0 or "405" not in proc.stdout + proc.stderr:
                break
            time.sleep(2)
        if check and proc.returncode != 0:
            raise AssertionError(f"polyaxon {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def api(self, call, *args, **kwargs):
        """A write through the client, asked again when the sandbox answers 405 (as cli() does)."""
        from polyaxon.exceptions import ApiException

        for attempt in range(3):
            try:
                return call(*args, **kwargs)
            except ApiException as e:
                if e.status != 405 or attempt == 2:
                    raise
                time.sleep(2)

    def succeed(self, client):
        """The run marked succeeded (set_status)."""
        self.set_status(client, "succeeded", "made")

    def set_status(self, client, status, message, reason="TestStandIn"):
        """The run's status set, waiting for the server's answer: the client's log_status posts it in the
        background, where a 405 from the sandbox would pass unseen and a test that reads the run at once could
        find the status before it."""
        _, condition = client._build_status_condition(status=status, reason=reason, message=message)
        self.api(
            client.client.runs_v1.create_run_status,
            owner=client.owner,
            project=client.project,
            uuid=client.run_uuid,
            body={"condition": condition},
            async_req=False,
        )

    def run_client(self, project, run_uuid=None):
        quiet()
        os.environ["POLYAXON_HOME"] = self.home  # the client reads its host from this home's config
        from polyaxon import settings
        from polyaxon.client import PolyaxonClient, RunClient

        config = settings.CLIENT_CONFIG
        config.host = self.url
        return RunClient(owner="default", project=project, run_uuid=run_uuid, client=PolyaxonClient(config=config))

    def managed_run(self, project, name):
        """A new run of project, and the environment that makes a process that run, as a job's pod is."""
        run = self.api(self.run_client(project).create, name=name)
        env = self.env(
            POLYAXON_RUN_INSTANCE=f"default.{project}.runs.{run.uuid}",
            POLYAXON_IS_MANAGED="true",
            POLYAXON_CONTEXT_ROOT=self.context,
        )
        return run, env

    def execute_queued_run(self, project, run_uuid, timeout=900):
        """The agent's part: run the queued run's resolved command, with the run's identity. Like an agent, it
        starts the run only once the server has queued it: the server's own compile-and-queue step saves the
        whole run, and would drop what the running process had set meanwhile (its readme, say)."""
        client = self.run_client(project, run_uuid)
        deadline = time.time() + 120
        client.refresh_data()
        while client.run_data.status != "queued":
            assert time.time() < deadline, f"run {run_uuid} never queued: {client.run_data.status}"
            time.sleep(0.5)
            client.refresh_data()
        content = json.loads(client.run_data.content)
        container = content["run"]["container"]
        workdir = container["workingDir"].replace("/plx-context", self.context, 1)
        client.log_status("running", reason="TestAgentStandIn", message="executing the resolved command")
        proc = subprocess.run(
            container["command"] + container["args"],
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(
                POLYAXON_RUN_INSTANCE=f"default.{project}.runs.{run_uuid}",
                POLYAXON_IS_MANAGED="true",
                POLYAXON_CONTEXT_ROOT=self.context,
            ),
        )
        # What the operator does when the pod ends. On a managed run Polyaxon's tracking client sets no final
        # status at exit (traceml's Run registers only its _wait): succeeded comes from the exit code alone.
        # train.py's own end is in its run.json, which the tests download and check. A status train.py set
        # itself (failed, stopped) is kept.
        client.refresh_data()
        if client.run_data.status not in ("succeeded", "failed", "stopped"):
            ending = "succeeded" if proc.returncode == 0 else "failed"
            self.set_status(client, ending, f"exit {proc.returncode}", reason="TestAgentStandIn")
        return proc, container


class StandInAgent:
    """The agent's part for a run that is stopped while it runs: on `stopping`, SIGTERM to the process
    (what deleting the pod does), then the process records its own end."""

    def __init__(self, sandbox, project, run_uuid):
        self.sandbox, self.project, self.run_uuid = sandbox, project, run_uuid
        self.client = sandbox.run_client(project, run_uuid)

    def start(self):
        self.client.refresh_data()
        container = json.loads(self.client.run_data.content)["run"]["container"]
        workdir = container["workingDir"].replace("/plx-context", self.sandbox.context, 1)
        self.client.log_status("running", reason="TestAgentStandIn", message="executing the resolved command")
        self.proc = subprocess.Popen(
            container["command"] + container["args"],
            cwd=workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.sandbox.env(
                POLYAXON_RUN_INSTANCE=f"default.{self.project}.runs.{self.run_uuid}",
                POLYAXON_IS_MANAGED="true",
                POLYAXON_CONTEXT_ROOT=self.sandbox.context,
            ),
        )
        return self

    def wait_for_line(self, marker, timeout=300):
        deadline = time.time() + timeout
        for line in self.proc.stderr:
            if marker in line:
                return line
            if time.time() > deadline:
                break
        raise AssertionError(f"the run never printed {marker!r}")

    def status(self):
        self.client.refresh_data()
        return getattr(self.client.run_data.status, "value", self.client.run_data.status)

    def terminate_when_stopping(self, timeout=60):
        deadline = time.time() + timeout
        while self.status() != "stopping":
            assert time.time() < deadline, f"the run never became stopping (status {self.status()})"
            time.sleep(0.5)
        self.proc.send_signal(15)
        rest = self.proc.stderr.read()
        self.proc.wait(timeout=120)
        return self.proc.returncode, rest


def created_uuid(output):
    """The run uuid from `polyaxon run` output ('A new run was created: owner/project:name@UUID')."""
    for line in output.splitlines():
        if "A new run was created" in line and "@" in line:
            return line.rsplit("@", 1)[1].strip()
    raise AssertionError(f"no run uuid in:\n{output}")
