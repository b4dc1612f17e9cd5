"""The tutorial's four profiler scopes and its capture schedule, defined once for train.py and steplens summarize."""

NEXT_BATCH = "input/next_batch"
TO_DEVICE = "input/to_device"
FORWARD_BACKWARD = "train/forward_backward"
OPTIMIZER = "train/optimizer"
SCOPES = (NEXT_BATCH, TO_DEVICE, FORWARD_BACKWARD, OPTIMIZER)

# Two cycles of three active steps: on_trace_ready fires at step_num 5 and 10 (ProfilerStep#2-4, #7-9).
SCHEDULE = dict(wait=1, warmup=1, active=3, repeat=2)
PROFILE_STEPS = (SCHEDULE["wait"] + SCHEDULE["warmup"] + SCHEDULE["active"]) * SCHEDULE["repeat"]

# --profile-detail: the tutorial's capture, or one that records only the timeline.
DETAIL = {
    "full": {"record_shapes": True, "profile_memory": True, "with_stack": True},
    "lean": {"record_shapes": False, "profile_memory": False, "with_stack": False},
}
