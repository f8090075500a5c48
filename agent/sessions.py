"""Interactive sessions on the agent: a task's terminal (``--pty``), attach to it, exec in a running task.

The coordinator relays each Admin ``Session`` call as ``SessionRequest`` messages on the agent's
stream and the answers as ``SessionChunk`` messages (``docs/interactive.md``).

- **A task's terminal** (:class:`Terminal`): a task started with ``pty`` gets a pseudo-terminal
  (``os.openpty``) whose agent-side end the agent holds; the task's stdin, stdout and stderr are the
  terminal, its controlling terminal (``setsid --ctty``, as the task's user, after every root step of
  :mod:`agent.launch`). What the task writes is read by the agent, written to the task's log (through
  its output FIFO, so ``logs`` and the log tail show it), kept in a small ring (:data:`RING_BYTES`, sent
  first to a session that attaches) and sent to every attached session. A session opened with
  ``hangup_on_close`` (``gptrmctl run``) owns the terminal: when it ends, the terminal is closed and the
  task gets SIGHUP, so the task ends with its shell. Until such a session attaches (within
  :data:`ORPHAN_S` of the start, or again after the stream to the coordinator broke) the terminal
  stays open; past that it is closed.
- **exec** (:func:`exec_command`): a command run in a running task's context: in its cgroup, in its PID,
  mount and IPC namespaces (``nsenter`` into those of the task's first process), as its uid, gid and
  groups (``setpriv --no-new-privs``), with the task's environment (read from its program's process,
  handed over as the task's own start does: a 0600 file of root's, opened by the root step and removed
  at once, never on a command line), in its working directory; on a terminal of its own with
  ``pty``, else with pipes (stdout and stderr apart). Its exit code ends the session; a session whose
  client goes away kills it.

Bounds: at most :data:`MAX_SESSIONS` sessions; each has at most :data:`WINDOW` output messages of at
most :data:`CHUNK_BYTES` not yet acknowledged by the coordinator (which acknowledges as its client
reads), and a session that acknowledges nothing for :data:`SLOW_S` while output waits is ended. So a
slow client slows its own session (and the terminal it shares), never the agent's stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import struct
import termios
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from agent import launch
from agent.cpu_binding import usable_cpus
from common.errors import GptrmError
from common.logging import get_logger
from common.pb.gptrm.v1 import agent_pb2
from common.topology import format_cpu_list

__all__ = [
    "CHUNK_BYTES",
    "MAX_SESSIONS",
    "ORPHAN_S",
    "RING_BYTES",
    "SLOW_S",
    "WINDOW",
    "SessionService",
    "TaskContext",
    "Terminal",
    "exec_command",
    "task_context",
]

WINDOW = 16
CHUNK_BYTES = 16 * 1024
RING_BYTES = 64 * 1024
MAX_SESSIONS = 32
SLOW_S = 30.0
ORPHAN_S = 120.0
_MAX_INPUT_QUEUED = 64   # the coordinator sends at most its window of input: this is slack, never reached
_MAX_ENV_BYTES = 1024 * 1024   # the most of a task's environment exec reads back from its process
_KILL_GRACE_S = 2.0

Send = Callable[[agent_pb2.SessionChunk], Awaitable[None]]

# The root step that makes the terminal (the path $1, of the agent's pseudo-terminal) the task's stdin, stdout and
# stderr; after the drop to the task's user, setsid --ctty makes it the controlling terminal of a new session.
# (sh names a file descriptor above 9 in no redirection: the terminal is opened by its path.)
_PTY_STEP = 't=$1; shift; exec <>"$t" >&0 2>&0; exec "$@"'
# exec's last step, as the task's user: the task's environment from fd 4, then the command.
_EXEC_STUB = ('eval "$(/bin/cat <&4)" || exit 125; exec 4<&-; '
              'if ! command -v "$1" >/dev/null 2>&1; then echo "gptrm: $1: not found on the task\'s PATH ($PATH)" >&2; '
              'exit 127; fi; exec "$@"')
# exec's first step, as root: join the task's cgroup (when it has one), open the environment file (a 0600 file of
# root's in the agent's own directory, as agent.launch's wrapper does) on fd 4 and remove it, then the rest.
_JOIN_STEP = ('cg=$1 envf=$2; shift 2; if [ -n "$cg" ]; then echo $$ > "$cg/cgroup.procs" || exit 125; fi; '
              'exec 4<"$envf" || exit 125; /bin/rm -f -- "$envf"; exec "$@"')


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()
    loop.add_reader(fd, _wake, fut)
    try:
        await fut
    finally:
        loop.remove_reader(fd)


async def _write_all(fd: int, data: bytes) -> None:
    """Write ``data`` to a non-blocking ``fd``, waiting while it is full."""
    loop = asyncio.get_running_loop()
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            fut: asyncio.Future[None] = loop.create_future()
            loop.add_writer(fd, _wake, fut)
            try:
                await fut
            finally:
                loop.remove_writer(fd)


def _set_size(fd: int, rows: int, cols: int) -> None:
    if rows and cols:
        with contextlib.suppress(OSError):
            fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", min(rows, 9999), min(cols, 9999), 0, 0))


class _Session:
    """One relayed session: its output window and its input, in order."""

    def __init__(self, sid: str, task_id: str, send: Send, *, hangup: bool = False) -> None:
        self.sid, self.task_id, self._send, self.hangup = sid, task_id, send, hangup
        self.unacked = 0
        self.room = asyncio.Event()
        self.room.set()
        self.inputs: asyncio.Queue[agent_pb2.SessionRequest] = asyncio.Queue(maxsize=_MAX_INPUT_QUEUED)
        self.closed = False
        self.tasks: set[asyncio.Task] = set()
        self.on_end: Callable[[], None] = lambda: None

    async def output(self, data: bytes, stderr: bool = False) -> bool:
        """Send ``data`` within the window; False when the session has ended (closed, or its reader too slow)."""
        for i in range(0, len(data), CHUNK_BYTES):
            while self.unacked >= WINDOW and not self.closed:
                self.room.clear()
                try:
                    await asyncio.wait_for(self.room.wait(), SLOW_S)
                except TimeoutError:
                    await self.end(error=f"the session's reader acknowledged nothing for {SLOW_S:.0f} s")
                    return False
            if self.closed:
                return False
            self.unacked += 1
            await self._send(agent_pb2.SessionChunk(session_id=self.sid, data=data[i:i + CHUNK_BYTES], stderr=stderr))
        return True

    def acked(self, n: int) -> None:
        self.unacked = max(0, self.unacked - n)
        self.room.set()

    async def end(self, *, exit_code: int | None = None, error: str = "") -> None:
        """Send the session's last message (once)."""
        if self.closed:
            return
        self.closed = True
        self.room.set()
        self.on_end()
        await self._send(agent_pb2.SessionChunk(session_id=self.sid, exited=not error, error=error,
                                                exit_code=exit_code or 0, has_exit_code=exit_code is not None))

    async def acknowledge_input(self) -> None:
        await self._send(agent_pb2.SessionChunk(session_id=self.sid, input_acked=1))

    def spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


