"""Between the leader and its agents: decisions out (:class:`Dispatcher`), reports in (:class:`Reconciler`)."""

from __future__ import annotations

from coordinator.dispatch.dispatcher import Dispatcher
from coordinator.dispatch.reconcile import Reconciler

__all__ = ["Dispatcher", "Reconciler"]
