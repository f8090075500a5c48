"""Task runtime: carries out placement decisions on this host.

Every task starts under a small root ``sh`` wrapper, its own process group and session, which
moves itself into the task's cgroup (where the host allows one, :mod:`agent.taskkill`), opens the
task's output FIFO (:mod:`agent.logpump`), starts the task through ``setpriv`` as the task's user
(a uid of its own by default, :mod:`agent.task_user`) and records the exit code in the agent's own
directory, so a restarted agent still reports the real exit code. The task sees only what is its
own (:mod:`agent.taskfs`): a fresh 0700 working directory, a clean environment (``PATH``,
``HOME``, ``LANG``, ``USER``, ``LOGNAME``, its spec's variables and gptrm's), nothing of the
agent's. ``CUDA_VISIBLE_DEVICES`` holds the allocated GPUs' UUIDs; ``NNODES``, ``NODE_RANK``,
``MASTER_ADDR``, ``MASTER_PORT`` and the rest of :func:`launch_env` tell a part of a multi-node
task its rank and its peers; rank 0's agent listens on the master port from the start and hands
the socket to the task (``GPTRM_MASTER_LISTEN_FD``, :func:`check_master_port`, ``docs/ports.md``).
When the task ends, or is stopped, whatever it left running is killed, however it detached.

Decisions are idempotent by id: a re-delivered decision is acknowledged with its recorded outcome
and never run twice. A decision this agent does not understand (no action, or one newer than
itself) is refused with a reason; it never ends the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import socket
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
from google.protobuf.unknown_fields import UnknownFieldSet

from agent import launch, systemd_task, taskfs
from agent.collectors.simulated import SIM_LOAD_ENV, parse_sim_load
from agent.collectors.task_metrics import MetricsTarget
from agent.cpu_binding import binding_for, process_prefix
from agent.images import Containers, Image, task_layer
from agent.images.bundle import device_paths, oci_config, write_config
from agent.images.cdi import apply_cdi, load_specs
from agent.launch import TASK_PATH
from agent.logpump import LogPump
from agent.logstore import TaskLog, valid_task_id
from agent.sessions import SessionService, TaskContext, task_context
from agent.task_user import NoRoom, TaskUser, TaskUserPolicy, UidClaims
from agent.taskkill import (
    TaskCgroup,
    cgroup_root,
    descendants,
    end_task,
    memory_cgroup_root,
    memory_limit,
    node_tag,
    uid_processes,
)
from agent.tasktable import DecisionOutcome, TaskRecord, TaskTable
from common.errors import GptrmError
from common.logging import get_logger
from common.oci import parse_image, parse_mount
from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.pbenum import pb_enum
from common.qos import ROLES
from common.types import TaskState

__all__ = [
    "MASTER_LISTEN_FD",
    "TASK_PATH",
    "MasterPortTaken",
    "TaskRuntime",
    "binds_port_itself",
    "check_master_port",
    "launch_env",
    "master_listen_handoff",
]

_START_STEP_CODES = (125, 126, 127)
"""Exit codes of the start steps that could not run the task (set-up failed, not executable, not found)."""
_FIRST_PASSED_FD = 10
"""The lowest fd number a task inherits from the agent (the master port's listener)."""
_KNOWN_ACTIONS = frozenset({"start", "stop", "pause", "resume", "scale", "set_power_limit", "pull_image"})
_LOG_TAIL_BYTES = 4096
_MAX_METRICS_FIELD = 1024   # longer values are refused when scraped; this only bounds the task table
_POLL_S = 0.2
Emit = Callable[[agent_pb2.TaskStatus], object]


class UnknownTask(GptrmError):
    """A decision names a task this agent does not run (the ack says so, so the coordinator reconciles)."""


def _tail(path: str, limit: int = _LOG_TAIL_BYTES) -> str:
    """The end of a task's log (never following a link, never a file that is not the agent's own)."""
    data, _ = TaskLog(Path(path)).tail(0, limit)
    return data.decode(errors="replace")


def _alive(rec: TaskRecord) -> bool:
    if rec.pid <= 1:    # a transient service that ended before its pid was read
        return False
    try:
        p = psutil.Process(rec.pid)
        return abs(p.create_time() - rec.create_time) < 1.0 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class TaskRuntime:
    """Starts, stops, pauses and resumes task processes; reports their states.

    :param state_dir: the agent's state directory (``tasks.json``, ``tasks/<id>/``).
    :param emit: receives every task-status event (queued in the outbox, never dropped).
    :param gpus: the GPU backend (simulated GPUs follow the tasks; power limits go here).
    :param task_users: who tasks run as (see :mod:`agent.task_user`); None runs them as the agent's user.
    :param runtime: ``process`` (a child process group) or ``systemd-run`` (a transient service
        outside the agent's cgroup and sandbox, with only the task's GPU device nodes; see
        :mod:`agent.systemd_task`).
    :param task_path: a task's ``PATH`` unless its spec sets one.
    :param namespaces: ``auto`` gives each task its own PID, mount and IPC namespace and ``/dev/shm``
        where the host allows it (see :mod:`agent.launch`); ``off`` never does.
    :param containers: runs tasks with an image (:mod:`agent.images`); None or unavailable refuses them.
    """

    def __init__(self, state_dir: Path, emit: Emit, gpus: Any, *, task_users: TaskUserPolicy | None = None,
                 runtime: str = "process", pump: LogPump | None = None, cgroups: bool = True,
                 task_path: str = TASK_PATH, namespaces: str = "auto", containers: Containers | None = None) -> None:
        self.state_dir = Path(state_dir)
        taskfs.secure_state_dir(self.state_dir)
        self.table = TaskTable.load(self.state_dir / "tasks.json")
        self._own_pump = pump is None
        self.pump = pump if pump is not None else LogPump(self.state_dir / "tasks")
        if self._own_pump:
            self.pump.start()
        own_cgroups = cgroups and runtime == "process" and os.geteuid() == 0
        self._cgroup_root = cgroup_root() if own_cgroups else None
        self._memory_root = memory_cgroup_root() if own_cgroups else None
        self._node_tag = node_tag(self.state_dir)
        if task_users is not None:
            task_users.resume_after([r.own_uid for r in self.table.tasks.values()])
            if task_users.uids is not None and task_users.claims is None:
                task_users.claims = UidClaims.open(self._node_tag)
        self._emit = emit
        self._gpus = gpus
        self._users = task_users
        if runtime == "systemd-run" and not systemd_task.systemd_running():
            raise GptrmError("--runtime systemd-run: systemd is not PID 1 or systemd-run is missing on this host")
        self._runtime = runtime
        self._task_path = task_path
        self._programs = launch.Programs.find()
        self._namespaces = namespaces != "off" and self._programs.namespaces_work()
        self.containers = containers
        self.sessions = SessionService(self._exec_context, self._programs)   # docs/interactive.md
        self._procs: dict[str, asyncio.subprocess.Process] = {}
        self._pulling: dict[str, asyncio.Task] = {}   # starts waiting for their image's pull
        self._pulling_runs: dict[str, str] = {}       # their start decisions
        self._resuming: set[str] = set()              # of those, the ones past their pull, being started
        self._watchers: dict[str, asyncio.Task] = {}
        self._descendants: dict[str, list[psutil.Process]] = {}   # found at stop, for tasks without cgroup or uid
        self._scrubbing: set[int] = set()   # own uids of ended tasks whose leftovers are being removed
        self._cleanups: set[asyncio.Task] = set()   # after a restart: uids claimed by tasks no longer in the table
        self._log = get_logger("agent").bind(component="runtime")
        self._log.info("task_isolation", namespaces=self._namespaces, configured=namespaces,
                       programs={k: getattr(self._programs, k) for k in self._programs.__slots__})

    # ---- reporting --------------------------------------------------------------------------

    def _report(self, rec: TaskRecord, state: TaskState, reason: str = "", *, exit_code: int | None = None,
                decision_id: str = "") -> None:
        rec.state = int(state)
        # Every report names the start decision of the run it is about, so a leader can tell a late report of
        # an earlier run of the same task (requeued and placed again meanwhile) from one of the run it placed.
        status = agent_pb2.TaskStatus(task_id=rec.task_id, state=pb_enum(types_pb2.TaskState, state), pids=[rec.pid],
                                      reason=reason,
                                      time_unix_s=time.time(), decision_id=decision_id or rec.decision_id)
        if exit_code is not None:
            status.exit_code = exit_code
            status.has_exit_code = True
            status.log_tail = _tail(rec.log_path)
        self._emit(status)

    def statuses(self) -> list[agent_pb2.TaskStatus]:
        """The whole task table, sent with every Register so the coordinator can reconcile."""
        return [agent_pb2.TaskStatus(task_id=r.task_id, state=pb_enum(types_pb2.TaskState, r.state), pids=[r.pid],
                                     decision_id=r.decision_id,
                                     time_unix_s=time.time()) for r in self.table.tasks.values()]

    def task_pids(self) -> dict[str, list[int]]:
        """Root pid of every running task (for per-task CPU/RSS/GPU accounting)."""
        return {r.task_id: [r.pid] for r in self.table.tasks.values()}

    def own_uids(self) -> list[int]:
        """The uids of this agent's own that its tasks hold now (read by the sampler's thread)."""
        return [r.own_uid for r in list(self.table.tasks.values()) if r.own_uid >= 0]

    def metrics_targets(self) -> dict[str, MetricsTarget]:
        """The metrics endpoint of every running task that declared one (read by the sampler's thread)."""
        return {r.task_id: MetricsTarget.declared(r.metrics_url, r.metrics_flavour, r.metrics_names)
                for r in list(self.table.tasks.values())
                if r.metrics_url and r.state == int(TaskState.RUNNING) and not r.stopping}

    # ---- decisions --------------------------------------------------------------------------

    async def handle(self, decision: agent_pb2.Decision) -> agent_pb2.DecisionAck:
        """Carry out one decision at most once; re-delivery returns the recorded outcome."""
        done = self.table.decisions.get(decision.decision_id)
        if decision.decision_id and done is not None:
            return agent_pb2.DecisionAck(decision_id=decision.decision_id, ok=bool(done["ok"]),
                                         reason=str(done["reason"]),
                                         resulting_state=pb_enum(types_pb2.TaskState, done["state"]),
                                         task_id=str(done["task_id"]))
        action = decision.WhichOneof("action")
        task_id = getattr(getattr(decision, action), "task_id", "") if action else ""
        try:
            if action not in _KNOWN_ACTIONS:
                raise GptrmError(_not_understood(decision, action))
            task_id, state = await getattr(self, f"_do_{action}")(decision)
            ack = agent_pb2.DecisionAck(decision_id=decision.decision_id, ok=True,
                                        resulting_state=pb_enum(types_pb2.TaskState, state), task_id=task_id)
        except Exception as e:
            if not isinstance(e, (GptrmError, OSError, ValueError, KeyError, psutil.Error)):
                self._log.exception("decision_failed", decision_id=decision.decision_id, action=action or "",
                                    task_id=task_id)
                e = GptrmError(f"the agent failed carrying out {action!r}: {type(e).__name__}: {e}")
            ack = agent_pb2.DecisionAck(decision_id=decision.decision_id, ok=False, reason=str(e), task_id=task_id,
                                        task_unknown=isinstance(e, UnknownTask),
                                        no_room=isinstance(e, NoRoom))
            self._log.warning("decision_refused", decision_id=decision.decision_id, task_id=task_id,
                              action=action or "", reason=str(e))
        # A start waiting for its image's pull has no outcome yet: its re-delivery (after an agent restart lost the
        # pull) must start it, not answer from the table. _start_after_pull records the outcome.
        deferred = action == "start" and ack.ok and task_id in self._pulling and task_id not in self._resuming
        if decision.decision_id and not deferred:
            self.table.decisions[decision.decision_id] = {"ok": ack.ok, "reason": ack.reason,
                                                          "state": ack.resulting_state, "task_id": ack.task_id}
        try:
            self.table.save()   # the decision's effect and its outcome in one atomic write
        except OSError as e:
            self._log.error("task_table_save_failed", decision_id=decision.decision_id, reason=str(e))
            if action == "start" and ack.ok:
                ack = await self._abandon_start(decision, e)
        return ack

    async def _abandon_start(self, decision: agent_pb2.Decision, error: OSError) -> agent_pb2.DecisionAck:
        """A task started but its record could not be saved: kill it rather than run it unrecorded
        (a restarted agent would forget it). Reported FAILED, and the start refused, with the cause."""
        task_id = decision.start.task_id
        reason = f"task {task_id!r} killed at start: the agent could not record it in its state file ({error})"
        rec = self.table.tasks.pop(task_id, None)
        if rec is not None and rec.own_uid >= 0:
            self._scrubbing.add(rec.own_uid)
        watcher = self._watchers.pop(task_id, None)
        if watcher is not None:
            watcher.cancel()
        proc = self._procs.pop(task_id, None)
        if rec is not None:
            self._signal(rec, signal.SIGKILL)
            if proc is not None:
                await proc.wait()
            await self._end_processes(rec)
            await self._release(rec)
            remove = getattr(self._gpus, "remove", None)
            if remove is not None:
                remove(task_id)
            self._report(rec, TaskState.FAILED, reason, exit_code=-int(signal.SIGKILL))
        self._log.warning("decision_refused", decision_id=decision.decision_id, task_id=task_id, reason=reason)
        outcome: DecisionOutcome = {"ok": False, "reason": reason, "state": int(TaskState.FAILED), "task_id": task_id}
        if decision.decision_id:
            self.table.decisions[decision.decision_id] = outcome
        return agent_pb2.DecisionAck(decision_id=decision.decision_id, ok=False, reason=reason, task_id=task_id)

    def _known(self, task_id: str) -> TaskRecord:
        rec = self.table.tasks.get(task_id)
        if rec is None:
            raise UnknownTask(f"task {task_id!r} is not running on this node")
        return rec

    async def _do_start(self, decision: agent_pb2.Decision) -> tuple[str, TaskState]:
        st = decision.start
        if st.task_id in self.table.tasks:
            return st.task_id, TaskState(self.table.tasks[st.task_id].state)
        if not st.argv:
            raise GptrmError(f"task {st.task_id!r}: empty argv")
        if not valid_task_id(st.task_id):
            raise GptrmError(f"task id {st.task_id[:64]!r} cannot name a directory")
        if st.task_id in self._pulling and st.task_id not in self._resuming:
            return st.task_id, TaskState.STARTING
        if st.image and self.containers is not None and self.containers.store is not None \
                and st.task_id not in self._resuming and not self.containers.store.has(parse_image(st.image).text):
            # The pull may take minutes: it runs beside the decision stream (a stop still reaches the task), and
            # the start carries on once the image is there (reported STARTING, with the pull's progress, meanwhile).
            self._pulling[st.task_id] = asyncio.create_task(self._start_after_pull(decision))
            self._pulling_runs[st.task_id] = decision.decision_id
            return st.task_id, TaskState.STARTING
        listener = check_master_port(st)   # held from here until the task's process holds it
        try:
            taken = self.own_uids() + sorted(self._scrubbing)
            user = self._users.resolve(st.run_as_user, taken=taken) if self._users is not None else None
            try:
                return await self._start_as(decision, user, listener)
            except BaseException:
                if user is not None and user.exclusive and self._users is not None:
                    self._users.release(user.uid)   # nothing runs as it
                raise
        finally:
            if listener is not None:
                listener.close()   # the task's process has its own copy (or nothing started)

    async def _start_after_pull(self, decision: agent_pb2.Decision) -> None:
        """A start whose image was not in the store: pull it, then start as any start (the decision handled again,
        its outcome recorded then). A pull or start that fails is reported FAILED with its reason (the coordinator
        had its ack already)."""
        st = decision.start
        try:
            try:
                await self._pull(decision)
            finally:
                if self.containers is not None and self.containers.store is not None:
                    self.containers.store.release(st.task_id)   # the start acquires it again, for its whole run
        except asyncio.CancelledError:
            raise
        except GptrmError as e:
            self._pulling.pop(st.task_id, None)
            self._pulling_runs.pop(st.task_id, None)
            self._fail_unstarted(decision, str(e))
            return
        # Started as any start; until it is in the table a stop waits for it (_do_stop) rather than find no task.
        self._resuming.add(st.task_id)
        try:
            ack = await self.handle(decision)
        finally:
            self._resuming.discard(st.task_id)
            self._pulling.pop(st.task_id, None)
            self._pulling_runs.pop(st.task_id, None)
        if not ack.ok:
            self._fail_unstarted(decision, ack.reason)

    def _fail_unstarted(self, decision: agent_pb2.Decision, reason: str) -> None:
        st = decision.start
        self._log.warning("task_not_started", task_id=st.task_id, decision_id=decision.decision_id, reason=reason)
        if decision.decision_id:
            self.table.decisions[decision.decision_id] = {"ok": False, "reason": reason,
                                                          "state": int(TaskState.FAILED), "task_id": st.task_id}
            with contextlib.suppress(OSError):
                self.table.save()
        self._emit(agent_pb2.TaskStatus(task_id=st.task_id, state=pb_enum(types_pb2.TaskState, TaskState.FAILED),
                                        reason=reason[:_MAX_METRICS_FIELD], time_unix_s=time.time(),
                                        decision_id=decision.decision_id))

    async def _pull(self, decision: agent_pb2.Decision) -> Image | None:
        """The image a start runs from, pulled into the node's store when it lacks it (None: no image). While it
        pulls the task is reported STARTING with what the pull is doing (bytes so far, unpacking).

        :raises GptrmError: this node runs no containers, or the pull failed (the registry's own error).
        """
        st = decision.start
        if not st.image:
            return None
        if self.containers is None or self.containers.store is None:
            raise GptrmError(f"task {st.task_id!r}: this node cannot run tasks with an image (the agent is not root, "
                             "or crun, skopeo or umoci is not installed)")
        said = [""]

        def progress(text: str) -> None:
            if text != said[0]:
                said[0] = text
                self._emit(agent_pb2.TaskStatus(task_id=st.task_id, state=pb_enum(types_pb2.TaskState,
                                                                                  TaskState.STARTING),
                                                reason=text[:_MAX_METRICS_FIELD], time_unix_s=time.time(),
                                                decision_id=decision.decision_id))

        return await self.containers.store.acquire(parse_image(st.image), st.task_id, progress)

    def _container_command(self, st: agent_pb2.StartTask, image: Image, user: TaskUser | None,
                           paths: taskfs.TaskPaths, task_env: dict[str, str],
                           pass_fds: tuple[int, ...] = ()) -> list[str]:
        """The root prefix that runs the task's container: a fresh writable layer of its own over the image, and the
        bundle's ``config.json`` with its argv, uid, environment, mounts, GPUs and ``/dev/shm`` (docs/containers.md).

        :raises GptrmError: a mount whose source is missing or reached through a link.
        """
        assert self.containers is not None
        mounts = [parse_mount(m, f"mounts[{i}]") for i, m in enumerate(st.mounts)]
        for m in mounts:
            _no_link_on_the_way(m.source)
        layer = task_layer(paths.agent_dir)
        layer.create()
        uid, gid = (user.uid, user.gid) if user is not None and user.switch else (os.geteuid(), os.getegid())
        env = dict(task_env)
        if "HOME" not in st.env:
            env["HOME"] = "/tmp"   # the host's work directory is not inside the container
        config = oci_config(image_config=image.config(), rootfs=str(layer.merged), argv=list(st.argv), env=env,
                            uid=uid, gid=gid, workdir=st.workdir, mounts=mounts,
                            shm_bytes=st.shm_bytes or st.demand.mem_bytes, gpu_indices=list(st.gpu_indices),
                            hostname=os.uname().nodename, task_path_given="PATH" in st.env)
        if self.containers.cdi_dirs and st.gpu_indices:
            apply_cdi(config, load_specs(self.containers.cdi_dirs), list(st.gpu_indices), list(st.gpu_uuids),
                      device_paths(st.gpu_indices))
        write_config(str(layer.bundle / "config.json"), config)
        return launch.container_prefix(self._programs, crun=self.containers.crun, lower=str(image.rootfs),
                                       upper=str(layer.upper), work=str(layer.work), merged=str(layer.merged),
                                       bundle=str(layer.bundle), state=str(layer.state),
                                       container_id=f"gptrm-{self._node_tag}-{st.task_id}"[:200], pass_fds=pass_fds)

    async def _start_as(self, decision: agent_pb2.Decision, user: TaskUser | None,
                        listener: socket.socket | None = None) -> tuple[str, TaskState]:
        st = decision.start
        switch = user is not None and user.switch
        self._record_or_refuse(st.task_id)
        image = await self._pull(decision)
        try:
            return await self._start_prepared(decision, user, listener, image, switch)
        except BaseException:
            if image is not None and self.containers is not None and self.containers.store is not None:
                self.containers.store.release(st.task_id)
                task_layer(taskfs.TaskPaths.of(self.state_dir, st.task_id).agent_dir).remove()
            raise

    async def _start_prepared(self, decision: agent_pb2.Decision, user: TaskUser | None,
                              listener: socket.socket | None, image: Image | None,
                              switch: bool) -> tuple[str, TaskState]:
        st = decision.start
        paths = taskfs.prepare(self.state_dir, st.task_id, user)
        # A systemd unit cannot inherit the listener, and torchrun binds the port itself: for those the port
        # is free again from here (docs/ports.md).
        handoff = listener if self._runtime != "systemd-run" and not binds_port_itself(st) else None
        if listener is not None and handoff is None:
            listener.close()
        pass_fds, listen_env = master_listen_handoff(handoff)
        task_env = {**_task_env(st, user, paths.work_dir, self._task_path), **listen_env}
        container = (self._container_command(st, image, user, paths, task_env, pass_fds) if image is not None
                     else None)
        # A container's environment is in its config.json; the wrapper still opens (and removes) an empty file.
        launch.write_env_file(paths.env_file, task_env if container is None else {})
        memory_max = memory_limit(st.demand.mem_bytes)
        cgroup = TaskCgroup.create(self._cgroup_root, self._node_tag, st.task_id, memory_max=memory_max,
                                   memory_root=self._memory_root)
        devices = getattr(self._gpus, "devices", None)
        binding = binding_for(devices(), st.gpu_indices) if devices is not None else None
        # The process runtime binds the task alone (inside the wrapper, before setpriv); a
        # systemd unit is bound by its properties instead.
        bind = (process_prefix(binding, taskset=self._programs.taskset, numactl=self._programs.numactl)
                if self._runtime != "systemd-run" else [])
        isolate = launch.namespace_prefix(self._programs, st.demand.mem_bytes) if self._namespaces else []
        drop = user.setpriv_argv(self._programs.setpriv) if switch and user is not None else []
        terminal = self._terminal_for(st, paths.fifo, container is not None)
        if container is not None:
            # crun gives the container its own namespaces and drops to the task's uid itself.
            command = launch.task_command(fifo=paths.fifo, exit_file=paths.exit_file,
                                          cgroup=str(cgroup.path) if cgroup else "", env_file=paths.env_file,
                                          prefix=[*bind, *container], argv=[], stub=False)
        else:
            if terminal is not None:   # its terminal as the task's stdin, stdout and stderr (agent.sessions)
                drop = terminal.around(drop, self.sessions.setsid)
                pass_fds = (*pass_fds, terminal.slave)
            command = launch.task_command(fifo=paths.fifo, exit_file=paths.exit_file,
                                          cgroup=str(cgroup.path) if cgroup else "", env_file=paths.env_file,
                                          prefix=[*isolate, *bind, *drop], argv=st.argv)
        self._log.info("task_starting", task_id=st.task_id, decision_id=decision.decision_id,
                       gpu_indices=list(st.gpu_indices), user=user.name if user else "",
                       uid=user.uid if user else os.geteuid(), runtime=self._runtime,
                       cgroup=str(cgroup.path) if cgroup else "",
                       cpu_binding=binding.cpu_list if binding else "",
                       numa_binding=binding.node_list if binding else "", image=st.image,
                       image_digest=image.digest if image is not None else "")
        self.pump.attach(st.task_id).result()
        proc: asyncio.subprocess.Process | None = None
        try:
            if self._runtime == "systemd-run":
                pid = await systemd_task.start_service(st.task_id, command, gpu_indices=list(st.gpu_indices),
                                                       paths=paths, binding=binding, memory_max=memory_max)
            else:
                # What the wrapper says before it starts the task (a FIFO it cannot open, ...) lands in the task's
                # log too: its stderr is the task's FIFO from the start.
                with _fifo_for_writing(paths.fifo) as err:
                    proc = await asyncio.create_subprocess_exec(
                        *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                        stderr=err, cwd=paths.work_dir, env=launch.root_env(), start_new_session=True,
                        pass_fds=pass_fds)
                pid = proc.pid
        except BaseException:
            self.pump.detach(st.task_id)
            self.sessions.task_ended(st.task_id)
            if cgroup is not None:
                cgroup.remove()
            taskfs.remove_work(self.state_dir, st.task_id)
            raise
        rec = TaskRecord(st.task_id, decision.decision_id, pid, _create_time(pid),
                         list(st.gpu_indices), list(st.gpu_uuids), str(paths.log), str(paths.exit_file),
                         st.stop_grace_s or 10.0, int(TaskState.STARTING), time.time(), st.gpu_share or 1.0,
                         st.demand.gpu_mem_bytes, metrics_url=st.metrics_url[:_MAX_METRICS_FIELD],
                         metrics_flavour=st.metrics_mapping.flavour[:_MAX_METRICS_FIELD],
                         metrics_names=_metric_overrides(st.metrics_mapping),
                         own_uid=user.uid if user is not None and user.exclusive else -1,
                         cgroup=str(cgroup.path) if cgroup else "", piped=True,
                         sim_load=self._declared_sim_load(st), image=st.image)
        # No await from here until handle() saves the table (one fsync per start, with the
        # pid, the RUNNING state and the decision's outcome together): an agent killed in
        # between loses nothing it could have recorded.
        self.table.tasks[st.task_id] = rec
        if proc is not None:
            self._procs[st.task_id] = proc
        if terminal is not None:
            terminal.started()
        self._report(rec, TaskState.STARTING, decision_id=decision.decision_id)
        self._follow_gpus(rec)
        self._report(rec, TaskState.RUNNING, decision_id=decision.decision_id)
        self._watchers[st.task_id] = asyncio.create_task(self._watch(rec))
        return st.task_id, TaskState.RUNNING

    def _terminal_for(self, st: agent_pb2.StartTask, fifo: Path, in_container: bool) -> Any:
        """The terminal of a ``pty`` task (None for any other); the process runtime only, not in a container."""
        if not st.pty:
            return None
        if in_container:
            raise GptrmError(f"task {st.task_id!r}: --pty is not for a task in a container image")
        if self._runtime != "process":
            raise GptrmError(f"task {st.task_id!r}: --pty needs the agent's process runtime, not {self._runtime}")
        return self.sessions.open_terminal(st.task_id, fifo)

    def _exec_context(self, task_id: str) -> TaskContext:
        """What ``exec`` enters of a running task (:func:`agent.sessions.task_context`)."""
        rec = self._known(task_id)
        if rec.state != int(TaskState.RUNNING) or rec.stopping:
            raise GptrmError(f"task {task_id!r} is not running on this node")
        return task_context(rec.pid, rec.cgroup, taskfs.TaskPaths.of(self.state_dir, task_id).agent_dir)

    def _record_or_refuse(self, task_id: str) -> None:
        """Save the table before a start: a task the agent cannot record (state directory full or
        read-only) is never started, since a restarted agent would forget it.

        :raises GptrmError: naming the task and the cause.
        """
        try:
            self.table.save()
        except OSError as e:
            raise GptrmError(f"task {task_id!r} not started: the agent cannot write its state file "
                             f"{self.table.path} ({e})") from e

    def _declared_sim_load(self, st: agent_pb2.StartTask) -> float:
        """The load a task declares for simulated GPUs (``GPTRM_SIM_LOAD`` in its env); -1 when it declares
        none, has a bad value (logged; its GPUs then follow its CPU) or the GPUs are real."""
        text = st.env.get(SIM_LOAD_ENV)
        if text is None or not getattr(self._gpus, "simulated", False):
            return -1.0
        try:
            return parse_sim_load(text)
        except ValueError as e:
            self._log.warning("sim_load_ignored", task_id=st.task_id, reason=str(e))
            return -1.0

    def _follow_gpus(self, rec: TaskRecord) -> None:
        """Simulated GPUs: run the task on its GPUs, at the load it declared or following its CPU usage."""
        place = getattr(self._gpus, "place", None)
        if place is not None and rec.gpu_indices:
            mem = rec.gpu_mem_bytes // max(1, len(rec.gpu_indices)) if rec.gpu_mem_bytes else 0
            share = min(1.0, rec.gpu_share)
            if rec.sim_load >= 0:
                place(rec.task_id, rec.gpu_indices, share * rec.sim_load, mem, [rec.pid])
            else:
                place(rec.task_id, rec.gpu_indices, share, mem, [rec.pid], follows_load=True)

    async def _do_stop(self, decision: agent_pb2.Decision) -> tuple[str, TaskState]:
        starting = self._pulling.get(decision.stop.task_id) if decision.stop.task_id in self._resuming else None
        if starting is not None:
            # Its image is there and it is being started: stopped once it runs, as any task.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(starting)
        pulling = self._pulling.pop(decision.stop.task_id, None)
        run = self._pulling_runs.pop(decision.stop.task_id, "")
        if pulling is not None:
            # Stopped while its image was pulled: it never starts (the pull goes on for any other task that waits).
            pulling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pulling
            self._emit(agent_pb2.TaskStatus(task_id=decision.stop.task_id,
                                            state=pb_enum(types_pb2.TaskState, TaskState.CANCELLED),
                                            reason="stopped by the coordinator while its image was pulled",
                                            time_unix_s=time.time(), decision_id=run))
            return decision.stop.task_id, TaskState.CANCELLED
        rec = self._known(decision.stop.task_id)
        grace = decision.stop.grace_s or rec.stop_grace_s
        watcher = self._watchers.get(rec.task_id)
        if _read_exit(rec.exit_file) is not None:
            # It ended by itself before the stop came (a gang's other part failing at the same moment, say):
            # it reports its own end, not a stop.
            if watcher is not None:
                await asyncio.shield(watcher)
            return rec.task_id, TaskState(rec.state)
        rec.stopping = True
        self.table.save()
        if _alive(rec):
            self._descendants[rec.task_id] = descendants(rec.pid)
        checkpoint = _checkpoint_signal(decision.stop.checkpoint_signal)
        if checkpoint is not None:
            # A preemption: the task may checkpoint (and exit) on its signal within its grace.
            self._log.info("task_checkpoint_signalled", task_id=rec.task_id, signal=checkpoint.name)
            self._signal(rec, checkpoint)
            self._signal(rec, signal.SIGCONT)
            if watcher is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(watcher), timeout=grace)
        self._signal(rec, signal.SIGTERM)
        self._signal(rec, signal.SIGCONT)   # a paused task must run to handle SIGTERM
        if watcher is not None:
            try:
                await asyncio.wait_for(asyncio.shield(watcher), timeout=grace)
            except TimeoutError:
                self._log.warning("task_killed", task_id=rec.task_id, reason=f"still alive after {grace}s grace")
                self._signal(rec, signal.SIGKILL)
                await watcher
        return rec.task_id, TaskState.CANCELLED

    def _signal_and_report(self, decision: agent_pb2.Decision, task_id: str, sig: signal.Signals,
                           state: TaskState) -> tuple[str, TaskState]:
        rec = self._known(task_id)
        self._signal(rec, sig)
        self._report(rec, state, decision_id=decision.decision_id)
        return rec.task_id, state   # handle() saves the table

    async def _do_pause(self, decision: agent_pb2.Decision) -> tuple[str, TaskState]:
        return self._signal_and_report(decision, decision.pause.task_id, signal.SIGSTOP, TaskState.PAUSED)

    async def _do_resume(self, decision: agent_pb2.Decision) -> tuple[str, TaskState]:
        return self._signal_and_report(decision, decision.resume.task_id, signal.SIGCONT, TaskState.RUNNING)

    async def _do_scale(self, decision: agent_pb2.Decision) -> tuple[str, TaskState]:
        rec = self._known(decision.scale.task_id)
        raise GptrmError(f"task {rec.task_id!r}: replicas are scaled by the coordinator placing or stopping "
                         "replica tasks, not in place on an agent")

    async def _do_pull_image(self, decision: agent_pb2.Decision) -> tuple[str, TaskState]:
        """Fetch an image into the store ahead of its tasks: acknowledged at once, pulled beside the other decisions
        (a failure is logged; what the store holds is reported as it changes)."""
        if self.containers is None or self.containers.store is None:
            raise GptrmError("this node cannot run tasks with an image (the agent is not root, or crun, skopeo or "
                             "umoci is not installed)")
        store, ref = self.containers.store, parse_image(decision.pull_image.image, "image")
        holder = f"pull:{decision.decision_id}"

        async def pull() -> None:
            try:
                await store.acquire(ref, holder)
            except GptrmError as e:
                self._log.warning("image_prepull_failed", image=ref.text, reason=str(e))
            finally:
                store.release(holder)

        task = asyncio.create_task(pull())
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)
        return "", TaskState.RUNNING

    async def _do_set_power_limit(self, decision: agent_pb2.Decision) -> tuple[str, TaskState]:
        spl = decision.set_power_limit
        await asyncio.to_thread(self._gpus.set_power_limit, spl.gpu_index, spl.power_limit_w)
        self._log.info("power_limit_set", gpu_index=spl.gpu_index, power_limit_w=spl.power_limit_w)
        return "", TaskState.RUNNING

    def _signal(self, rec: TaskRecord, sig: signal.Signals) -> None:
        if not _alive(rec):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(rec.pid, sig)
        if rec.image and sig in (signal.SIGSTOP, signal.SIGCONT):
            # A container's processes are in a session of their own (crun passes on the signals it can catch, not
            # SIGSTOP): a pause or resume reaches each of them, found in the task's cgroup or by its own uid.
            pids = (TaskCgroup(Path(rec.cgroup)).pids() if rec.cgroup
                    else [p.pid for p in uid_processes(rec.own_uid)] if rec.own_uid >= 0 else [])
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

    # ---- watching ---------------------------------------------------------------------------

    async def _watch(self, rec: TaskRecord) -> None:
        proc = self._procs.get(rec.task_id)
        if proc is not None:
            code = await proc.wait()
        else:
            while _alive(rec):
                await asyncio.sleep(_POLL_S)
            code = None
        await self._end_processes(rec)
        self.sessions.task_ended(rec.task_id)
        if rec.own_uid >= 0:
            self._scrubbing.add(rec.own_uid)   # out of the table from _finish on, not free before _release
        self._finish(rec, code)
        await self._release(rec)

    async def _end_processes(self, rec: TaskRecord) -> None:
        """Kill whatever of the task is still running, however it detached (see :mod:`agent.taskkill`)."""
        cgroup = TaskCgroup(Path(rec.cgroup)) if rec.cgroup else None
        await end_task(cgroup=cgroup, uid=rec.own_uid if rec.own_uid >= 0 else None,
                       found_at_stop=self._descendants.pop(rec.task_id, None))

    async def _release(self, rec: TaskRecord) -> None:
        """After the task's last process: its working directory, and what its own uid left on the host;
        only then is the uid free for another task."""
        await asyncio.to_thread(taskfs.remove_work, self.state_dir, rec.task_id)
        if rec.image:
            await asyncio.to_thread(task_layer(taskfs.TaskPaths.of(self.state_dir, rec.task_id).agent_dir).remove)
            if self.containers is not None and self.containers.store is not None:
                self.containers.store.release(rec.task_id)
        if rec.own_uid >= 0:
            await self._scrub_and_free(rec.own_uid, rec.task_id)

    async def _scrub_and_free(self, uid: int, task_id: str) -> None:
        """Remove what ``uid`` left (:func:`agent.taskfs.scrub_uid`), then give the uid back."""
        self._scrubbing.add(uid)
        try:
            removed = await asyncio.to_thread(taskfs.scrub_uid, uid)
        except OSError as e:
            # Better unused than handed over with what it left: this agent keeps it out of new starts, and its claim
            # makes a restarted agent try again.
            self._log.error("task_uid_scrub_failed", task_id=task_id, uid=uid, reason=str(e))
            return
        if removed:
            self._log.info("task_files_removed", task_id=task_id, uid=uid, paths=removed[:20], count=len(removed))
        if self._users is not None:
            self._users.release(uid)
        self._scrubbing.discard(uid)

    async def _clean_up_after(self, uid: int) -> None:
        """A uid this agent claimed for a task that is no longer in its table (the agent stopped between the
        task's end and its clean-up): end what still runs as it, remove what it left, give it back."""
        await end_task(cgroup=None, uid=uid)
        await self._scrub_and_free(uid, "")

    def _finish(self, rec: TaskRecord, code: int | None) -> None:
        if rec.piped:
            with contextlib.suppress(OSError, TimeoutError):
                self.pump.detach(rec.task_id).result(timeout=30)
        else:
            self.pump.bound_unpiped(rec.task_id, running=False)
        recorded = _read_exit(rec.exit_file)
        if recorded is not None:
            code = recorded
        remove = getattr(self._gpus, "remove", None)
        if remove is not None:
            remove(rec.task_id)
        # What the start steps said when they could not run the task (its program not on its PATH, ...): a
        # failure of its own even when a stop came meanwhile (a gang's other part failing the same way).
        said = _own_words(rec.log_path) if code in _START_STEP_CODES else ""
        if rec.stopping and not said:
            state, reason = TaskState.CANCELLED, "stopped by the coordinator"
        elif code == 0:
            state, reason = TaskState.SUCCEEDED, ""
        elif recorded is None and code is not None and code > 0:
            # The wrapper records the task's exit code once the task ends: it ended before the task did.
            last = _last_line(rec.log_path)
            state, reason = TaskState.FAILED, (f"the task did not start: its wrapper exited with code {code}"
                                               + (f": {last[:300]}" if last else ""))
        else:
            state = TaskState.FAILED
            reason = (f"exited with code {code}" if code is not None and code >= 0
                      else f"killed by signal {-code}" if code is not None else "ended while the agent was down; "
                      "exit code unknown")
            if said:
                reason = f"{reason}: {said}"
        self._log.info("task_exited", task_id=rec.task_id, exit_code=code, state=state.label)
        self._report(rec, state, reason, exit_code=code if code is not None else -1)
        self.table.tasks.pop(rec.task_id, None)
        self._procs.pop(rec.task_id, None)
        self._watchers.pop(rec.task_id, None)
        self.table.save()

    def adopt(self) -> None:
        """After an agent restart: follow tasks still alive, report those that ended meanwhile (and clean up
        after their uids), and clean up after uids it still claims that no task of its table holds."""
        in_table = set(self.own_uids())
        for uid in self._users.held() if self._users is not None else []:
            if uid not in in_table:
                self._scrubbing.add(uid)   # not handed out before its clean-up is done
                cleanup = asyncio.create_task(self._clean_up_after(uid))
                self._cleanups.add(cleanup)
                cleanup.add_done_callback(self._cleanups.discard)
        for rec in list(self.table.tasks.values()):
            if rec.piped:
                try:
                    self.pump.attach(rec.task_id).result()
                except OSError as e:
                    self._log.warning("task_log_unavailable", task_id=rec.task_id, reason=str(e))
            else:
                self.pump.bound_unpiped(rec.task_id)
            if rec.image and self.containers is not None and self.containers.store is not None:
                self.containers.store.hold(rec.image, rec.task_id)
            if _alive(rec):
                self._log.info("task_adopted", task_id=rec.task_id, pid=rec.pid)
                self._follow_gpus(rec)
                self._watchers[rec.task_id] = asyncio.create_task(self._watch(rec))
            else:
                self._watchers[rec.task_id] = asyncio.create_task(self._watch(rec))   # ends it at once

    async def shutdown(self) -> None:
        """Stop watching (tasks keep running; a restarted agent adopts them)."""
        for w in [*self._watchers.values(), *self._cleanups, *self._pulling.values()]:
            w.cancel()
        if self._own_pump:
            await asyncio.to_thread(self.pump.stop)


