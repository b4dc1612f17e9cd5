"""The profile mode's files: each cycle's trace written atomically with its operator tables, then its evidence."""

import os
import sys
import time

import summarize
from runinfo import write_atomic, write_json_atomic
from scopes import SCHEDULE


class TraceWriter:
    """on_trace_ready for the tutorial's schedule: trace-cycleN-stepsA-B.pt.trace.json[.gz] and operator tables.

    The trace goes to a temp name and is renamed when complete, so a reader never meets half a trace;
    how long each dump took is recorded (DataLoader workers keep loading meanwhile).
    """

    def __init__(self, out_dir, trace_format, cuda, subdir="", skip=lambda: False):
        # subdir: "rank{R}" in a DDP run, so that every rank's files lie apart under one outputs folder.
        # skip: true once a stop was asked for (the profiler's exit would dump a partial cycle).
        self.out_dir, self.trace_format, self.cuda, self.subdir, self.skip = out_dir, trace_format, cuda, subdir, skip
        self.cycles = []

    def __call__(self, prof):
        if self.skip():  # a stop was asked for: the profiler's exit would dump a partial cycle
            return
        delay = float(os.environ.get("TRAIN_TEST_SLOW_TRACE_EXPORT_S", 0))  # set by the tests alone
        if delay:
            print("profile: writing a trace (slowed for a test)", file=sys.stderr)
            time.sleep(delay)
        # Called at step_num 5 and 10; the cycle's active steps are the three before.
        n = len(self.cycles) + 1
        first, last = prof.step_num - SCHEDULE["active"], prof.step_num - 1
        t0 = time.perf_counter()
        trace = os.path.join(self.out_dir, "traces", self.subdir,
                             f"trace-cycle{n}-steps{first}-{last}.pt.trace.{self.trace_format}")
        os.makedirs(os.path.dirname(trace), exist_ok=True)
        tmp = os.path.join(os.path.dirname(trace), f".partial-{os.getpid()}-{os.path.basename(trace)}")
        try:
            prof.export_chrome_trace(tmp)  # gzips when the name ends in .gz
            os.replace(tmp, trace)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        averages = prof.key_averages()
        operators = os.path.join(self.out_dir, "operators", self.subdir)
        tables = {"self_cpu": write_atomic(os.path.join(operators, f"cycle{n}-by-self-cpu.txt"),
                                           averages.table(sort_by="self_cpu_time_total", row_limit=-1))}
        if self.cuda:
            tables["self_device"] = write_atomic(
                os.path.join(operators, f"cycle{n}-by-self-device.txt"),
                averages.table(sort_by="self_device_time_total", row_limit=-1))
        seconds = time.perf_counter() - t0
        print(f"profile: cycle {n} (ProfilerStep#{first}-{last}) -> {trace} in {seconds:.1f}s", file=sys.stderr)
        self.cycles.append({"cycle": n, "profiler_steps": [first, last], "trace": trace,
                            "trace_bytes": os.path.getsize(trace), "operator_tables": tables,
                            "dump_seconds": round(seconds, 3)})


def write_evidence(cycles):
    """summarize.py over each cycle's trace, saved beside it; returns the pooled headline figures."""
    evidences = []
    for c in cycles:
        evidence = summarize.summarize_file(c["trace"])
        base = c["trace"].rsplit(".pt.trace.", 1)[0]
        c["evidence_json"] = write_json_atomic(base + ".evidence.json", evidence)
        c["evidence_txt"] = write_atomic(base + ".evidence.txt", summarize.format_table([evidence]))
        c["evidence"] = summarize.headline(evidence)
        c["step_wall_ms"] = {s["step"]: s["wall_us"] / 1000.0 for s in evidence["steps"]}
        evidences.append(evidence)
    return summarize.headline(evidences)


def log_cycles(record, results):
    """Each cycle's files as lineage; the profiled step times as metrics; the headline evidence (pooled and
    per cycle) as Polyaxon outputs."""
    for c in results["cycles"]:
        record.log_file(c["trace"], f"trace-cycle{c['cycle']}")
        for kind, path in c["operator_tables"].items():
            record.log_file(path, f"operators-cycle{c['cycle']}-{kind.replace('_', '-')}")
        record.log_file(c["evidence_json"], f"evidence-cycle{c['cycle']}")
        record.log_file(c["evidence_txt"], f"evidence-cycle{c['cycle']}-table")
    # Each ProfilerStep's wall time as a metric, charted by step on the run's dashboard.
    record.log_steps("profiled_step_wall_ms",
                     {n: ms for c in results["cycles"] for n, ms in c["step_wall_ms"].items()})
    outputs = {k: v for k, v in results["evidence"].items() if v is not None}
    outputs.update({f"cycle{c['cycle']}_{k}": v for c in results["cycles"] for k, v in c["evidence"].items()
                    if v is not None})
    return outputs
