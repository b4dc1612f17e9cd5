"""--cuda-graph: the whole step captured once as CUDA graphs (one per scope), replayed every step, and timed alone."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from steplens.scopes import FORWARD_BACKWARD, NEXT_BATCH, OPTIMIZER, TO_DEVICE

if TYPE_CHECKING:
    import torch

    from steplens.speedups.gpu_input import DeviceBatches


class CapturedStep:
    """Each scope's GPU work captured once; calling the object replays the graphs inside the four scopes.

    One graph per scope, so the four scopes stay in the trace, each around its replay; the graphs
    share one memory pool and replay in capture order. Static buffers: the batch, the loss, the
    gradients and the optimizer state keep their addresses from one replay to the next. The
    augmentation's generator is registered with the batch graph, so every replay draws new numbers.
    What a replay hides from the trace: the per-operator CPU launches (one cudaGraphLaunch per
    scope instead) and the epoch turnover, which stays on the host, outside the graphs.
    """

    def __init__(
        self,
        device: torch.device,
        eager_step: Callable[[], torch.Tensor],
        batches: DeviceBatches,
        model: torch.nn.Module,
        criterion: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        memory_format: torch.memory_format,
        autocast: Callable[[], AbstractContextManager[Any]],
        channels_last: bool,
    ):
        import torch

        self.torch, self.device, self.eager_step, self.batches = torch, device, eager_step, batches
        self.model, self.criterion, self.optimizer = model, criterion, optimizer
        self.memory_format, self.autocast, self.channels_last = memory_format, autocast, channels_last
        self.graphs = {}
        self.loss = None
        self.info = None

    def warm_up(self, steps: int, lap: Callable[[], None]) -> None:
        """steps - 1 eager steps on a side stream (as torch.cuda.graph's docs ask before a capture), the
        capture, then the first replay as the last warm-up step; lap() after each step."""
        torch = self.torch
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(steps - 1):
                self.eager_step()
                lap()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.capture()
        self()
        lap()

    def _capture(self, scope, work, generators=()):
        graph = self.torch.cuda.CUDAGraph()
        for generator in generators:
            graph.register_generator_state(generator)
        with self.torch.cuda.graph(graph, pool=self.pool):
            result = work()
        self.graphs[scope] = graph
        return result

    def capture(self) -> None:
        torch, batches = self.torch, self.batches
        self.pool = torch.cuda.graph_pool_handle()
        t0 = time.perf_counter()
        batches.sync_cursor()
        images, targets = self._capture(NEXT_BATCH, batches.assemble_at_cursor, [batches.generator])
        if self.channels_last:  # the only device work of input/to_device when the batch is born on the device
            images = self._capture(TO_DEVICE, lambda: images.contiguous(memory_format=self.memory_format))
        # Gradients set to None before the capture are allocated inside it: every replay writes them anew.
        self.optimizer.zero_grad(set_to_none=True)

        def forward_backward():
            with self.autocast():
                loss = self.criterion(self.model(images), targets)
            loss.backward()
            return loss

        self.loss = self._capture(FORWARD_BACKWARD, forward_backward)
        self._capture(OPTIMIZER, self.optimizer.step)
        self.info = {"seconds": round(time.perf_counter() - t0, 3), "graphs": list(self.graphs)}

    def __call__(self):
        from torch.profiler import record_function

        with record_function(NEXT_BATCH):
            self.batches.advance()
            self.graphs[NEXT_BATCH].replay()
        with record_function(TO_DEVICE):
            if TO_DEVICE in self.graphs:
                self.graphs[TO_DEVICE].replay()
        with record_function(FORWARD_BACKWARD):
            self.graphs[FORWARD_BACKWARD].replay()
        with record_function(OPTIMIZER):
            self.graphs[OPTIMIZER].replay()
        return self.loss  # the same static tensor at every replay: bench mode copies it on the device at once

    def replay_all(self) -> None:
        """One step without scopes: what gpu_time_per_step queues."""
        self.batches.advance()
        for graph in self.graphs.values():
            graph.replay()

    def gpu_bound(self, samples_per_sec: float, batch_size: int) -> dict[str, Any]:
        """The graphs' GPU time per step (gpu_time_per_step) and the GPU-bound share: the window's rate
        (samples_per_sec) over the rate the step's own GPU time allows. Near 1 the step is GPU-bound; it
        says nothing of how close the GPU runs to its arithmetic peak (that is MFU)."""
        gpu = self.gpu_time_per_step()
        if gpu["gpu_ms_per_step"] is not None:
            gpu["gpu_time_samples_per_sec"] = batch_size / (gpu["gpu_ms_per_step"] / 1000)
            gpu["gpu_bound_share"] = samples_per_sec / gpu["gpu_time_samples_per_sec"]
        return gpu

    def gpu_time_per_step(self, steps: int = 50, head_start_cycles: int = 200_000_000) -> dict[str, Any]:
        """The graphs' own GPU time per step, with the host out of the way.

        A GPU-side sleep holds the stream while the host queues the replays; CUDA events time them back to
        back. The host may fall behind (a long queue blocks cudaGraphLaunch until the GPU drains it): an
        event after each replay shows it. Before queueing replay k the host asks whether replay k-1 has
        already finished; if it has, the GPU waited for the host and the time is not the GPU's own: the
        figure is then None with the reason. These replays train on: call it after any measured window.
        """
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        torch.cuda._sleep(head_start_cycles)  # about 0.1 s at 2 GHz: the host gets ahead before the GPU starts
        start.record()
        done, gpu_waited = None, 0
        for _ in range(steps):
            if done is not None and done.query():  # the previous replay is over before this one is queued
                gpu_waited += 1
            self.replay_all()
            done = torch.cuda.Event()
            done.record()
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end) / steps
        out = {"gpu_ms_per_step": ms, "replayed_steps": steps, "replays_the_gpu_waited_for": gpu_waited, "note": None}
        if gpu_waited:
            out.update(
                gpu_ms_per_step=None,
                measured_ms_per_step=ms,
                note=f"the GPU waited for the host before {gpu_waited} of {steps} replays: the time "
                "includes host time, not the graphs' own",
            )
        return out
