"""What the GPU does: each GPU event of a trace in one kernel class, read from its name, and the GPU time by class.

    from steplens.trace.kernels import classify, breakdown
    classify("sm90_xmma_wgrad_indexed_implicit_gemm_bf16bf16_...")   # 'convolution weight-gradient'
    breakdown([(name, cat, start_us, end_us), ...])                   # count, time, share per class

The rules (CLASSES, first match wins) were built from the kernel names of the stored NVIDIA H200 traces; a name
no rule knows goes to "other" and is listed. Where events overlap, each instant is charged once, so the classes
sum to the GPU busy time. The classes and both invariants: docs/KERNELS.md#what-the-gpu-does-kernel-classes."""

import functools
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from steplens.trace.spill import SortedRecords, median

COPIES = "copies and memsets"
OTHER = "other"
CLASSES = (
    "convolution forward",
    "convolution data-gradient",
    "convolution weight-gradient",
    "matrix multiply",
    "batch-norm",
    "elementwise and activation",
    "reductions and the loss",
    "optimizer",
    COPIES,
    "communication",
    OTHER,
)
SHORT = {
    "convolution forward": "conv fwd",
    "convolution data-gradient": "conv dgrad",
    "convolution weight-gradient": "conv wgrad",
    "matrix multiply": "matmul",
    "batch-norm": "batch-norm",
    "elementwise and activation": "elementwise",
    "reductions and the loss": "reductions+loss",
    "optimizer": "optimizer",
    COPIES: "copies",
    "communication": "communication",
    OTHER: "other",
}
COPY_CATS = ("gpu_memcpy", "gpu_memset")

# (class, pattern) in order, matched against the lower-cased name; triton names are read apart (_triton).
# cuDNN's init_device_workspace_kernel (zeroing a split-K workspace) goes with the pass its template names:
# it is part of that convolution algorithm's cost. cuDNN's convolve_common_engine names no pass: it is read
# as forward, an assumption its name does not confirm.
_RULES = [
    (cls, re.compile(pattern))
    for cls, pattern in [
        (COPIES, r"memset|memcpy|nchwtonhwc|nhwctonchw|addpadding|converttensor"),
        ("communication", r"nccl"),
        ("optimizer", r"multi_tensor_apply|foreach|fusedsgd|fused_sgd|fusedadam|fused_adam|sgd_kernel|adam_kernel"),
        ("convolution weight-gradient", r"wgrad|reducesplitk"),
        ("convolution data-gradient", r"dgrad"),
        ("convolution forward", r"fprop|convolve|conv2d_fwd|implicit_convolve"),
        ("batch-norm", r"batch_?norm|bn_fw|bn_bw|cudnn::bn_"),
        ("reductions and the loss", r"nll_loss|cross_entropy|softmax|(?<!splitk)reduce_kernel|reduction_kernel"),
        ("matrix multiply", r"gemm|gemv|cublas|nvjet|scal_kernel|cutlass|ampere_|hopper_|volta_|turing_"),
        (
            "elementwise and activation",
            r"elementwise|gather|scatter|index|fillfunctor|fill_kernel|copy_kernel|"
            r"relu|gelu|silu|sigmoid|tanh|threshold|clamp|dropout|where|arange|"
            r"distribution|random|scalepackedtensor|flip",
        ),
    ]
]
_TRITON = re.compile(r"triton_([a-z]+)_")


def _triton(low):
    kind = _TRITON.match(low).group(1)
    if kind == "for" or re.search(r"foreach|fused_sgd|_fused_adam|multi_tensor", low):
        return "optimizer"
    if kind == "poi":
        return "elementwise and activation"
    if kind in ("red", "per"):
        return "batch-norm" if "batch_norm" in low else "reductions and the loss"
    if kind == "tem":
        if "convolution_backward" in low:
            return OTHER  # a template of a backward convolution: its pass is not in the name
        if "convolution" in low:
            return "convolution forward"
        if re.search(r"(^|_)(mm|addmm|bmm|baddbmm)(_|$)", low):
            return "matrix multiply"
    return OTHER


def classify(name: str | None, cat: str = "kernel") -> str:
    """The class of one GPU event, from its name (and its cat: the copy engine's events are copies)."""
    if cat in COPY_CATS:
        return COPIES
    low = (name or "").lower()
    if _TRITON.match(low):
        return _triton(low)
    for cls, pattern in _RULES:
        if pattern.search(low):
            return cls
    return OTHER


# classify of each (name, cat) once per breakdown (which empties it first): a trace's steps launch the same few
# hundred kernels thousands of times
_classified = functools.lru_cache(maxsize=4096)(classify)


def exclusive(events: Sequence[tuple[Any, Any, float, float]]) -> list[float]:
    """Each event's (name, cat, start, end) share of the union of all intervals: the part past every event that
    started before it. The shares sum to the union, so a subset's shares are its part of the classes' time."""
    order = sorted(range(len(events)), key=lambda i: (events[i][2], -events[i][3]))
    out, frontier = [0.0] * len(events), float("-inf")
    for i in order:
        s, e = events[i][2], events[i][3]
        out[i] = max(0.0, e - max(s, frontier))
        frontier = max(frontier, e)
    return out


