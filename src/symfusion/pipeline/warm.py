"""A warm process for one machine's pipeline jobs: it imports the stages once and forks a child per job.

Each stage command used to pay its imports (torch, transformers' modeling code: about 5 CPU seconds)
in every one of a run's ~76 jobs, for jobs whose own work is often a fraction of a second. `serve`
imports them once and then, for each command that connects to its socket, forks a child that runs
the command as that process would have: its argument list, working directory, environment, and its
stdin/stdout/stderr (passed over the socket). The command's process waits for the child's exit code
and exits with it; a child whose command process goes away (Snakemake stopping a job) is terminated.

A command uses the worker only when the variable SYMFUSION_WORKER names a socket and the worker
accepts: the same Python executable and symfusion installation, and an environment that differs from
the worker's only in the variables a scheduler sets per job (threads, temporary directory, shell
bookkeeping). Anything else (no worker, another environment, a GPU visible to the worker, where
forking after CUDA is unsafe) runs in the command's own process, as without a worker.

A child's CPU time is its own from the fork (getrusage restarts at zero), so each job's usage line
counts its work; the worker, reaping the children, carries their CPU time to whoever waits for it.
"""
from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import socket
import stat
import struct
import sys
import time
import traceback
from dataclasses import dataclass, field

VARIABLE = "SYMFUSION_WORKER"
# what Snakemake (or a shell) sets per job; any other difference from the worker's environment is refused
PER_JOB = frozenset({"OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
                     "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "TMPDIR", "TEMP", "TEMPDIR", "TMP",
                     "SHLVL", "PS1", "_", "PWD", "OLDPWD", VARIABLE})
HEADER = struct.Struct("!I")          # byte length of the request's JSON that follows it
CREDENTIALS = struct.Struct("3i")     # SO_PEERCRED: pid, uid, gid
PR_SET_PDEATHSIG = 1                  # prctl(2): a signal for this process when its parent exits


def refusal(request: dict, *, executable: str, installation: str, environment: dict) -> str | None:
    """Why the worker cannot run `request` as its own process would (None when it can)."""
    if request.get("executable") != executable:
        return f"another Python ({request.get('executable')})"
    if request.get("installation") != installation:
        return f"another symfusion installation ({request.get('installation')})"
    job = request.get("environment", {})
    differing = sorted(k for k in set(job) | set(environment) if job.get(k) != environment.get(k) and k not in PER_JOB)
    if differing:
        return "another environment: " + ", ".join(differing[:5])
    return None


def _installation() -> str:
    return os.path.dirname(os.path.abspath(__file__))


# ------------------------------------------------------------------------------------------ the command's side


