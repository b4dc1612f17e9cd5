"""A fork server for the tests' train.py runs: torch and torchvision are imported once, each run is a fork.

A TINY bench run cost about 15 s of CPU on the 2-CPU development VM (2026-12-07), 6-7 s of it importing torch
and torchvision. This server imports them once per test process, then forks a child per run that becomes
`python SCRIPT ARGS`: its own argv, environment, working folder, stdout and stderr (the client's pipes, passed
over a Unix socket), the script run as a fresh __main__ module, and Python's exit in Python's order: the
non-daemon threads joined, the atexit handlers (Polyaxon's tracking ends its run there), the script's globals
freed (when no other thread is left) and collected, the streams flushed. What it skips: the teardown of every
other module (with torch loaded, 1.5 s more for a run refused at its flags) and the C library's exit handlers.
Polyaxon is not imported ahead: it reads its settings (POLYAXON_OFFLINE_ROOT, a different folder per test) when
it loads.

    server:  python tests/trainfork.py SOCKET PARENT_PID     (prints "ready" once it listens)
    client:  Client(env).run(argv, env, cwd, timeout) -> subprocess.CompletedProcess; .popen(...) -> Forked

Each connection is one run. The server forks a waiter for it; the waiter forks the run, puts it in its own process
group, sends back its pid, then its wait status. A client that goes away (EOF) takes the run's group with it; a
SIGINT or SIGTERM to the waiter (Ctrl-C on the suite) is passed on to the run's group. The server leaves, and
removes its socket's folder, once its parent (the test process) is gone.
"""

import json
import locale
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

# What may differ from one run to the next: read when the run asks for it, never when torch or Python load. Any
# other variable with another value than the server's (OMP_NUM_THREADS, PYTHONHASHSEED, LANG, TMPDIR, ...) makes
# the run a fresh process.
PER_RUN_ENV = ("POLYAXON_", "STEPLENS_", "PYTEST_", "MASTER_", "TRAINFORK_TEST")
PER_RUN_KEYS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "COLUMNS"}
PER_RUN_KEYS |= {k for name in ("http_proxy", "https_proxy", "no_proxy") for k in (name, name.upper())}


def fixed_env(env):
    return {k: v for k, v in env.items() if not (k.startswith(PER_RUN_ENV) or k in PER_RUN_KEYS)}


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
    try:
        while os.getppid() == parent:
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            if os.fork() == 0:
                try:  # never back into this loop: one server only
                    listener.close()
                    wait_for_run(conn)
                except ConnectionError:  # the client went away: its run is gone too
                    pass
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(1)
            conn.close()
    finally:
        folder = os.path.dirname(path)
        shutil.rmtree(folder, ignore_errors=True)
        if os.path.exists(folder + ".log") and os.path.getsize(folder + ".log") == 0:  # Client.start's log
            os.remove(folder + ".log")


def receive(conn):
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 2)
    while not data.endswith(b"\n"):
        more = conn.recv(1 << 16)
        if not more:
            raise EOFError("the client left before its request was whole")
        data += more
    return json.loads(data), fds