def _shares(fresh: Callable[[], Iterable[tuple[Any, Any, float, float]]]) -> Iterator[float]:
    """exclusive's shares in the events' order, sorted through spill.SortedRecords: no list of the events."""
    order = SortedRecords("d", 3)
    for pos, (_, _, s, e) in enumerate(fresh()):
        order.add((s, -e, pos))
    shares, frontier = SortedRecords("d", 2), float("-inf")
    for s, neg_e, pos in order:
        e = -neg_e
        shares.add((pos, max(0.0, e - max(s, frontier))))
        frontier = max(frontier, e)
    return (x for _, x in shares)


def breakdown(
    events: Sequence[tuple[str, str, float, float]] | Callable[[], Iterable[tuple[str, str, float, float]]],
    top: int = 0,
) -> dict[str, Any]:
    """GPU time by class of events (name, cat, start_us, end_us): a sequence, or a function that gives them
    afresh (read twice; a window's events are never held at once).

    Returns {"busy_us": union of the intervals, "kernel_us": plain sum of durations, "overlap_us": their
    difference, "classes": {class: {"count", "us", "kernel_us", "median_us", "share"}} for the classes present,
    in CLASSES' order ("us" is the class's part of busy_us, "share" = us / busy_us), "other_names": the names
    no rule knows, longest total first; "signs": what the names show of the candidate fixes (signs); with top > 0
    also "top": the top kernels by summed duration as
    {"name", "class", "count", "us"}}.
    """
    fresh = events if callable(events) else (lambda: events)
    per, by_name, busy, kernel_us = {}, {}, 0, 0
    _classified.cache_clear()
    for (name, cat, s, e), x in zip(fresh(), _shares(fresh)):
        cls = _classified(name, cat)
        c = per.setdefault(cls, {"count": 0, "us": 0.0, "kernel_us": 0.0, "durations": SortedRecords("d", 1)})
        c["count"] += 1
        c["us"] += x
        c["kernel_us"] += e - s
        c["durations"].add(e - s)
        k = by_name.setdefault(name, {"name": name, "class": cls, "count": 0, "us": 0.0})
        k["count"] += 1
        k["us"] += e - s
        busy += x
        kernel_us += e - s
    classes = {
        cls: {
            "count": per[cls]["count"],
            "us": per[cls]["us"],
            "kernel_us": per[cls]["kernel_us"],
            "median_us": median(per[cls]["durations"]),
            "share": per[cls]["us"] / busy if busy else None,
        }
        for cls in CLASSES
        if cls in per
    }
    out = {
        "busy_us": busy,
        "kernel_us": kernel_us,
        "overlap_us": kernel_us - busy,
        "classes": classes,
        "other_names": [k["name"] for k in sorted(by_name.values(), key=lambda k: -k["us"]) if k["class"] == OTHER],
        "signs": signs(by_name.values()),
    }
    if top:
        out["top"] = sorted(by_name.values(), key=lambda k: -k["us"])[:top]
    return out


CONVOLUTIONS = ("convolution forward", "convolution data-gradient", "convolution weight-gradient")
# bf16, fp16 and f16 in cuDNN's and CUTLASS's names (cutlass's tensorop_f16), cuBLAS's h884/h1688/
# h16816 half-precision GEMMs, and __half
_HALF = re.compile(r"bf16|fp16|f16|half|h884|h1688|h16816")
# cuDNN names the output layout last: ..._nhwckrsc_nhwc_... (NHWC out) against ..._nhwckrsc_nchw_... (NCHW out)
_NHWC_OUT = re.compile(r"_nhwc(_|$)")
_LAYOUT_CONVERSION = re.compile(r"nchwtonhwc|nhwctonchw")
SIGNS = ("gemm_us", "half_us", "conv_us", "nhwc_us", "conversion_us", "triton_us", "compute_us")


def signs(by_name: Iterable[dict[str, Any]]) -> dict[str, float]:
    """What the kernels' names show of the candidate fixes, as GPU time (us, the kernels' own durations): the
    convolutions and matrix multiplies, those in half precision (_HALF), the convolutions, those whose output is
    NHWC (_NHWC_OUT), the layout conversions cuDNN adds around an NCHW model, the kernels torch.compile generated
    (triton_), and the compute kernels' time (neither copies nor communication), what the triton time is a share of."""
    out = dict.fromkeys(SIGNS, 0.0)
    for k in by_name:
        low, us = (k["name"] or "").lower(), k["us"]
        if k["class"] in CONVOLUTIONS or k["class"] == "matrix multiply":
            out["gemm_us"] += us
            out["half_us"] += us if _HALF.search(low) else 0.0
        if k["class"] in CONVOLUTIONS:
            out["conv_us"] += us
            out["nhwc_us"] += us if _NHWC_OUT.search(low) else 0.0
        out["conversion_us"] += us if _LAYOUT_CONVERSION.search(low) else 0.0
        out["triton_us"] += us if low.startswith("triton_") else 0.0
        out["compute_us"] += us if k["class"] not in (COPIES, "communication") else 0.0
    return out


def top_classes(classes: dict[str, dict[str, Any]], n: int = 3) -> str:
    """The n classes with the largest share, as 'class share' words: 'conv wgrad 31%, conv dgrad 22%, ...'."""
    ranked = sorted(((c["share"], cls) for cls, c in classes.items() if c.get("share")), reverse=True)[:n]
    return ", ".join(f"{SHORT[cls]} {share:.0%}" for share, cls in ranked)
