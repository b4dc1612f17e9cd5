"""The profile mode's measurements and files: the profiler's cost, the pauses it makes, each cycle's trace and evidence.

What the profiler distorts, and how this module keeps the evidence honest:
- Its own cost. record_shapes, profile_memory and with_stack (--profile-detail full, the tutorial's
  capture) inflate the profiled main process only; DataLoader workers run unprofiled in their own
  processes. So PROFILE_STEPS unprofiled steps are timed in the same process just before the capture
  (synchronized at both ends, never inside the profiled window), and profiler_distortion = profiled
  step / unprofiled step is reported beside every trace's evidence.
- Its pauses. Writing a cycle's trace takes about a second inside profiler.step(), and starting the
  profiler takes time too; the workers keep loading meanwhile, up to workers x prefetch_factor batches
  ahead, so the steps after a long pause may be served from refilled queues and show no input wait that
  the bench would feel. Every pause of the main loop between steps is measured. A pause of p seconds
  refills about p / (one unprofiled step) batches, capped at the queue depth: when the loop waits for
  input, one unprofiled step is the loader's time per batch (when it does not, queues are full anyway
  and a refill hides nothing). A cycle whose active steps fall within a pause's refill is flagged.
- The decision: the tutorial's schedule (wait=1, warmup=1, active=3, repeat=2) stays; with it, cycle 2
  always follows cycle 1's dump by two steps, fewer than the queue depth of 4 workers (8 batches), so
  the headline figures come from the cycles no pause refilled (cycle 1, unless the profiler's start
  also paused long enough: then from the steps no pause refilled, where idle time is read on the CPU's
  steps, whose per-step figures add up; else the headline idle and input-gap figures are null with the
  reason; the per-cycle figures stay in run.json either way). A schedule with warmup >= workers x prefetch_factor
  would drain a dump's refill too, at the price of more profiled steps than the tutorial prints.
"""

import os
import sys
import time

import summarize
from runinfo import write_atomic, write_json_atomic
from scopes import SCHEDULE

# --profile-detail: the tutorial's capture, or one that records only the timeline.
DETAIL = {"full": {"record_shapes": True, "profile_memory": True, "with_stack": True},
          "lean": {"record_shapes": False, "profile_memory": False, "with_stack": False}}
# Above this, the workers get at least 10% more time per batch than in an unprofiled run; below its
# inverse, the profiled steps ran faster than the unprofiled ones, which the profiler cannot cause.
DISTORTION_NOTE_AT = 1.1
# The slowest unprofiled step over the fastest, from which the pace the ratio divides by is called unsteady.
UNSTEADY_AT = 1.5


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
                            "dump_seconds": round(seconds, 3), "dump_before_step": prof.step_num})


class Laps:
    """Each step's time without a synchronization inside: on CUDA an event recorded after each step (the
    device's clock, on the current stream), on the CPU the host clock. lap() after each step, seconds() once
    the caller has synchronized."""

    def __init__(self, torch, cuda):
        self.torch, self.cuda, self.marks = torch, cuda, []

    def lap(self):
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def seconds(self):
        pairs = zip(self.marks, self.marks[1:])
        laps = [a.elapsed_time(b) / 1000 for a, b in pairs] if self.cuda else [b - a for a, b in pairs]
        return [round(v, 6) for v in laps]


def time_unprofiled(step, steps, synchronize, boundary=lambda: None, laps=None):
    """steps plain steps between two synchronizations, just before the capture, in the same process.

    boundary() runs after each step (a stop request is honoured there; a flag test, no sync). laps: a Laps,
    for each step's time (their spread says how steady the pace was that the distortion is measured
    against). Returns the timing and the moment the last step returned (the main loop stops consuming
    batches there: the closing synchronization and the profiler's start are the first pause).
    """
    synchronize()
    t0 = time.perf_counter()
    if laps:
        laps.lap()
    for _ in range(steps):
        step()
        if laps:
            laps.lap()
        boundary()
    last_step_end = time.perf_counter()
    synchronize()
    seconds = time.perf_counter() - t0
    out = {"steps": steps, "seconds": seconds, "step_ms": seconds / steps * 1e3}
    if laps:
        out["step_ms_each"] = [round(v * 1e3, 4) for v in laps.seconds()]
    return out, last_step_end


