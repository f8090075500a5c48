"""How a task's processes are started: a root wrapper that trusts nothing of the task's.

The agent runs as root and a task is code it did not write, so the steps that run as root before
the task's own process never read anything the task chose:

- the root wrapper (:data:`WRAPPER`) and every root step after it run with a fixed environment
  (:func:`root_env`: the system ``PATH`` and ``LANG`` only) and name each program by the absolute
  path found on that fixed ``PATH`` when the agent started (:class:`Programs`), so a task's
  ``PATH``, ``LD_PRELOAD``, ``LD_LIBRARY_PATH`` or any other loader variable never reaches a
  process running as root;
- the task's environment is written by the agent to a 0600 file in its own directory
  (:func:`write_env_file`), opened by the root wrapper on fd 4 and removed at once, and applied by
  a small ``sh`` (:data:`EXEC_STUB`) only after ``setpriv`` has dropped to the task's user, in
  the task's own process; secrets in it never appear on any command line;
- where the host allows it (the agent is root and ``unshare`` works), the task runs in a PID, mount
  and IPC namespace of its own (:func:`namespace_prefix`): it sees only its own processes in
  ``/proc`` (not other tasks', not the root wrapper's command line), its SysV IPC objects and POSIX
  message queues vanish with it, and its ``/dev/shm`` is a tmpfs of its own, capped by its memory
  demand and gone when it ends. The stub is then PID 1 of that namespace and keeps the task as its
  child, so the task still gets every signal the agent sends its process group, and when the
  task's main process ends everything it left in the namespace is killed with it.

The stub also says plainly when the task's program is not on the task's ``PATH`` (exit 127),
naming the ``PATH`` it searched and how to change it (``--env PATH=...`` on submit, or the agent's
``--task-path``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from common.errors import GptrmError

__all__ = ["EXEC_STUB", "ROOT_PATH", "TASK_PATH", "WRAPPER", "Programs", "container_prefix", "env_script",
           "namespace_prefix",
           "path_problem", "root_env", "root_program", "task_command", "valid_env", "write_env_file"]

TASK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""A task's ``PATH`` unless its spec or the agent's ``--task-path`` sets one (never the agent's own)."""
ROOT_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
"""The only ``PATH`` a root step of a task's start ever has (never the task's, never the agent's)."""

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NS_PROBE_TIMEOUT_S = 10.0

# The root wrapper. Its environment is root_env() and nothing else. It joins the task's cgroup when
# it has one, holds the output FIFO open for reading and writing (so the task never gets SIGPIPE
# while the agent restarts), opens the task's environment file on fd 4 and removes it, and outlives
# the task: its TERM trap is a handler, not "ignore", so the task (which gets the group's SIGTERM
# itself) keeps the default disposition, and the wrapper waits for the real exit status and records
# it even if the agent is gone by then. The checkpoint signals a preemption may send to the group
# are trapped the same way. Arguments: FIFO, exit-code file, cgroup directory or "", environment
# file, then the command (namespace and binding prefixes, ``setpriv ...`` when the task runs as
# another user, the exec stub and the task's argv).
WRAPPER = (
    f'PATH={ROOT_PATH}; export PATH; '
    'fifo=$1 exitf=$2 cg=$3 envf=$4; shift 4; '
    'if [ -n "$cg" ]; then echo $$ > "$cg/cgroup.procs" || echo "gptrm: cannot join $cg" >&2; fi; '
    'exec 3<>"$fifo" || exit 125; exec >&3 2>&3; '
    'exec 4<"$envf" || { echo "gptrm: cannot open the task\'s environment file" >&2; exit 125; }; '
    '/bin/rm -f -- "$envf"; '
    'trap : TERM INT HUP QUIT USR1 USR2 ALRM; "$@" 3>&- & c=$!; exec 4<&-; '
    'while :; do wait $c; code=$?; kill -0 $c 2>/dev/null || break; done; '
    'echo $code > "$exitf.tmp" && /bin/mv -f -- "$exitf.tmp" "$exitf"; exit $code'
)

