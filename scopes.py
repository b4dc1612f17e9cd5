"""The tutorial's four profiler scopes and its capture schedule, defined once for train.py and summarize.py."""

NEXT_BATCH = "input/next_batch"
TO_DEVICE = "input/to_device"
FORWARD_BACKWARD = "train/forward_backward"
OPTIMIZER = "train/optimizer"
SCOPES = (NEXT_BATCH, TO_DEVICE, FORWARD_BACKWARD, OPTIMIZER)

# Two cycles of three active steps: on_trace_ready fires at step_num 5 and 10 (ProfilerStep#2-4, #7-9).
SCHEDULE = dict(wait=1, warmup=1, active=3, repeat=2)
PROFILE_STEPS = (SCHEDULE["wait"] + SCHEDULE["warmup"] + SCHEDULE["active"]) * SCHEDULE["repeat"]


def cycle_steps(cycle):
    """The ProfilerStep numbers (first, last) of a cycle's active steps, cycle counted from 1."""
    period = SCHEDULE["wait"] + SCHEDULE["warmup"] + SCHEDULE["active"]
    last = cycle * period - 1
    return last - SCHEDULE["active"] + 1, last