def _no_link_on_the_way(path: str) -> None:
    """Refuse a mount source that is missing or that a symbolic link anywhere on its path leads to: a task could
    otherwise plant a link below an allowed root and have another task's container (or its own) mount what the
    link points at.

    :raises GptrmError: naming the path and the component.
    """
    current = "/"
    for part in [p for p in path.split("/") if p]:
        current = os.path.join(current, part)
        try:
            st = os.lstat(current)
        except OSError as e:
            raise GptrmError(f"mount source {path!r}: {current} {e.strerror or e}") from None
        if stat.S_ISLNK(st.st_mode):
            raise GptrmError(f"mount source {path!r}: {current} is a symbolic link (refused: a mount never goes "
                             "through a link)")


def _metric_overrides(mapping: types_pb2.MetricsMapping) -> dict[str, str]:
    """The role → name overrides of a StartTask's mapping (bounded; checked when scraped)."""
    return {role: getattr(mapping, role)[:_MAX_METRICS_FIELD] for role in ROLES if getattr(mapping, role)}


def _last_line(log_path: str) -> str:
    """The last non-empty line of a task's log ("" when it has none)."""
    lines = _tail(log_path, 1024).strip().splitlines()
    return lines[-1] if lines else ""


def _own_words(log_path: str) -> str:
    """The last line of a task's log when the agent's own start steps wrote it ("gptrm: ..."): why the task could
    not start (its program not on its PATH, its environment or /dev/shm not set up)."""
    last = _last_line(log_path)
    return last.removeprefix("gptrm: ")[:_MAX_METRICS_FIELD] if last.startswith("gptrm: ") else ""


