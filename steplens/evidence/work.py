"""The work a step must do, by kernel class: FLOPs and bytes of each operator of a trace, or of each layer of a model.

    op_work(OpCall("aten::mm", dims=[[128, 512], [512, 10]], types=["float", "float"]))
    # [Part("matrix multiply", flops=1310720, bytes=..., precision="tf32")]
    model_work(build_model, batch=128, amp="bf16")   # {class: {"flops", "bytes"}} per step, from the layers

FLOPs are counted for convolutions and matrix multiplies (2 per multiply-add, as FlopCounterMode does).
Bytes are a lower bound: each input tensor read once and each output written once. A kernel that reads a
tensor twice, or spills, moves more; the cache may serve some of it. The rules for each operator and layer:
docs/KERNELS.md#the-roofline-by-kernel-class."""

from __future__ import annotations

import ast
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

CONV_FWD = "convolution forward"
CONV_DGRAD = "convolution data-gradient"
CONV_WGRAD = "convolution weight-gradient"
MATMUL = "matrix multiply"
BATCH_NORM = "batch-norm"
ELEMENTWISE = "elementwise and activation"
REDUCTIONS = "reductions and the loss"
OPTIMIZER = "optimizer"
COMPUTE_CLASSES = (CONV_FWD, CONV_DGRAD, CONV_WGRAD, MATMUL)

# The trace's "Input type" of each tensor, in bytes per element.
DTYPE_BYTES = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
}
# Which dense peak bounds a convolution or matrix multiply on these inputs: the highest the dtype can reach.
# fp32 may run on TF32 Tensor Cores (cuDNN's default for convolutions); where TF32 is off, the FP32 peak is
# lower, and the class is nearer its limit than the roofline shows.
PRECISION = {"c10::BFloat16": "bf16", "c10::Half": "bf16", "float": "tf32"}


class Unmodeled(Exception):
    """An operator whose work cannot be read from the trace: the reason says why (never a guess)."""


@dataclass
class OpCall:
    """One cpu_op of a trace, as recorded with record_shapes: its name and the four per-input lists."""

    name: str
    dims: list = field(default_factory=list)
    types: list = field(default_factory=list)
    strides: list = field(default_factory=list)
    concrete: list = field(default_factory=list)


@dataclass
class Part:
    """Work for one kernel class; cls None: the class of the kernels the operator launched (memory-bound work)."""

    cls: str | None
    flops: int
    bytes: int
    precision: str | None = None


def _tensor(op, i):
    """(dims, bytes per element, bytes) of input i, or None where it is not a tensor (a scalar, a list, None)."""
    if i >= len(op.types) or i >= len(op.dims):
        return None
    es = DTYPE_BYTES.get(op.types[i])
    if es is None:
        if op.types[i] in ("", "Scalar", "ScalarList", "GenericList", "TensorList") or not op.types[i]:
            return None
        raise Unmodeled(f"{op.name}: input {i} has a dtype the work model does not know ({op.types[i]!r})")
    dims = list(op.dims[i])
    numel = math.prod(dims)
    strides = op.strides[i] if i < len(op.strides) else None
    if numel and strides and len(strides) == len(dims):  # an expanded tensor (stride 0) spans less memory
        numel = min(numel, 1 + sum((d - 1) * abs(s) for d, s in zip(dims, strides)))
    return dims, es, numel * es


def _tensors(op):
    return [t for i in range(len(op.types)) if (t := _tensor(op, i)) is not None]


def _arg(op, i, default=None):
    """Concrete input i as a Python value ([1, 1], 1, True), or default where it is absent or unreadable."""
    if i >= len(op.concrete) or op.concrete[i] in ("", None):
        return default
    try:
        return ast.literal_eval(op.concrete[i])
    except (ValueError, SyntaxError):
        return default


