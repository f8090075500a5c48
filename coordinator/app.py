"""The coordinator's object graph, built once, in dependency order, through constructors.

Each paper component lives in its own package (Resource Monitor ``monitor/``, GPT Task Profiler
``profiler/``, GPT Task Scheduler ``scheduler/``, Resource Allocator ``allocator/``, QoS Manager
``qos/``, Resource Adaptor ``adaptor/``, Synchronizer ``sync/``); :func:`build` wires them, and
:class:`LeaderDuties` is what this replica does when it wins or loses the leader key.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from common.errors import EtcdUnavailable, Fenced, GptrmError
from common.logging import get_logger
from common.pb.gptrm.v1 import types_pb2
from coordinator.adaptor.autoscale import ScalePolicy
from coordinator.adaptor.capping import PowerCapper
from coordinator.adaptor.power import PowerManager
from coordinator.adaptor.providers import build_provider
from coordinator.adaptor.scale_out import ScaleOutRequests
from coordinator.adaptor.services import ServiceController, ServiceMetrics, check_stored_service
from coordinator.config import CoordinatorConfig
from coordinator.dispatch import Dispatcher, Reconciler
from coordinator.dispatch.logs import LogRelay
from coordinator.dispatch.sessions import SessionRelay
from coordinator.elastic.allocator import ElasticAllocator
from coordinator.elastic.rules import ElasticSettings
from coordinator.events import EventBus
from coordinator.health.moves import GpuMoves
from coordinator.monitor import Metrics, NodeRegistry, PowerModel, ResourceMonitor
from coordinator.monitor.metrics import GpuHealthMetrics
from coordinator.monitor.telemetry_rate import RateMetrics, TelemetryRate
from coordinator.nodes import NodeService
from coordinator.profiler import Profiler
from coordinator.qos import RestartPolicy
from coordinator.qos.lost_nodes import LostNodes
from coordinator.qos.preemption import Preemptor
from coordinator.qos.retention import TaskRetention
from coordinator.qos.time_limits import TimeLimits
from coordinator.qos.watch import QosWatch
from coordinator.queues import load_toml
from coordinator.queues.admin import QueueAdmin, QueueMetrics
from coordinator.queues.planning import LeaderQueues
from coordinator.reservations import Reservations, validate_reservation
from coordinator.scheduler.admission import PlaceabilityCheck
from coordinator.scheduler.cycle import SchedulerCycle
from coordinator.scheduler.policy import PolicySetting, threshold_mode
from coordinator.scheduler.snapshot import SnapshotBuilder
from coordinator.scheduler.wakeup import Wakeup
from coordinator.state import LeaderState
from coordinator.supervisor import Supervisor
from coordinator.sync import AdminLocks, EtcdClient, Keys, Leadership, Store
from coordinator.sync.quarantine import Quarantine
from coordinator.sync.queues import QueueStore
from coordinator.sync.reservations import ReservationStore
from coordinator.sync.services import ServiceStore
from coordinator.sync.usage import UsageStore
from coordinator.tasks import TaskTable
from coordinator.usage import Prices, UsageDuty, UsageMetrics
from coordinator.version import VERSION

__all__ = ["VERSION", "App", "LeaderDuties", "build"]


class LeaderDuties:
    """What this replica does when it wins the leader key, and stops when it loses it.

    :param app: the replica's components.
    """

    def __init__(self, app: App) -> None:
        self._app = app
        self._log = get_logger("coordinator").bind(leader_id=app.cfg.replica_id)
        sup, cfg = app.supervisor, app.cfg
        sup.on_give_up = self.give_up
        sup.add("cycle", lambda beat: app.cycle.run(beat=beat), interval_s=1.0)
        sup.add("power", lambda beat: app.power_manager.run(beat=beat), interval_s=1.0)
        sup.add("reconcile", lambda beat: app.reconciler.reconcile_after_grace(beat=beat), interval_s=cfg.task_grace_s)
        sup.add("qos", lambda beat: app.qos.run(lambda: app.leadership.leading, beat=beat), interval_s=1.0)
        sup.add("retention", lambda beat: app.retention.run(beat=beat), interval_s=10.0)
        sup.add("time_limits", lambda beat: app.time_limits.run(beat=beat), interval_s=1.0)
        sup.add("lost_nodes", lambda beat: app.lost_nodes.run(beat=beat), interval_s=1.0)
        sup.add("services", lambda beat: app.services.run(lambda: app.leadership.leading, beat=beat),
                interval_s=cfg.service_interval_s)
        sup.add("usage", lambda beat: app.usage.run(beat=beat), interval_s=cfg.usage_interval_s)
        sup.add("health", lambda beat: app.nodes.health.run(beat=beat), interval_s=0.5)
        if cfg.power_capping == "on":
            sup.add("capping", lambda beat: app.capper.run(beat=beat), interval_s=2.0)

    async def take_over(self, record: types_pb2.LeaderRecord) -> bool:
        """Rebuild the view from etcd at one revision; on failure give the lease up for another replica."""
        app = self._app
        try:
            return await self._recover(record)
        except (EtcdUnavailable, Fenced) as e:
            self._log.warning("recovery_failed", reason=str(e))
            app.leadership.step_down(f"recovery failed: {e}")
            return False
        except Exception as e:   # never a replica holding the lease without leading
            self._log.exception("recovery_failed", reason=repr(e))
            app.leadership.step_down(f"recovery failed: {type(e).__name__}")
            return False

    async def _recover(self, record: types_pb2.LeaderRecord) -> bool:
        app = self._app
        state = await asyncio.to_thread(app.store.load_all)   # corrupt values are reported by App.on_quarantined
        if not app.leadership.election.is_leader:
            return False
        app.state.adopt(state.tasks, state.nodes, state.allocations)
        # The interval for the nodes just loaded, before the first agent is welcomed (the rate's own loop
        # would set it within a second, after a fleet's worth of welcomes at the shortest interval).
        app.telemetry_rate.tick()
        await app.queue_admin.recover()
        await app.reservations.recover()
        if app.store.keys.policy in state.quarantined:
            current = app.policy.current
            self._log.warning("policy_fallback", policy=current.name, threshold=current.threshold,
                              reason="the stored policy was unusable and moved under quarantine/")
            app.events.publish("policy", f"stored policy unusable: using {current.name} threshold "
                               f"{current.threshold:.2f}", policy=current.name, threshold=current.threshold)
        if not app.policy.adopt(state.policy):
            try:
                await app.leadership.write_as_leader(app.store.put_policy, app.policy.current)
            except GptrmError as e:  # retried at the next policy change
                self._log.warning("policy_persist_failed", reason=str(e))
        self._log.info("leader_view_recovered", epoch=record.epoch, nodes=len(state.nodes), tasks=len(state.tasks),
                       revision=state.revision)
        return True

    def start_leading(self) -> None:
        """Run the scheduler, the power manager, the QoS watch, the finished-task retention, the lost-node
        sweep, the services' replica controller, the usage ledger (and with it the queues' budget readings), the power
        capping loop (``--power-capping on``) and, after the agents' grace, the reconcile of unreported tasks.

        Each runs under the supervisor (``coordinator.supervisor``): restarted when it fails, and the lease
        given up when one keeps failing."""
        self._app.supervisor.start()

    def give_up(self, duty: str, reason: str) -> None:
        """A duty keeps failing: give the lease up so that a standby leads (called by the supervisor)."""
        app = self._app
        self._log.error("leader_stepping_down", duty=duty, reason=reason)
        app.events.publish("leader", f"{app.cfg.replica_id} gives up leadership: {reason}",
                           leader_id=app.cfg.replica_id, duty=duty, reason=reason)
        app.leadership.step_down(reason)

    def stand_down(self, reason: str) -> None:
        """Stop the leader's work and send every agent to the new leader."""
        self._app.supervisor.stop()
        redirect = self._app.leadership.redirect_message()
        for entry in self._app.registry:
            if entry.outbox is not None:
                entry.outbox.put_nowait(redirect)
                entry.outbox.put_nowait(None)