def private_socket(path: str, server: bool = False) -> str | None:
    """Why `path` cannot be this user's worker socket (None when it can): its folder must be a real folder of this
    user that nobody else may write (else another user could put a socket of theirs in its place and receive the
    jobs' streams and environment); a client also wants the socket itself to be this user's."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        info = os.lstat(folder)
    except OSError:
        return f"its folder {folder} does not exist"
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        return f"its folder {folder} is not a folder of this user that only this user may write"
    if not server:
        try:
            found = os.lstat(path)
        except OSError:
            return "there is no socket"
        if not stat.S_ISSOCK(found.st_mode) or found.st_uid != os.geteuid():
            return f"{path} is not a socket of this user"
    return None


def peer_uid(connection: socket.socket) -> int:
    """The user id of the process at the other end of a Unix socket (SO_PEERCRED)."""
    return CREDENTIALS.unpack(connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, CREDENTIALS.size))[1]


def run_in_worker(command: str, argv: list[str], notes: list | None = None) -> int | None:
    """Run `command argv` in the warm worker named by $SYMFUSION_WORKER: its exit code, or None when none serves.
    `notes`: where a note that the worker did not take the job goes (printed on stderr when None)."""
    path = os.environ.get(VARIABLE)
    if not path or private_socket(path) is not None:
        return None
    try:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(path)
    except OSError:
        return None
    if peer_uid(connection) != os.geteuid():      # a worker of another user never gets this job's streams
        connection.close()
        return None
    with connection:
        try:
            request = json.dumps({"command": command, "argv": list(argv), "cwd": os.getcwd(),
                                  "environment": dict(os.environ), "executable": sys.executable,
                                  "installation": _installation(), "argv0": sys.argv[0]}).encode()
            socket.send_fds(connection, [HEADER.pack(len(request))], [0, 1, 2])   # the length, and the streams
            connection.sendall(request)
        except OSError:                  # e.g. a closed stdin or a removed folder: the job runs here
            return None
        try:
            replies = connection.makefile("r")
            for line in replies:
                reply = json.loads(line)
                if "refused" in reply:
                    note = (f"note: the warm worker did not take this job ({reply['refused']}); "
                            "it runs in its own process")
                    if notes is None:
                        print(note, file=sys.stderr, flush=True)
                    else:
                        notes.append(note)
                    return None
                if "exit" in reply:
                    return int(reply["exit"])
        except (OSError, ValueError):
            pass
    print("error: the warm worker ended before this job did (see its log); run the command again",
          file=sys.stderr, flush=True)
    return 1


# ------------------------------------------------------------------------------------------ the worker's side


def _read_request(connection: socket.socket) -> tuple[dict, list[int]]:
    """The request's JSON and its three stream descriptors (closed here if the request is unreadable)."""
    data, fds, _, _ = socket.recv_fds(connection, 1 << 16, 3)
    try:
        if len(data) < HEADER.size or len(fds) != 3:
            raise ValueError("a malformed request")
        (length,) = HEADER.unpack_from(data)
        body = data[HEADER.size:]
        while len(body) < length:
            chunk = connection.recv(length - len(body))
            if not chunk:
                break
            body += chunk
        return json.loads(body), fds
    except ValueError:
        for fd in fds:
            os.close(fd)
        raise


