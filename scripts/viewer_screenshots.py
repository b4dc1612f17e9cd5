"""Screenshots of Polyaxon's own UI over offline runs: the runs page and each run's page.

    python scripts/viewer_screenshots.py .polyaxon-offline OUTDIR            # the runs page, every run's page
    python scripts/viewer_screenshots.py .polyaxon-offline OUTDIR UUID ...   # the runs page, these runs' pages
    python scripts/viewer_screenshots.py --readme .polyaxon-offline OUTDIR UUID ...  # their readmes, images loaded

Starts `haupt viewer --path ROOT` on a free port of 127.0.0.1, opens the pages in headless Chromium
(Debian's `chromium` package) at 1400x1000, writes OUTDIR/runs.png and OUTDIR/run-NAME-UUID8.png, and
stops the viewer and the browser on every way out. A page is shot once its text is there (the run
names on the runs page, the run's name on its page), so a slow machine gives the same pictures.
With --readme it drives Chromium over the DevTools protocol instead: it waits until every image the run's
readme shows has loaded or failed, prints each one's naturalWidth (0: broken), writes OUTDIR/readme-NAME-UUID8.png
(the readme panel at half size) and exits 1 if an image is broken.
Viewer and Browser are what tests/test_viewer.py drives the UI with.
"""

import argparse
import base64
import html
import json
import os
import re
import select
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

    def devtools(self, url):
        """The page open in a live browser, driven over the DevTools protocol (a context manager)."""
        return DevTools(self.binary, url, self.size, self.timeout)


