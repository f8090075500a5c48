"""Remember refused requests so that requests at least as large are refused without a scan.

Committing a placement only ever removes room, so once a request was refused, any later request
that needs at least as much of everything (each dimension, per-GPU memory, GPU shape, gang size)
under the same constraints is refused too — until something is released. The engine clears the
memo whenever room comes back.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.domain import Rejection, Request

__all__ = ["RefusalMemo"]

_CAPACITY = 16


@dataclass(frozen=True, slots=True)
class _Refused:
    """What a refused request needed, with the rejection it got."""

    constraints: tuple[str, frozenset[tuple[str, str]], frozenset[str], frozenset[str]] | None
    demand: tuple[float, int, float, int, int]
    whole: int
    per_gpu: int
    nodes: int
    rejection: Rejection


def _dominates(demand: tuple[float, int, float, int, int], old: _Refused) -> bool:
    """Whether ``demand`` is at least ``old``'s in every dimension."""
    return all(new >= prev for new, prev in zip(demand, old.demand, strict=True))


class RefusalMemo:
    """The last few refusals, newest first, valid until room is released."""

    def __init__(self) -> None:
        self._refused: list[_Refused] = []

    def find(self, req: Request, demand: tuple[float, int, float, int, int], whole: int) -> Rejection | None:
        """A remembered rejection that implies this request is refused too.

        :param req: the request.
        :param demand: ``req.demand.as_tuple()``.
        :param whole: ``req.whole_gpus``.
        :returns: the earlier rejection, or None.
        """
        if not self._refused:
            return None
        constraints = req.constraint_key
        for old in self._refused:
            # A shared (or GPU-less) request never dominates a whole-GPU one. The other way round
            # is fine: a whole free GPU with enough memory also satisfies any share, and the gpus
            # dimension makes a shared request dominate only smaller shares.
            if whole < old.whole or req.gpu_mem_per_gpu_bytes < old.per_gpu or req.nodes < old.nodes:
                continue
            # A shared request may be held to lower limits than one for whole GPUs (or none), so its
            # refusal says nothing about them.
            if old.whole == 0 and old.demand[0] > 0 and not (whole == 0 and demand[0] > 0):
                continue
            if old.constraints == constraints and _dominates(demand, old):
                return old.rejection
        return None

    def remember(self, req: Request, whole: int, rejection: Rejection) -> None:
        """Record a refusal (the oldest is forgotten beyond a small capacity).

        :param req: the refused request.
        :param whole: ``req.whole_gpus``.
        :param rejection: what it got.
        """
        entry = _Refused(
            constraints=req.constraint_key,
            demand=req.demand.as_tuple(),
            whole=whole,
            per_gpu=req.gpu_mem_per_gpu_bytes,
            nodes=req.nodes,
            rejection=rejection,
        )
        self._refused.insert(0, entry)
        del self._refused[_CAPACITY:]

    def clear(self) -> None:
        """Forget everything (room was released)."""
        self._refused.clear()