class Pauses:
    """How long the main loop stopped between profiled steps (profiler.step(), trace dumps, the start)."""

    def __init__(self, since):
        self.seconds, self._last_end = [], since

    def before_step(self):
        self.seconds.append(time.perf_counter() - self._last_end)

    def after_step(self):
        self._last_end = time.perf_counter()


def refills(cycles, pauses_s, queue_depth, step_s):
    """Per cycle, the pauses whose refilled batches may have served its active steps.

    pauses_s[i]: the pause before profiled step i. A pause of p seconds refills min(depth, p / step_s)
    batches (all of the depth when step_s is unknown); they serve the steps that follow it.
    """
    out = {}
    dumps = {c.get("dump_before_step"): c["cycle"] for c in cycles}
    for c in cycles:
        first, last = c["profiler_steps"]
        found = []
        for i, p in enumerate(pauses_s):
            batches = queue_depth if not step_s else min(queue_depth, int(p / step_s))
            if batches and i <= last and i + batches - 1 >= first:
                what = f"cycle {dumps[i]}'s trace dump" if i in dumps else (
                    "the profiler's start" if i < first else "profiler.step()")
                found.append({"before_step": i, "seconds": round(p, 4), "batches": batches, "what": what,
                              "dump": i in dumps})
        out[c["cycle"]] = found
    return out


def distortion_sentence(ratio, workers, device_input, each_ms=None, detail="full"):
    """A plain sentence when the profiler slows the steps enough to hide (or inflate) input waits, when the
    profiled steps ran faster than the unprofiled ones (which the profiler cannot cause), or when the
    unprofiled pace was too unsteady for the ratio to mean much. each_ms: each unprofiled step's time;
    detail: the --profile-detail of the capture (a lean one still pays for recording every operator)."""
    lean = "compare --profile-detail lean" if detail == "full" else "a lean capture still records every operator"
    if ratio is None:
        return None
    said = f"profiled steps take {ratio:.2f}x the unprofiled ones"
    spread = (f"unprofiled steps ranged from {min(each_ms):.1f} to {max(each_ms):.1f} ms"
              if each_ms and min(each_ms) > 0 else None)
    unsteady = spread if spread and max(each_ms) / min(each_ms) >= UNSTEADY_AT else None
    if ratio <= 1 / DISTORTION_NOTE_AT:
        if workers:
            said += (", which the profiler cannot cause: the DataLoader workers' queues, refilled during the "
                     "profiler's pauses, served them (or the host's pace changed), so the trace understates the "
                     "input wait; the unprofiled step is the loader-bound pace")
        else:
            said += (", which the profiler cannot cause: the host's pace changed between the two timings, so the "
                     "ratio says nothing of the profiler's cost here")
    elif ratio >= DISTORTION_NOTE_AT:
        if workers:
            said += (f": the profiler slows the main process while the {workers} DataLoader workers run "
                     f"unprofiled in their own processes, so they get {ratio:.2f}x the time per batch and input "
                     f"waits the bench feels may not show in the trace ({lean})")
        elif device_input:
            said += ": the trace's CPU times are inflated; the GPU's figures are not"
        else:
            said += (": loading runs in the profiled main process, so the trace overstates the in-process "
                     f"input cost ({lean})")
    elif not unsteady:
        return None
    return said + (f"; {unsteady}, a pace that changes this much leaves the ratio uncertain" if unsteady else "")


