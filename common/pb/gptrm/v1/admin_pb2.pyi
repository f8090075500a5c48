from common.pb.gptrm.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_KIND_UNSPECIFIED: _ClassVar[EventKind]
    EVENT_KIND_NODE_JOINED: _ClassVar[EventKind]
    EVENT_KIND_NODE_STATE: _ClassVar[EventKind]
    EVENT_KIND_TASK_STATE: _ClassVar[EventKind]
    EVENT_KIND_DECISION: _ClassVar[EventKind]
    EVENT_KIND_LEADER: _ClassVar[EventKind]
    EVENT_KIND_POLICY: _ClassVar[EventKind]
    EVENT_KIND_SCALE_OUT: _ClassVar[EventKind]
    EVENT_KIND_ETCD: _ClassVar[EventKind]
    EVENT_KIND_AUDIT: _ClassVar[EventKind]
    EVENT_KIND_POWER: _ClassVar[EventKind]
    EVENT_KIND_PREEMPTION: _ClassVar[EventKind]
    EVENT_KIND_QOS_VIOLATION: _ClassVar[EventKind]
    EVENT_KIND_SCALE: _ClassVar[EventKind]
    EVENT_KIND_QUEUES: _ClassVar[EventKind]
    EVENT_KIND_RESIZE: _ClassVar[EventKind]
    EVENT_KIND_HEALTH: _ClassVar[EventKind]
    EVENT_KIND_RESERVATION: _ClassVar[EventKind]
EVENT_KIND_UNSPECIFIED: EventKind
EVENT_KIND_NODE_JOINED: EventKind
EVENT_KIND_NODE_STATE: EventKind
EVENT_KIND_TASK_STATE: EventKind
EVENT_KIND_DECISION: EventKind
EVENT_KIND_LEADER: EventKind
EVENT_KIND_POLICY: EventKind
EVENT_KIND_SCALE_OUT: EventKind
EVENT_KIND_ETCD: EventKind
EVENT_KIND_AUDIT: EventKind
EVENT_KIND_POWER: EventKind
EVENT_KIND_PREEMPTION: EventKind
EVENT_KIND_QOS_VIOLATION: EventKind
EVENT_KIND_SCALE: EventKind
EVENT_KIND_QUEUES: EventKind
EVENT_KIND_RESIZE: EventKind
EVENT_KIND_HEALTH: EventKind
EVENT_KIND_RESERVATION: EventKind

class PullImageRequest(_message.Message):
    __slots__ = ("image", "nodes")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    image: str
    nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, image: _Optional[str] = ..., nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class PullImageResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class ServiceRef(_message.Message):
    __slots__ = ("service_id",)
    SERVICE_ID_FIELD_NUMBER: _ClassVar[int]
    service_id: str
    def __init__(self, service_id: _Optional[str] = ...) -> None: ...

class ScaleServiceRequest(_message.Message):
    __slots__ = ("service_id", "replicas", "auto")
    SERVICE_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    AUTO_FIELD_NUMBER: _ClassVar[int]
    service_id: str
    replicas: int
    auto: bool
    def __init__(self, service_id: _Optional[str] = ..., replicas: _Optional[int] = ..., auto: _Optional[bool] = ...) -> None: ...