def _need(op, *indices):
    found = [_tensor(op, i) for i in indices]
    if any(t is None for t in found):
        raise Unmodeled(f"{op.name}: the trace does not give the shapes of its tensor inputs")
    return found


def _precision(op, i):
    return PRECISION.get(op.types[i]) if i < len(op.types) else None


# Where each convolution signature keeps (bias, stride, padding, dilation, transposed, groups); None: not in it.
_CONV_ARGS = {
    "aten::cudnn_convolution": (None, 3, 2, 4, None, 5),
    "aten::convolution": (2, 3, 4, 5, 6, 8),
    "aten::_convolution": (2, 3, 4, 5, 6, 8),
    "aten::conv2d": (2, 3, 4, 5, None, 6),
}


def _conv_forward(op):
    bias_i, stride_i, pad_i, dil_i, trans_i, groups_i = _CONV_ARGS[op.name]
    (x_dims, es, x_bytes), (w_dims, _, w_bytes) = _need(op, 0, 1)
    if (trans_i is not None and _arg(op, trans_i)) or len(x_dims) != len(w_dims) or len(x_dims) < 3:
        raise Unmodeled(f"{op.name}: a transposed or malformed convolution has no work model")
    spatial = len(x_dims) - 2
    stride, pad, dil = (_arg(op, i, [1] * spatial) for i in (stride_i, pad_i, dil_i))
    stride, pad, dil = ([v] * spatial if isinstance(v, int) else v for v in (stride, pad, dil))
    out = [(h + 2 * p - d * (k - 1) - 1) // s + 1 for h, k, s, p, d in zip(x_dims[2:], w_dims[2:], stride, pad, dil)]
    y_numel = x_dims[0] * w_dims[0] * math.prod(out)
    flops = 2 * y_numel * math.prod(w_dims[1:])
    bias = _tensor(op, bias_i) if bias_i is not None else None
    nbytes = x_bytes + w_bytes + y_numel * es + (bias[2] if bias else 0)
    precision = "fp32" if op.name == "aten::cudnn_convolution" and _arg(op, 8) is False else _precision(op, 0)
    return [Part(CONV_FWD, flops, nbytes, precision)]


def _conv_backward(op):
    """convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    output_padding, groups, output_mask): each pass the mask asks for costs what the forward did."""
    (dy_dims, es, dy_bytes), (x_dims, x_es, x_bytes), (w_dims, w_es, w_bytes) = _need(op, 0, 1, 2)
    if _arg(op, 7):
        raise Unmodeled(f"{op.name}: a transposed convolution has no work model")
    mask = _arg(op, 10, [True, True, False])
    flops = 2 * math.prod(dy_dims) * math.prod(w_dims[1:])
    precision = _precision(op, 0)
    parts = []
    if mask[0]:
        parts.append(Part(CONV_DGRAD, flops, dy_bytes + w_bytes + math.prod(x_dims) * x_es, precision))
    if mask[1]:
        parts.append(Part(CONV_WGRAD, flops, dy_bytes + x_bytes + math.prod(w_dims) * w_es, precision))
    if len(mask) > 2 and mask[2]:
        parts.append(Part(None, 0, dy_bytes + dy_dims[1] * es))  # the bias gradient: a sum over dy
    return parts


def _matmul(op):
    """mm(a, b), addmm(bias, a, b), bmm(a, b), baddbmm(bias, a, b): 2 x M x N x K (x batches) FLOPs."""
    first = 1 if op.name in ("aten::addmm", "aten::baddbmm") else 0
    (a_dims, es, a_bytes), (b_dims, _, b_bytes) = _need(op, first, first + 1)
    if len(a_dims) != len(b_dims) or len(a_dims) not in (2, 3) or a_dims[-1] != b_dims[-2]:
        raise Unmodeled(f"{op.name}: shapes {a_dims} x {b_dims} are not a matrix product")
    out = a_dims[:-1] + b_dims[-1:]
    bias = _tensor(op, 0)[2] if first else 0
    flops, nbytes = 2 * math.prod(out) * a_dims[-1], a_bytes + b_bytes + bias + math.prod(out) * es
    return [Part(MATMUL, flops, nbytes, _precision(op, first))]


def _batch_norm(op):
    """Forward: read every tensor input, write the output and, in training, 4 per-channel vectors (the running
    statistics and the saved mean and inverse deviation). Backward: read every input, write the input's gradient
    and the weight's and bias's."""
    tensors = _tensors(op)
    x = _tensor(op, 1 if op.name == "aten::native_batch_norm_backward" else 0)
    if x is None or len(tensors) < 2:
        raise Unmodeled(f"{op.name}: the trace does not give the shapes of its tensor inputs")
    channels = x[0][1] if len(x[0]) > 1 else 1
    vectors = 4 if "backward" not in op.name else 2
    return [Part(None, 0, sum(t[2] for t in tensors) + math.prod(x[0]) * x[1] + vectors * channels * 4)]


_IN_PLACE_WRITE_ONLY = {"aten::fill_", "aten::zero_", "aten::copy_"}
_COMPARISONS = {"aten::eq", "aten::ne", "aten::lt", "aten::le", "aten::gt", "aten::ge", "aten::logical_not"}
ELEMENTWISE_OPS = {
    f"aten::{n}"
    for base in (
        "add sub mul div relu clamp clamp_min clamp_max neg exp log sqrt rsqrt reciprocal abs sign pow sigmoid "
        "tanh hardtanh leaky_relu gelu silu masked_fill addcmul addcdiv lerp maximum minimum where"
    ).split()
    for n in (base, base + "_")
} | {
    "aten::threshold_backward",
    "aten::sigmoid_backward",
    "aten::tanh_backward",
    "aten::gelu_backward",
    "aten::silu_backward",
    "aten::hardtanh_backward",
    "aten::leaky_relu_backward",
    "aten::fill_",
    "aten::zero_",
    "aten::copy_",
    *_COMPARISONS,
}


def _broadcast(shapes):
    out = []
    for dims in shapes:
        pad = [1] * (len(dims) - len(out)) + out
        dims = [1] * (len(out) - len(dims)) + list(dims)
        out = [max(a, b) for a, b in zip(pad, dims)]
    return out


def _elementwise(op):
    """Every tensor input read once, the output written once: in place, the first input is the output (fill_,
    zero_ and copy_ do not read it); else the inputs' broadcast shape, in the first input's dtype (bool for a
    comparison)."""
    indexed = [(i, t) for i in range(len(op.types)) if (t := _tensor(op, i)) is not None]
    if not indexed:
        raise Unmodeled(f"{op.name}: the trace does not give the shapes of its tensor inputs")
    in_place = op.name.endswith("_") and not op.name.endswith("__") and indexed[0][0] == 0
    if in_place:
        read = sum(t[2] for i, t in indexed if not (i == 0 and op.name in _IN_PLACE_WRITE_ONLY))
        return [Part(None, 0, read + indexed[0][1][2])]
    first = indexed[1][1] if op.name == "aten::where" and len(indexed) > 1 else indexed[0][1]
    es = 1 if op.name in _COMPARISONS else first[1]
    return [Part(None, 0, sum(t[2] for _, t in indexed) + math.prod(_broadcast([t[0] for _, t in indexed])) * es)]


def _reduction(op):
    """sum, mean, amax, amin over dims (keepdim or not): read the input, write the reduced output. The softmax
    family writes the input's shape; the loss writes its scalar (forward) or the logits' gradient (backward)."""
    x = _tensor(op, 0)
    if x is None:
        raise Unmodeled(f"{op.name}: the trace does not give the shapes of its tensor inputs")
    reads = sum(t[2] for t in _tensors(op))
    if op.name in ("aten::sum", "aten::mean", "aten::amax", "aten::amin"):
        dims = _arg(op, 1, [])
        dims = [dims] if isinstance(dims, int) else dims
        kept = [d for i, d in enumerate(x[0]) if dims and i not in {k % max(1, len(x[0])) for k in dims}]
        return [Part(None, 0, reads + math.prod(kept) * x[1])]
    if op.name == "aten::nll_loss_forward":
        return [Part(None, 0, reads + 2 * x[1])]
    if op.name == "aten::nll_loss_backward":
        grad = _tensor(op, 1)
        return [Part(None, 0, reads + (grad[2] if grad else 0))]
    return [Part(None, 0, reads + math.prod(x[0]) * x[1])]  # softmax, log_softmax and their backward


_RULES = {
    **{name: _conv_forward for name in _CONV_ARGS},
    "aten::convolution_backward": _conv_backward,
    **{f"aten::{n}": _matmul for n in ("mm", "addmm", "bmm", "baddbmm")},
    **{
        f"aten::{n}": _batch_norm
        for n in (
            "cudnn_batch_norm",
            "native_batch_norm",
            "_native_batch_norm_legit",
            "_native_batch_norm_legit_no_training",
            "cudnn_batch_norm_backward",
            "native_batch_norm_backward",
        )
    },
    **{name: _elementwise for name in ELEMENTWISE_OPS},
    **{
        f"aten::{n}": _reduction
        for n in (
            "sum mean amax amin _softmax _log_softmax _softmax_backward_data _log_softmax_backward_data "
            "nll_loss_forward nll_loss_backward"
        ).split()
    },
}


def op_work(op: OpCall) -> list[Part]:
    """The work of one operator call from its recorded shapes; raises Unmodeled with the reason where the trace
    cannot tell it (no shapes, tensor lists, an operator without a rule)."""
    if op.name.startswith(("aten::_foreach_", "aten::_fused_")):
        raise Unmodeled(
            "tensor lists (the optimizer's foreach and fused kernels): the trace records no shapes for them"
        )
    rule = _RULES.get(op.name)
    if rule is None:
        raise Unmodeled(f"no work model for {op.name}")
    if not op.dims or not op.types:
        raise Unmodeled("no shapes in the trace: profile with record_shapes=True")
    try:
        return rule(op)
    except (TypeError, IndexError, ValueError) as e:  # shapes the rule cannot read: absent with the reason
        raise Unmodeled(f"{op.name}: unreadable shapes ({type(e).__name__}: {e})") from e


def _record_layers(build_model, batch, image_shape):
    """Each leaf module's call on the meta device, in order: (module, input shape, its requires_grad, output shape)."""
    import torch

    with torch.device("meta"):
        model = build_model()
        images = torch.empty(batch, *image_shape)
    model.train()
    calls = []

    def hook(module, inputs, output):
        x = inputs[0] if inputs else None
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else None
        calls.append((module, shape, bool(getattr(x, "requires_grad", False)), tuple(output.shape)))

    handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    try:
        with torch.enable_grad():  # requires_grad tells which convolutions need their input's gradient
            model(images)
    finally:
        for h in handles:
            h.remove()
    return model, calls


def _layer_work(torch, module, x, x_grad, y, act):
    """[(class, flops, bytes)] of one layer's forward and backward, activations act bytes per element."""
    nn = torch.nn
    if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)):
        w = module.weight.numel() * act
        bias = module.bias.numel() * act if module.bias is not None else 0
        k = math.prod(module.weight.shape[1:])  # in_features, or Cin/groups x kernel
        flops = 2 * math.prod(y) * k
        xb, yb = math.prod(x) * act, math.prod(y) * act
        fwd, dgrad, wgrad = (MATMUL,) * 3 if isinstance(module, nn.Linear) else (CONV_FWD, CONV_DGRAD, CONV_WGRAD)
        parts = [(fwd, flops, xb + w + bias + yb), (wgrad, flops, yb + xb + w)]
        if x_grad:  # the first layer's input (the images) needs no gradient
            parts.append((dgrad, flops, yb + w + xb))
        if bias:
            parts.append((REDUCTIONS, 0, yb + bias))  # the bias gradient: a sum over the output's gradient
        return parts
    if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)):
        n = math.prod(x) * act
        # statistics (reductions): forward reads x; backward reads the gradient and x.
        # apply (pointwise, with the ReLU and residual add fused): forward reads x and writes the output;
        # backward reads the gradient and x and writes x's gradient.
        return [(BATCH_NORM, 0, 3 * n), (ELEMENTWISE, 0, 5 * n)]
    if isinstance(module, (nn.AdaptiveAvgPool2d, nn.AvgPool2d, nn.MaxPool2d, nn.AdaptiveMaxPool2d)):
        return [(REDUCTIONS, 0, (math.prod(x) + math.prod(y)) * act)]  # its backward fuses into the next pass
    if isinstance(module, (nn.ReLU, nn.Identity, nn.Flatten)):
        return []  # fused into the batch-norm's passes, or no work
    return None