class DevTools:
    """One page in headless Chromium, driven over the DevTools protocol on a pipe (--remote-debugging-pipe:
    the browser reads commands on its fd 3 and answers on fd 4, each message JSON ended by a NUL byte), so no
    package is needed. A context manager: the browser and its profile folder go on every way out.
    errors: the page's uncaught exceptions and console errors, as Chromium reports them."""

    def __init__(self, binary, url, size=(1400, 1000), timeout=120):
        self.binary, self.url, self.size, self.timeout = binary, url, size, timeout
        self.proc = self.profile = None
        self.buf, self.last_id, self.errors = b"", 0, []

    def __enter__(self):
        self.profile = tempfile.mkdtemp(prefix="chromium-profile-")
        to_browser, self.commands = os.pipe()
        self.answers, from_browser = os.pipe()

        def onto_3_and_4():  # in the child, before exec: dup first, so that neither pipe end is overwritten
            read, write = os.dup(to_browser), os.dup(from_browser)
            os.dup2(read, 3)
            os.dup2(write, 4)

        cmd = [self.binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
        cmd += ["--hide-scrollbars", f"--user-data-dir={self.profile}", f"--window-size={self.size[0]},{self.size[1]}"]
        self.proc = subprocess.Popen(
            [*cmd, "--remote-debugging-pipe", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=False,
            preexec_fn=onto_3_and_4,
        )
        os.close(to_browser)
        os.close(from_browser)
        try:
            target = self._send("Target.createTarget", None, url="about:blank")["targetId"]
            self.session = self._send("Target.attachToTarget", None, targetId=target, flatten=True)["sessionId"]
            self.call("Runtime.enable")
            self.call("Page.navigate", url=self.url)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        stop_group(self.proc, grace=5)
        for fd in (getattr(self, "commands", None), getattr(self, "answers", None)):
            if fd is not None:
                os.close(fd)
        self.commands = self.answers = None
        if self.profile:
            shutil.rmtree(self.profile, ignore_errors=True)

    def call(self, method, **params):
        """One command to the page; its result. ViewerError on the browser's error or no answer in time."""
        return self._send(method, self.session, **params)

    def _send(self, method, session, **params):
        self.last_id += 1
        message = {"id": self.last_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self.commands, json.dumps(message).encode() + b"\0")
        deadline = time.time() + self.timeout
        while True:
            while b"\0" in self.buf:
                raw, self.buf = self.buf.split(b"\0", 1)
                answer = json.loads(raw)
                if answer.get("method") == "Runtime.exceptionThrown":
                    details = answer["params"]["exceptionDetails"]
                    self.errors.append((details.get("exception") or {}).get("description") or details.get("text"))
                elif answer.get("method") == "Runtime.consoleAPICalled" and answer["params"]["type"] == "error":
                    said = answer["params"]["args"][:1]
                    self.errors.append(said[0].get("value") or said[0].get("description") if said else "console error")
                if answer.get("id") == self.last_id:
                    if "error" in answer:
                        raise ViewerError(f"Chromium refused {method}: {answer['error'].get('message')}")
                    return answer["result"]
            left = deadline - time.time()
            if left <= 0 or not select.select([self.answers], [], [], left)[0]:
                raise ViewerError(f"Chromium did not answer {method} within {self.timeout} s")
            chunk = os.read(self.answers, 1 << 20)
            if not chunk:
                raise ViewerError(f"Chromium exited before answering {method}")
            self.buf += chunk

    def evaluate(self, expression):
        """A JavaScript expression's value in the page (JSON-like values come back as Python ones)."""
        answer = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in answer:
            raise ViewerError(
                f"the page could not evaluate {expression[:80]}: {answer['exceptionDetails'].get('text')}"
            )
        return answer["result"].get("value")

    def wait_for(self, expression, done, timeout=300):
        """expression's value once done(value) holds; AssertionError with the last value if it never does."""
        deadline, value = time.time() + timeout, None
        while time.time() < deadline:
            value = self.evaluate(expression)
            if done(value):
                return value
            time.sleep(1)
        raise AssertionError(f"{self.url}: after {timeout} s, {expression[:80]} gave {str(value)[:2000]}")

    def screenshot(self, path, selector=None, scale=1.0):
        """A PNG of the page, or of the first element selector finds, whole: the view is made tall enough first."""
        box = None
        if selector:
            find = f"document.querySelector({json.dumps(selector)})"
            height = self.evaluate(
                f"(() => {{ const e = {find}; const r = e.getBoundingClientRect(); return r.bottom; }})()"
            )
            self.call(
                "Emulation.setDeviceMetricsOverride",
                width=self.size[0],
                height=max(self.size[1], int(height) + 40),
                deviceScaleFactor=1,
                mobile=False,
            )
            time.sleep(1)  # the page lays itself out again at the new height
            box = self.evaluate(
                f"(() => {{ const r = {find}.getBoundingClientRect(); "
                "return {x: r.left, y: r.top, width: r.width, height: r.height}; })()"
            )
        clip = dict(box, scale=scale) if box else None
        data = self.call("Page.captureScreenshot", format="png", **({"clip": clip} if clip else {}))["data"]
        write_png(path, base64.b64decode(data))
        return path


def write_png(path, data):
    """The bytes to a temp file beside path, then renamed onto it."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial = f"{path}.partial-{os.getpid()}"
    with open(partial, "wb") as f:
        f.write(data)
    os.replace(partial, path)


def page_text(dom):
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S | re.I)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", dom)).split())


# Every image of the page: its src as written, whether it finished loading, and its width in pixels (0 if broken).
IMAGES = (
    "Array.from(document.images).map((i) => ({src: i.getAttribute('src'), complete: i.complete, "
    "width: i.naturalWidth}))"
)
README = ".puiMarkdownFormat"  # the readme panel of Polyaxon 2.18's run page (for the screenshot's frame only)


def readme_image_urls(readme):
    """The URLs of the Markdown images a readme holds, in order."""
    return re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", readme or "")


def readme_images(viewer, run_uuid, browser=None, png=None, timeout=300):
    """{url: naturalWidth} of each image the run's readme names, as the UI's page in Chromium loaded it (0: broken);
    with png, a picture of the readme panel there. ViewerError when the readme names no image."""
    readme = viewer.api(f"{OWNER}/{PROJECT}/runs/{run_uuid}/").get("readme")
    urls = readme_image_urls(readme)
    if not urls:
        raise ViewerError(f"run {run_uuid}'s readme shows no image (a profile run's readme shows its step pictures)")
    browser = browser or Browser()
    with browser.devtools(viewer.page(run_uuid)) as page:

        def settled(images):
            done = {i["src"] for i in images or [] if i["complete"]}
            return set(urls) <= done

        images = page.wait_for(IMAGES, settled, timeout)
        if png:
            page.screenshot(png, README if page.evaluate(f"!!document.querySelector('{README}')") else None, 0.5)
    widths = {i["src"]: i["width"] for i in images}
    return {u: widths[u] for u in urls}


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


def chosen_runs(root, uuids):
    """[(uuid, name)]: the given runs, or every run under root; ViewerError for an unknown uuid."""
    runs = offline_runs(root)
    if uuids:
        known = dict(runs)
        unknown = [u for u in uuids if u not in known]
        if unknown:
            raise ViewerError(f"no run {', '.join(unknown)} under {os.path.join(root, 'runs')}")
        runs = [(u, known[u]) for u in uuids]
    return runs


def png_name(prefix, name, uuid):
    return f"{prefix}-{re.sub(r'[^A-Za-z0-9_.=-]+', '-', name)}-{uuid[:8]}.png"


def shoot_readmes(root, outdir, uuids, browser=None):
    """Each run's readme panel as OUTDIR/readme-NAME-UUID8.png (half size), once its images loaded; the lines
    to print (a path, then each image's width and URL) and whether every image loaded."""
    runs = chosen_runs(root, uuids)
    browser = browser or Browser()
    lines, loaded = [], True
    with Viewer(root) as viewer:
        for uuid, name in runs:
            png = os.path.join(outdir, png_name("readme", name, uuid))
            widths = readme_images(viewer, uuid, browser, png)
            lines.append(png)
            lines += [f"  {'loaded' if w > 0 else 'BROKEN'} naturalWidth={w} {url}" for url, w in widths.items()]
            loaded = loaded and all(w > 0 for w in widths.values())
    return lines, loaded


def shoot(root, outdir, uuids=None, browser=None):
    """The runs page and each run's page as PNGs under outdir; their paths."""
    runs = chosen_runs(root, uuids)
    browser = browser or Browser()
    os.makedirs(outdir, exist_ok=True)
    paths = []
    with Viewer(root) as viewer:
        browser.wait_for(viewer.page(), [name for _, name in runs])
        paths.append(browser.screenshot(viewer.page(), os.path.join(outdir, "runs.png")))
        for uuid, name in runs:
            browser.wait_for(viewer.page(uuid), [name])
            paths.append(browser.screenshot(viewer.page(uuid), os.path.join(outdir, png_name("run", name, uuid))))
    return paths


def main(argv=None):
    p = argparse.ArgumentParser(prog="viewer_screenshots.py", description=__doc__.split("\n")[0])
    p.add_argument("root", help="the offline root (POLYAXON_OFFLINE_ROOT, e.g. .polyaxon-offline)")
    p.add_argument("outdir", help="where the PNGs go (made if missing)")
    p.add_argument("uuids", nargs="*", help="the runs whose pages to shoot (default: every run)")
    p.add_argument(
        "--readme",
        action="store_true",
        help="shoot each run's readme panel instead, once the images it shows loaded; exit 1 if one is broken",
    )
    args = p.parse_args(argv)
    if not os.path.isdir(args.root):
        p.error(f"{args.root} is not a folder")
    try:
        if args.readme:
            lines, loaded = shoot_readmes(args.root, args.outdir, args.uuids)
            print("\n".join(lines))
            return 0 if loaded else 1
        for path in shoot(args.root, args.outdir, args.uuids):
            print(path)
    except ViewerError as e:
        print(f"viewer_screenshots.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