@dataclass
class App:
    """One coordinator replica's components (see :func:`build`)."""

    cfg: CoordinatorConfig
    store: Store
    leadership: Leadership
    events: EventBus
    registry: NodeRegistry
    monitor: ResourceMonitor
    power: PowerModel
    profiler: Profiler
    state: LeaderState
    tasks: TaskTable
    policy: PolicySetting
    snapshots: SnapshotBuilder
    metrics: Metrics
    cycle: SchedulerCycle
    reconciler: Reconciler
    nodes: NodeService
    wakeup: Wakeup
    power_manager: PowerManager
    qos: QosWatch
    logs: LogRelay
    sessions: SessionRelay
    capper: PowerCapper
    retention: TaskRetention
    lost_nodes: LostNodes
    services: ServiceController
    admission: PlaceabilityCheck
    supervisor: Supervisor
    usage: UsageDuty
    queues: LeaderQueues
    queue_admin: QueueAdmin
    elastic: ElasticAllocator
    telemetry_rate: TelemetryRate
    time_limits: TimeLimits
    reservations: Reservations
    started: float = field(default_factory=time.monotonic)
    loop: asyncio.AbstractEventLoop | None = None

    def on_quarantined(self, key: str, prefix: str, reason: str) -> None:
        """Count and publish a value moved under ``quarantine/`` (called from any thread)."""
        self.metrics.quarantined.labels(prefix).inc()

        def publish() -> None:
            self.events.publish("etcd", f"corrupt etcd value {key} moved under quarantine/: {reason}", key=key,
                                prefix=prefix, reason=reason)

        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if self.loop is None or running is self.loop or self.loop.is_closed():
            publish()
        else:   # the event bus belongs to the event loop's thread
            self.loop.call_soon_threadsafe(publish)

    def start(self, loop: asyncio.AbstractEventLoop) -> list[asyncio.Task[None]]:
        """Campaign for leadership and start what every replica runs (node states, the etcd probe)."""
        self.loop = loop
        self.leadership.start(LeaderDuties(self), loop)
        return [asyncio.create_task(self.nodes.watch()), asyncio.create_task(self.telemetry_rate.run()),
                asyncio.create_task(self.leadership.watch_etcd(on_recovered=self.wakeup.set))]


