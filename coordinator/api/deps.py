"""What the gRPC servicers read from the replica: the components they use, not the whole ``App``.

``coordinator.app.App`` satisfies both protocols structurally; ``coordinator.server`` passes it.
"""

from __future__ import annotations

from typing import Protocol

from coordinator.adaptor.services import ServiceController
from coordinator.config import CoordinatorConfig
from coordinator.dispatch import Reconciler
from coordinator.dispatch.logs import LogRelay
from coordinator.dispatch.sessions import SessionRelay
from coordinator.elastic.allocator import ElasticAllocator
from coordinator.events import EventBus
from coordinator.monitor import NodeRegistry, ResourceMonitor
from coordinator.monitor.telemetry_rate import TelemetryRate
from coordinator.nodes import NodeService
from coordinator.qos.lost_nodes import LostNodes
from coordinator.queues.admin import QueueAdmin
from coordinator.reservations import Reservations
from coordinator.scheduler.admission import PlaceabilityCheck
from coordinator.scheduler.policy import PolicySetting
from coordinator.scheduler.snapshot import SnapshotBuilder
from coordinator.supervisor import Supervisor
from coordinator.sync import Leadership, Store
from coordinator.tasks import TaskTable
from coordinator.usage import UsageDuty

__all__ = ["AdminDeps", "GatewayDeps"]


class GatewayDeps(Protocol):
    """What the AgentGateway servicer uses."""

    cfg: CoordinatorConfig
    leadership: Leadership
    registry: NodeRegistry
    tasks: TaskTable
    nodes: NodeService
    logs: LogRelay
    sessions: SessionRelay
    reconciler: Reconciler
    telemetry_rate: TelemetryRate


class AdminDeps(Protocol):
    """What the Admin servicer uses."""

    cfg: CoordinatorConfig
    started: float
    store: Store
    leadership: Leadership
    events: EventBus
    registry: NodeRegistry
    monitor: ResourceMonitor
    tasks: TaskTable
    policy: PolicySetting
    snapshots: SnapshotBuilder
    nodes: NodeService
    logs: LogRelay
    sessions: SessionRelay
    lost_nodes: LostNodes
    services: ServiceController
    admission: PlaceabilityCheck
    supervisor: Supervisor
    usage: UsageDuty
    queue_admin: QueueAdmin
    elastic: ElasticAllocator
    telemetry_rate: TelemetryRate
    reservations: Reservations
