"""A fork server for the tests' train.py runs: torch and torchvision are imported once, each run is a fork.

A TINY bench run costs about 15 s of CPU on the 2-CPU CI machine, 6-7 s of it importing torch and torchvision.
This server imports them once per test process, then forks a child per run that becomes `python train.py ARGS`:
its own argv, environment, working folder, stdout and stderr (the client's files, passed over a Unix socket), a
fresh __main__ run by runpy, and Python's own exit (atexit handlers, so Polyaxon's tracking ends the run as it does
in a fresh process). Only what reads no environment at import time is imported ahead: polyaxon reads its settings
(POLYAXON_OFFLINE_ROOT, a different folder per test) when imported, so each run imports it itself.

    server:  python tests/trainfork.py SOCKET PARENT_PID     (prints "ready" once it listens)
    client:  trainfork.Client(...).run(argv, env, cwd, timeout) -> subprocess.CompletedProcess

Each connection is one run. The server forks a waiter for it, the waiter forks the run and sends back the run's
pid, then its wait status; the server reaps its waiters and leaves when its parent (the test process) is gone.
"""

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

# Read at import time by torch (its thread pools), the C library or Python itself: a run whose environment gives
# any of these another value than the server's runs as a fresh process instead.
IMPORT_TIME_ENV = (
    *("OMP_", "MKL_", "KMP_", "GOMP_", "TORCH", "PYTORCH", "CUDA", "NVIDIA", "LD_", "PYTHON", "MALLOC"),
    *("LANG", "LC_", "TZ", "HOME", "TMPDIR"),
)


def import_time_env(env):
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV)}


# --------------------------------------------------------------------------- server


def serve(path, parent):
    import torch  # noqa: F401
    import torchvision  # noqa: F401

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    listener.settimeout(1.0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the waiters are reaped by the kernel
    print("ready", flush=True)
    while os.getppid() == parent:
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            continue
        if os.fork() == 0:
            try:  # never back into this loop: one server only
                listener.close()
                wait_for_run(conn)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(1)
        conn.close()


def receive(conn):
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 2)
    while not data.endswith(b"\n"):
        more = conn.recv(1 << 16)
        if not more:
            raise EOFError("the client left before its request was whole")
        data += more
    return json.loads(data), fds


def wait_for_run(conn):
    """In the waiter: fork the run, send its pid, then its wait status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    conn.settimeout(None)
    request, fds = receive(conn)
    pid = os.fork()
    if pid == 0:
        conn.close()
        become(request, fds)  # never returns
    for fd in fds:
        os.close(fd)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    _, status = os.waitpid(pid, 0)
    conn.sendall(json.dumps({"status": status}).encode() + b"\n")
    os._exit(0)


def become(request, fds):
    """In the run's process: take the client's argv, environment, folder and files, run the script as __main__,
    then exit as a fresh interpreter would."""
    os.setpgid(0, 0)  # its own group: a client past its timeout kills the run and its loader workers together
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in (devnull, *fds):
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    script = os.path.abspath(request["argv"][0])
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(script)
    import runpy

    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = exit_code(e.code)
    except BaseException as e:
        tb = e.__traceback__  # from the script's own frame on, as a fresh interpreter prints it
        while tb is not None and tb.tb_frame.f_code.co_filename != script:
            tb = tb.tb_next
        e = e.with_traceback(tb or e.__traceback__)
        sys.excepthook(type(e), e, e.__traceback__)
        code = -signal.SIGINT if isinstance(e, KeyboardInterrupt) else 1
    leave(code)


def exit_code(code):
    """What Python's exit makes of SystemExit(code): None is 0, a number itself, anything else printed, then 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def leave(code):
    """Python's exit in its own order (the non-daemon threads joined, then the atexit handlers, then the streams
    flushed), without its last step, the teardown of every module: with torch loaded that takes 1.5 s, and a fresh
    train.py refused before importing torch never pays it."""
    import atexit
    import threading

    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if code == -signal.SIGINT:  # as Python ends on a KeyboardInterrupt: killed by the signal itself
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


# --------------------------------------------------------------------------- client


class Client:
    """Starts the server on first use (with env: the environment every run it serves must share at import time)."""

    def __init__(self, env):
        self.env = dict(env)
        self.folder = tempfile.mkdtemp(prefix="trainfork-")
        self.path = os.path.join(self.folder, "socket")
        self.server = None

    def start(self):
        with open(os.path.join(self.folder, "server.log"), "wb") as log:
            self.server = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), self.path, str(os.getpid())],
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        line = self.server.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"the fork server did not start: see {self.folder}/server.log")

    def serves(self, env):
        return import_time_env(env) == import_time_env(self.env)

    def popen(self, argv, env, cwd, stdout, stderr):
        """A run with its output to these writable file descriptors (closed here once sent)."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if self.server is None:
                self.start()
            conn.connect(self.path)
            request = {"argv": [str(a) for a in argv], "env": dict(env), "cwd": str(cwd)}
            socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [stdout, stderr])
            return Forked(conn, [sys.executable, *argv])
        except BaseException:
            conn.close()
            raise
        finally:
            os.close(stdout)
            os.close(stderr)

    def run(self, argv, env, cwd, timeout):
        """As subprocess.run(capture_output=True, text=True, timeout=timeout)."""
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = self.popen(argv, env, cwd, os.dup(out.fileno()), os.dup(err.fileno()))
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise subprocess.TimeoutExpired(proc.args, timeout, read(out), read(err)) from None
            finally:
                proc.close()
            return subprocess.CompletedProcess(proc.args, proc.returncode, read(out), read(err))

    def stop(self):
        if self.server is not None and self.server.poll() is None:
            self.server.terminate()
            self.server.wait(timeout=30)
        shutil.rmtree(self.folder, ignore_errors=True)


class Forked:
    """A run the server forked, as much of subprocess.Popen as the tests use: pid, send_signal, kill, poll,
    wait, returncode (the run's exit status, negative for a signal, as Popen's)."""

    def __init__(self, conn, args):
        self.args, self.conn, self.buffer, self.returncode = args, conn, b"", None
        self.stdout = self.stderr = None
        self.pid = json.loads(self.line(None))["pid"]

    def line(self, timeout):
        """The server's next line; None where none came within timeout seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.conn], [], [], left)[0]:
                return None
            more = self.conn.recv(1 << 16)
            if not more:
                raise RuntimeError("the fork server's waiter left without the run's status")
            self.buffer += more
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line

    def poll(self):
        return self.wait(0, quiet=True)

    def wait(self, timeout=None, quiet=False):
        if self.returncode is None:
            line = self.line(timeout)
            if line is None:
                if quiet:
                    return None
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = os.waitstatus_to_exitcode(json.loads(line)["status"])
            self.close()
        return self.returncode

    def send_signal(self, signum):
        if self.returncode is None:
            os.kill(self.pid, signum)

    def kill(self):
        """The run and its loader workers (its process group)."""
        if self.returncode is None:
            kill_group(self.pid)

    def close(self):
        self.conn.close()


def kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def read(f):
    """As subprocess.run(text=True) reads: decoded, with universal newlines."""
    f.seek(0)
    return f.read().decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