def build(cfg: CoordinatorConfig, client: EtcdClient) -> App:
    """Build the replica's object graph, each component from the ones it needs.

    :param cfg: frozen configuration.
    :param client: a connected etcd client.
    :returns: the components, not started (see :meth:`App.start`).
    """
    keys = Keys(cfg.etcd_prefix)
    if cfg.queues_file:
        load_toml(cfg.queues_file)   # a broken file stops the replica now, not at its first take-over
    events = EventBus()
    leadership = Leadership(client, keys, cfg.replica_id, cfg.advertise_address, ttl_s=cfg.lease_ttl_s, events=events)
    quarantine = Quarantine(client, keys, leadership.election)   # every read value that is unusable goes here
    store = Store(client, keys, leadership.election, quarantine=quarantine, policy_check=PolicySetting.check_stored)
    locks = AdminLocks(client, keys, holder=cfg.replica_id, timeout_s=cfg.lock_timeout_s)
    wakeup = Wakeup()
    registry = NodeRegistry(cfg.heartbeat_interval_s, cfg.lost_grace_s)
    power = PowerModel()
    monitor = ResourceMonitor(cfg.history_s, cfg.sampling_interval_s, power_model=power,   # Alg. 3's curves
                              fine_s=cfg.history_fine_s)
    profiler = Profiler()
    dispatcher = Dispatcher(registry, epoch=lambda: leadership.epoch)
    scale_out = ScaleOutRequests(events)
    state = LeaderState(registry, on_forget=monitor.forget_task_qos)
    tasks = TaskTable(store, leadership, state, registry, monitor, profiler, dispatcher, scale_out, events, wakeup)
    metrics = Metrics(monitor, registry, tasks.counts, leading=lambda: leadership.leading,
                      etcd_up=lambda: not leadership.stale)
    policy = PolicySetting(cfg.policy, cfg.threshold, store, leadership, locks, events, wakeup, cfg.threshold_mode)
    snapshots = SnapshotBuilder(power)
    provider = build_provider(cfg.node_provider, cfg.node_provider_command, events,
                              timeout_s=cfg.node_provider_timeout_s,
                              missing=lambda resource, amount: metrics.missing_resources.labels(resource).set(amount))
    power_manager = PowerManager(registry, state, store, leadership, locks, provider, events,
                                 power_down_after_s=cfg.power_down_after_s, spare_nodes=cfg.spare_nodes,
                                 wake_timeout_s=cfg.wake_timeout_s,
                                 idle_power_w=lambda e: snapshots.power_curve(e)[0].idle_w, on_change=wakeup.set,
                                 fit=lambda: snapshots.fit(tasks.live(), policy.current.threshold,
                                                           threshold_mode(policy.current)),
                                 on_provider_failure=lambda action: metrics.provider_failures.labels(action).inc(),
                                 power_off_grace_s=cfg.power_off_grace_s, power_off_retry_s=cfg.power_off_retry_s,
                                 power_off_retry_max_s=cfg.power_off_retry_max_s,
                                 on_power_off_ignored=metrics.power_off_ignored.inc)
    queues = LeaderQueues(state, registry)
    tasks.releasing = queues.releasing   # a queue's usage counts each task up to its end
    usage = UsageDuty(UsageStore(client, keys, leadership.election, quarantine=quarantine), leadership,
                      tasks.values, registry, monitor.task_energy.current, UsageMetrics(metrics.registry),
                      interval_s=cfg.usage_interval_s, released=state.released, since=tasks.since)
    queue_admin = QueueAdmin(QueueStore(client, keys, leadership.election, quarantine=quarantine), leadership, locks,
                             state, queues, usage, Prices(cfg.gpu_hour_prices, cfg.price_kwh), events,
                             queues_file=cfg.queues_file)
    usage.on_accounted = queue_admin.check_budgets   # budgets are read as usage is accounted
    reservations = Reservations(ReservationStore(client, keys, leadership.election, quarantine=quarantine,
                                                 validate=validate_reservation), leadership, tasks.view, registry,
                                events)
    queues.shielded = reservations.shields              # a reservation's own work on its GPUs is never reclaimed
    power_manager.reserved = reservations.nodes_needed  # nor are its nodes powered down; woken ahead of its start
    preemptor = Preemptor(tasks, registry, snapshots, dispatcher, events, metrics.preemptions,
                          protection_s=cfg.preemption_protection_s,
                          may_preempt=lambda task, victim: queues.may_preempt(task, victim)
                          and not reservations.shields(victim, task), view=reservations.view_for)
    elastic = ElasticAllocator(tasks, dispatcher, monitor, events, metrics,
                               ElasticSettings(interval_s=cfg.elastic_interval_s,
                                               restart_cost_s=cfg.elastic_restart_cost_s), profiler)
    # nodes (and its health watch) is built below; the moves ask it only once the cycle runs
    moves = GpuMoves(tasks, registry, lambda: nodes.health.fenced_holders(), dispatcher, events, elastic)
    restarts = RestartPolicy(tasks, fault_move=moves.after_failure)
    cycle = SchedulerCycle(tasks, registry, snapshots, policy, store, leadership, dispatcher, scale_out, metrics,
                           events, wakeup, preemptor, profiler, on_unplaced=power_manager.unplaced,
                           gang_label=cfg.gang_topology_label, queues=queues, elastic=elastic,
                           on_shrunk=power_manager.shrunk_for, moves=moves,
                           will_restart=lambda task: restarts.allows(task) or moves.requeues(task),
                           reservations=reservations)
    power_manager.startable = cycle.startable   # a task held back (start time, dependency) keeps no node on
    reconciler = Reconciler(cfg.task_grace_s, tasks, registry, dispatcher, restarts, events, preemptor)
    qos = QosWatch(tasks.live_view, monitor, profiler, events, metrics.qos_violations, cfg.sampling_interval_s)
    telemetry_rate = TelemetryRate(registry, cfg.ingest_budget_per_s, cfg.sampling_interval_s,
                                   samples_total=lambda: monitor.samples_total, on_change=qos.set_report_interval)
    metrics.registry.register(RateMetrics(telemetry_rate))
    capper = PowerCapper(registry, monitor.latest.get, tasks.view, qos, dispatcher, events,
                         metrics.power_cap_changes, interval_s=cfg.power_cap_interval_s)
    services = ServiceController(ServiceStore(client, keys, leadership.election, quarantine=quarantine,
                                              validate=check_stored_service), leadership, state, tasks, monitor,
                                 registry, profiler, events, ServiceMetrics(metrics.registry),
                                 interval_s=cfg.service_interval_s,
                                 policy=ScalePolicy(min_replicas=1, max_replicas=1,
                                                    stabilization_s=cfg.service_stabilization_s,
                                                    cooldown_s=cfg.service_cooldown_s,
                                                    up_cooldown_s=cfg.service_cooldown_s / 2,
                                                    max_actions=cfg.service_max_actions))
    nodes = NodeService(registry, state, monitor, store, leadership, locks, tasks, dispatcher, reconciler, metrics,
                        events, health_drain_gpus=cfg.health_drain_gpus, on_health_change=wakeup.set)
    nodes.health.on_fenced = lambda node_id, fence: wakeup.set()   # the cycle's first step moves its work
    retention = TaskRetention(tasks, store, leadership, retain_s=cfg.finished_retention_s,
                              retain_count=cfg.finished_retention_count)
    lost_nodes = LostNodes(registry, tasks, restarts, preemptor, store, leadership, monitor, events,
                           task_grace_s=cfg.lost_task_grace_s, gc_after_s=cfg.lost_node_gc_s, gangs=reconciler.gangs)
    app = App(cfg=cfg, store=store, leadership=leadership, events=events, registry=registry, monitor=monitor,
              power=power, profiler=profiler, state=state, tasks=tasks, policy=policy, snapshots=snapshots,
              metrics=metrics,
              cycle=cycle, reconciler=reconciler, nodes=nodes, wakeup=wakeup, power_manager=power_manager, qos=qos,
              logs=LogRelay(registry), sessions=SessionRelay(registry), capper=capper, retention=retention,
              lost_nodes=lost_nodes,
              services=services,
              admission=PlaceabilityCheck(lambda: snapshots.empty_nodes(registry), lambda: policy.current,
                                          creates_nodes=provider.can_create, generation=lambda: registry.generation),
              supervisor=Supervisor(metrics.leader_duty_failures, on_give_up=lambda duty, reason: None),
              queues=queues, queue_admin=queue_admin,
              usage=usage, elastic=elastic, telemetry_rate=telemetry_rate,
              time_limits=TimeLimits(tasks, leadership, dispatcher, events), reservations=reservations)
    metrics.registry.register(QueueMetrics(queue_admin, lambda: leadership.leading))
    metrics.registry.register(GpuHealthMetrics(nodes.health.counts))
    quarantine.listener = app.on_quarantined
    return app
