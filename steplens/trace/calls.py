"""The names a trace's events are sorted by: its GPU categories, the runtime calls that launch, copy or wait;
and the slack of the exported times."""

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
CAPTURE_CAT = "Trace"  # the profiler's span of its capture, "PyTorch Profiler (0)"


CPU_SLICE_CATS = ("user_annotation", "cpu_op", "python_function", "cuda_runtime", "cuda_driver")


LAUNCH_CALLS = {
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cudaLaunchCooperativeKernel",
    "cudaGraphLaunch",
    "cuGraphLaunch",
    # ROCm: torch.profiler writes the HIP runtime's names in the same categories
    "hipLaunchKernel",
    "hipExtLaunchKernel",
    "hipModuleLaunchKernel",
    "hipExtModuleLaunchKernel",
    "hipLaunchCooperativeKernel",
    "hipGraphLaunch",
}


# The runtime calls that put work on the GPU: each one's correlation id should reappear on a GPU event.
WORK_CALLS = LAUNCH_CALLS | {
    "cudaMemcpyAsync",
    "cudaMemsetAsync",
    "cudaMemcpy",
    "cudaMemset",
    "cudaMemcpy2DAsync",
    "cuMemcpyAsync",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemsetD8Async",
    "cuMemsetD32Async",
    "hipMemcpyAsync",
    "hipMemcpyWithStream",
    "hipMemcpy",
    "hipMemsetAsync",
    "hipMemset",
    "hipMemcpy2DAsync",
}


# The work calls that copy memory (their GPU record says the direction) and those that set it.
COPY_CALLS = {n for n in WORK_CALLS if "Memcpy" in n}
MEMSET_CALLS = {n for n in WORK_CALLS if "Memset" in n}


GRAPH_LAUNCH_CALLS = {"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"}


SYNC_CALLS = {
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "cuStreamSynchronize",
    "cuCtxSynchronize",
    "cuEventSynchronize",
    "cuMemcpyDtoH_v2",
    "cuMemcpyHtoD_v2",
    "hipStreamSynchronize",
    "hipDeviceSynchronize",
    "hipEventSynchronize",
    "hipMemcpy",
}


# Copies that block the host until they are done, whatever their direction: a device-to-host one is a sync (ROCm's
# .item() is a hipMemcpyWithStream, with no hipStreamSynchronize after it); a host-to-device one, a copy.
BLOCKING_COPY_CALLS = {"cudaMemcpy", "hipMemcpy", "hipMemcpyWithStream", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2"}


# The CPU operators that wait for the GPU to hand a value to the host: named as a sync's origin.
SYNC_OPS = {
    "aten::item",
    "aten::_local_scalar_dense",
    "aten::is_nonzero",
    "aten::nonzero",
    "aten::equal",
    "aten::masked_select",
    "aten::unique",
    "aten::_unique2",
    "aten::tolist",
    "aten::allclose",
    "aten::any",
    "aten::all",
}

STEP_SLACK_US = 1e-3  # exported timestamps are rounded to ns: a step may end a hair after the next one starts