class ServiceView(_message.Message):
    __slots__ = ("service", "replicas", "stale")
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    service: _types_pb2.Service
    replicas: _containers.RepeatedCompositeFieldContainer[_types_pb2.Task]
    stale: bool
    def __init__(self, service: _Optional[_Union[_types_pb2.Service, _Mapping]] = ..., replicas: _Optional[_Iterable[_Union[_types_pb2.Task, _Mapping]]] = ..., stale: _Optional[bool] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterObjectives(_message.Message):
    __slots__ = ("util_mean", "util_std", "power_w", "gpu_mem_util", "energy_j")
    UTIL_MEAN_FIELD_NUMBER: _ClassVar[int]
    UTIL_STD_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    GPU_MEM_UTIL_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    util_mean: float
    util_std: float
    power_w: float
    gpu_mem_util: float
    energy_j: float
    def __init__(self, util_mean: _Optional[float] = ..., util_std: _Optional[float] = ..., power_w: _Optional[float] = ..., gpu_mem_util: _Optional[float] = ..., energy_j: _Optional[float] = ...) -> None: ...

class CountEntry(_message.Message):
    __slots__ = ("key", "count")
    KEY_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    key: str
    count: int
    def __init__(self, key: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class ClusterStatus(_message.Message):
    __slots__ = ("coordinator_id", "is_leader", "leader_id", "leader_address", "leader_epoch", "uptime_s", "nodes_by_state", "tasks_by_state", "objectives", "policy", "version", "stale", "gpus_total", "gpus_allocated", "insecure", "auth", "quarantined_keys", "telemetry_rejected_total", "leader_duties", "telemetry_rate")
    COORDINATOR_ID_FIELD_NUMBER: _ClassVar[int]
    IS_LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    NODES_BY_STATE_FIELD_NUMBER: _ClassVar[int]
    TASKS_BY_STATE_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVES_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    GPUS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    GPUS_ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    INSECURE_FIELD_NUMBER: _ClassVar[int]
    AUTH_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_KEYS_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_REJECTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LEADER_DUTIES_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_RATE_FIELD_NUMBER: _ClassVar[int]
    coordinator_id: str
    is_leader: bool
    leader_id: str
    leader_address: str
    leader_epoch: int
    uptime_s: float
    nodes_by_state: _containers.RepeatedCompositeFieldContainer[CountEntry]
    tasks_by_state: _containers.RepeatedCompositeFieldContainer[CountEntry]
    objectives: ClusterObjectives
    policy: _types_pb2.Policy
    version: str
    stale: bool
    gpus_total: int
    gpus_allocated: int
    insecure: bool
    auth: str
    quarantined_keys: _containers.RepeatedScalarFieldContainer[str]
    telemetry_rejected_total: int
    leader_duties: _containers.RepeatedCompositeFieldContainer[LeaderDutyStatus]
    telemetry_rate: TelemetryRateStatus
    def __init__(self, coordinator_id: _Optional[str] = ..., is_leader: _Optional[bool] = ..., leader_id: _Optional[str] = ..., leader_address: _Optional[str] = ..., leader_epoch: _Optional[int] = ..., uptime_s: _Optional[float] = ..., nodes_by_state: _Optional[_Iterable[_Union[CountEntry, _Mapping]]] = ..., tasks_by_state: _Optional[_Iterable[_Union[CountEntry, _Mapping]]] = ..., objectives: _Optional[_Union[ClusterObjectives, _Mapping]] = ..., policy: _Optional[_Union[_types_pb2.Policy, _Mapping]] = ..., version: _Optional[str] = ..., stale: _Optional[bool] = ..., gpus_total: _Optional[int] = ..., gpus_allocated: _Optional[int] = ..., insecure: _Optional[bool] = ..., auth: _Optional[str] = ..., quarantined_keys: _Optional[_Iterable[str]] = ..., telemetry_rejected_total: _Optional[int] = ..., leader_duties: _Optional[_Iterable[_Union[LeaderDutyStatus, _Mapping]]] = ..., telemetry_rate: _Optional[_Union[TelemetryRateStatus, _Mapping]] = ...) -> None: ...

class TelemetryRateStatus(_message.Message):
    __slots__ = ("report_interval_s", "sampling_interval_s", "ingest_budget_per_s", "ingest_per_s", "reporting_nodes")
    REPORT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    INGEST_BUDGET_PER_S_FIELD_NUMBER: _ClassVar[int]
    INGEST_PER_S_FIELD_NUMBER: _ClassVar[int]
    REPORTING_NODES_FIELD_NUMBER: _ClassVar[int]
    report_interval_s: float
    sampling_interval_s: float
    ingest_budget_per_s: float
    ingest_per_s: float
    reporting_nodes: int
    def __init__(self, report_interval_s: _Optional[float] = ..., sampling_interval_s: _Optional[float] = ..., ingest_budget_per_s: _Optional[float] = ..., ingest_per_s: _Optional[float] = ..., reporting_nodes: _Optional[int] = ...) -> None: ...

class LeaderDutyStatus(_message.Message):
    __slots__ = ("name", "state", "failures", "last_pass_age_s", "has_last_pass", "last_error")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    LAST_PASS_AGE_S_FIELD_NUMBER: _ClassVar[int]
    HAS_LAST_PASS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: str
    failures: int
    last_pass_age_s: float
    has_last_pass: bool
    last_error: str
    def __init__(self, name: _Optional[str] = ..., state: _Optional[str] = ..., failures: _Optional[int] = ..., last_pass_age_s: _Optional[float] = ..., has_last_pass: _Optional[bool] = ..., last_error: _Optional[str] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "states")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    states: _containers.RepeatedScalarFieldContainer[_types_pb2.NodeState]
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., states: _Optional[_Iterable[_Union[_types_pb2.NodeState, str]]] = ...) -> None: ...

class NodeView(_message.Message):
    __slots__ = ("record", "state", "latest", "has_latest", "allocations", "task_ids", "last_seen_age_s", "dropped_samples_total", "power_curve")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    HAS_LATEST_FIELD_NUMBER: _ClassVar[int]
    ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_AGE_S_FIELD_NUMBER: _ClassVar[int]
    DROPPED_SAMPLES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    POWER_CURVE_FIELD_NUMBER: _ClassVar[int]
    record: _types_pb2.NodeRecord
    state: _types_pb2.NodeState
    latest: _types_pb2.TelemetrySample
    has_latest: bool
    allocations: _containers.RepeatedCompositeFieldContainer[_types_pb2.NodeAllocation]
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    last_seen_age_s: float
    dropped_samples_total: int
    power_curve: PowerCurveView
    def __init__(self, record: _Optional[_Union[_types_pb2.NodeRecord, _Mapping]] = ..., state: _Optional[_Union[_types_pb2.NodeState, str]] = ..., latest: _Optional[_Union[_types_pb2.TelemetrySample, _Mapping]] = ..., has_latest: _Optional[bool] = ..., allocations: _Optional[_Iterable[_Union[_types_pb2.NodeAllocation, _Mapping]]] = ..., task_ids: _Optional[_Iterable[str]] = ..., last_seen_age_s: _Optional[float] = ..., dropped_samples_total: _Optional[int] = ..., power_curve: _Optional[_Union[PowerCurveView, _Mapping]] = ...) -> None: ...

class PowerCurveView(_message.Message):
    __slots__ = ("idle_w", "max_w", "source", "samples")
    IDLE_W_FIELD_NUMBER: _ClassVar[int]
    MAX_W_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    idle_w: float
    max_w: float
    source: str
    samples: int
    def __init__(self, idle_w: _Optional[float] = ..., max_w: _Optional[float] = ..., source: _Optional[str] = ..., samples: _Optional[int] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes", "stale", "next_page_token")
    NODES_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeView]
    stale: bool
    next_page_token: str
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeView, _Mapping]]] = ..., stale: _Optional[bool] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ResumeGpusRequest(_message.Message):
    __slots__ = ("node_id", "gpu_indices")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node_id: _Optional[str] = ..., gpu_indices: _Optional[_Iterable[int]] = ...) -> None: ...

class GetNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class NodeRef(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("states", "page_size", "page_token", "filter")
    STATES_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[_types_pb2.TaskState]
    page_size: int
    page_token: str
    filter: TaskFilter
    def __init__(self, states: _Optional[_Iterable[_Union[_types_pb2.TaskState, str]]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., filter: _Optional[_Union[TaskFilter, _Mapping]] = ...) -> None: ...

class TaskFilter(_message.Message):
    __slots__ = ("users", "queues", "name", "states")
    USERS_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedScalarFieldContainer[str]
    queues: _containers.RepeatedScalarFieldContainer[str]
    name: str
    states: _containers.RepeatedScalarFieldContainer[_types_pb2.TaskState]
    def __init__(self, users: _Optional[_Iterable[str]] = ..., queues: _Optional[_Iterable[str]] = ..., name: _Optional[str] = ..., states: _Optional[_Iterable[_Union[_types_pb2.TaskState, str]]] = ...) -> None: ...

class CancelTasksRequest(_message.Message):
    __slots__ = ("filter", "task_ids", "dry_run")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    filter: TaskFilter
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    dry_run: bool
    def __init__(self, filter: _Optional[_Union[TaskFilter, _Mapping]] = ..., task_ids: _Optional[_Iterable[str]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class CancelTasksResponse(_message.Message):
    __slots__ = ("task_ids", "refused", "failed")
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    refused: int
    failed: int
    def __init__(self, task_ids: _Optional[_Iterable[str]] = ..., refused: _Optional[int] = ..., failed: _Optional[int] = ...) -> None: ...

class TaskSessionOpen(_message.Message):
    __slots__ = ("task_id", "rank", "argv", "pty", "rows", "cols", "hangup_on_close")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    PTY_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    HANGUP_ON_CLOSE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    rank: int
    argv: _containers.RepeatedScalarFieldContainer[str]
    pty: bool
    rows: int
    cols: int
    hangup_on_close: bool
    def __init__(self, task_id: _Optional[str] = ..., rank: _Optional[int] = ..., argv: _Optional[_Iterable[str]] = ..., pty: _Optional[bool] = ..., rows: _Optional[int] = ..., cols: _Optional[int] = ..., hangup_on_close: _Optional[bool] = ...) -> None: ...

class TaskSessionInput(_message.Message):
    __slots__ = ("open", "data", "eof", "rows", "cols")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    open: TaskSessionOpen
    data: bytes
    eof: bool
    rows: int
    cols: int
    def __init__(self, open: _Optional[_Union[TaskSessionOpen, _Mapping]] = ..., data: _Optional[bytes] = ..., eof: _Optional[bool] = ..., rows: _Optional[int] = ..., cols: _Optional[int] = ...) -> None: ...

class TaskSessionOutput(_message.Message):
    __slots__ = ("data", "stderr", "exited", "exit_code", "node_id")
    DATA_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    stderr: bool
    exited: bool
    exit_code: int
    node_id: str
    def __init__(self, data: _Optional[bytes] = ..., stderr: _Optional[bool] = ..., exited: _Optional[bool] = ..., exit_code: _Optional[int] = ..., node_id: _Optional[str] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("tasks", "stale", "next_page_token")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[_types_pb2.Task]
    stale: bool
    next_page_token: str
    def __init__(self, tasks: _Optional[_Iterable[_Union[_types_pb2.Task, _Mapping]]] = ..., stale: _Optional[bool] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class TaskRef(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class SubmitTaskRequest(_message.Message):
    __slots__ = ("spec", "request_id", "queue_unplaceable")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_UNPLACEABLE_FIELD_NUMBER: _ClassVar[int]
    spec: _types_pb2.TaskSpec
    request_id: str
    queue_unplaceable: bool
    def __init__(self, spec: _Optional[_Union[_types_pb2.TaskSpec, _Mapping]] = ..., request_id: _Optional[str] = ..., queue_unplaceable: _Optional[bool] = ...) -> None: ...

class GetPolicyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StreamEventsRequest(_message.Message):
    __slots__ = ("follow", "backlog", "task_id")
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    follow: bool
    backlog: int
    task_id: str
    def __init__(self, follow: _Optional[bool] = ..., backlog: _Optional[int] = ..., task_id: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("seq", "time_unix_s", "kind", "node_id", "task_id", "message", "fields")
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    time_unix_s: float
    kind: EventKind
    node_id: str
    task_id: str
    message: str
    fields: _containers.ScalarMap[str, str]
    def __init__(self, seq: _Optional[int] = ..., time_unix_s: _Optional[float] = ..., kind: _Optional[_Union[EventKind, str]] = ..., node_id: _Optional[str] = ..., task_id: _Optional[str] = ..., message: _Optional[str] = ..., fields: _Optional[_Mapping[str, str]] = ...) -> None: ...

class TaskLogsRequest(_message.Message):
    __slots__ = ("task_id", "tail_lines", "follow", "rank")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TAIL_LINES_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    tail_lines: int
    follow: bool
    rank: int
    def __init__(self, task_id: _Optional[str] = ..., tail_lines: _Optional[int] = ..., follow: _Optional[bool] = ..., rank: _Optional[int] = ...) -> None: ...

class TaskLogChunk(_message.Message):
    __slots__ = ("task_id", "node_id", "seq", "data")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    node_id: str
    seq: int
    data: bytes
    def __init__(self, task_id: _Optional[str] = ..., node_id: _Optional[str] = ..., seq: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class UsageRequest(_message.Message):
    __slots__ = ("since_unix_s", "until_unix_s", "by")
    SINCE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    UNTIL_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    since_unix_s: float
    until_unix_s: float
    by: str
    def __init__(self, since_unix_s: _Optional[float] = ..., until_unix_s: _Optional[float] = ..., by: _Optional[str] = ...) -> None: ...

class UsageReportRow(_message.Message):
    __slots__ = ("key", "gpu_hours_by_model", "gpu_hours", "cpu_core_hours", "energy_kwh", "cost", "tasks")
    class GpuHoursByModelEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    KEY_FIELD_NUMBER: _ClassVar[int]
    GPU_HOURS_BY_MODEL_FIELD_NUMBER: _ClassVar[int]
    GPU_HOURS_FIELD_NUMBER: _ClassVar[int]
    CPU_CORE_HOURS_FIELD_NUMBER: _ClassVar[int]
    ENERGY_KWH_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    key: str
    gpu_hours_by_model: _containers.ScalarMap[str, float]
    gpu_hours: float
    cpu_core_hours: float
    energy_kwh: float
    cost: float
    tasks: int
    def __init__(self, key: _Optional[str] = ..., gpu_hours_by_model: _Optional[_Mapping[str, float]] = ..., gpu_hours: _Optional[float] = ..., cpu_core_hours: _Optional[float] = ..., energy_kwh: _Optional[float] = ..., cost: _Optional[float] = ..., tasks: _Optional[int] = ...) -> None: ...

class UsageReport(_message.Message):
    __slots__ = ("since_unix_s", "until_unix_s", "by", "rows", "accounted_until_unix_s", "price_gpu_hour", "price_kwh", "budgets")
    class PriceGpuHourEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SINCE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    UNTIL_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTED_UNTIL_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    PRICE_GPU_HOUR_FIELD_NUMBER: _ClassVar[int]
    PRICE_KWH_FIELD_NUMBER: _ClassVar[int]
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    since_unix_s: float
    until_unix_s: float
    by: str
    rows: _containers.RepeatedCompositeFieldContainer[UsageReportRow]
    accounted_until_unix_s: float
    price_gpu_hour: _containers.ScalarMap[str, float]
    price_kwh: float
    budgets: _containers.RepeatedCompositeFieldContainer[UsageBudget]
    def __init__(self, since_unix_s: _Optional[float] = ..., until_unix_s: _Optional[float] = ..., by: _Optional[str] = ..., rows: _Optional[_Iterable[_Union[UsageReportRow, _Mapping]]] = ..., accounted_until_unix_s: _Optional[float] = ..., price_gpu_hour: _Optional[_Mapping[str, float]] = ..., price_kwh: _Optional[float] = ..., budgets: _Optional[_Iterable[_Union[UsageBudget, _Mapping]]] = ...) -> None: ...

class UsageBudget(_message.Message):
    __slots__ = ("queue", "kind", "amount", "period", "action", "fraction", "gate")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_FIELD_NUMBER: _ClassVar[int]
    PERIOD_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    FRACTION_FIELD_NUMBER: _ClassVar[int]
    GATE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    kind: str
    amount: float
    period: str
    action: str
    fraction: float
    gate: str
    def __init__(self, queue: _Optional[str] = ..., kind: _Optional[str] = ..., amount: _Optional[float] = ..., period: _Optional[str] = ..., action: _Optional[str] = ..., fraction: _Optional[float] = ..., gate: _Optional[str] = ...) -> None: ...

class QueueQuota(_message.Message):
    __slots__ = ("gpu_model", "gpus", "has_limit", "limit", "has_lend", "lend")
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    HAS_LIMIT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    HAS_LEND_FIELD_NUMBER: _ClassVar[int]
    LEND_FIELD_NUMBER: _ClassVar[int]
    gpu_model: str
    gpus: int
    has_limit: bool
    limit: int
    has_lend: bool
    lend: int
    def __init__(self, gpu_model: _Optional[str] = ..., gpus: _Optional[int] = ..., has_limit: _Optional[bool] = ..., limit: _Optional[int] = ..., has_lend: _Optional[bool] = ..., lend: _Optional[int] = ...) -> None: ...

class QueueBudget(_message.Message):
    __slots__ = ("kind", "amount", "period", "action")
    KIND_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_FIELD_NUMBER: _ClassVar[int]
    PERIOD_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    kind: str
    amount: float
    period: str
    action: str
    def __init__(self, kind: _Optional[str] = ..., amount: _Optional[float] = ..., period: _Optional[str] = ..., action: _Optional[str] = ...) -> None: ...

class Queue(_message.Message):
    __slots__ = ("name", "parent", "quotas", "weight", "has_cpu", "cpu", "has_mem_gib", "mem_gib", "members", "default_for", "budget", "has_budget", "mount_allowed", "default_time_limit_s", "max_time_limit_s", "default_min_runtime_s", "grace_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    HAS_CPU_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    HAS_MEM_GIB_FIELD_NUMBER: _ClassVar[int]
    MEM_GIB_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_FOR_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    HAS_BUDGET_FIELD_NUMBER: _ClassVar[int]
    MOUNT_ALLOWED_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_TIME_LIMIT_S_FIELD_NUMBER: _ClassVar[int]
    MAX_TIME_LIMIT_S_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MIN_RUNTIME_S_FIELD_NUMBER: _ClassVar[int]
    GRACE_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    parent: str
    quotas: _containers.RepeatedCompositeFieldContainer[QueueQuota]
    weight: float
    has_cpu: bool
    cpu: float
    has_mem_gib: bool
    mem_gib: float
    members: _containers.RepeatedScalarFieldContainer[str]
    default_for: _containers.RepeatedScalarFieldContainer[str]
    budget: QueueBudget
    has_budget: bool
    mount_allowed: _containers.RepeatedScalarFieldContainer[str]
    default_time_limit_s: float
    max_time_limit_s: float
    default_min_runtime_s: float
    grace_s: float
    def __init__(self, name: _Optional[str] = ..., parent: _Optional[str] = ..., quotas: _Optional[_Iterable[_Union[QueueQuota, _Mapping]]] = ..., weight: _Optional[float] = ..., has_cpu: _Optional[bool] = ..., cpu: _Optional[float] = ..., has_mem_gib: _Optional[bool] = ..., mem_gib: _Optional[float] = ..., members: _Optional[_Iterable[str]] = ..., default_for: _Optional[_Iterable[str]] = ..., budget: _Optional[_Union[QueueBudget, _Mapping]] = ..., has_budget: _Optional[bool] = ..., mount_allowed: _Optional[_Iterable[str]] = ..., default_time_limit_s: _Optional[float] = ..., max_time_limit_s: _Optional[float] = ..., default_min_runtime_s: _Optional[float] = ..., grace_s: _Optional[float] = ...) -> None: ...

class QueueHeld(_message.Message):
    __slots__ = ("gpu_model", "own", "borrowed")
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    OWN_FIELD_NUMBER: _ClassVar[int]
    BORROWED_FIELD_NUMBER: _ClassVar[int]
    gpu_model: str
    own: int
    borrowed: int
    def __init__(self, gpu_model: _Optional[str] = ..., own: _Optional[int] = ..., borrowed: _Optional[int] = ...) -> None: ...

class QueueView(_message.Message):
    __slots__ = ("queue", "held", "running", "pending", "fair_order", "budget_used", "budget_gate", "leaf", "existing_work")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    FAIR_ORDER_FIELD_NUMBER: _ClassVar[int]
    BUDGET_USED_FIELD_NUMBER: _ClassVar[int]
    BUDGET_GATE_FIELD_NUMBER: _ClassVar[int]
    LEAF_FIELD_NUMBER: _ClassVar[int]
    EXISTING_WORK_FIELD_NUMBER: _ClassVar[int]
    queue: Queue
    held: _containers.RepeatedCompositeFieldContainer[QueueHeld]
    running: int
    pending: int
    fair_order: int
    budget_used: float
    budget_gate: str
    leaf: bool
    existing_work: str
    def __init__(self, queue: _Optional[_Union[Queue, _Mapping]] = ..., held: _Optional[_Iterable[_Union[QueueHeld, _Mapping]]] = ..., running: _Optional[int] = ..., pending: _Optional[int] = ..., fair_order: _Optional[int] = ..., budget_used: _Optional[float] = ..., budget_gate: _Optional[str] = ..., leaf: _Optional[bool] = ..., existing_work: _Optional[str] = ...) -> None: ...

class ListQueuesRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListQueuesResponse(_message.Message):
    __slots__ = ("queues", "managed", "half_life_h", "stale")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    MANAGED_FIELD_NUMBER: _ClassVar[int]
    HALF_LIFE_H_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueView]
    managed: bool
    half_life_h: float
    stale: bool
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueView, _Mapping]]] = ..., managed: _Optional[bool] = ..., half_life_h: _Optional[float] = ..., stale: _Optional[bool] = ...) -> None: ...

class SetQueueRequest(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: Queue
    def __init__(self, queue: _Optional[_Union[Queue, _Mapping]] = ...) -> None: ...

class QueueRef(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ArrayRef(_message.Message):
    __slots__ = ("array_id",)
    ARRAY_ID_FIELD_NUMBER: _ClassVar[int]
    array_id: str
    def __init__(self, array_id: _Optional[str] = ...) -> None: ...

class CancelArrayResponse(_message.Message):
    __slots__ = ("array_id", "cancelled", "already_ended")
    ARRAY_ID_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    ALREADY_ENDED_FIELD_NUMBER: _ClassVar[int]
    array_id: str
    cancelled: int
    already_ended: int
    def __init__(self, array_id: _Optional[str] = ..., cancelled: _Optional[int] = ..., already_ended: _Optional[int] = ...) -> None: ...

class ReservedGpus(_message.Message):
    __slots__ = ("node_id", "gpu_indices")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node_id: _Optional[str] = ..., gpu_indices: _Optional[_Iterable[int]] = ...) -> None: ...

class ReservationView(_message.Message):
    __slots__ = ("reservation", "state", "held", "used_gpus")
    RESERVATION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    USED_GPUS_FIELD_NUMBER: _ClassVar[int]
    reservation: _types_pb2.Reservation
    state: str
    held: _containers.RepeatedCompositeFieldContainer[ReservedGpus]
    used_gpus: int
    def __init__(self, reservation: _Optional[_Union[_types_pb2.Reservation, _Mapping]] = ..., state: _Optional[str] = ..., held: _Optional[_Iterable[_Union[ReservedGpus, _Mapping]]] = ..., used_gpus: _Optional[int] = ...) -> None: ...

class ListReservationsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListReservationsResponse(_message.Message):
    __slots__ = ("reservations",)
    RESERVATIONS_FIELD_NUMBER: _ClassVar[int]
    reservations: _containers.RepeatedCompositeFieldContainer[ReservationView]
    def __init__(self, reservations: _Optional[_Iterable[_Union[ReservationView, _Mapping]]] = ...) -> None: ...

class ReservationRef(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...
