"""Screenshots of Polyaxon's own UI over offline runs: the runs page and each run's page.

    python scripts/viewer_screenshots.py .polyaxon-offline OUTDIR            # the runs page, every run's page
    python scripts/viewer_screenshots.py .polyaxon-offline OUTDIR UUID ...   # the runs page, these runs' pages

Starts `haupt viewer --path ROOT` on a free port of 127.0.0.1, opens the pages in headless Chromium
(Debian's `chromium` package) at 1400x1000, writes OUTDIR/runs.png and OUTDIR/run-NAME-UUID8.png, and
stops the viewer and the browser on every way out. A page is shot once its text is there (the run
names on the runs page, the run's name on its page), so a slow machine gives the same pictures.
Viewer and Browser are what tests/test_viewer.py drives the UI with.
"""

import argparse
import html
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from steplens.polyaxonenv import OWNER, PROJECT  # the local runs' owner and project

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


class ViewerError(Exception):
    """A problem the user can fix (no runs, no browser, a viewer that will not start); one line."""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_group(proc, grace=20):
    """SIGTERM to a process started as its own process group, and all its children, SIGKILL after grace seconds."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace)
    except ProcessLookupError:
        pass


class Viewer:
    """`haupt viewer --path ROOT` on 127.0.0.1 with its own Polyaxon home; a context manager that stops it."""

    def __init__(self, root, timeout=240):
        self.root = os.path.abspath(root)
        self.timeout = timeout
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = self.home = None

    def __enter__(self):
        haupt = os.path.join(os.path.dirname(sys.executable), "haupt")
        if not os.path.exists(haupt):
            raise ViewerError(f"no haupt beside {sys.executable}: pip install -r requirements-dev.txt")
        self.home = tempfile.mkdtemp(prefix="viewer-home-")
        env = {k: v for k, v in os.environ.items() if not k.startswith("POLYAXON_")}
        # HOME too: the client keeps a cache under ~/.polyaxon whatever POLYAXON_HOME says.
        env.update(
            HOME=self.home,
            POLYAXON_HOME=self.home,
            POLYAXON_UI_OFFLINE="true",
            POLYAXON_UI_IN_SANDBOX="true",
            POLYAXON_DISABLE_ERRORS_REPORTING="true",
        )
        self.log = open(os.path.join(self.home, "viewer.log"), "w+")
        self.proc = subprocess.Popen(
            [haupt, "viewer", "--host", "127.0.0.1", "--port", str(self.port), "--path", self.root],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            self._wait()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait(self):
        deadline = time.time() + self.timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise ViewerError(f"haupt viewer exited ({self.proc.returncode}): {self.log.read()[-2000:]}")
            try:
                self.api(f"{OWNER}/projects/list")
                return
            except OSError:
                time.sleep(0.5)
        raise ViewerError(f"haupt viewer did not answer on {self.url} in {self.timeout}s")

    def __exit__(self, *exc):
        stop_group(self.proc)
        if self.proc is not None:
            self.log.close()
        if self.home:
            shutil.rmtree(self.home, ignore_errors=True)

    def api(self, path, timeout=30):
        """GET /api/v1/PATH (or /streams/v1/... when PATH starts with "streams/"), as JSON."""
        prefix = "/" if path.startswith("streams/") else "/api/v1/"
        with urllib.request.urlopen(self.url + prefix + path, timeout=timeout) as r:
            return json.loads(r.read())

    def page(self, run_uuid=None):
        """The UI's runs page of the project, or one run's page."""
        return f"{self.url}/ui/{OWNER}/{PROJECT}/runs" + (f"/{run_uuid}" if run_uuid else "")


def find_browser():
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    raise ViewerError("no Chromium found (looked for " + ", ".join(BROWSERS) + "): apt-get install -y chromium")


class Browser:
    """Headless Chromium, one process per page, each in its own process group and profile folder."""

    def __init__(self, binary=None, size=(1400, 1000), budget_ms=20000, timeout=120):
        self.binary = binary or find_browser()
        self.size, self.budget_ms, self.timeout = size, budget_ms, timeout

    def _run(self, url, *what):
        profile = tempfile.mkdtemp(prefix="chromium-profile-")
        cmd = [
            self.binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--window-size={self.size[0]},{self.size[1]}",
            # virtual time runs on while the page's scripts and requests finish, up to the budget
            f"--virtual-time-budget={self.budget_ms}",
            *what,
            url,
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=self.timeout)
            return out.decode("utf-8", "replace")
        except subprocess.TimeoutExpired:
            return ""
        finally:
            stop_group(proc, grace=5)
            shutil.rmtree(profile, ignore_errors=True)

    def text(self, url):
        """The rendered page's visible text, on one line (the DOM after the page's scripts ran)."""
        return page_text(self._run(url, "--dump-dom"))

    def wait_for(self, url, wanted, timeout=300):
        """The page's text once every string in wanted shows in it; AssertionError with the last text if not."""
        deadline, text = time.time() + timeout, ""
        while time.time() < deadline:
            text = self.text(url)
            if all(w in text for w in wanted):
                return text
            time.sleep(2)
        missing = [w for w in wanted if w not in text]
        raise AssertionError(f"{url} never showed {missing}; its text was: {text[:3000]}")

    def screenshot(self, url, path):
        self._run(url, f"--screenshot={os.path.abspath(path)}")
        if not os.path.isfile(path):
            raise ViewerError(f"Chromium wrote no screenshot of {url}")
        return path


