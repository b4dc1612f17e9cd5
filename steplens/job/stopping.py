"""Stop requests: SIGTERM (Kubernetes, `polyaxon ops stop`) and SIGINT (Ctrl-C) end a run at the next step boundary."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequested(BaseException):
    """Raised at a step boundary after a stop signal (or at once during start-up, or on a second signal).

    A BaseException, like KeyboardInterrupt, so that no `except Exception` on the way swallows it.
    """

    def __init__(self, signum: int, phase: str, steps_done: int):
        self.signum, self.phase, self.steps_done = signum, phase, steps_done
        self.signal_name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.signal_name} during {phase}, {steps_done} steps completed in it")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention for a process ended by a signal


class Stopper:
    """Installs the handlers; the step loops call boundary() after each step.

    During start-up and between phases a signal stops the run at once; inside a phase (steps(...))
    it only sets a flag, so the step in flight, and a trace being written, complete first.
    A second signal stops at once wherever the run is.
    """

    def __init__(self):
        self.signum, self.pid = None, os.getpid()
        self.phase, self.steps_done, self.in_steps = "start-up", 0, False
        for s in SIGNALS:
            signal.signal(s, self._handle)

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum, frame):
        if os.getpid() != self.pid:
            # A forked DataLoader worker. Ctrl-C reaches the whole process group: the worker ignores it and
            # keeps serving batches until the parent shuts it down at the boundary. SIGTERM (how the parent's
            # shutdown ends a slow worker) keeps its default: the worker ends.
            if signum == signal.SIGINT:
                signal.signal(signum, signal.SIG_IGN)
                return
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        first = self.signum is None
        self.signum = signum
        if not first or not self.in_steps:
            raise StopRequested(signum, self.phase, self.steps_done)

    @contextmanager
    def steps(self, phase: str) -> Iterator[Stopper]:
        """A phase of steps (warm-up, profile, bench): signals wait for the next boundary()."""
        self.phase, self.steps_done, self.in_steps = phase, 0, True
        try:
            self.boundary()  # a signal that came between phases
            yield self
        finally:
            self.in_steps = False

    def boundary(self) -> None:
        """A step boundary: raise if a stop was asked for."""
        if self.signum is not None:
            raise StopRequested(self.signum, self.phase, self.steps_done)

    def step_done(self) -> None:
        self.steps_done += 1
        self.boundary()