def _create_time(pid: int) -> float:
    """The process's start time; a task that already exited (and was reaped) started just now."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return time.time()


@contextlib.contextmanager
def _fifo_for_writing(path: Path) -> Iterator[int]:
    """The task's FIFO open for writing (blocking writes, like the task's own), or /dev/null where it cannot be."""
    try:
        fd = taskfs.open_nofollow(path, os.O_WRONLY, kind=stat.S_IFIFO)
        os.set_blocking(fd, True)
    except OSError:
        fd = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def _read_exit(path: str) -> int | None:
    """The exit code the wrapper recorded (a file in the agent's own directory; never through a link)."""
    try:
        fd = taskfs.open_nofollow(Path(path), os.O_RDONLY)
    except OSError:
        return None
    try:
        return int(os.read(fd, 64).decode(errors="replace").strip())
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def _task_env(st: agent_pb2.StartTask, user: TaskUser | None, workdir: Path, path: str = TASK_PATH) -> dict[str, str]:
    """A task's whole environment: nothing of the agent's (see the module docstring); applied to the task's own
    process only, after the drop to its user (:mod:`agent.launch`)."""
    base = {"PATH": path, "LANG": os.environ.get("LANG") or "C.UTF-8"}
    if user is not None and user.switch:
        base.update(user.env(str(workdir)))
    else:
        base.update({"HOME": str(workdir), **({"USER": user.name, "LOGNAME": user.name} if user else {})})
    return {**base, **dict(st.env), "CUDA_VISIBLE_DEVICES": ",".join(st.gpu_uuids), "GPTRM_TASK_ID": st.task_id,
            "GPTRM_GPU_INDICES": ",".join(map(str, st.gpu_indices)), **launch_env(st)}


def launch_env(st: agent_pb2.StartTask) -> dict[str, str]:
    """The distributed-launch variables of a part: its rank and its peers (none from a coordinator that sends
    no ``nnodes``). ``MASTER_PORT`` only when a port was reserved."""
    if not st.nnodes:
        return {}
    env = {"NNODES": str(st.nnodes), "NODE_RANK": str(st.node_rank), "LOCAL_WORLD_SIZE": str(st.local_world_size),
           "WORLD_SIZE": str(st.world_size), "MASTER_ADDR": st.master_addr,
           "GPTRM_NODELIST": ",".join(st.node_addresses), "GPTRM_NODE_IDS": ",".join(st.node_ids)}
    if st.master_port:
        env["MASTER_PORT"] = str(st.master_port)
    return env


class MasterPortTaken(NoRoom):
    """Rank 0's agent could not reserve a task's master port: something else on this node holds it."""


MASTER_LISTEN_FD = "GPTRM_MASTER_LISTEN_FD"
"""The task's variable naming the inherited fd of its listening master-port socket (rank 0 of a gang only)."""


def check_master_port(st: agent_pb2.StartTask) -> socket.socket | None:
    """Reserve the master port of rank 0 of a multi-node task: bind and listen on it now, before anything
    of the task runs, and keep it until the task's rank-0 process holds it (:func:`master_listen_handoff`).
    Nothing else on the node can bind a port while this socket listens on it, whatever its uid or socket
    options (``docs/ports.md``). A single-node task, another rank, or a start without a port reserves
    nothing (None).

    The socket listens on every address of both families where the host has IPv6 (an IPv6 socket that
    also takes IPv4), else on every IPv4 address; it is not inherited by anything but the task.

    :raises MasterPortTaken: naming the task and the port, when something else holds the port.
    """
    if st.nnodes <= 1 or st.node_rank != 0 or not st.master_port:
        return None
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError:   # no IPv6 on this host
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        address: tuple[str, int] = ("0.0.0.0", st.master_port)
    else:
        address = ("::", st.master_port)
    try:
        # SO_REUSEADDR: a connection of an earlier run left in TIME_WAIT does not hold the port; a
        # listener (another task's, or a squatter's) still does.
        if sock.fileno() < _FIRST_PASSED_FD:
            # Below it are the fds the root wrapper and the exec stub use (the output FIFO, the environment).
            moved = socket.socket(fileno=fcntl.fcntl(sock.fileno(), fcntl.F_DUPFD_CLOEXEC, _FIRST_PASSED_FD))
            sock.close()
            sock = moved
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if sock.family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
    except OSError as e:
        sock.close()
        raise MasterPortTaken(f"task {st.task_id!r} not started: its master port {st.master_port} cannot be "
                              f"bound on this node ({e.strerror or e}); it is placed again") from None
    return sock


def binds_port_itself(st: agent_pb2.StartTask) -> bool:
    """Whether the task's argv is a launcher that binds MASTER_PORT itself and takes no listening fd
    (``torchrun``: its rendezvous store binds the port): such a task is not handed the reservation."""
    return bool(st.argv) and Path(st.argv[0]).name == "torchrun"


def master_listen_handoff(sock: socket.socket | None) -> tuple[tuple[int, ...], dict[str, str]]:
    """What a start passes on for a reserved master port: the fds the task's process inherits
    (``pass_fds``) and the variable that names the listening one (:data:`MASTER_LISTEN_FD`); nothing
    without a reservation. The agent closes its own copy once the process is started."""
    if sock is None:
        return (), {}
    return (sock.fileno(),), {MASTER_LISTEN_FD: str(sock.fileno())}


def _not_understood(decision: agent_pb2.Decision, action: str | None) -> str:
    """Why a decision with no action this agent knows is refused (names the action or its field number)."""
    if action:
        return f"decision action {action!r} is not supported by this agent"
    fields: list[int] = []
    if decision.ByteSize():
        unknown = UnknownFieldSet(decision)
        fields = sorted({unknown[i].field_number for i in range(len(unknown))})
    if fields:
        return (f"decision action (field {', '.join(map(str, fields))}) is unknown to this agent; it is older than "
                "the coordinator")
    return "decision carries no action"


def _checkpoint_signal(name: str) -> signal.Signals | None:
    """The catchable signal a StopTask names (``SIGUSR1``/``USR1``); None for "" or a name that is no such signal."""
    if not name or len(name) > 16:
        return None
    key = name.strip().upper()
    try:
        sig = signal.Signals[key if key.startswith("SIG") else f"SIG{key}"]
    except KeyError:
        return None
    return None if sig in (signal.SIGKILL, signal.SIGSTOP) else sig