def wait_for_run(conn):
    """In the waiter: fork the run, send its pid, watch the run and the client, send the run's wait status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    conn.settimeout(None)
    request, fds = receive(conn)
    stops = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)  # until the waiter's handlers are in place
    pid = os.fork()
    if pid == 0:
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
            conn.close()
            os.setpgid(0, 0)
            become(request, fds)  # leaves through os._exit
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(1)
    try:
        os.setpgid(pid, pid)  # here too: the group exists before the client can signal it
        for signum in stops:  # Ctrl-C on the suite reaches the waiter: pass it on
            signal.signal(signum, lambda s, _: kill_group(pid, s))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
        for fd in fds:
            os.close(fd)
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        status = watch(conn, pid)
    except BaseException:  # the client went away (or the waiter failed): the run goes too
        kill_group(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    conn.sendall(json.dumps({"status": status}).encode() + b"\n")


def watch(conn, pid):
    """The run's wait status once it ends; ConnectionError once the client has gone (its socket's end)."""
    try:
        run = [os.pidfd_open(pid)]  # readable when the run ends (Linux 5.3)
    except (AttributeError, OSError):
        run = []
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        ready = select.select([conn, *run], [], [], None if run else 0.2)[0]
        if conn in ready and not conn.recv(1):
            raise ConnectionError("the client is gone")


def become(request, fds):
    """In the run's process: take the client's argv, environment, folder and pipes, run the script as __main__,
    then exit as Python does (see the module's docstring for what is skipped)."""
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
    import builtins
    import importlib.machinery
    import types

    main = types.ModuleType("__main__")
    main.__file__, main.__cached__ = script, None
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", script)
    main.__builtins__ = builtins
    sys.modules["__main__"] = main  # and left there, for the threads and atexit handlers after the script
    try:
        with open(script, "rb") as f:
            code = compile(f.read(), script, "exec")
        exec(code, main.__dict__)
        status = 0
    except SystemExit as e:
        status = exit_code(e.code)
    except BaseException as e:
        report(e, script)
        status = -signal.SIGINT if isinstance(e, KeyboardInterrupt) else 1
    leave(status, main)


def report(e, script):
    """The uncaught exception as a fresh interpreter prints it: from the script's own frame on (none for a
    SyntaxError, which names its line itself)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    e = e.with_traceback(tb)
    sys.excepthook(type(e), e, tb)


def exit_code(code):
    """What Python's exit makes of SystemExit(code): None is 0, a number itself, anything else printed, then 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def leave(status, main):
    """Python's exit in its order: the non-daemon threads joined, the atexit handlers, the script's globals set
    to None (as Python does to a module at exit; not while a thread of the script still runs), a collection, the
    streams flushed. An exception on the way is printed as Python prints one at exit, and the exit goes on."""
    import atexit
    import gc

    try:
        threading._shutdown()
    except BaseException as e:
        ignored(f"Exception ignored in: {threading!r}", e)
    atexit._run_exitfuncs()
    try:
        if threading.active_count() == 1:
            names = sorted(main.__dict__, key=lambda k: not k.startswith("_"))  # underscored names first
            for name in names:
                if name != "__builtins__":
                    main.__dict__[name] = None
        gc.collect()
    except BaseException as e:
        ignored("Exception ignored while freeing __main__", e)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if status == -signal.SIGINT:  # as Python ends on a KeyboardInterrupt: killed by the signal itself
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


def ignored(message, e):
    """As Python prints an exception it ignores at exit: the message, then the traceback from the frame that
    raised on (not leave()'s own)."""
    try:
        print(message, file=sys.stderr)
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
        lines = traceback.format_exception(type(e), e, tb)
        if not str(e):  # Python's hook writes "Name: " where the traceback module writes "Name"
            lines[-1] = lines[-1].rstrip("\n") + ": \n"
        sys.stderr.write("".join(lines))
    except BaseException:
        pass


# --------------------------------------------------------------------------- client


class Client:
    """Starts the server on first use, and again if it died (with env: the environment every run it serves must
    share, bar PER_RUN_ENV and PER_RUN_KEYS)."""

    def __init__(self, env):
        self.env = dict(env)
        self.server = None

    def start(self):
        self.stop()  # what a server that died left behind
        self.folder = tempfile.mkdtemp(prefix="trainfork-")
        self.path = os.path.join(self.folder, "socket")
        self.log = self.folder + ".log"
        with open(self.log, "wb") as log:
            self.server = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), self.path, str(os.getpid())],
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        ready = select.select([self.server.stdout], [], [], 300)[0] and self.server.stdout.readline()
        if not ready or ready.strip() != b"ready":
            self.stop(keep_log=True)
            raise RuntimeError(f"the fork server did not start: see {self.log}")

    def serves(self, env):
        return fixed_env(env) == fixed_env(self.env)

    def popen(self, argv, env, cwd, text=False):
        """A run started, as subprocess.Popen(stdout=PIPE, stderr=PIPE, text=text) starts one."""
        pipes = os.pipe(), os.pipe()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if self.server is None or self.server.poll() is not None:
                self.start()
            conn.connect(self.path)
            request = {"argv": [str(a) for a in argv], "env": dict(env), "cwd": str(cwd)}
            socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [w for _, w in pipes])
            proc = Forked(conn, [sys.executable, *argv])
        except BaseException:
            conn.close()
            for r, _ in pipes:
                os.close(r)
            raise
        finally:
            for _, w in pipes:  # the run holds its own copies
                os.close(w)
        proc.stdout, proc.stderr = (open(r, "r" if text else "rb") for r, _ in pipes)
        return proc

    def run(self, argv, env, cwd, timeout):
        """As subprocess.run(capture_output=True, text=True, timeout=timeout): the output read to its end, so a
        process the run leaves behind holding its stdout or stderr holds this call too, as it holds that one."""
        proc = self.popen(argv, env, cwd)
        deadline = time.monotonic() + timeout
        with proc.stdout, proc.stderr:
            chunks = {proc.stdout: [], proc.stderr: []}
            try:
                drain(chunks, deadline)
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                raise subprocess.TimeoutExpired(
                    proc.args, timeout, b"".join(chunks[proc.stdout]), b"".join(chunks[proc.stderr])
                ) from None
            finally:
                proc.close()
        out, err = (decoded(b"".join(chunks[pipe])) for pipe in (proc.stdout, proc.stderr))
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def stop(self, keep_log=False):
        if self.server is None:
            return
        if self.server.poll() is None:
            self.server.terminate()
            self.server.wait(timeout=30)
        self.server.stdout.close()
        self.server = None
        shutil.rmtree(self.folder, ignore_errors=True)
        if not keep_log and os.path.exists(self.log) and os.path.getsize(self.log) == 0:
            os.remove(self.log)


def drain(chunks, deadline):
    """Read every pipe of chunks to its end, or raise TimeoutExpired at the deadline."""
    open_ = list(chunks)
    while open_:
        left = deadline - time.monotonic()
        ready = select.select(open_, [], [], max(0.0, left))[0] if left > 0 else []
        if not ready:
            raise subprocess.TimeoutExpired("", 0)
        for pipe in ready:
            data = os.read(pipe.fileno(), 1 << 16)
            if data:
                chunks[pipe].append(data)
            else:
                open_.remove(pipe)


class Forked:
    """A run the server forked, as much of subprocess.Popen as the tests use: pid, send_signal, kill, poll,
    wait, returncode (the run's exit status, negative for a signal, as Popen's)."""

    def __init__(self, conn, args):
        self.args, self.conn, self.buffer, self.returncode = args, conn, b"", None
        line = self.line(300)
        if line is None:
            raise RuntimeError("the fork server sent no pid within 300 s")
        self.pid = json.loads(line)["pid"]

    def line(self, timeout):
        """The waiter's next line; None where none came within timeout seconds."""
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
        """As Popen's: nothing once the run has ended. Between the waiter's reaping and its word the pid is free:
        a signal then finds no process (ignored), or, on a machine that reuses pids at once, another one."""
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self):
        """The run and its loader workers (its process group)."""
        if self.poll() is None:
            kill_group(self.pid, signal.SIGKILL)

    def close(self):
        self.conn.close()


def kill_group(pid, signum):
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def decoded(data):
    """As subprocess.run(text=True) decodes: the locale's encoding, universal newlines."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
