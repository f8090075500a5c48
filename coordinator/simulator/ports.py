"""What the simulator's parts (elastic jobs, team queues, preemption) may use of a replay: one narrow interface.

:class:`Replay` is implemented by :class:`coordinator.simulator.engine.Simulator`; the parts
(:mod:`coordinator.simulator.elastic`, :mod:`~coordinator.simulator.queues`, :mod:`~coordinator.simulator.qos`)
type against it and never import the engine, so there is no import cycle between the engine and its parts. They
read the replay's state through it and change it only through its methods (book, start, stop, requeue), which keep
the replay's own bookkeeping (its pending queue, event counts and refusal cache) consistent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from coordinator.domain import ClusterSnapshot, Decision, Placement, Request
from coordinator.scheduler.placement.engine import PlacementEngine

if TYPE_CHECKING:
    from coordinator.simulator.adaptor_driver import SimAdaptor

__all__ = ["Replay", "SimJob"]


@dataclass(frozen=True, slots=True)
class SimJob:
    """One job to replay.

    :param request: what the placement engine sees (``submit_s`` is the arrival time).
    :param duration_s: run time once started.
    :param queue: the team queue it is submitted to (from the trace's ``group``; used only when the
        replay has queues).
    """

    request: Request
    duration_s: float
    queue: str = ""


class Replay(Protocol):
    """A replay as its parts see it (jobs by index in :attr:`jobs`)."""

    @property
    def jobs(self) -> Sequence[SimJob]:
        """The replayed jobs."""

    @property
    def base(self) -> ClusterSnapshot:
        """The cluster at the start."""

    @property
    def index(self) -> Mapping[str, int]:
        """Node id → its index in :attr:`base`."""

    @property
    def adaptor(self) -> SimAdaptor | None:
        """The Resource Adaptor's power manager in virtual time (None: every node stays on)."""

    @property
    def engine(self) -> PlacementEngine:
        """The placement engine: the cluster's reservations as the replay booked them."""

    @property
    def placed(self) -> Mapping[int, Placement]:
        """Job → its placement, for every job booked (running, or placed and not yet started)."""

    @property
    def start_times(self) -> Mapping[int, float]:
        """Running job → when its current run started."""

    @property
    def running_gpus(self) -> Sequence[float]:
        """Node → GPUs its running jobs use."""

    @property
    def waiting(self) -> int:
        """Jobs pending."""

    def request(self, k: int) -> Request:
        """The request job ``k`` is placed with while pending (an elastic job's at the size it asks for)."""

    def job_of(self, task_id: str) -> int:
        """The index of the job with this task id."""

    def pending(self) -> list[int]:
        """Every pending job, in queue order (:func:`coordinator.domain.queue_key`)."""

    def heads(self) -> list[int]:
        """The first pending job of every shape (jobs of one shape are accepted by the same nodes), in queue order."""

    def place(self, engine: PlacementEngine, requests: Sequence[Request]) -> list[Decision]:
        """What ``engine.place_batch(requests)`` decides (the policy's order), skipping shapes refused since the last
        release: the :data:`~coordinator.scheduler.pipeline.Placer` of the replay."""

    def book(self, k: int, placement: Placement, now: float) -> None:
        """Pending job ``k`` was placed (its reservations taken in the engine): out of the queue, booked."""

    def start(self, k: int, placement: Placement, now: float, run_s: float) -> None:
        """Booked job ``k`` starts running on ``placement`` and ends ``run_s`` later."""

    def stop(self, k: int, now: float, *, preempted: bool = True, resized: bool = False) -> Placement:
        """Running job ``k`` stops before its end (preempted, or ``resized``: then its pending completion event is
        no longer awaited); its reservations are given back. Returns the placement it ran on."""

    def requeue(self, k: int, request: Request | None = None) -> None:
        """A stopped job ``k`` is pending again (with ``request``: placed with that from now on)."""

    def schedule(self, now: float, released: bool, only: Sequence[int] | None = None) -> None:
        """One scheduling pass at ``now`` (``released``: something was given back since the last one; ``only``: a
        pass over these pending jobs alone, placed ahead of the rest: a preemptor)."""

    def tick_at(self, t: float) -> None:
        """Run a pass at ``t`` even if no job event happens then."""

    def run_energy_j(self, placement: Placement, seconds: float) -> float:
        """What the GPUs of a placement draw over ``seconds``."""
