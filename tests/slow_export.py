"""train.py with each profiler trace export slowed, so that a test can signal the process mid-export.

python tests/slow_export.py SECONDS [train.py flags...]
"""

import os
import runpy
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's steplens

from steplens.job import capture  # noqa: E402

seconds = float(sys.argv.pop(1))
export = capture.TraceWriter.__call__


def slowed(self, prof):
    if self.skip():  # a stop was asked for before the export: skipped, as without the slow-down
        return export(self, prof)
    print("profile: writing a trace (slowed for a test)", file=sys.stderr, flush=True)
    time.sleep(seconds)
    # A signal that came during the pause finds the export under way: it completes, as a real slow export would.
    skip, self.skip = self.skip, lambda: False
    try:
        return export(self, prof)
    finally:
        self.skip = skip


capture.TraceWriter.__call__ = slowed

train = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "train.py")
sys.argv[0] = train
runpy.run_path(train, run_name="__main__")  # train.py's own entry point, its second-signal exit included