def page_text(dom):
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S | re.I)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", dom)).split())


def offline_runs(root):
    """[(uuid, name)] of the runs under ROOT/runs, oldest first; ViewerError when there are none."""
    runs = []
    folder = os.path.join(root, "runs")
    for uuid in os.listdir(folder) if os.path.isdir(folder) else []:
        try:
            with open(os.path.join(folder, uuid, "run.plx.json")) as f:
                run = json.load(f)
        except (OSError, ValueError):
            continue
        runs.append((run.get("created_at") or "", uuid, run.get("name") or uuid))
    if not runs:
        raise ViewerError(f"no offline runs under {folder} (run train.py first, or give the offline root)")
    return [(uuid, name) for _, uuid, name in sorted(runs)]


def shoot(root, outdir, uuids=None, browser=None):
    """The runs page and each run's page as PNGs under outdir; their paths."""
    runs = offline_runs(root)
    if uuids:
        known = dict(runs)
        unknown = [u for u in uuids if u not in known]
        if unknown:
            raise ViewerError(f"no run {', '.join(unknown)} under {os.path.join(root, 'runs')}")
        runs = [(u, known[u]) for u in uuids]
    browser = browser or Browser()
    os.makedirs(outdir, exist_ok=True)
    paths = []
    with Viewer(root) as viewer:
        browser.wait_for(viewer.page(), [name for _, name in runs])
        paths.append(browser.screenshot(viewer.page(), os.path.join(outdir, "runs.png")))
        for uuid, name in runs:
            browser.wait_for(viewer.page(uuid), [name])
            safe = re.sub(r"[^A-Za-z0-9_.=-]+", "-", name)
            paths.append(browser.screenshot(viewer.page(uuid), os.path.join(outdir, f"run-{safe}-{uuid[:8]}.png")))
    return paths


def main(argv=None):
    p = argparse.ArgumentParser(prog="viewer_screenshots.py", description=__doc__.split("\n")[0])
    p.add_argument("root", help="the offline root (POLYAXON_OFFLINE_ROOT, e.g. .polyaxon-offline)")
    p.add_argument("outdir", help="where the PNGs go (made if missing)")
    p.add_argument("uuids", nargs="*", help="the runs whose pages to shoot (default: every run)")
    args = p.parse_args(argv)
    if not os.path.isdir(args.root):
        p.error(f"{args.root} is not a folder")
    try:
        for path in shoot(args.root, args.outdir, args.uuids):
            print(path)
    except ViewerError as e:
        print(f"viewer_screenshots.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
