"""The profiler at run time: each cycle's trace written whole, unprofiled steps timed around the capture, pauses.

What the profiler distorts and how the capture brackets it: docs/EVIDENCE.md#the-profilers-cost."""

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from steplens.atomic import write_atomic
from steplens.evidence.cycle_evidence import usage_line
from steplens.evidence.formatting import run_label
from steplens.job import cpu_use, host_memory
from steplens.job.machine import cpu_budget
from steplens.job.stopping import Stopper, StopRequested
from steplens.scopes import SCHEDULE
from steplens.trace import nesting


class TraceWriter:
    """on_trace_ready for the tutorial's schedule: trace-cycleN-stepsA-B.pt.trace.json[.gz] and operator tables.

    The trace goes to a temp name, is repaired there so that every Perfetto version shows all its slices
    (nesting.repair: what it changed is recorded as the cycle's "perfetto"), and is renamed when complete, so
    a reader never meets half a trace; how long each dump took is recorded (DataLoader workers keep loading
    meanwhile), and how much of it the repair took.
    """

    def __init__(
        self, out_dir: str, trace_format: str, cuda: bool, subdir: str = "", skip: Callable[[], bool] = lambda: False
    ):
        # subdir: "rank{R}" in a DDP run, so that every rank's files lie apart under one outputs folder.
        # skip: true once a stop was asked for (the profiler's exit would dump a partial cycle).
        self.out_dir, self.trace_format, self.cuda, self.subdir, self.skip = out_dir, trace_format, cuda, subdir, skip
        self.cycles = []
        self.before_dump: Callable[[], None] | None = None  # CycleEdges.trace_closed: host memory, read first

    def __call__(self, prof):
        if self.before_dump is not None:
            self.before_dump()
        if self.skip():  # a stop was asked for: the profiler's exit would dump a partial cycle
            return
        # Called at step_num 5 and 10; the cycle's active steps are the three before.
        n = len(self.cycles) + 1
        first, last = prof.step_num - SCHEDULE["active"], prof.step_num - 1
        t0 = time.perf_counter()
        trace = os.path.join(
            self.out_dir, "traces", self.subdir, f"trace-cycle{n}-steps{first}-{last}.pt.trace.{self.trace_format}"
        )
        os.makedirs(os.path.dirname(trace), exist_ok=True)
        tmp = os.path.join(os.path.dirname(trace), f".partial-{os.getpid()}-{os.path.basename(trace)}")
        try:
            prof.export_chrome_trace(tmp)  # gzips when the name ends in .gz
            t1 = time.perf_counter()
            try:
                perfetto = nesting.repair_file(tmp)
            except nesting.NestingError as e:  # the profiler's own export stays: a trace with drops beats none
                perfetto = {"error": str(e)}
                print(f"profile: the trace could not be made to nest, kept as exported: {e}", file=sys.stderr)
            perfetto["repair_seconds"] = round(time.perf_counter() - t1, 3)
            os.replace(tmp, trace)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        averages = prof.key_averages()
        operators = os.path.join(self.out_dir, "operators", self.subdir)
        tables = {
            "self_cpu": write_atomic(
                os.path.join(operators, f"cycle{n}-by-self-cpu.txt"),
                averages.table(sort_by="self_cpu_time_total", row_limit=-1),
            )
        }
        if self.cuda:
            tables["self_device"] = write_atomic(
                os.path.join(operators, f"cycle{n}-by-self-device.txt"),
                averages.table(sort_by="self_device_time_total", row_limit=-1),
            )
        seconds = time.perf_counter() - t0
        print(f"profile: cycle {n} (ProfilerStep#{first}-{last}) -> {trace} in {seconds:.1f}s", file=sys.stderr)
        self.cycles.append(
            {
                "cycle": n,
                "profiler_steps": [first, last],
                "trace": trace,
                "trace_bytes": os.path.getsize(trace),
                "operator_tables": tables,
                "perfetto": perfetto,
                "dump_seconds": round(seconds, 3),
                "dump_before_step": prof.step_num,
            }
        )


class Laps:
    """Each step's time without a synchronization inside: on CUDA an event recorded after each step (the
    device's clock, on the current stream), on the CPU the host clock. lap() after each step, seconds() once
    the caller has synchronized."""

    def __init__(self, cuda: bool):
        import torch

        self.torch, self.cuda, self.marks = torch, cuda, []

    def lap(self) -> None:
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def seconds(self) -> list[float]:
        pairs = zip(self.marks, self.marks[1:])
        laps = [a.elapsed_time(b) / 1000 for a, b in pairs] if self.cuda else [b - a for a, b in pairs]
        return [round(v, 6) for v in laps]


