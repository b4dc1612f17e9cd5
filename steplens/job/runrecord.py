"""The run record and all Polyaxon logging: run.json, outputs, files, images, readme, the end of a run."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from types import ModuleType
from typing import TYPE_CHECKING, Any

from steplens.atomic import write_atomic, write_json_atomic
from steplens.errors import UserError
from steplens.job import loader_timeline, overview
from steplens.job.machine import comparable_facts, environment, package_inventory, set_threads
from steplens.job.paths import DEFAULT_OFFLINE_ROOT
from steplens.polyaxonenv import PROJECT, artifact_url, is_managed, managed_identity, namespace, tell

if TYPE_CHECKING:
    import torch


def start_tracking(name: str, tags: list[str]) -> ModuleType:
    """Polyaxon tracking: the managed run inside Polyaxon, an offline run everywhere else."""
    managed = is_managed()
    if not managed:
        # Read by polyaxon at import time: set it first.
        os.environ.setdefault("POLYAXON_OFFLINE_ROOT", DEFAULT_OFFLINE_ROOT)
    try:
        from polyaxon import tracking
    except ImportError as e:
        raise UserError(f"polyaxon is not installed ({e}): pip install -r requirements.txt") from e
    if managed:
        tracking.init(**managed_identity())
    else:
        tracking.init(
            is_offline=True,
            project=PROJECT,
            name=name,
            tags=tags,
            track_code=False,
            track_env=False,
            collect_resources=False,
        )
        # <root>/runs/<uuid>: the project's record goes beside runs/, under <root>/projects/.
        root = os.path.dirname(os.path.dirname(os.path.abspath(tracking.get_artifacts_path())))
        write_project_record(root, tracking.TRACKING_RUN.owner, PROJECT)
    return tracking


def write_project_record(root: str, owner: str | None, project: str) -> str:
    """ROOT/projects/PROJECT/project.plx.json, the record Polyaxon's viewer (`haupt viewer --path ROOT`) lists
    the project from: offline tracking writes only the runs. Written once, by the first run; never replaced."""
    path = os.path.join(root, "projects", project, "project.plx.json")
    if not os.path.exists(path):
        from datetime import datetime, timezone

        now = datetime.now(timezone.utc).isoformat()
        record = {
            "uuid": uuid.uuid5(uuid.NAMESPACE_URL, f"polyaxon-offline/{owner}/{project}").hex,
            "name": project,
            "owner": owner,
            "created_at": now,
            "updated_at": now,
            "description": "train.py's runs on this machine, tracked offline: profile and bench",
        }
        write_atomic(path, json.dumps(record, indent=2, sort_keys=True) + "\n", replace=False)
    return path


class RunRecord:
    """run.json and the Polyaxon run of one job: files are written, then logged; the end state is set once.

    tracking: polyaxon.tracking, or a stand-in that logs nothing (RankRecord); name: the record's file
    under out_dir; polyaxon: what the record says of its Polyaxon run (default: tracking's own run).
    """

    def __init__(
        self,
        tracking: Any,
        settings: dict[str, Any],
        mode: str,
        output_dir: str | None = None,
        name: str = "run.json",
        polyaxon: dict[str, Any] | None = None,
    ):
        self.tracking = tracking
        self.out_dir = os.path.abspath(output_dir or tracking.get_outputs_path())
        os.makedirs(self.out_dir, exist_ok=True)
        self.path = os.path.join(self.out_dir, name)
        self.logged = []
        self.served = None  # (owner, project, run uuid, namespace) where Polyaxon serves the run's outputs/
        if polyaxon is None:
            run = tracking.TRACKING_RUN
            # Served at outputs/ only when out_dir is the run's own outputs folder (not another --output-dir).
            if self.out_dir == os.path.abspath(tracking.get_outputs_path()):
                self.served = (run.owner, run.project, run.run_uuid, namespace())
            polyaxon = {
                "managed": is_managed(),
                "run_uuid": tracking.TRACKING_RUN.run_uuid,
                "offline_root": None if is_managed() else os.environ.get("POLYAXON_OFFLINE_ROOT"),
            }
        self.data = {
            "status": "running",
            "mode": mode,
            "settings": settings,
            "started_at": self._now(),
            "polyaxon": polyaxon,
        }

    @staticmethod
    def _now():
        from datetime import datetime, timezone

        return datetime.now(timezone.utc).isoformat()

    def __setitem__(self, key, value):
        self.data[key] = value

    def __getitem__(self, key):
        return self.data[key]

    def update(self, facts: dict[str, Any]) -> None:
        self.data.update(facts)

    def image_url(self, rel: str) -> str | None:
        """Where Polyaxon's streams service serves a file under the run's outputs/ (a URL path on Polyaxon's
        host), or None when the run's files are not there."""
        if self.served is None:
            return None
        owner, project, run_uuid, ns = self.served
        return artifact_url(owner, project, run_uuid, "outputs/" + rel, ns)

    def log_file(self, path: str, name: str) -> None:
        self.tracking.log_file_ref(path=path, name=name)
        self.logged.append(path)

    def log_image(self, path: str, name: str) -> None:
        """A picture the run's dashboard shows (Polyaxon copies it under the run's assets/image/), and a file."""
        self.tracking.log_image(data=path, name=name)
        self.log_file(path, name)

    def log_outputs(self, **outputs: Any) -> None:
        """Outputs logged while the run goes on (the comparable facts): a failed run keeps them too."""
        self.tracking.log_outputs(**outputs)

    def log_steps(self, name: str, values: dict[int, float]) -> None:
        """One figure per step ({step: value}) as a Polyaxon metric, which the run dashboard charts.
        name must differ from every output's name: at end() a metric's last value replaces an output's."""
        for step, value in sorted(values.items()):
            self.tracking.log_metrics(step=step, **{name: value})

    def tell(self, description: str, readme: str) -> None:
        """The run's description and readme, set before end() (polyaxonenv.tell)."""
        tell(self.tracking, description, readme)

    def end(self) -> None:
        self.tracking.end()

    def succeeded(self, outputs: dict[str, Any]) -> None:
        self.data.update(
            status="succeeded",
            finished_at=self._now(),
            artifacts=[os.path.relpath(p, self.out_dir) for p in self.logged] + ["run.json"],
        )
        self.log_file(write_json_atomic(self.path, self.data), "run.json")
        self.tell(*overview.succeeded(self.data, self.out_dir, self.image_url))
        # Synchronous: the last outputs must reach Polyaxon before end() stops the client. A server that
        # refuses the request is asked again; the run's files are written whatever it answers.
        for attempt in range(3):
            try:
                self.tracking.log_outputs(async_req=False, **outputs)
                break
            except Exception as e:  # the client raises its ApiException, or a connection error
                if attempt == 2:
                    why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
                    print(
                        f"warning: the Polyaxon server did not take the outputs ({why}); run.json holds the "
                        f"results: {self.path}",
                        file=sys.stderr,
                    )
                    self.data["outputs_not_logged"] = why
                    write_json_atomic(self.path, self.data)
                else:
                    time.sleep(1.0)  # not timed: the run is over
        self.end()

    def stopped(self, stop: Any) -> None:
        """A stop signal: run.json and Polyaxon say stopped, with the signal and how far the run got."""
        self.data.update(
            status="stopped",
            finished_at=self._now(),
            stopped={"signal": stop.signal_name, "phase": stop.phase, "steps_completed_in_phase": stop.steps_done},
        )
        self.log_file(write_json_atomic(self.path, self.data), "run.json")
        self.tell(*overview.ended(self.data))
        self.tracking.log_stopped(reason=stop.signal_name, message=str(stop))
        self.end()

    def failed(self, error: BaseException, trace: str | None = None) -> None:
        self.data.update(status="failed", error=f"{type(error).__name__}: {error}", finished_at=self._now())
        if trace:
            self.data["traceback"] = trace
        self.log_file(write_json_atomic(self.path, self.data), "run.json")
        self.tell(*overview.ended(self.data))
        self.tracking.log_failed(reason=type(error).__name__, message=str(error)[:2000])
        self.end()


class _NoTracking:
    """What a rank other than 0 has instead of a Polyaxon run: rank 0 logs its files."""

    def log_inputs(self, **_):
        pass

    def log_outputs(self, **_):
        pass

    def log_metrics(self, **_):
        pass

    def log_failed(self, **_):
        pass

    def log_stopped(self, **_):
        pass

    def set_description(self, *_, **__):
        pass

    def set_readme(self, *_, **__):
        pass

    def end(self):
        pass


class RankRecord(RunRecord):
    """The record of a rank other than 0: ranks/rank{R}.json beside rank 0's run.json, no Polyaxon run."""

    def __init__(self, settings: dict[str, Any], mode: str, out_dir: str, rank: int, run_uuid: str | None):
        super().__init__(
            _NoTracking(),
            settings,
            mode,
            out_dir,
            os.path.join("ranks", f"rank{rank}.json"),
            {"logged_by": "rank 0", "run_uuid": run_uuid},
        )
        self.files = []

    def log_file(self, path: str, name: str) -> None:
        self.logged.append(path)
        self.files.append((path, name))

    def log_image(self, path: str, name: str) -> None:
        self.log_file(path, name)  # rank 0 logs it with the rank's other files

    def succeeded(self, outputs: dict[str, Any]) -> None:
        self.data.update(
            status="succeeded",
            finished_at=self._now(),
            outputs=outputs,
            artifacts=[os.path.relpath(p, self.out_dir) for p in self.logged],
        )
        self.log_file(write_json_atomic(self.path, self.data), "run-json")


def start_record(
    world: Any, settings: dict[str, Any], mode: str, output_dir: str | None, name: str, tags: list[str]
) -> RunRecord:
    """One Polyaxon run per job, rank 0's: it starts the run and broadcasts its outputs folder; the other
    ranks write there without a run of their own. world: a distributed.World (a world of one without --ddp)."""
    record = None
    if world.is_leader:
        record = RunRecord(start_tracking(name=name, tags=tags + world.tags()), settings, mode, output_dir)
    shared = world.broadcast(
        {"out_dir": record.out_dir, "run_uuid": record["polyaxon"]["run_uuid"]} if world.is_leader else None
    )
    if not world.is_leader:
        record = RankRecord(settings, mode, shared["out_dir"], world.rank, shared["run_uuid"])
    record["distributed"] = world.facts()
    return record


def finish_record(world: Any, record: RunRecord, outputs: dict[str, Any]) -> None:
    """The run succeeded: the other ranks write their records first; rank 0 then logs every rank's files
    and ends the run."""
    if not world.active:
        return record.succeeded(outputs)
    if not world.is_leader:
        record.succeeded(outputs)
    files = world.all_gather(
        [(os.path.relpath(p, record.out_dir), n) for p, n in record.files] if not world.is_leader else []
    )
    if world.is_leader:
        for rank, theirs in enumerate(files):
            for rel, name in theirs:
                record.log_file(os.path.join(record.out_dir, rel), f"rank{rank}-{name}")
        record.succeeded(outputs)


def describe_run(
    record: RunRecord, world: Any, device: torch.device, budget: dict[str, Any], workers_note: str | None
) -> None:
    """What the numbers depend on, in run.json and as Polyaxon inputs and outputs, before any step runs."""
    record["cpu_budget"] = budget
    record["workers_note"] = workers_note
    record["torch_threads"] = set_threads(budget)
    record["environment"] = environment(device)
    record["device"] = str(device)
    record.log_outputs(**comparable_facts(record["environment"], budget))
    if world.is_leader:  # one inventory per job: every replica runs the same image
        record.log_file(write_atomic(os.path.join(record.out_dir, "packages.txt"), package_inventory()), "packages")
    record.tracking.log_inputs(**{k: v for k, v in record["settings"].items() if v is not None})


# Headline figures logged as Polyaxon outputs (scalars only; reasons and lists stay in run.json).
OUTPUT_KEYS = (
    "profiled_step_ms",
    "gpu_idle_share",
    "input_gap_share",
    "gpu_work_ms_per_step",
    "gpu_span_ms_per_step",
    "cpu_step_ms",
    "cpu_runs_ahead",
    "unprofiled_step_ms",
    "profiler_distortion",
    "profiler_distortion_se",
    "unprofiled_drift",
    "distortion_low",
    "distortion_high",
    "gpu_top_classes",
)


def log_cycles(record: RunRecord, results: dict[str, Any]) -> dict[str, Any]:
    """Each cycle's files as lineage; the profiled step times as metrics; the headline evidence (pooled and
    per cycle) as Polyaxon outputs."""
    for c in results["cycles"]:
        record.log_file(c["trace"], f"trace-cycle{c['cycle']}")
        for kind, path in c["operator_tables"].items():
            record.log_file(path, f"operators-cycle{c['cycle']}-{kind.replace('_', '-')}")
        record.log_file(c["evidence_json"], f"evidence-cycle{c['cycle']}")
        record.log_file(c["evidence_txt"], f"evidence-cycle{c['cycle']}-table")
        if c.get("picture"):
            record.log_image(c["picture"], f"steps-cycle{c['cycle']}")
    # Each ProfilerStep's wall time as a metric, charted by step on the run's dashboard.
    record.log_steps("profiled_step_wall_ms", {n: ms for c in results["cycles"] for n, ms in c["step_wall_ms"].items()})
    outputs = {k: results["evidence"][k] for k in OUTPUT_KEYS if results["evidence"].get(k) is not None}
    verdict = results["evidence"].get("verdict")
    if verdict:
        outputs["verdict"] = verdict["sentence"]
        if verdict["stage"]:
            outputs["verdict_stage"] = verdict["stage"]
    outputs.update(
        {
            f"cycle{c['cycle']}_{k}": c["evidence"][k]
            for c in results["cycles"]
            for k in OUTPUT_KEYS
            if c["evidence"].get(k) is not None
        }
    )
    outputs.update(loader_timeline.outputs(results.get("input")))  # the DataLoader's figures over the cycles
    for c in results["cycles"]:  # CPU use and host memory read at each cycle's edges (capture.CycleEdges)
        outputs.update({f"cycle{c['cycle']}_{k}": v for k, v in usage_outputs(c).items() if v is not None})
    outputs.update(
        {
            f"cycle{c['cycle']}_launches_without_gpu_work": c["launches_without_gpu_work"]
            for c in results["cycles"]
            if "launches_without_gpu_work" in c
        }
    )
    return outputs


USAGE_OUTPUTS = {  # Polyaxon output: (part of the cycle, its key)
    "cpus_used": ("cpu", "cpus_used"),
    "cpu_throttled_share": ("cpu", "throttled_share"),
    "cpu_bound": ("cpu", "cpu_bound"),
    "cpu_sentence": ("cpu", "cpu_sentence"),
    "pss_peak_mb": ("host_memory", "pss_peak_mb"),
    "main_pss_peak_mb": ("host_memory", "main_pss_peak_mb"),
    "workers_pss_peak_mb": ("host_memory", "workers_pss_peak_mb"),
    "shm_peak_mb": ("host_memory", "shm_peak_mb"),
}


def usage_outputs(cycle: dict[str, Any]) -> dict[str, Any]:
    """A profiled cycle's CPU use and host memory as flat outputs (the caller adds cycleN_); None where unread."""
    return {name: (cycle.get(part) or {}).get(key) for name, (part, key) in USAGE_OUTPUTS.items()}


def record_stop(record: RunRecord | None, stop: Any) -> int:
    """A stop request, recorded where a run exists; the shell's exit code for the signal."""
    if record is None:
        print(f"train.py: {stop}; no run was started", file=sys.stderr)
    else:
        if getattr(stop, "results", None):  # capture.stop_keeping: the profiled cycles completed
            record["results"] = stop.results
        record.stopped(stop)
        print(f"train.py: {stop}; run.json says stopped: {record.path}", file=sys.stderr)
    return stop.exit_code