class Terminal:
    """The pseudo-terminal of one ``pty`` task (see the module docstring).

    :param task_id: the task.
    :param fifo: the task's output FIFO, where what it writes goes on to its log.
    """

    def __init__(self, task_id: str, fifo: Path) -> None:
        self.task_id = task_id
        self._fifo = fifo
        self.master, self.slave = os.openpty()
        os.set_blocking(self.master, False)
        self.ring = bytearray()
        self.sessions: dict[str, _Session] = {}
        self.closed = False
        self._reader: asyncio.Task | None = None
        self._orphan: asyncio.TimerHandle | None = None
        self._log = get_logger("agent").bind(component="sessions", task_id=task_id)

    def around(self, drop: list[str], setsid: str) -> list[str]:
        """The launch steps that give the task this terminal, around ``drop`` (the switch to the task's user):
        the terminal as stdin, stdout and stderr before it, the new session that it controls after it."""
        if not setsid:
            raise GptrmError("a --pty task needs setsid (util-linux) on the agent's host")
        return ["/bin/sh", "-c", _PTY_STEP, "gptrm-pty", os.ttyname(self.slave), *drop, setsid, "--ctty", "--wait"]

    def started(self) -> None:
        """The task's process holds the terminal: read it from now on."""
        self.close_slave()
        self._reader = asyncio.get_running_loop().create_task(self._read())
        self.arm_orphan()

    def close_slave(self) -> None:
        """Close the agent's copy of the task's end (once: its number may be reused afterwards)."""
        if self.slave >= 0:
            with contextlib.suppress(OSError):
                os.close(self.slave)
            self.slave = -1

    def arm_orphan(self) -> None:
        """Close the terminal unless a session that owns it attaches within :data:`ORPHAN_S`."""
        if self._orphan is None and not self.closed:
            self._orphan = asyncio.get_running_loop().call_later(ORPHAN_S, self._orphaned)

    def _orphaned(self) -> None:
        self._orphan = None
        if not any(s.hangup for s in self.sessions.values()):
            self._log.info("terminal_closed", reason=f"no session attached within {ORPHAN_S:.0f} s")
            self.hangup()

    async def attach(self, session: _Session) -> None:
        self.sessions[session.sid] = session
        if session.hangup and self._orphan is not None:
            self._orphan.cancel()
            self._orphan = None
        if self.ring and not await session.output(bytes(self.ring)):
            self.sessions.pop(session.sid, None)

    def detach(self, session: _Session) -> None:
        """``session`` ended; when it owned the terminal, the task gets its hangup."""
        if self.sessions.pop(session.sid, None) is not None and session.hangup:
            self.hangup()

    async def write(self, data: bytes) -> None:
        if not self.closed:
            await _write_all(self.master, data)

    def resize(self, rows: int, cols: int) -> None:
        if not self.closed:
            _set_size(self.master, rows, cols)

    def hangup(self) -> None:
        """Close the terminal: the task's session gets SIGHUP (a shell ends)."""
        if self.closed:
            return
        self.closed = True
        if self._orphan is not None:
            self._orphan.cancel()
            self._orphan = None
        if self._reader is not None:
            self._reader.cancel()
        with contextlib.suppress(OSError):
            os.close(self.master)
        for s in list(self.sessions.values()):
            s.spawn(s.end())
        self.sessions.clear()

    async def _read(self) -> None:
        try:
            fifo = os.open(self._fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            self._log.warning("terminal_log_unavailable", reason=str(e))
            fifo = -1
        try:
            while True:
                await _readable(self.master)
                try:
                    data = os.read(self.master, CHUNK_BYTES)
                except BlockingIOError:
                    continue
                except OSError:   # EIO: every process that held the terminal has ended
                    break
                if not data:
                    break
                self.ring += data
                del self.ring[:-RING_BYTES]
                if fifo >= 0:
                    await _write_all(fifo, data)
                for s in list(self.sessions.values()):
                    if not await s.output(data):
                        self.sessions.pop(s.sid, None)
        finally:
            if fifo >= 0:
                os.close(fifo)
            if not self.closed:
                self._reader = None
                self.hangup()


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What ``exec`` enters: the task's first process (its namespaces, when it has its own), credentials,
    cgroup, working directory and environment."""

    pid: int
    own_namespaces: bool
    uid: int
    gid: int
    groups: tuple[int, ...]
    cgroup: str
    cwd: str
    env: dict[str, str]
    agent_dir: Path = Path("/nonexistent")   # the task's directory of the agent's own (where exec's env file goes)
    cpus: str = ""   # the CPUs the task's program is bound to (kernel list format); "" when not fewer than the agent's


def _ns(pid: int | str, kind: str = "pid") -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return ""


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read(_MAX_ENV_BYTES)
    except OSError:
        return {}
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.decode(errors="surrogateescape").partition("=")
        if sep and key.isidentifier() and key.isascii():
            env[key] = value
    return env


def _groups(pid: int) -> tuple[int, ...]:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("Groups:"):
                    return tuple(int(g) for g in line.split()[1:])
    except (OSError, ValueError):
        pass
    return ()


def task_context(wrapper_pid: int, cgroup: str, agent_dir: Path) -> TaskContext:
    """The context of the task whose root wrapper is ``wrapper_pid``: its first process past the root steps
    (PID 1 of its own PID namespace where it has one, else the wrapper's child), and the environment of the
    task's program.

    :raises GptrmError: the task has no process (yet, or any more)."""
    try:
        wrapper = psutil.Process(wrapper_pid)
        below = sorted(wrapper.children(recursive=True), key=lambda p: (p.create_time(), p.pid))
        own = _ns(wrapper_pid)
        first = next((p for p in below if own and _ns(p.pid) not in ("", own)), None)
        in_ns = first is not None
        if first is None:
            direct = [p for p in below if p.ppid() == wrapper_pid]
            if not direct:
                raise GptrmError("the task has no running process to exec in")
            first = direct[0]
        # In its own namespace the first process keeps the program as its child (agent.launch EXEC_STUB).
        program = next((p for p in below if p.ppid() == first.pid), first) if in_ns else first
        uids, gids = first.uids(), first.gids()
        env = _environ(program.pid) or _environ(first.pid)
        bound = frozenset(program.cpu_affinity())
        cpus = format_cpu_list(sorted(bound)) if bound and bound != usable_cpus() else ""
        return TaskContext(first.pid, in_ns, uids.real, gids.real, _groups(first.pid), cgroup,
                           first.cwd() or "/", env, agent_dir, cpus)
    except psutil.Error as e:
        raise GptrmError(f"the task's processes cannot be read: {e}") from e


def exec_command(ctx: TaskContext, argv: list[str], env_file: Path, programs: launch.Programs, *,
                 nsenter: str, setsid: str, pty: bool) -> list[str]:
    """The whole argv that runs ``argv`` in ``ctx``: join its cgroup and open ``env_file`` (root), enter its
    namespaces (root), drop to its user, bind it to the task's CPUs (the process runtime binds the task with
    taskset, which joining the cgroup does not carry), then (as the user) apply its environment and run the
    command."""
    command = ["/bin/sh", "-c", _JOIN_STEP, "gptrm-exec-join", ctx.cgroup, str(env_file)]
    if ctx.own_namespaces:
        if not nsenter:
            raise GptrmError("exec into a task with its own namespaces needs nsenter (util-linux) on the agent's host")
        command += [nsenter, f"--target={ctx.pid}", "--pid", "--mount", "--ipc", "--"]
    if os.geteuid() == 0:   # a root agent always drops to the task's credentials (a task's root included)
        if not programs.setpriv:
            raise GptrmError("exec as the task's user needs setpriv (util-linux) on the agent's host")
        groups = f"--groups={','.join(map(str, ctx.groups))}" if ctx.groups else "--clear-groups"
        command += [programs.setpriv, f"--reuid={ctx.uid}", f"--regid={ctx.gid}", groups, "--no-new-privs", "--"]
    if pty:
        if not setsid:
            raise GptrmError("exec --pty needs setsid (util-linux) on the agent's host")
        command += [setsid, "--ctty", "--wait"]
    if ctx.cpus:
        if not programs.taskset:
            raise GptrmError(f"exec into a task bound to CPUs {ctx.cpus} needs taskset (util-linux) on the agent's "
                             "host")
        command += [programs.taskset, "--cpu-list", ctx.cpus]
    return [*command, "/bin/sh", "-c", _EXEC_STUB, "gptrm-exec", *argv]


class _Exec:
    """One exec'd command of a session: its process, its terminal or pipes, its exit code."""

    def __init__(self, session: _Session) -> None:
        self.session = session
        self.proc: asyncio.subprocess.Process | None = None
        self.master = -1

    async def start(self, command: list[str], cwd: str, *, pty: bool, rows: int, cols: int) -> None:
        """Start ``command`` (:func:`exec_command`), on a terminal of its own or on pipes."""
        slave = -1
        try:
            if pty:
                self.master, slave = os.openpty()
                os.set_blocking(self.master, False)
                _set_size(self.master, rows, cols)
            io = slave if pty else asyncio.subprocess.PIPE
            self.proc = await asyncio.create_subprocess_exec(
                *command, cwd=cwd if os.path.isdir(cwd) else "/", env=launch.root_env(), start_new_session=True,
                stdin=io, stdout=io, stderr=io)
        finally:
            if slave >= 0:
                os.close(slave)
        self.session.spawn(self._run())

    async def _run(self) -> None:
        assert self.proc is not None
        readers = []
        if self.master >= 0:
            readers.append(asyncio.ensure_future(self._read_master()))
        else:
            assert self.proc.stdout is not None and self.proc.stderr is not None
            readers += [asyncio.ensure_future(self._read_pipe(self.proc.stdout, False)),
                        asyncio.ensure_future(self._read_pipe(self.proc.stderr, True))]
        code = await self.proc.wait()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*readers, return_exceptions=True), 5.0)
        for r in readers:
            r.cancel()
        if self.master >= 0:
            with contextlib.suppress(OSError):
                os.close(self.master)
            self.master = -1
        await self.session.end(exit_code=code)

    async def _read_pipe(self, stream: asyncio.StreamReader, stderr: bool) -> None:
        while data := await stream.read(CHUNK_BYTES):
            if not await self.session.output(data, stderr):
                self.kill()
                return

    async def _read_master(self) -> None:
        while True:
            await _readable(self.master)
            try:
                data = os.read(self.master, CHUNK_BYTES)
            except BlockingIOError:
                continue
            except OSError:
                return
            if not data or not await self.session.output(data):
                if data:
                    self.kill()
                return

    async def write(self, data: bytes) -> None:
        if self.master >= 0:
            await _write_all(self.master, data)
        elif self.proc is not None and self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.write(data)
            with contextlib.suppress(ConnectionError):
                await self.proc.stdin.drain()

    def close_stdin(self) -> None:
        if self.master >= 0:
            with contextlib.suppress(OSError):
                os.write(self.master, b"\x04")   # the terminal's end-of-file character
        elif self.proc is not None and self.proc.stdin is not None:
            self.proc.stdin.close()

    def resize(self, rows: int, cols: int) -> None:
        if self.master >= 0:
            _set_size(self.master, rows, cols)

    def kill(self) -> None:
        """The session ended first: its command gets SIGHUP, then SIGKILL after a grace."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGHUP)
        if self.master >= 0:
            with contextlib.suppress(OSError):
                os.close(self.master)
            self.master = -1

        def force() -> None:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
        asyncio.get_running_loop().call_later(_KILL_GRACE_S, force)


ContextOf = Callable[[str], TaskContext]
"""The exec context of a task this agent runs, by id (:raises GptrmError: not running here)."""


class SessionService:
    """Every session of this agent, driven by the coordinator's ``SessionRequest`` messages.

    :param context_of: the exec context of a running task (the runtime's).
    :param programs: absolute paths of the root steps' programs.
    """

    def __init__(self, context_of: ContextOf, programs: launch.Programs) -> None:
        self._context_of = context_of
        self._programs = programs
        self._nsenter = launch.root_program("nsenter")
        self.setsid = launch.root_program("setsid")
        self.terminals: dict[str, Terminal] = {}
        self._sessions: dict[str, tuple[_Session, Terminal | _Exec]] = {}
        self._opening: set[asyncio.Future] = set()
        self._log = get_logger("agent").bind(component="sessions")

    def open_terminal(self, task_id: str, fifo: Path) -> Terminal:
        """A new terminal for a ``pty`` task being started (:meth:`Terminal.started` once it runs)."""
        old = self.terminals.pop(task_id, None)
        if old is not None:
            old.hangup()
        term = Terminal(task_id, fifo)
        self.terminals[task_id] = term
        return term

    def task_ended(self, task_id: str) -> None:
        """The task ended (or its start failed): its terminal goes with it."""
        term = self.terminals.pop(task_id, None)
        if term is not None:
            term.close_slave()
            term.hangup()

    def handle(self, req: agent_pb2.SessionRequest, send: Send) -> None:
        """One message of the coordinator's; never blocks the stream's reader."""
        known = self._sessions.get(req.session_id)
        if req.open:
            if known is None:
                opening = asyncio.ensure_future(self._open(req, send))
                self._opening.add(opening)
                opening.add_done_callback(self._opening.discard)
            return
        if known is None:
            return
        session, target = known
        if req.output_acked:
            session.acked(req.output_acked)
        if req.close:
            self._close(session, target)
            return
        if req.data or req.eof or req.resize:
            try:
                session.inputs.put_nowait(req)
            except asyncio.QueueFull:   # the coordinator keeps to its window: this is a broken peer
                session.spawn(session.end(error="too much input in flight"))
                self._close(session, target)

    async def _open(self, req: agent_pb2.SessionRequest, send: Send) -> None:
        session = _Session(req.session_id, req.task_id, send, hangup=req.hangup_on_close and not req.argv)
        try:
            if len(self._sessions) >= MAX_SESSIONS:
                raise GptrmError(f"more than {MAX_SESSIONS} sessions on this node; try again later")
            target: Terminal | _Exec
            if req.argv:
                target = await self._exec(session, req)
            else:
                term = self.terminals.get(req.task_id)
                if term is None or term.closed:
                    raise GptrmError(f"task {req.task_id!r} has no terminal on this node (started without --pty, "
                                     "or ended)")
                target = term
            self._sessions[session.sid] = (session, target)
            feed = asyncio.ensure_future(self._feed(session, target))

            def ended() -> None:
                feed.cancel()
                if isinstance(target, Terminal):
                    target.sessions.pop(session.sid, None)
                self._forget(session)
            session.on_end = ended
            self._log.info("session_opened", session_id=session.sid, task_id=req.task_id,
                           kind="exec" if req.argv else "attach", principal=req.principal, pty=req.pty)
            if isinstance(target, Terminal):
                target.resize(req.rows, req.cols)
                await target.attach(session)
        except (GptrmError, OSError) as e:
            self._log.info("session_refused", session_id=session.sid, task_id=req.task_id, reason=str(e))
            await session.end(error=str(e))

    async def _exec(self, session: _Session, req: agent_pb2.SessionRequest) -> _Exec:
        ctx = self._context_of(req.task_id)
        env = dict(ctx.env) or {"PATH": launch.TASK_PATH, "HOME": ctx.cwd}
        if req.pty:
            env.setdefault("TERM", "xterm")
        env = {k: v for k, v in env.items() if "\0" not in v}
        env_file = ctx.agent_dir / f"exec-{session.sid}.env"
        launch.write_env_file(env_file, env)   # read and removed by exec's first step
        proc = _Exec(session)
        try:
            await proc.start(exec_command(ctx, list(req.argv), env_file, self._programs, nsenter=self._nsenter,
                                          setsid=self.setsid, pty=req.pty), ctx.cwd, pty=req.pty, rows=req.rows,
                             cols=req.cols)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(env_file)
            raise
        return proc

    async def _feed(self, session: _Session, target: Terminal | _Exec) -> None:
        """The session's input, in order, each acknowledged once written."""
        while not session.closed:
            req = await session.inputs.get()
            try:
                if req.data:
                    await target.write(req.data)
                if req.resize:
                    target.resize(req.rows, req.cols)
                if req.eof and isinstance(target, _Exec):
                    target.close_stdin()
            except OSError as e:   # the terminal or the command's stdin is gone: its end is reported apart
                self._log.info("session_input_dropped", session_id=session.sid, reason=str(e))
            await session.acknowledge_input()   # the coordinator counts each input message in flight

    def _close(self, session: _Session, target: Terminal | _Exec) -> None:
        """The client went away: the session ends without a last message (nobody would read it)."""
        if isinstance(target, Terminal):
            target.detach(session)
        else:
            target.kill()
        session.closed = True
        session.room.set()
        session.on_end()

    def _forget(self, session: _Session) -> None:
        if self._sessions.pop(session.sid, None) is not None:
            self._log.info("session_ended", session_id=session.sid, task_id=session.task_id)

    def cancel_all(self) -> None:
        """The stream to the coordinator broke: every session ends (exec'd commands are killed); a terminal
        waits :data:`ORPHAN_S` for its owner to attach again."""
        for session, target in list(self._sessions.values()):
            if isinstance(target, Terminal):
                session.hangup = False   # detached, not hung up
                target.arm_orphan()
            self._close(session, target)