def capture_lines(cycle, capture):
    """The evidence text's account of the capture: the profiler's cost and the pauses before this cycle."""
    lines = [f"capture: --profile-detail {capture['detail']}; unprofiled step "
             f"{_ms(capture['unprofiled_step_ms'])} ms (same process, {capture['unprofiled_steps']} steps "
             f"just before the capture{_spread(capture.get('unprofiled_step_ms_each'))}), profiled step "
             f"{_ms(capture['profiled_step_ms'])} ms, "
             f"profiler_distortion {_ratio(capture['profiler_distortion'])}"]
    if capture["distortion_sentence"]:
        lines.append(f"capture: {capture['distortion_sentence']}")
    for d in capture["dumps"]:
        if d["before_step"] <= cycle["profiler_steps"][0]:
            lines.append(f"capture: cycle {cycle['cycle']}'s active steps start "
                         f"{cycle['profiler_steps'][0] - d['before_step']} steps after cycle {d['cycle']}'s trace "
                         f"dump ({d['seconds']:.3f} s, before step {d['before_step']})")
    for r in cycle["refilled_by"]:
        lines.append(f"capture: cycle {cycle['cycle']} follows {r['what']} ({r['seconds']:.3f} s, before step "
                     f"{r['before_step']}): with {capture['queue_depth']} batches of loader queue "
                     f"({capture['queue']}), about {r['batches']} steps after it may be served from refilled "
                     "queues, so this cycle's input waits may be understated")
    if capture["headline_clean"]:
        lines.append(f"capture: headline figures from cycle(s) {', '.join(map(str, capture['headline_cycles']))}")
    elif capture.get("headline_steps"):
        lines.append(f"capture: every cycle followed a refilling pause: headline idle, input gap and profiled step "
                     f"from the steps no pause refilled ({', '.join(map(str, capture['headline_steps']))})")
    else:
        lines.append(f"capture: headline figures from cycle(s) {', '.join(map(str, capture['headline_cycles']))} "
                     "(every cycle followed a refilling pause: idle and input gap null)")
    return lines


def _spread(each):
    return f", each {min(each):.2f} to {max(each):.2f} ms" if each else ""


def _ms(v):
    return "n/a" if v is None else f"{v:.2f}"


def _ratio(v):
    return "n/a" if v is None else f"{v:.2f}"


def refilled_steps(refilled_by):
    """The profiler steps a cycle's refilling pauses may have served: a pause before step i that refilled b
    batches serves steps i .. i + b - 1."""
    return {i for r in refilled_by for i in range(r["before_step"], r["before_step"] + r["batches"])}


def clean_steps(cycles, evidences):
    """When every cycle follows a refilling pause: the steps no pause refilled, with their per-step figures,
    if the cycles read idle time on the CPU's steps (per-step figures then add up to the window's; on the
    GPU's own timeline they do not, and no step is returned)."""
    if any(evidences[c["cycle"]].get("idle_basis") != "cpu_steps" for c in cycles):
        return []
    out = []
    for c in cycles:
        served = refilled_steps(c["refilled_by"])
        out += [s for s in evidences[c["cycle"]]["steps"]
                if s["step"] not in served and s.get("pace_us") and s.get("gpu_idle_us") is not None]
    return out


def pool_steps(steps):
    """The headline idle and input-gap shares and the profiled step, pooled over these steps alone."""
    pace = sum(s["pace_us"] for s in steps)
    idle = sum(s["gpu_idle_us"] for s in steps)
    return {"gpu_idle_share": idle / pace, "input_gap_share": sum(s["input_gap_us"] for s in steps) / idle if idle else 0.0,
            "profiled_step_ms": pace / len(steps) / 1e3}


