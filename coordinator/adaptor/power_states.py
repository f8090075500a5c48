"""Power states of the simulated nodes: busy, idle, off, and the pool a scaling policy sees.

A node is *busy* while it runs work, *idle* when powered with no work (it draws its idle power)
and *off* after ``power_down_after_s`` without work (it draws nothing). Placing work on an off
node powers it on; the work starts ``wake_delay_s`` later. In *elastic* mode (a policy that asks
for new nodes, Alg. 1-2, with ``scale_out``) an off node also leaves the policy's view — the
node provider has taken it back (scale-in) — and comes back only when a refusal asks for one
(scale-out).
"""

from __future__ import annotations

from coordinator.simulator.metrics import MetricsRecorder

__all__ = ["NodePower"]

_EPS = 1e-9


class NodePower:
    """Per-node power state, kept in step with the metrics recorder.

    :param n: number of nodes.
    :param start_s: replay start (every node powered, no work, empty since then).
    :param metrics: the recorder to tell about power and load changes.
    :param power_down_after_s: idle time before powering down (None: never).
    :param wake_delay_s: time from power-on until work can start.
    """

    def __init__(
        self, n: int, start_s: float, metrics: MetricsRecorder, power_down_after_s: float | None, wake_delay_s: float
    ) -> None:
        self.metrics = metrics
        self.after = power_down_after_s
        self.wake_delay_s = wake_delay_s
        self.powered = [True] * n
        self.in_view = [True] * n
        self.ready_s = [start_s] * n
        self.jobs_on = [0] * n
        self.empty_since = [start_s] * n
        self.running_gpus = [0.0] * n
        self.running_jobs = [0] * n
        self.view_changed = False

    def book(self, i: int, now: float) -> float:
        """A job was placed on node ``i``: power it on if it was off.

        :param i: node index.
        :param now: current time.
        :returns: the earliest time work can start on it.
        """
        self.jobs_on[i] += 1
        if not self.powered[i]:
            self.power_on(i, now)
        return max(now, self.ready_s[i])

    def power_on(self, i: int, now: float) -> None:
        """Power node ``i`` on (and put it back in the policy's view).

        :param i: node index.
        :param now: current time.
        """
        self.powered[i] = True
        self.ready_s[i] = now + self.wake_delay_s
        if self.jobs_on[i] == 0:
            self.empty_since[i] = now
        if not self.in_view[i]:
            self.in_view[i] = True
            self.view_changed = True
        self.metrics.set_node(i, powered=True)

    def run(self, i: int, gpus: float, *, start: bool) -> None:
        """A job using ``gpus`` GPUs starts or stops running on node ``i``.

        :param i: node index.
        :param gpus: GPUs it uses there.
        :param start: True when it starts, False when it stops.
        """
        sign = 1 if start else -1
        self.running_jobs[i] += sign
        self.running_gpus[i] += sign * gpus
        if abs(self.running_gpus[i]) < _EPS:
            self.running_gpus[i] = 0.0
        self.metrics.set_node(i, used_gpus=self.running_gpus[i], busy=self.running_jobs[i] > 0)

    def unbook(self, i: int, now: float) -> bool:
        """A job left node ``i``.

        :param i: node index.
        :param now: current time.
        :returns: True when the node became empty and a power-down timer should be armed.
        """
        self.jobs_on[i] -= 1
        if self.jobs_on[i] > 0:
            return False
        self.empty_since[i] = now
        return self.after is not None

    def power_down(self, i: int, now: float, *, elastic: bool) -> bool:
        """A power-down timer fired: power node ``i`` off if it stayed empty long enough.

        A timer armed before the node got work and emptied again finds ``empty_since`` later
        than its own start, and does nothing: the newer timer is still pending.

        :param i: node index.
        :param now: current time.
        :param elastic: also take it out of the policy's view (scale-in).
        :returns: True when it was powered down.
        """
        if self.after is None or not self.powered[i] or self.jobs_on[i] > 0:
            return False
        if self.empty_since[i] + self.after > now:
            return False
        self.powered[i] = False
        self.metrics.set_node(i, powered=False)
        if elastic:
            self.in_view[i] = False
            self.view_changed = True
        return True
