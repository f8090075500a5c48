"""The CPU priority of the coordinator's event-loop thread.

Every call, stream message and decision of the leader passes through one thread, its asyncio event loop. On a
busy host that thread, ready to run, waits in the kernel's run queue behind everything else that is runnable
(the etcd members, agents, other services): with the host a quarter idle on average, a loaded leader's loop
thread waited for a CPU a quarter of the time, and that wait, not its own work, set how many submits a second
it took (``docs/throughput.md``, ninth round).

``realtime`` puts that one thread in the lowest real-time class (``SCHED_RR``, priority 1): when it is ready it
runs, ahead of ordinary processes. ``SCHED_RESET_ON_FORK`` keeps it to that thread: the threads it starts
(etcd calls, gRPC) and the processes it starts (an embedded etcd) run at normal priority. The kernel still keeps
5 % of each CPU for ordinary processes (``kernel.sched_rt_runtime_us``), and the systemd watchdog restarts a
leader whose duties stop progressing, so a loop that never yields cannot take a host.

The installed unit (``systemd/gptrm-coordinator.service``) sets the same class itself
(``CPUSchedulingPolicy=rr``, ``CPUSchedulingPriority=1``, ``CPUSchedulingResetOnFork=yes``), where the
coordinator runs without the privilege to do it; ``--loop-priority realtime`` is for runs outside systemd, as
root or with ``CAP_SYS_NICE`` or an ``RLIMIT_RTPRIO`` of at least 1. Either way the coordinator logs what its
loop thread got (``loop_priority``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["LOOP_PRIORITIES", "LoopPriority", "current", "raise_to"]

LOOP_PRIORITIES = ("normal", "realtime")
_RR_PRIORITY = 1


@dataclass(frozen=True, slots=True)
class LoopPriority:
    """What the calling thread runs at: ``policy`` (``normal``, ``realtime``, or the kernel's name of another
    class), the real-time ``priority`` (0 when not real-time), ``nice``, and whether threads and processes it
    starts are reset to normal (``reset_on_fork``)."""

    policy: str
    priority: int
    nice: int
    reset_on_fork: bool


_NAMES = {os.SCHED_OTHER: "normal", os.SCHED_RR: "realtime", os.SCHED_FIFO: "fifo", os.SCHED_BATCH: "batch",
          os.SCHED_IDLE: "idle"}


def current(thread: int = 0) -> LoopPriority:
    """The scheduling class of thread ``thread`` (a thread id; a process id names its main thread, the
    coordinator's event loop), by default the calling thread's."""
    raw = os.sched_getscheduler(thread)
    policy = raw & ~os.SCHED_RESET_ON_FORK
    return LoopPriority(_NAMES.get(policy, str(policy)), os.sched_getparam(thread).sched_priority,
                        os.getpriority(os.PRIO_PROCESS, thread), bool(raw & os.SCHED_RESET_ON_FORK))


def raise_to(wanted: str) -> tuple[LoopPriority, str]:
    """Put the calling thread (the event loop's) in the ``wanted`` class (:data:`LOOP_PRIORITIES`).

    ``normal`` changes nothing (a class set by the service manager stays). ``realtime`` on a thread already
    real-time changes nothing either.

    :returns: what the thread runs at afterwards, and why ``wanted`` was not had ("" when it was).
    :raises ValueError: an unknown ``wanted``.
    """
    if wanted not in LOOP_PRIORITIES:
        raise ValueError(f"loop priority must be one of {', '.join(LOOP_PRIORITIES)}, got {wanted!r}")
    now = current()
    if wanted == "normal" or now.policy in ("realtime", "fifo"):
        return now, ""
    try:
        os.sched_setscheduler(0, os.SCHED_RR | os.SCHED_RESET_ON_FORK, os.sched_param(_RR_PRIORITY))
    except OSError as e:
        return now, (f"SCHED_RR refused ({e.strerror}): needs root, CAP_SYS_NICE or an RLIMIT_RTPRIO of at least "
                     f"{_RR_PRIORITY} (systemd: CPUSchedulingPolicy=rr)")
    return current(), ""
