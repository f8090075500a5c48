"""Leader roles for tests and benchmarks that run a :class:`coordinator.sync.Leadership` without a coordinator."""

from __future__ import annotations

from common.pb.gptrm.v1 import types_pb2


class IdleRole:
    """A leader role that takes over at once and runs no duties."""

    async def take_over(self, record: types_pb2.LeaderRecord) -> bool:
        return True

    def start_leading(self) -> None:
        pass

    def stand_down(self, reason: str) -> None:
        pass