def time_unprofiled(
    step: Callable[[], Any],
    steps: int,
    synchronize: Callable[[], None],
    boundary: Callable[[], bool | None] = lambda: None,
    laps: Laps | None = None,
) -> tuple[dict[str, Any], float]:
    """steps plain steps between two synchronizations, in the same process as the capture.

    boundary() runs after each step: a stop request is honoured there, by raising, or by returning true,
    which ends the block early and keeps the steps it completed (a flag test, no sync). laps: a Laps, for
    each step's time (their spread says how steady the pace was that the distortion is measured against).
    Returns the timing and the moment the last step returned (the main loop stops consuming batches there:
    the closing synchronization and the profiler's start are the first pause).
    """
    synchronize()
    t0 = time.perf_counter()
    if laps:
        laps.lap()
    done = 0
    for _ in range(steps):
        step()
        done += 1
        if laps:
            laps.lap()
        if boundary():
            break
    last_step_end = time.perf_counter()
    synchronize()
    seconds = time.perf_counter() - t0
    out = {"steps": done, "seconds": seconds, "step_ms": seconds / done * 1e3 if done else None}
    if laps:
        out["step_ms_each"] = [round(v * 1e3, 4) for v in laps.seconds()]
    return out, last_step_end


@contextmanager
def bracketed(
    step: Callable[[], Any],
    steps: int,
    synchronize: Callable[[], None],
    stop: Stopper,
    laps: Callable[[], Laps],
    settle: int = 0,
) -> Iterator[dict[str, Any]]:
    """steps unprofiled steps timed before the with block (the profiled cycles), and as many after it.

    The host's pace drifts (the loader's most): one block of steps can sit well off a long bench window of
    the same configuration, so the ratio is read against a block on each side of the capture. A stop in
    the first block ends the run there, its completed steps counted; a stop in the second ends that block
    and keeps what it completed, so the profiled cycles keep their evidence (stop_keeping ends the run
    after it). settle: untimed steps before the second block, which take up the batches the DataLoader
    workers queued during the profiler's last pause (its trace dump); laps(): a new Laps. Yields
    {"unprofiled": the first block, "since": when its last step returned}; "unprofiled_after" is added.
    """
    with stop.steps("unprofiled timing"):  # a stop here records the unprofiled steps completed
        print(
            f"profile: timing {steps} unprofiled steps before the capture and {steps} after it (the "
            "profiler's cost is measured against them)",
            file=sys.stderr,
        )
        before, since = time_unprofiled(step, steps, synchronize, stop.step_done, laps())
    timing = {"unprofiled": before, "since": since}
    yield timing

    def ended():  # a step boundary that ends the block, rather than the run, on a stop
        stop.steps_done += 1
        return stop.requested

    with stop.steps("unprofiled timing after"):
        print(
            f"profile: timing {steps} unprofiled steps after the capture ({settle} settle steps first)", file=sys.stderr
        )
        cut = False
        for _ in range(settle):
            step()
            if ended():
                cut = True
                break
        timing["unprofiled_after"] = time_unprofiled(step, 0 if cut else steps, synchronize, ended, laps())[0]


def stop_keeping(stop: Stopper, results: dict[str, Any]) -> None:
    """A stop that ended the second unprofiled block early ends the run once its evidence is written: the
    StopRequested carries the results, which run.json keeps beside the stop."""
    if stop.requested:
        e = StopRequested(stop.signum, stop.phase, stop.steps_done)
        e.results = results
        raise e


def input_clock(batches: Any) -> Callable[[], float] | None:
    """The seconds the loop has spent waiting for batches so far (Batches.waited_s), or None where not timed."""
    return (lambda: batches.waited_s) if hasattr(batches, "waited_s") else None