# Runs as the task's user (after setpriv), before the task's program: applies the task's
# environment from fd 4, then runs the program by the task's own PATH. As PID 1 of the task's own
# PID namespace it keeps the program as a child (PID 1 ignores signals it has no handler for, the
# program does not), and its exit ends the namespace with whatever the program left in it.
# The program keeps the stub's stdin (a --pty task's terminal): sh would give a background
# command /dev/null, so stdin goes through fd 5.
EXEC_STUB = (
    'eval "$(/bin/cat <&4)" || { echo "gptrm: cannot apply the task\'s environment" >&2; exit 125; }; '
    'exec 4<&-; '
    'if ! command -v "$1" >/dev/null 2>&1; then '
    'printf "gptrm: %s: not found on the task\'s PATH (%s). Pass the directory that holds it with '
    '--env PATH=... on submit, or ask an admin to set the agents\' --task-path.\\n" "$1" "$PATH" >&2; '
    'exit 127; fi; '
    'if [ "$$" = 1 ]; then exec 5<&0; "$@" <&5 5<&- & exec 5<&-; wait $!; exit $?; fi; '
    'exec "$@"'
)

# The root step in the task's new mount and IPC namespaces, whose next child is PID 1 of its new PID
# namespace. That child mounts the namespace's own /proc and a private /dev/shm, then runs the rest
# of the command (setpriv, the exec stub, the task). This step stays in the task's process group, so
# like the wrapper it handles (rather than dies of) the signals sent to the group, and it waits for
# the real exit status. A mount killed by such a signal (a stop that came while the task was still being set
# up) ends the step with the signal's status, not as a failed set-up. Arguments: the mount program, the tmpfs
# options, then the command.
_NS_STEP = (
    'm=$1 o=$2; shift 2; '
    'trap : TERM INT HUP QUIT USR1 USR2 ALRM; '
    '( "$m" -t proc -o nosuid,nodev,noexec gptrm-proc /proc && "$m" -t tmpfs -o "$o" gptrm-shm /dev/shm; r=$?; '
    '[ $r -eq 0 ] || { [ $r -gt 128 ] && exit $r; '
    'echo "gptrm: cannot set up the task\'s own /proc and /dev/shm" >&2; exit 125; }; exec "$@" ) & c=$!; '
    'while :; do wait $c; code=$?; kill -0 $c 2>/dev/null || break; done; exit $code'
)


# The root step of a task with an image (docs/containers.md), run in a mount namespace of the task's own: mounts
# the task's writable overlay over the image's shared read-only tree, then runs the container in the foreground
# with crun (which passes the signals it gets to the container's process and exits with its status). crun leaves
# cgroups alone, so the container stays in the task's cgroup; on a host with cgroup v1 controllers beside a v2
# hierarchy (hybrid mode, which crun refuses) the v2 mount is hidden from this namespace only. Arguments: the mount
# and umount programs, crun, the overlay's lower, upper, work and merged directories, the bundle directory, crun's
# state directory, the container's id and how many fds from 3 up the container keeps (its master port's listener).
_CONTAINER_STEP = (
    'm=$1 um=$2 crun=$3 lower=$4 upper=$5 work=$6 merged=$7 bundle=$8 state=$9; shift 9; id=$1 keep=$2; '
    '"$m" -t overlay -o "lowerdir=$lower,upperdir=$upper,workdir=$work" gptrm-root "$merged" '
    '|| { echo "gptrm: cannot mount the container\'s root file system" >&2; exit 125; }; '
    'if [ -d /sys/fs/cgroup/unified ]; then "$um" /sys/fs/cgroup/unified 2>/dev/null; fi; '
    'exec "$crun" --root "$state" --cgroup-manager=disabled run --preserve-fds "$keep" --bundle "$bundle" "$id"'
)


def container_prefix(programs: Programs, *, crun: str, lower: str, upper: str, work: str, merged: str,
                     bundle: str, state: str, container_id: str, pass_fds: Sequence[int] = ()) -> list[str]:
    """The root command that runs a task's container (:data:`_CONTAINER_STEP`), whole: the task's argv, user and
    environment are in the bundle's ``config.json``. ``pass_fds``: fds the task inherits (its master port's
    listener, numbered from 10 up), kept open in the container at the same numbers. Paths holding ``,`` or ``:``
    are refused (overlay options).

    :raises GptrmError: a path overlayfs cannot take.
    """
    for path in (lower, upper, work):
        if any(c in path for c in ",:\n"):
            raise GptrmError(f"cannot use {path!r} in an overlay mount (',' or ':' in the agent's state directory)")
    umount = root_program("umount") or "/bin/umount"
    return [programs.unshare, "--mount", "--propagation", "private", "/bin/sh", "-c", _CONTAINER_STEP, "gptrm-ctr",
            programs.mount, umount, crun, lower, upper, work, merged, bundle, state, container_id,
            str(max(pass_fds) - 2) if pass_fds else "0"]