def _child(request: dict, fds: list[int], run, prepare_child) -> None:
    """In the forked child: become the command's process and run it; never returns."""
    code = 1
    try:
        for number in (signal.SIGTERM, signal.SIGCHLD):            # as in a new Python process
            signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["environment"])
        sys.argv = [request["argv0"], *request["argv"]]
        prepare_child()
        code = run(request["command"], request["argv"])
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if done.code is not None and not isinstance(done.code, int):
            print(done.code, file=sys.stderr)
    except BaseException:             # noqa: BLE001 - a traceback on the job's stderr, as its own process would
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _watch_parent() -> int:
    """Have the kernel send SIGTERM when the process that started the worker exits; its pid."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    return os.getppid()


@dataclass
class _Job:
    """A forked child and the connection of the command process waiting for it."""
    connection: socket.socket
    command: str
    start: float = field(default_factory=time.perf_counter)
    stopped: bool = False            # SIGTERM sent: its command went away


class _Worker:
    """The serving loop's state: the listening socket, the self-pipe that signals write to, the running jobs."""

    def __init__(self, path: str, run, prepare_child, environment: dict, log):
        self.run, self.prepare_child, self.environment, self.log = run, prepare_child, environment, log
        self.identity = {"executable": sys.executable, "installation": _installation()}
        self.imported = {k: v for k, v in os.environ.items() if k not in environment}
        self.wakeup, self.woken = os.pipe()          # a signal (a child's exit) wakes select at once
        for fd in (self.wakeup, self.woken):
            os.set_blocking(fd, False)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_mask = os.umask(0o177)                   # the socket: this user only
        try:
            self.listener.bind(path)
        finally:
            os.umask(old_mask)
        self.bound = os.lstat(path).st_ino           # close() removes this socket, never what replaced it
        self.listener.listen(16)
        self.jobs: dict[int, _Job] = {}

    def say(self, line: str) -> None:
        print(line, file=self.log, flush=True)

    def step(self) -> None:
        """Wait up to a second, then take new commands, stop jobs whose command went away, reap ended jobs."""
        waiting = {job.connection: pid for pid, job in self.jobs.items() if not job.stopped}
        try:
            readable, _, _ = select.select([self.listener, self.wakeup, *waiting], [], [], 1.0)
        except InterruptedError:
            readable = []
        for ready in readable:
            if ready is self.wakeup:
                while _drain(self.wakeup):
                    pass
            elif ready is self.listener:
                self.accept()
            elif not ready.recv(1, socket.MSG_PEEK):     # the command process closed its end: stop its job
                pid = waiting[ready]
                self.say(f"job {pid} ({self.jobs[pid].command}): its command went away; stopping it")
                _signal(pid, signal.SIGTERM)
                self.jobs[pid].stopped = True
        self.reap(block=False)

    def accept(self) -> None:
        connection, _ = self.listener.accept()
        if peer_uid(connection) != os.geteuid():     # only this user's commands run here
            self.say("refused a connection of another user")
            connection.close()
            return
        try:
            request, fds = _read_request(connection)
        except (OSError, ValueError) as error:
            self.say(f"a request could not be read: {error}")
            connection.close()
            return
        reason = refusal(request, environment=self.environment, **self.identity)
        if reason:
            for fd in fds:
                os.close(fd)
            self.say(f"refused {request.get('command')}: {reason}")
            try:
                connection.sendall((json.dumps({"refused": reason}) + "\n").encode())
            finally:
                connection.close()
            return
        for stream in (sys.stdout, sys.stderr, self.log):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            for fd in (self.wakeup, self.woken):
                os.close(fd)
            for other in (self.listener, connection, *(job.connection for job in self.jobs.values())):
                other.close()
            request["environment"] = {**self.imported, **request["environment"]}
            _child(request, fds, self.run, self.prepare_child)
        for fd in fds:
            os.close(fd)
        self.jobs[pid] = _Job(connection, request["command"])
        self.say(f"job {pid}: symfusion-{request['command']} {' '.join(request['argv'])}")

    def reap(self, block: bool) -> None:
        """Send each ended job's exit code to its command (the shell's 128 + N for a signal N)."""
        while self.jobs:
            try:
                pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                self.jobs.clear()
                return
            if pid == 0:
                return
            job = self.jobs.pop(pid, None)
            if job is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            code = 128 - code if code < 0 else code
            self.say(f"job {pid} ({job.command}): exit {code} after {time.perf_counter() - job.start:.1f} s")
            try:
                job.connection.sendall((json.dumps({"exit": code}) + "\n").encode())
            except OSError:
                pass
            job.connection.close()

    def close(self, path: str) -> None:
        """Stop and reap the running jobs, remove the socket, state the CPU time (the jobs' included)."""
        for pid in list(self.jobs):
            _signal(pid, signal.SIGTERM)
        self.reap(block=True)
        self.listener.close()
        signal.set_wakeup_fd(-1)
        os.close(self.wakeup)
        os.close(self.woken)
        try:
            if os.lstat(path).st_ino == self.bound:
                os.unlink(path)
        except OSError:
            pass
        own = os.times()
        self.say(f"usage: symfusion-worker user {own.user + own.children_user:.2f} s, "
                 f"system {own.system + own.children_system:.2f} s (its jobs included)")


def serve(path: str, run, prepare_child, environment: dict, log=sys.stderr) -> None:
    """Accept commands on the socket `path` (created here, removed at the end) until SIGTERM or the parent exits.

    environment: the worker's environment as it started, before its imports; a job's must equal it but for
    PER_JOB. Variables that the imports set (as they would in the job's own process) are kept in the child.

    run(command, argv) -> exit code runs one command in a forked child, after prepare_child() (called once
    the child has the command's environment, e.g. to set the thread count from it).
    """
    parent = _watch_parent()
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    worker = _Worker(path, run, prepare_child, environment, log)
    signal.set_wakeup_fd(worker.woken)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    worker.say(f"worker {os.getpid()} serving {path}")
    try:
        while not stopping and os.getppid() == parent:
            worker.step()
    finally:
        worker.close(path)


def _signal(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass


def _drain(fd: int) -> bool:
    try:
        return bool(os.read(fd, 512))
    except BlockingIOError:
        return False