class CycleEdges:
    """Profile mode: the CPU counters (cpu_use) and host memory (host_memory) read at each profiled cycle's edges.

    The CPU counters are read as the cycle's first recorded step begins, before its input/next_batch, and as its
    last recorded step ends, after its train/optimizer: inside those two ProfilerStep slices, outside the four
    scopes. They are read in a few system calls (cpu_use.edge_snapshot: the processes' CPU clocks, no walk over
    the main process's threads), so that they do not stretch those steps: the full per-thread walk took 2 to 7 ms
    a read on an NVIDIA H200 machine, longer than a whole CUDA-graph step on the CPU (about 1 ms), and left the
    GPU idle in them. Host memory takes longer to read (smaps_rollup walks every mapping): it is read outside the
    trace, as the warm-up step before the cycle begins (that step refills the GPU's queue before the cycle) and,
    given the TraceWriter, as the profiler hands over the finished cycle, before its trace is written. Pauses
    calls before_step and after_step; the reads count as pauses between steps.
    """

    def __init__(self, batches: Any, writer: TraceWriter | None = None, schedule: dict[str, int] = SCHEDULE):
        self.pids = batches.worker_pids if hasattr(batches, "worker_pids") else list
        self.budget = cpu_budget()["cpus"]
        self.first = schedule["wait"] + schedule["warmup"]
        self.span, self.repeat = self.first + schedule["active"], schedule["repeat"]
        self.step, self.reads, self.open, self.hooked = 0, {}, None, writer is not None
        if writer is not None:
            writer.before_dump = self.trace_closed

    def _cycle(self, at: int) -> int | None:
        """The cycle (1, 2, ...) whose step at position `at` of its span the loop is at; None past the schedule."""
        k, pos = divmod(self.step, self.span)
        return k + 1 if pos == at and (not self.repeat or k < self.repeat) else None

    def _memory(self, n: int) -> None:
        t0, r = time.perf_counter(), self.reads[n]
        r["memory"].append(host_memory.read(r["pids"]))
        r["read_ms"].append(("memory", round((time.perf_counter() - t0) * 1e3, 2)))

    def _counters(self, n: int) -> None:
        t0, r = time.perf_counter(), self.reads[n]
        r["counters"].append(cpu_use.edge_snapshot(r["pids"]))
        r["read_ms"].append(("cpu", round((time.perf_counter() - t0) * 1e3, 2)))

    def before_step(self) -> None:
        before = self._cycle(self.first - 1)
        if before is not None:  # the warm-up step before the cycle's first recorded one: outside the trace
            self.reads[before] = {"counters": [], "memory": [], "read_ms": [], "pids": self.pids()}
            self._memory(before)
        n = self._cycle(self.first)
        if n is not None:
            if n not in self.reads:  # no step before the cycle to read memory in
                self.reads[n] = {"counters": [], "memory": [], "read_ms": [], "pids": self.pids()}
                self._memory(n)
            self._counters(n)

    def after_step(self) -> None:
        end = self._cycle(self.span - 1)
        self.step += 1
        if end is not None and end in self.reads:
            self._counters(end)
            self.open = end
            if not self.hooked:  # no TraceWriter to say when the trace closes: memory now, inside the step
                self.trace_closed()

    def trace_closed(self) -> None:
        """The profiler has stopped recording the cycle and not yet written it: host memory's second read."""
        if self.open is not None:
            self._memory(self.open)
            self.open = None

    def figures(self, cycle: int) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """The cycle's CPU use (cpu_use.window_use) and host memory (host_memory.peak); None where it was not
        read at both edges."""
        r = self.reads.get(cycle) or {}
        if len(r.get("counters", [])) < 2:
            return None, None
        cpu = cpu_use.window_use(r["counters"][0], r["counters"][1], self.budget)
        cpu["read_ms"] = [ms for what, ms in r["read_ms"] if what == "cpu"]
        memory = host_memory.peak(r["memory"]) if len(r["memory"]) == 2 else None
        if memory is not None:
            memory["read_ms"] = [ms for what, ms in r["read_ms"] if what == "memory"]
        return cpu, memory


class Pauses:
    """How long the main loop stopped between profiled steps (profiler.step(), trace dumps, the start), how
    long each step took, and, given input_clock (the seconds the loop has spent waiting for batches, so
    far), how long each step waited for its batch. edges: a CycleEdges, whose reads count as pauses."""

    def __init__(self, since: float, input_clock: Callable[[], float] | None = None, edges: CycleEdges | None = None):
        self.seconds, self.step_seconds, self.input_seconds = [], [], []
        self._last_end, self._start, self._clock, self._input0 = since, since, input_clock, None
        self.edges = edges

    def before_step(self) -> None:
        if self.edges:
            self.edges.before_step()
        self._start = time.perf_counter()
        self.seconds.append(self._start - self._last_end)
        self._input0 = self._clock() if self._clock else None

    def after_step(self) -> None:
        self._last_end = time.perf_counter()
        self.step_seconds.append(self._last_end - self._start)
        self.input_seconds.append(self._clock() - self._input0 if self._clock else None)
        if self.edges:
            self.edges.after_step()

    def account(self, cycles: list[dict[str, Any]]) -> dict[str, Any]:
        """The loop's timings for the evidence (pauses_s, steps_s, inputs_s); each cycle gains its CPU use and host
        memory ("cpu", "host_memory"), read at its edges, and a line says them."""
        for c in cycles if self.edges else []:
            c["cpu"], c["host_memory"] = self.edges.figures(c["cycle"])
            if c["cpu"]:
                print(f"profile: cycle {c['cycle']}: {usage_line(c['cpu'], c['host_memory'])}", file=sys.stderr)
        return {"pauses_s": self.seconds, "steps_s": self.step_seconds, "inputs_s": self.input_seconds}


def loop_pauses(since: float, batches: Any, writer: TraceWriter) -> Pauses:
    """The profiled loop's Pauses: each step's wait for its batch where batches times it, and each cycle's CPU use
    and host memory read at its edges (CycleEdges)."""
    return Pauses(since, input_clock(batches), CycleEdges(batches, writer))


def queue_account(loader: dict, args: argparse.Namespace) -> dict:
    """What the evidence needs to know of the capture beyond its timings: the loader's queue and the options on."""
    workers, factor = loader.get("num_workers") or 0, loader.get("prefetch_factor")
    return {
        "detail": args.profile_detail,
        "queue_depth": workers * (factor or 0),
        "workers": workers,
        "queue": f"{workers} workers x prefetch_factor {factor}" if workers else "no worker processes",
        "device_input": loader["kind"] == "device",
        "on": {k: getattr(args, k) for k in ("amp", "channels_last", "compile")},
        "run_label": run_label(vars(args)),  # the step pictures' titles name the run by it
    }