def model_work(
    build_model: Callable[[], torch.nn.Module],
    batch: int,
    amp: str = "off",
    momentum: float | None = None,
    image_shape: tuple[int, ...] = (3, 32, 32),
) -> dict[str, Any]:
    """The work of one training step of the model at this batch size, by kernel class, from its layers.

    Counted on the meta device (shapes only, as flops.training_flops does). Convolutions and linear layers:
    forward, data-gradient (not for the images) and weight-gradient FLOPs and bytes. Batch norm in training
    (as torch.compile's kernels split it): its statistics are reductions (batch-norm class: 3 passes over its
    input), its normalization with the ReLU is pointwise (elementwise class: 5 passes). Under amp bf16 each
    step casts the weights of convolutions and linear layers to bf16 and their gradients back (12 bytes per
    weight, elementwise). The optimizer reads each parameter and its gradient and writes the parameter, and
    reads and writes a momentum buffer where momentum is known to be > 0 (unknown: not counted, a lower bound).
    The loss reads the logits and targets and writes the logits' gradient. Residual additions are not counted.
    Returns {"classes": {class: {"flops", "bytes"}} per step, "precision" (the peak that bounds the FLOPs),
    "batch_size", "layers" (counted), "layers_not_counted" ({module type: calls}), "parameters"}.
    """
    import torch

    model, calls = _record_layers(build_model, batch, image_shape)
    act = 2 if amp == "bf16" else 4
    work, skipped = {}, {}
    for module, x, x_grad, y in calls:
        parts = _layer_work(torch, module, x, x_grad, y, act) if x is not None else None
        if parts is None:
            skipped[type(module).__name__] = skipped.get(type(module).__name__, 0) + 1
            continue
        for cls, flops, nbytes in parts:
            w = work.setdefault(cls, {"flops": 0, "bytes": 0})
            w["flops"] += flops
            w["bytes"] += nbytes
    cast = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.Linear)  # what autocast runs in bf16
    weights = sum(p.numel() for m in model.modules() if isinstance(m, cast) for p in m.parameters(recurse=False))
    params = sum(p.numel() for p in model.parameters())
    if amp == "bf16":
        work.setdefault(ELEMENTWISE, {"flops": 0, "bytes": 0})["bytes"] += 12 * weights
    work[OPTIMIZER] = {"flops": 0, "bytes": (20 if momentum else 12) * params}
    logits = calls[-1][3] if calls else (batch, 0)
    work.setdefault(REDUCTIONS, {"flops": 0, "bytes": 0})["bytes"] += 2 * math.prod(logits) * act + batch * 8
    return {
        "classes": work,
        "precision": "bf16" if amp == "bf16" else "tf32",
        "batch_size": batch,
        "layers": len(calls) - sum(skipped.values()),
        "layers_not_counted": skipped,
        "parameters": params,
    }