def write_evidence(cycles, capture):
    """summarize.py over each cycle's trace, saved beside it with the capture's account; the headline figures.

    capture: detail, unprofiled (time_unprofiled's dict), pauses_s, queue_depth, queue (words), workers,
    device_input. The headline is pooled over the cycles no pause refilled (see the module's docstring).
    """
    step_s = capture["unprofiled"]["step_ms"] / 1e3 if capture.get("unprofiled") else None
    refilled = refills(cycles, capture["pauses_s"], capture["queue_depth"], step_s)
    evidences = {}
    for c in cycles:
        evidences[c["cycle"]] = summarize.summarize_file(c["trace"])
        c["refilled_by"] = refilled[c["cycle"]]
        c["follows_dump"] = [r["before_step"] for r in refilled[c["cycle"]] if r["dump"]]
    clean = [c["cycle"] for c in cycles if not c["refilled_by"]]
    chosen = clean or [c["cycle"] for c in cycles]
    head = summarize.headline([evidences[n] for n in chosen])
    head["headline_steps"] = None
    if not clean:
        steps = clean_steps(cycles, evidences)
        if steps:
            head.update(pool_steps(steps), headline_steps=[s["step"] for s in steps])
        else:
            why = ("every cycle's active steps follow a pause that let the DataLoader workers refill their queues "
                   "(see refilled_by per cycle), and no step read on the CPU's steps escaped it: the trace may "
                   "hide input waits the bench feels")
            head["gpu_idle_share"] = head["input_gap_share"] = None
            head["null_reasons"]["input_wait"] = why
    unprofiled_ms = capture["unprofiled"]["step_ms"] if capture.get("unprofiled") else None
    each = (capture.get("unprofiled") or {}).get("step_ms_each")
    ratio = head["profiled_step_ms"] / unprofiled_ms if unprofiled_ms and head["profiled_step_ms"] else None
    head.update(unprofiled_step_ms=unprofiled_ms, profiler_distortion=ratio, headline_cycles=chosen,
                unprofiled_step_ms_range=[min(each), max(each)] if each else None)
    account = {"detail": capture["detail"], "unprofiled_step_ms": unprofiled_ms,
               "unprofiled_steps": capture["unprofiled"]["steps"] if capture.get("unprofiled") else None,
               "profiled_step_ms": head["profiled_step_ms"], "profiler_distortion": ratio,
               "unprofiled_step_ms_each": each,
               "distortion_sentence": distortion_sentence(ratio, capture["workers"], capture["device_input"], each,
                                                         capture["detail"]),
               "queue_depth": capture["queue_depth"], "queue": capture["queue"],
               "pauses_s": [round(p, 4) for p in capture["pauses_s"]],
               "headline_cycles": chosen, "headline_clean": bool(clean), "headline_steps": head["headline_steps"],
               "dumps": [{"cycle": d["cycle"], "seconds": d.get("dump_seconds"), "before_step": d["dump_before_step"]}
                         for d in cycles if d.get("dump_before_step") is not None]}
    for c in cycles:
        evidence = evidences[c["cycle"]]
        evidence["capture"] = {**account, "cycle": c["cycle"], "refilled_by": c["refilled_by"]}
        base = c["trace"].rsplit(".pt.trace.", 1)[0]
        c["evidence_json"] = write_json_atomic(base + ".evidence.json", evidence)
        text = summarize.format_table([evidence]) + "\n".join(capture_lines(c, account)) + "\n"
        c["evidence_txt"] = write_atomic(base + ".evidence.txt", text)
        c["evidence"] = summarize.headline(evidence)
        c["step_wall_ms"] = {s["step"]: s["wall_us"] / 1000.0 for s in evidence["steps"]}
    head["distortion_sentence"] = account["distortion_sentence"]
    return head


# Headline figures logged as Polyaxon outputs (scalars only; reasons and lists stay in run.json).
OUTPUT_KEYS = ("profiled_step_ms", "gpu_idle_share", "input_gap_share", "gpu_work_ms_per_step",
               "gpu_span_ms_per_step", "cpu_step_ms", "cpu_runs_ahead", "unprofiled_step_ms", "profiler_distortion")


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
    outputs = {k: results["evidence"][k] for k in OUTPUT_KEYS if results["evidence"].get(k) is not None}
    outputs.update({f"cycle{c['cycle']}_{k}": c["evidence"][k] for c in results["cycles"] for k in OUTPUT_KEYS
                    if c["evidence"].get(k) is not None})
    return outputs
