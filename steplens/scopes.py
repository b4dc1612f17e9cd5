"""The tutorial's four profiler scopes and its capture schedule, defined once for train.py and steplens summarize."""

NEXT_BATCH = "input/next_batch"
TO_DEVICE = "input/to_device"
FORWARD_BACKWARD = "train/forward_backward"
OPTIMIZER = "train/optimizer"
SCOPES = (NEXT_BATCH, TO_DEVICE, FORWARD_BACKWARD, OPTIMIZER)

# Two cycles of three active steps: on_trace_ready fires at step_num 5 and 10 (ProfilerStep#2-4, #7-9).
SCHEDULE = dict(wait=1, warmup=1, active=3, repeat=2)
UNPROFILED_STEPS = 10  # each block of unprofiled steps around the capture, by default as many as it profiles
PROFILE_STEPS = (SCHEDULE["wait"] + SCHEDULE["warmup"] + SCHEDULE["active"]) * SCHEDULE["repeat"]

# --profile-detail: the tutorial's capture, or one that records only the timeline.
DETAIL = {
    "full": {"record_shapes": True, "profile_memory": True, "with_stack": True},
    "lean": {"record_shapes": False, "profile_memory": False, "with_stack": False},
}

# --profile-phase: the phases a capture can hold, each with its scopes (the input scope first).
# validation: held-out batches in eval mode under no_grad; checkpoint: the training step, with a save every few steps.
EVAL_NEXT_BATCH = "eval/next_batch"
EVAL_TO_DEVICE = "eval/to_device"
EVAL_FORWARD = "eval/forward"
EVAL_SCOPES = (EVAL_NEXT_BATCH, EVAL_TO_DEVICE, EVAL_FORWARD)
SAVE = "checkpoint/save"
PHASES = {"train": SCOPES, "validation": EVAL_SCOPES, "checkpoint": SCOPES + (SAVE,)}
KNOWN = tuple(dict.fromkeys(n for names in PHASES.values() for n in names))  # every scope a reader keeps
CHECKPOINT_EVERY = 2  # the checkpoint phase saves after every 2nd step: each cycle of 3 active steps holds a save


def scope_set(present: set[str] | frozenset[str]) -> tuple[str, ...]:
    """The scopes a trace is read by: its phase's, chosen by the scopes present in it. The checkpoint phase's
    where checkpoint/save is present, the validation phase's where eval scopes are and the training ones are
    not, else the four training scopes (a trace of someone else's loop included)."""
    if SAVE in present:
        return PHASES["checkpoint"]
    if present & set(EVAL_SCOPES) and not present & set(SCOPES):
        return PHASES["validation"]
    return SCOPES