def root_env() -> dict[str, str]:
    """The whole environment of a task's root steps (the wrapper, the namespace set-up, setpriv)."""
    return {"PATH": ROOT_PATH, "LANG": "C.UTF-8"}


def root_program(name: str) -> str:
    """The absolute path of ``name`` on :data:`ROOT_PATH` ("" when it is not there): how every program the agent
    runs as root, or as a task's uid on the task's behalf, is named."""
    found = shutil.which(name, path=ROOT_PATH)
    return os.path.abspath(found) if found else ""


@dataclass(frozen=True, slots=True)
class Programs:
    """Absolute paths of the programs a root step runs, found on :data:`ROOT_PATH` once ("" if missing)."""

    setpriv: str = ""
    taskset: str = ""
    numactl: str = ""
    unshare: str = ""
    mount: str = ""

    @classmethod
    def find(cls) -> Programs:
        return cls(setpriv=root_program("setpriv"), taskset=root_program("taskset"), numactl=root_program("numactl"),
                   unshare=root_program("unshare"), mount=root_program("mount"))

    def namespaces_work(self) -> bool:
        """Whether this host lets the agent give a task its own PID, mount and IPC namespace and /dev/shm."""
        if os.geteuid() != 0 or not self.unshare or not self.mount:
            return False
        try:
            done = subprocess.run([*namespace_prefix(self, 0), "/bin/true"], env=root_env(),
                                  timeout=_NS_PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, check=False)
        except (OSError, subprocess.SubprocessError):
            return False
        return done.returncode == 0


def namespace_prefix(programs: Programs, shm_bytes: int) -> list[str]:
    """The root prefix that runs the rest of a command in a PID, mount and IPC namespace of its own,
    with a private ``/dev/shm`` of ``shm_bytes`` (0: the kernel's default size, half the host's memory)."""
    opts = "nosuid,nodev,mode=1777" + (f",size={int(shm_bytes)}" if shm_bytes > 0 else "")
    return [programs.unshare, "--pid", "--mount", "--ipc", "--propagation", "private",
            "/bin/sh", "-c", _NS_STEP, "gptrm-ns", programs.mount, opts]


def path_problem(value: str) -> str | None:
    """Why ``value`` cannot be a task's default ``PATH`` (None when it can): absolute directories only."""
    dirs = value.split(":")
    if not value or any(not d.startswith("/") for d in dirs):
        return f"{value!r} must be absolute directories separated by ':'"
    if "\0" in value or "\n" in value:
        return "must not hold NUL or newline"
    return None


def valid_env(env: Mapping[str, str]) -> None:
    """:raises GptrmError: naming the first variable whose name is not a shell identifier or whose value holds NUL."""
    for key, value in env.items():
        if not _ENV_KEY.match(key):
            raise GptrmError(f"env: {key[:64]!r} is not a valid variable name")
        if "\0" in value:
            raise GptrmError(f"env: {key} holds a NUL byte")


def env_script(env: Mapping[str, str]) -> str:
    """The task's environment as ``export KEY='value'`` lines for the exec stub (values quoted whole)."""
    valid_env(env)
    return "".join(f"export {key}='{value.replace(chr(39), chr(39) + chr(92) + chr(39) + chr(39))}'\n"
                   for key, value in env.items())


def write_env_file(path: Path, env: Mapping[str, str]) -> None:
    """Write the task's environment for the root wrapper (a new 0600 file of root's, never through a link)."""
    data = env_script(env).encode(errors="surrogateescape")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    # O_EXCL creates a new file or fails, a link in its place included.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def task_command(*, fifo: Path, exit_file: Path, cgroup: str, env_file: Path, prefix: Sequence[str],
                 argv: Sequence[str], stub: bool = True) -> list[str]:
    """The whole argv of a task's start: the root wrapper, the root ``prefix`` (namespaces, binding,
    ``setpriv``), the exec stub and the task's own ``argv``; without ``stub`` the prefix is the whole command
    (a container: :func:`container_prefix`) and ``argv`` must be empty."""
    tail = ["/bin/sh", "-c", EXEC_STUB, "gptrm-exec", *argv] if stub else list(argv)
    return ["/bin/sh", "-c", WRAPPER, "gptrm-task", str(fifo), str(exit_file), cgroup, str(env_file), *prefix, *tail]
