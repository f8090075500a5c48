from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATE_UNSPECIFIED: _ClassVar[TaskState]
    TASK_STATE_PENDING: _ClassVar[TaskState]
    TASK_STATE_SCHEDULED: _ClassVar[TaskState]
    TASK_STATE_STARTING: _ClassVar[TaskState]
    TASK_STATE_RUNNING: _ClassVar[TaskState]
    TASK_STATE_SUCCEEDED: _ClassVar[TaskState]
    TASK_STATE_FAILED: _ClassVar[TaskState]
    TASK_STATE_CANCELLED: _ClassVar[TaskState]
    TASK_STATE_PAUSED: _ClassVar[TaskState]
    TASK_STATE_PREEMPTED: _ClassVar[TaskState]
    TASK_STATE_TIMEOUT: _ClassVar[TaskState]

class TaskKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_KIND_UNSPECIFIED: _ClassVar[TaskKind]
    TASK_KIND_TRAINING: _ClassVar[TaskKind]
    TASK_KIND_FINE_TUNING: _ClassVar[TaskKind]
    TASK_KIND_INFERENCE: _ClassVar[TaskKind]

class RestartPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESTART_POLICY_UNSPECIFIED: _ClassVar[RestartPolicy]
    RESTART_POLICY_NEVER: _ClassVar[RestartPolicy]
    RESTART_POLICY_ON_FAILURE: _ClassVar[RestartPolicy]
    RESTART_POLICY_ALWAYS: _ClassVar[RestartPolicy]

class NodeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATE_UNSPECIFIED: _ClassVar[NodeState]
    NODE_STATE_READY: _ClassVar[NodeState]
    NODE_STATE_NOT_READY: _ClassVar[NodeState]
    NODE_STATE_LOST: _ClassVar[NodeState]
    NODE_STATE_CORDONED: _ClassVar[NodeState]
    NODE_STATE_DRAINING: _ClassVar[NodeState]

class NodePowerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_POWER_STATE_UNSPECIFIED: _ClassVar[NodePowerState]
    NODE_POWER_STATE_READY: _ClassVar[NodePowerState]
    NODE_POWER_STATE_DRAINING: _ClassVar[NodePowerState]
    NODE_POWER_STATE_POWERING_OFF: _ClassVar[NodePowerState]
    NODE_POWER_STATE_OFF: _ClassVar[NodePowerState]
    NODE_POWER_STATE_POWERING_ON: _ClassVar[NodePowerState]

class DependencyKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEPENDENCY_KIND_UNSPECIFIED: _ClassVar[DependencyKind]
    DEPENDENCY_KIND_OK: _ClassVar[DependencyKind]
    DEPENDENCY_KIND_NOTOK: _ClassVar[DependencyKind]
    DEPENDENCY_KIND_ANY: _ClassVar[DependencyKind]

class GpuLinkLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GPU_LINK_LEVEL_UNKNOWN: _ClassVar[GpuLinkLevel]
    GPU_LINK_LEVEL_NVLINK: _ClassVar[GpuLinkLevel]
    GPU_LINK_LEVEL_SAME_SWITCH: _ClassVar[GpuLinkLevel]
    GPU_LINK_LEVEL_SAME_SOCKET: _ClassVar[GpuLinkLevel]
    GPU_LINK_LEVEL_CROSS_SOCKET: _ClassVar[GpuLinkLevel]

class GpuHealthState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GPU_HEALTH_STATE_UNSPECIFIED: _ClassVar[GpuHealthState]
    GPU_HEALTH_STATE_HEALTHY: _ClassVar[GpuHealthState]
    GPU_HEALTH_STATE_DEGRADED: _ClassVar[GpuHealthState]
    GPU_HEALTH_STATE_UNHEALTHY: _ClassVar[GpuHealthState]

class GpuHealthAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GPU_HEALTH_ACTION_NONE: _ClassVar[GpuHealthAction]
    GPU_HEALTH_ACTION_RESET: _ClassVar[GpuHealthAction]
    GPU_HEALTH_ACTION_REPLACE: _ClassVar[GpuHealthAction]

class HealthCheckState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HEALTH_CHECK_STATE_UNSPECIFIED: _ClassVar[HealthCheckState]
    HEALTH_CHECK_STATE_PENDING: _ClassVar[HealthCheckState]
    HEALTH_CHECK_STATE_OK: _ClassVar[HealthCheckState]
    HEALTH_CHECK_STATE_FAILED: _ClassVar[HealthCheckState]
TASK_STATE_UNSPECIFIED: TaskState
TASK_STATE_PENDING: TaskState
TASK_STATE_SCHEDULED: TaskState
TASK_STATE_STARTING: TaskState
TASK_STATE_RUNNING: TaskState
TASK_STATE_SUCCEEDED: TaskState
TASK_STATE_FAILED: TaskState
TASK_STATE_CANCELLED: TaskState
TASK_STATE_PAUSED: TaskState
TASK_STATE_PREEMPTED: TaskState
TASK_STATE_TIMEOUT: TaskState
TASK_KIND_UNSPECIFIED: TaskKind
TASK_KIND_TRAINING: TaskKind
TASK_KIND_FINE_TUNING: TaskKind
TASK_KIND_INFERENCE: TaskKind
RESTART_POLICY_UNSPECIFIED: RestartPolicy
RESTART_POLICY_NEVER: RestartPolicy
RESTART_POLICY_ON_FAILURE: RestartPolicy
RESTART_POLICY_ALWAYS: RestartPolicy
NODE_STATE_UNSPECIFIED: NodeState
NODE_STATE_READY: NodeState
NODE_STATE_NOT_READY: NodeState
NODE_STATE_LOST: NodeState
NODE_STATE_CORDONED: NodeState
NODE_STATE_DRAINING: NodeState
NODE_POWER_STATE_UNSPECIFIED: NodePowerState
NODE_POWER_STATE_READY: NodePowerState
NODE_POWER_STATE_DRAINING: NodePowerState
NODE_POWER_STATE_POWERING_OFF: NodePowerState
NODE_POWER_STATE_OFF: NodePowerState
NODE_POWER_STATE_POWERING_ON: NodePowerState
DEPENDENCY_KIND_UNSPECIFIED: DependencyKind
DEPENDENCY_KIND_OK: DependencyKind
DEPENDENCY_KIND_NOTOK: DependencyKind
DEPENDENCY_KIND_ANY: DependencyKind
GPU_LINK_LEVEL_UNKNOWN: GpuLinkLevel
GPU_LINK_LEVEL_NVLINK: GpuLinkLevel
GPU_LINK_LEVEL_SAME_SWITCH: GpuLinkLevel
GPU_LINK_LEVEL_SAME_SOCKET: GpuLinkLevel
GPU_LINK_LEVEL_CROSS_SOCKET: GpuLinkLevel
GPU_HEALTH_STATE_UNSPECIFIED: GpuHealthState
GPU_HEALTH_STATE_HEALTHY: GpuHealthState
GPU_HEALTH_STATE_DEGRADED: GpuHealthState
GPU_HEALTH_STATE_UNHEALTHY: GpuHealthState
GPU_HEALTH_ACTION_NONE: GpuHealthAction
GPU_HEALTH_ACTION_RESET: GpuHealthAction
GPU_HEALTH_ACTION_REPLACE: GpuHealthAction
HEALTH_CHECK_STATE_UNSPECIFIED: HealthCheckState
HEALTH_CHECK_STATE_PENDING: HealthCheckState
HEALTH_CHECK_STATE_OK: HealthCheckState
HEALTH_CHECK_STATE_FAILED: HealthCheckState

class ResourceVector(_message.Message):
    __slots__ = ("gpus", "gpu_mem_bytes", "cpu_cores", "mem_bytes", "disk_bytes")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_MEM_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_CORES_FIELD_NUMBER: _ClassVar[int]
    MEM_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    gpus: float
    gpu_mem_bytes: int
    cpu_cores: float
    mem_bytes: int
    disk_bytes: int
    def __init__(self, gpus: _Optional[float] = ..., gpu_mem_bytes: _Optional[int] = ..., cpu_cores: _Optional[float] = ..., mem_bytes: _Optional[int] = ..., disk_bytes: _Optional[int] = ...) -> None: ...

class ModelSpec(_message.Message):
    __slots__ = ("name", "params_billions", "precision", "context_length", "batch_size", "layers", "hidden_size")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMS_BILLIONS_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    params_billions: float
    precision: str
    context_length: int
    batch_size: int
    layers: int
    hidden_size: int
    def __init__(self, name: _Optional[str] = ..., params_billions: _Optional[float] = ..., precision: _Optional[str] = ..., context_length: _Optional[int] = ..., batch_size: _Optional[int] = ..., layers: _Optional[int] = ..., hidden_size: _Optional[int] = ...) -> None: ...

class QosSpec(_message.Message):
    __slots__ = ("deadline_unix_s", "max_latency_ms", "min_tokens_per_s")
    DEADLINE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    MAX_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    deadline_unix_s: float
    max_latency_ms: float
    min_tokens_per_s: float
    def __init__(self, deadline_unix_s: _Optional[float] = ..., max_latency_ms: _Optional[float] = ..., min_tokens_per_s: _Optional[float] = ...) -> None: ...

class MetricsMapping(_message.Message):
    __slots__ = ("flavour", "latency_histogram", "ttft_histogram", "tokens_counter", "running_gauge", "waiting_gauge")
    FLAVOUR_FIELD_NUMBER: _ClassVar[int]
    LATENCY_HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    TTFT_HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    TOKENS_COUNTER_FIELD_NUMBER: _ClassVar[int]
    RUNNING_GAUGE_FIELD_NUMBER: _ClassVar[int]
    WAITING_GAUGE_FIELD_NUMBER: _ClassVar[int]
    flavour: str
    latency_histogram: str
    ttft_histogram: str
    tokens_counter: str
    running_gauge: str
    waiting_gauge: str
    def __init__(self, flavour: _Optional[str] = ..., latency_histogram: _Optional[str] = ..., ttft_histogram: _Optional[str] = ..., tokens_counter: _Optional[str] = ..., running_gauge: _Optional[str] = ..., waiting_gauge: _Optional[str] = ...) -> None: ...

class Constraints(_message.Message):
    __slots__ = ("gpu_model", "node_selector", "avoid_nodes", "only_nodes")
    class NodeSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    NODE_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    AVOID_NODES_FIELD_NUMBER: _ClassVar[int]
    ONLY_NODES_FIELD_NUMBER: _ClassVar[int]
    gpu_model: str
    node_selector: _containers.ScalarMap[str, str]
    avoid_nodes: _containers.RepeatedScalarFieldContainer[str]
    only_nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, gpu_model: _Optional[str] = ..., node_selector: _Optional[_Mapping[str, str]] = ..., avoid_nodes: _Optional[_Iterable[str]] = ..., only_nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class TaskSpec(_message.Message):
    __slots__ = ("name", "kind", "model", "demand", "has_demand", "replicas", "nodes", "gpus_per_node", "priority", "qos", "argv", "env", "restart_policy", "max_restarts", "labels", "constraints", "allow_gpu_sharing", "stop_grace_s", "preemptible", "checkpoint_signal", "metrics_port", "metrics_url", "metrics_mapping", "run_as_user", "full_power", "service", "launcher", "queue", "elastic", "image", "mounts", "workdir", "shm_bytes", "array", "after", "keep_unmet", "begin_unix_s", "time_limit_s", "min_runtime_s", "pty")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    HAS_DEMAND_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    RESTART_POLICY_FIELD_NUMBER: _ClassVar[int]
    MAX_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_GPU_SHARING_FIELD_NUMBER: _ClassVar[int]
    STOP_GRACE_S_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIBLE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SIGNAL_FIELD_NUMBER: _ClassVar[int]
    METRICS_PORT_FIELD_NUMBER: _ClassVar[int]
    METRICS_URL_FIELD_NUMBER: _ClassVar[int]
    METRICS_MAPPING_FIELD_NUMBER: _ClassVar[int]
    RUN_AS_USER_FIELD_NUMBER: _ClassVar[int]
    FULL_POWER_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    LAUNCHER_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    ELASTIC_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    MOUNTS_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    SHM_BYTES_FIELD_NUMBER: _ClassVar[int]
    ARRAY_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    KEEP_UNMET_FIELD_NUMBER: _ClassVar[int]
    BEGIN_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    TIME_LIMIT_S_FIELD_NUMBER: _ClassVar[int]
    MIN_RUNTIME_S_FIELD_NUMBER: _ClassVar[int]
    PTY_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: TaskKind
    model: ModelSpec
    demand: ResourceVector
    has_demand: bool
    replicas: int
    nodes: int
    gpus_per_node: int
    priority: int
    qos: QosSpec
    argv: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    restart_policy: RestartPolicy
    max_restarts: int
    labels: _containers.ScalarMap[str, str]
    constraints: Constraints
    allow_gpu_sharing: bool
    stop_grace_s: float
    preemptible: bool
    checkpoint_signal: str
    metrics_port: int
    metrics_url: str
    metrics_mapping: MetricsMapping
    run_as_user: str
    full_power: bool
    service: ServiceSpec
    launcher: str
    queue: str
    elastic: ElasticSpec
    image: str
    mounts: _containers.RepeatedScalarFieldContainer[str]
    workdir: str
    shm_bytes: int
    array: ArraySpec
    after: _containers.RepeatedCompositeFieldContainer[Dependency]
    keep_unmet: bool
    begin_unix_s: float
    time_limit_s: float
    min_runtime_s: float
    pty: bool
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[TaskKind, str]] = ..., model: _Optional[_Union[ModelSpec, _Mapping]] = ..., demand: _Optional[_Union[ResourceVector, _Mapping]] = ..., has_demand: _Optional[bool] = ..., replicas: _Optional[int] = ..., nodes: _Optional[int] = ..., gpus_per_node: _Optional[int] = ..., priority: _Optional[int] = ..., qos: _Optional[_Union[QosSpec, _Mapping]] = ..., argv: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., restart_policy: _Optional[_Union[RestartPolicy, str]] = ..., max_restarts: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., constraints: _Optional[_Union[Constraints, _Mapping]] = ..., allow_gpu_sharing: _Optional[bool] = ..., stop_grace_s: _Optional[float] = ..., preemptible: _Optional[bool] = ..., checkpoint_signal: _Optional[str] = ..., metrics_port: _Optional[int] = ..., metrics_url: _Optional[str] = ..., metrics_mapping: _Optional[_Union[MetricsMapping, _Mapping]] = ..., run_as_user: _Optional[str] = ..., full_power: _Optional[bool] = ..., service: _Optional[_Union[ServiceSpec, _Mapping]] = ..., launcher: _Optional[str] = ..., queue: _Optional[str] = ..., elastic: _Optional[_Union[ElasticSpec, _Mapping]] = ..., image: _Optional[str] = ..., mounts: _Optional[_Iterable[str]] = ..., workdir: _Optional[str] = ..., shm_bytes: _Optional[int] = ..., array: _Optional[_Union[ArraySpec, _Mapping]] = ..., after: _Optional[_Iterable[_Union[Dependency, _Mapping]]] = ..., keep_unmet: _Optional[bool] = ..., begin_unix_s: _Optional[float] = ..., time_limit_s: _Optional[float] = ..., min_runtime_s: _Optional[float] = ..., pty: _Optional[bool] = ...) -> None: ...

class ArraySpec(_message.Message):
    __slots__ = ("first", "last", "step", "max_running")
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_FIELD_NUMBER: _ClassVar[int]
    first: int
    last: int
    step: int
    max_running: int
    def __init__(self, first: _Optional[int] = ..., last: _Optional[int] = ..., step: _Optional[int] = ..., max_running: _Optional[int] = ...) -> None: ...

class Dependency(_message.Message):
    __slots__ = ("kind", "ids")
    KIND_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    kind: DependencyKind
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, kind: _Optional[_Union[DependencyKind, str]] = ..., ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ElasticSpec(_message.Message):
    __slots__ = ("min_gpus", "max_gpus", "min_nodes", "max_nodes", "throughput_counter")
    MIN_GPUS_FIELD_NUMBER: _ClassVar[int]
    MAX_GPUS_FIELD_NUMBER: _ClassVar[int]
    MIN_NODES_FIELD_NUMBER: _ClassVar[int]
    MAX_NODES_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_COUNTER_FIELD_NUMBER: _ClassVar[int]
    min_gpus: int
    max_gpus: int
    min_nodes: int
    max_nodes: int
    throughput_counter: str
    def __init__(self, min_gpus: _Optional[int] = ..., max_gpus: _Optional[int] = ..., min_nodes: _Optional[int] = ..., max_nodes: _Optional[int] = ..., throughput_counter: _Optional[str] = ...) -> None: ...

class ElasticPoint(_message.Message):
    __slots__ = ("gpus", "throughput")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_FIELD_NUMBER: _ClassVar[int]
    gpus: int
    throughput: float
    def __init__(self, gpus: _Optional[int] = ..., throughput: _Optional[float] = ...) -> None: ...

class ResizeRecord(_message.Message):
    __slots__ = ("time_unix_s", "from_gpus", "to_gpus", "reason", "expected_speedup")
    TIME_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    FROM_GPUS_FIELD_NUMBER: _ClassVar[int]
    TO_GPUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SPEEDUP_FIELD_NUMBER: _ClassVar[int]
    time_unix_s: float
    from_gpus: int
    to_gpus: int
    reason: str
    expected_speedup: float
    def __init__(self, time_unix_s: _Optional[float] = ..., from_gpus: _Optional[int] = ..., to_gpus: _Optional[int] = ..., reason: _Optional[str] = ..., expected_speedup: _Optional[float] = ...) -> None: ...

class ElasticStatus(_message.Message):
    __slots__ = ("gpus", "target_gpus", "resizes", "resize_reason", "last_resize_unix_s", "restart_cost_s", "curve", "history", "resize_stop_unix_s", "interval_s", "grow_blocked")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    TARGET_GPUS_FIELD_NUMBER: _ClassVar[int]
    RESIZES_FIELD_NUMBER: _ClassVar[int]
    RESIZE_REASON_FIELD_NUMBER: _ClassVar[int]
    LAST_RESIZE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    RESTART_COST_S_FIELD_NUMBER: _ClassVar[int]
    CURVE_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    RESIZE_STOP_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    GROW_BLOCKED_FIELD_NUMBER: _ClassVar[int]
    gpus: int
    target_gpus: int
    resizes: int
    resize_reason: str
    last_resize_unix_s: float
    restart_cost_s: float
    curve: _containers.RepeatedCompositeFieldContainer[ElasticPoint]
    history: _containers.RepeatedCompositeFieldContainer[ResizeRecord]
    resize_stop_unix_s: float
    interval_s: float
    grow_blocked: str
    def __init__(self, gpus: _Optional[int] = ..., target_gpus: _Optional[int] = ..., resizes: _Optional[int] = ..., resize_reason: _Optional[str] = ..., last_resize_unix_s: _Optional[float] = ..., restart_cost_s: _Optional[float] = ..., curve: _Optional[_Iterable[_Union[ElasticPoint, _Mapping]]] = ..., history: _Optional[_Iterable[_Union[ResizeRecord, _Mapping]]] = ..., resize_stop_unix_s: _Optional[float] = ..., interval_s: _Optional[float] = ..., grow_blocked: _Optional[str] = ...) -> None: ...

class ServiceSpec(_message.Message):
    __slots__ = ("min_replicas", "max_replicas", "target_util", "pack_replicas")
    MIN_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MAX_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TARGET_UTIL_FIELD_NUMBER: _ClassVar[int]
    PACK_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    min_replicas: int
    max_replicas: int
    target_util: float
    pack_replicas: bool
    def __init__(self, min_replicas: _Optional[int] = ..., max_replicas: _Optional[int] = ..., target_util: _Optional[float] = ..., pack_replicas: _Optional[bool] = ...) -> None: ...

class ScaleDecision(_message.Message):
    __slots__ = ("time_unix_s", "from_replicas", "to_replicas", "reason")
    TIME_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    FROM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TO_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    time_unix_s: float
    from_replicas: int
    to_replicas: int
    reason: str
    def __init__(self, time_unix_s: _Optional[float] = ..., from_replicas: _Optional[int] = ..., to_replicas: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Service(_message.Message):
    __slots__ = ("id", "spec", "desired", "pinned", "submit_unix_s", "reason", "decisions", "revision", "signal", "load", "forecast_load", "forecast_replicas", "forecast_mape", "lead_time_s", "forecast_model", "stopped", "submitted_by")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    DESIRED_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    FORECAST_LOAD_FIELD_NUMBER: _ClassVar[int]
    FORECAST_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    FORECAST_MAPE_FIELD_NUMBER: _ClassVar[int]
    LEAD_TIME_S_FIELD_NUMBER: _ClassVar[int]
    FORECAST_MODEL_FIELD_NUMBER: _ClassVar[int]
    STOPPED_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_BY_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: TaskSpec
    desired: int
    pinned: bool
    submit_unix_s: float
    reason: str
    decisions: _containers.RepeatedCompositeFieldContainer[ScaleDecision]
    revision: int
    signal: float
    load: float
    forecast_load: float
    forecast_replicas: int
    forecast_mape: float
    lead_time_s: float
    forecast_model: str
    stopped: bool
    submitted_by: str
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[TaskSpec, _Mapping]] = ..., desired: _Optional[int] = ..., pinned: _Optional[bool] = ..., submit_unix_s: _Optional[float] = ..., reason: _Optional[str] = ..., decisions: _Optional[_Iterable[_Union[ScaleDecision, _Mapping]]] = ..., revision: _Optional[int] = ..., signal: _Optional[float] = ..., load: _Optional[float] = ..., forecast_load: _Optional[float] = ..., forecast_replicas: _Optional[int] = ..., forecast_mape: _Optional[float] = ..., lead_time_s: _Optional[float] = ..., forecast_model: _Optional[str] = ..., stopped: _Optional[bool] = ..., submitted_by: _Optional[str] = ...) -> None: ...

class ServiceLoadHistory(_message.Message):
    __slots__ = ("service_id", "bucket_s", "last_bucket", "values", "error_times_unix_s", "errors", "capacity", "saved_unix_s")
    SERVICE_ID_FIELD_NUMBER: _ClassVar[int]
    BUCKET_S_FIELD_NUMBER: _ClassVar[int]
    LAST_BUCKET_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    ERROR_TIMES_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    SAVED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    service_id: str
    bucket_s: float
    last_bucket: int
    values: _containers.RepeatedScalarFieldContainer[float]
    error_times_unix_s: _containers.RepeatedScalarFieldContainer[float]
    errors: _containers.RepeatedScalarFieldContainer[float]
    capacity: float
    saved_unix_s: float
    def __init__(self, service_id: _Optional[str] = ..., bucket_s: _Optional[float] = ..., last_bucket: _Optional[int] = ..., values: _Optional[_Iterable[float]] = ..., error_times_unix_s: _Optional[_Iterable[float]] = ..., errors: _Optional[_Iterable[float]] = ..., capacity: _Optional[float] = ..., saved_unix_s: _Optional[float] = ...) -> None: ...

class NodeAllocation(_message.Message):
    __slots__ = ("node_id", "gpu_indices", "gpu_uuids", "demand", "gpu_share", "address")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    GPU_UUIDS_FIELD_NUMBER: _ClassVar[int]
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    GPU_SHARE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    gpu_uuids: _containers.RepeatedScalarFieldContainer[str]
    demand: ResourceVector
    gpu_share: float
    address: str
    def __init__(self, node_id: _Optional[str] = ..., gpu_indices: _Optional[_Iterable[int]] = ..., gpu_uuids: _Optional[_Iterable[str]] = ..., demand: _Optional[_Union[ResourceVector, _Mapping]] = ..., gpu_share: _Optional[float] = ..., address: _Optional[str] = ...) -> None: ...

class Allocation(_message.Message):
    __slots__ = ("task_id", "nodes", "leader_epoch", "decision_id", "created_unix_s", "master_port")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    nodes: _containers.RepeatedCompositeFieldContainer[NodeAllocation]
    leader_epoch: int
    decision_id: str
    created_unix_s: float
    master_port: int
    def __init__(self, task_id: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[NodeAllocation, _Mapping]]] = ..., leader_epoch: _Optional[int] = ..., decision_id: _Optional[str] = ..., created_unix_s: _Optional[float] = ..., master_port: _Optional[int] = ...) -> None: ...

class TaskStateChange(_message.Message):
    __slots__ = ("state", "time_unix_s", "reason")
    STATE_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    state: TaskState
    time_unix_s: float
    reason: str
    def __init__(self, state: _Optional[_Union[TaskState, str]] = ..., time_unix_s: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("id", "spec", "state", "reason", "submit_unix_s", "demand", "allocation", "exit_code", "has_exit_code", "log_tail", "history", "restarts", "revision", "pids", "qos_reading", "energy_j", "preemptions", "cancel_requested", "not_before_unix_s", "service_id", "replica_index", "parts", "queue", "submitted_by", "borrowed_gpus", "elastic", "gpu_fault_moves", "app_xids", "array_id", "array_index", "timed_out")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    HAS_EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    LOG_TAIL_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    QOS_READING_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    NOT_BEFORE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    SERVICE_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_INDEX_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_BY_FIELD_NUMBER: _ClassVar[int]
    BORROWED_GPUS_FIELD_NUMBER: _ClassVar[int]
    ELASTIC_FIELD_NUMBER: _ClassVar[int]
    GPU_FAULT_MOVES_FIELD_NUMBER: _ClassVar[int]
    APP_XIDS_FIELD_NUMBER: _ClassVar[int]
    ARRAY_ID_FIELD_NUMBER: _ClassVar[int]
    ARRAY_INDEX_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: TaskSpec
    state: TaskState
    reason: str
    submit_unix_s: float
    demand: ResourceVector
    allocation: Allocation
    exit_code: int
    has_exit_code: bool
    log_tail: str
    history: _containers.RepeatedCompositeFieldContainer[TaskStateChange]
    restarts: int
    revision: int
    pids: _containers.RepeatedScalarFieldContainer[int]
    qos_reading: TaskQos
    energy_j: float
    preemptions: int
    cancel_requested: bool
    not_before_unix_s: float
    service_id: str
    replica_index: int
    parts: _containers.RepeatedCompositeFieldContainer[TaskPart]
    queue: str
    submitted_by: str
    borrowed_gpus: int
    elastic: ElasticStatus
    gpu_fault_moves: int
    app_xids: _containers.RepeatedCompositeFieldContainer[AppXid]
    array_id: str
    array_index: int
    timed_out: bool
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[TaskSpec, _Mapping]] = ..., state: _Optional[_Union[TaskState, str]] = ..., reason: _Optional[str] = ..., submit_unix_s: _Optional[float] = ..., demand: _Optional[_Union[ResourceVector, _Mapping]] = ..., allocation: _Optional[_Union[Allocation, _Mapping]] = ..., exit_code: _Optional[int] = ..., has_exit_code: _Optional[bool] = ..., log_tail: _Optional[str] = ..., history: _Optional[_Iterable[_Union[TaskStateChange, _Mapping]]] = ..., restarts: _Optional[int] = ..., revision: _Optional[int] = ..., pids: _Optional[_Iterable[int]] = ..., qos_reading: _Optional[_Union[TaskQos, _Mapping]] = ..., energy_j: _Optional[float] = ..., preemptions: _Optional[int] = ..., cancel_requested: _Optional[bool] = ..., not_before_unix_s: _Optional[float] = ..., service_id: _Optional[str] = ..., replica_index: _Optional[int] = ..., parts: _Optional[_Iterable[_Union[TaskPart, _Mapping]]] = ..., queue: _Optional[str] = ..., submitted_by: _Optional[str] = ..., borrowed_gpus: _Optional[int] = ..., elastic: _Optional[_Union[ElasticStatus, _Mapping]] = ..., gpu_fault_moves: _Optional[int] = ..., app_xids: _Optional[_Iterable[_Union[AppXid, _Mapping]]] = ..., array_id: _Optional[str] = ..., array_index: _Optional[int] = ..., timed_out: _Optional[bool] = ...) -> None: ...

class AppXid(_message.Message):
    __slots__ = ("time_unix_s", "node_id", "gpu_index", "xid")
    TIME_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    XID_FIELD_NUMBER: _ClassVar[int]
    time_unix_s: float
    node_id: str
    gpu_index: int
    xid: int
    def __init__(self, time_unix_s: _Optional[float] = ..., node_id: _Optional[str] = ..., gpu_index: _Optional[int] = ..., xid: _Optional[int] = ...) -> None: ...

class TaskPart(_message.Message):
    __slots__ = ("node_id", "rank", "state", "exit_code", "has_exit_code", "reason")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    HAS_EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    rank: int
    state: TaskState
    exit_code: int
    has_exit_code: bool
    reason: str
    def __init__(self, node_id: _Optional[str] = ..., rank: _Optional[int] = ..., state: _Optional[_Union[TaskState, str]] = ..., exit_code: _Optional[int] = ..., has_exit_code: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class GpuInfo(_message.Message):
    __slots__ = ("index", "uuid", "model", "mem_total_bytes", "power_limit_w", "power_min_w", "power_max_w", "power_default_w", "pci_bus_id", "topology_group", "mig_enabled", "numa_node_plus_one", "cpu_affinity", "links")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MEM_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    POWER_MIN_W_FIELD_NUMBER: _ClassVar[int]
    POWER_MAX_W_FIELD_NUMBER: _ClassVar[int]
    POWER_DEFAULT_W_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_GROUP_FIELD_NUMBER: _ClassVar[int]
    MIG_ENABLED_FIELD_NUMBER: _ClassVar[int]
    NUMA_NODE_PLUS_ONE_FIELD_NUMBER: _ClassVar[int]
    CPU_AFFINITY_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    model: str
    mem_total_bytes: int
    power_limit_w: float
    power_min_w: float
    power_max_w: float
    power_default_w: float
    pci_bus_id: str
    topology_group: int
    mig_enabled: bool
    numa_node_plus_one: int
    cpu_affinity: _containers.RepeatedScalarFieldContainer[int]
    links: _containers.RepeatedCompositeFieldContainer[GpuLink]
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., model: _Optional[str] = ..., mem_total_bytes: _Optional[int] = ..., power_limit_w: _Optional[float] = ..., power_min_w: _Optional[float] = ..., power_max_w: _Optional[float] = ..., power_default_w: _Optional[float] = ..., pci_bus_id: _Optional[str] = ..., topology_group: _Optional[int] = ..., mig_enabled: _Optional[bool] = ..., numa_node_plus_one: _Optional[int] = ..., cpu_affinity: _Optional[_Iterable[int]] = ..., links: _Optional[_Iterable[_Union[GpuLink, _Mapping]]] = ...) -> None: ...

class GpuLink(_message.Message):
    __slots__ = ("peer_index", "level", "nvlinks")
    PEER_INDEX_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    NVLINKS_FIELD_NUMBER: _ClassVar[int]
    peer_index: int
    level: GpuLinkLevel
    nvlinks: int
    def __init__(self, peer_index: _Optional[int] = ..., level: _Optional[_Union[GpuLinkLevel, str]] = ..., nvlinks: _Optional[int] = ...) -> None: ...

class NodeInventory(_message.Message):
    __slots__ = ("node_id", "hostname", "gpus", "cpu_cores", "mem_total_bytes", "disk_total_bytes", "labels", "agent_version", "simulated", "gpu_backend", "host_simulated", "advertise_address", "task_port_min", "task_port_max", "health_check", "containers", "images")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    CPU_CORES_FIELD_NUMBER: _ClassVar[int]
    MEM_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    SIMULATED_FIELD_NUMBER: _ClassVar[int]
    GPU_BACKEND_FIELD_NUMBER: _ClassVar[int]
    HOST_SIMULATED_FIELD_NUMBER: _ClassVar[int]
    ADVERTISE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TASK_PORT_MIN_FIELD_NUMBER: _ClassVar[int]
    TASK_PORT_MAX_FIELD_NUMBER: _ClassVar[int]
    HEALTH_CHECK_FIELD_NUMBER: _ClassVar[int]
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    hostname: str
    gpus: _containers.RepeatedCompositeFieldContainer[GpuInfo]
    cpu_cores: int
    mem_total_bytes: int
    disk_total_bytes: int
    labels: _containers.ScalarMap[str, str]
    agent_version: str
    simulated: bool
    gpu_backend: str
    host_simulated: bool
    advertise_address: str
    task_port_min: int
    task_port_max: int
    health_check: bool
    containers: bool
    images: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_id: _Optional[str] = ..., hostname: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[GpuInfo, _Mapping]]] = ..., cpu_cores: _Optional[int] = ..., mem_total_bytes: _Optional[int] = ..., disk_total_bytes: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., agent_version: _Optional[str] = ..., simulated: _Optional[bool] = ..., gpu_backend: _Optional[str] = ..., host_simulated: _Optional[bool] = ..., advertise_address: _Optional[str] = ..., task_port_min: _Optional[int] = ..., task_port_max: _Optional[int] = ..., health_check: _Optional[bool] = ..., containers: _Optional[bool] = ..., images: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeRecord(_message.Message):
    __slots__ = ("inventory", "state", "cordoned", "draining", "reserved", "reserved_gpu_indices", "registered_unix_s", "last_seen_unix_s", "power_state", "power_state_unix_s", "power_reason", "gpu_fences", "health_drained", "health_drain_reason", "gpu_health_history")
    INVENTORY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CORDONED_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    RESERVED_FIELD_NUMBER: _ClassVar[int]
    RESERVED_GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    POWER_STATE_FIELD_NUMBER: _ClassVar[int]
    POWER_STATE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    POWER_REASON_FIELD_NUMBER: _ClassVar[int]
    GPU_FENCES_FIELD_NUMBER: _ClassVar[int]
    HEALTH_DRAINED_FIELD_NUMBER: _ClassVar[int]
    HEALTH_DRAIN_REASON_FIELD_NUMBER: _ClassVar[int]
    GPU_HEALTH_HISTORY_FIELD_NUMBER: _ClassVar[int]
    inventory: NodeInventory
    state: NodeState
    cordoned: bool
    draining: bool
    reserved: ResourceVector
    reserved_gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    registered_unix_s: float
    last_seen_unix_s: float
    power_state: NodePowerState
    power_state_unix_s: float
    power_reason: str
    gpu_fences: _containers.RepeatedCompositeFieldContainer[GpuFence]
    health_drained: bool
    health_drain_reason: str
    gpu_health_history: _containers.RepeatedCompositeFieldContainer[GpuHealthEvent]
    def __init__(self, inventory: _Optional[_Union[NodeInventory, _Mapping]] = ..., state: _Optional[_Union[NodeState, str]] = ..., cordoned: _Optional[bool] = ..., draining: _Optional[bool] = ..., reserved: _Optional[_Union[ResourceVector, _Mapping]] = ..., reserved_gpu_indices: _Optional[_Iterable[int]] = ..., registered_unix_s: _Optional[float] = ..., last_seen_unix_s: _Optional[float] = ..., power_state: _Optional[_Union[NodePowerState, str]] = ..., power_state_unix_s: _Optional[float] = ..., power_reason: _Optional[str] = ..., gpu_fences: _Optional[_Iterable[_Union[GpuFence, _Mapping]]] = ..., health_drained: _Optional[bool] = ..., health_drain_reason: _Optional[str] = ..., gpu_health_history: _Optional[_Iterable[_Union[GpuHealthEvent, _Mapping]]] = ...) -> None: ...

class GpuFence(_message.Message):
    __slots__ = ("gpu_index", "gpu_uuid", "action", "reason", "evidence", "since_unix_s", "simulated")
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    SIMULATED_FIELD_NUMBER: _ClassVar[int]
    gpu_index: int
    gpu_uuid: str
    action: GpuHealthAction
    reason: str
    evidence: str
    since_unix_s: float
    simulated: bool
    def __init__(self, gpu_index: _Optional[int] = ..., gpu_uuid: _Optional[str] = ..., action: _Optional[_Union[GpuHealthAction, str]] = ..., reason: _Optional[str] = ..., evidence: _Optional[str] = ..., since_unix_s: _Optional[float] = ..., simulated: _Optional[bool] = ...) -> None: ...

class GpuHealthEvent(_message.Message):
    __slots__ = ("time_unix_s", "gpu_index", "state", "reason", "evidence", "by")
    TIME_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    time_unix_s: float
    gpu_index: int
    state: GpuHealthState
    reason: str
    evidence: str
    by: str
    def __init__(self, time_unix_s: _Optional[float] = ..., gpu_index: _Optional[int] = ..., state: _Optional[_Union[GpuHealthState, str]] = ..., reason: _Optional[str] = ..., evidence: _Optional[str] = ..., by: _Optional[str] = ...) -> None: ...

class Policy(_message.Message):
    __slots__ = ("name", "threshold", "threshold_mode")
    NAME_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_MODE_FIELD_NUMBER: _ClassVar[int]
    name: str
    threshold: float
    threshold_mode: str
    def __init__(self, name: _Optional[str] = ..., threshold: _Optional[float] = ..., threshold_mode: _Optional[str] = ...) -> None: ...

class LeaderRecord(_message.Message):
    __slots__ = ("coordinator_id", "address", "epoch", "since_unix_s")
    COORDINATOR_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    coordinator_id: str
    address: str
    epoch: int
    since_unix_s: float
    def __init__(self, coordinator_id: _Optional[str] = ..., address: _Optional[str] = ..., epoch: _Optional[int] = ..., since_unix_s: _Optional[float] = ...) -> None: ...

class GpuProcess(_message.Message):
    __slots__ = ("pid", "used_mem_bytes")
    PID_FIELD_NUMBER: _ClassVar[int]
    USED_MEM_BYTES_FIELD_NUMBER: _ClassVar[int]
    pid: int
    used_mem_bytes: int
    def __init__(self, pid: _Optional[int] = ..., used_mem_bytes: _Optional[int] = ...) -> None: ...

class GpuSample(_message.Message):
    __slots__ = ("index", "uuid", "util_gpu", "util_mem", "mem_used_bytes", "mem_total_bytes", "power_w", "power_limit_w", "energy_j", "temperature_c", "sm_clock_mhz", "mem_clock_mhz", "ecc_corrected_total", "ecc_uncorrected_total", "healthy", "health_reason", "processes", "mig_enabled", "simulated", "xid_last", "util_gpu_max", "power_w_max", "temperature_c_max", "mem_used_bytes_max", "health")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    UTIL_GPU_FIELD_NUMBER: _ClassVar[int]
    UTIL_MEM_FIELD_NUMBER: _ClassVar[int]
    MEM_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEM_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    SM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    MEM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    ECC_CORRECTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ECC_UNCORRECTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    HEALTH_REASON_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    MIG_ENABLED_FIELD_NUMBER: _ClassVar[int]
    SIMULATED_FIELD_NUMBER: _ClassVar[int]
    XID_LAST_FIELD_NUMBER: _ClassVar[int]
    UTIL_GPU_MAX_FIELD_NUMBER: _ClassVar[int]
    POWER_W_MAX_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_MAX_FIELD_NUMBER: _ClassVar[int]
    MEM_USED_BYTES_MAX_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    util_gpu: float
    util_mem: float
    mem_used_bytes: int
    mem_total_bytes: int
    power_w: float
    power_limit_w: float
    energy_j: float
    temperature_c: float
    sm_clock_mhz: int
    mem_clock_mhz: int
    ecc_corrected_total: int
    ecc_uncorrected_total: int
    healthy: bool
    health_reason: str
    processes: _containers.RepeatedCompositeFieldContainer[GpuProcess]
    mig_enabled: bool
    simulated: bool
    xid_last: int
    util_gpu_max: float
    power_w_max: float
    temperature_c_max: float
    mem_used_bytes_max: int
    health: GpuHealth
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., util_gpu: _Optional[float] = ..., util_mem: _Optional[float] = ..., mem_used_bytes: _Optional[int] = ..., mem_total_bytes: _Optional[int] = ..., power_w: _Optional[float] = ..., power_limit_w: _Optional[float] = ..., energy_j: _Optional[float] = ..., temperature_c: _Optional[float] = ..., sm_clock_mhz: _Optional[int] = ..., mem_clock_mhz: _Optional[int] = ..., ecc_corrected_total: _Optional[int] = ..., ecc_uncorrected_total: _Optional[int] = ..., healthy: _Optional[bool] = ..., health_reason: _Optional[str] = ..., processes: _Optional[_Iterable[_Union[GpuProcess, _Mapping]]] = ..., mig_enabled: _Optional[bool] = ..., simulated: _Optional[bool] = ..., xid_last: _Optional[int] = ..., util_gpu_max: _Optional[float] = ..., power_w_max: _Optional[float] = ..., temperature_c_max: _Optional[float] = ..., mem_used_bytes_max: _Optional[int] = ..., health: _Optional[_Union[GpuHealth, _Mapping]] = ...) -> None: ...

class GpuHealth(_message.Message):
    __slots__ = ("state", "action", "reason", "evidence", "since_unix_s", "simulated", "app_xid_count", "app_xid_last", "app_xid_unix_s")
    STATE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    SIMULATED_FIELD_NUMBER: _ClassVar[int]
    APP_XID_COUNT_FIELD_NUMBER: _ClassVar[int]
    APP_XID_LAST_FIELD_NUMBER: _ClassVar[int]
    APP_XID_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    state: GpuHealthState
    action: GpuHealthAction
    reason: str
    evidence: str
    since_unix_s: float
    simulated: bool
    app_xid_count: int
    app_xid_last: int
    app_xid_unix_s: float
    def __init__(self, state: _Optional[_Union[GpuHealthState, str]] = ..., action: _Optional[_Union[GpuHealthAction, str]] = ..., reason: _Optional[str] = ..., evidence: _Optional[str] = ..., since_unix_s: _Optional[float] = ..., simulated: _Optional[bool] = ..., app_xid_count: _Optional[int] = ..., app_xid_last: _Optional[int] = ..., app_xid_unix_s: _Optional[float] = ...) -> None: ...

class NodeHealthCheck(_message.Message):
    __slots__ = ("state", "message", "ran_unix_s", "exit_code")
    STATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RAN_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    state: HealthCheckState
    message: str
    ran_unix_s: float
    exit_code: int
    def __init__(self, state: _Optional[_Union[HealthCheckState, str]] = ..., message: _Optional[str] = ..., ran_unix_s: _Optional[float] = ..., exit_code: _Optional[int] = ...) -> None: ...

class DiskSample(_message.Message):
    __slots__ = ("path", "total_bytes", "used_bytes", "read_bytes_total", "write_bytes_total")
    PATH_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    READ_BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    WRITE_BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    path: str
    total_bytes: int
    used_bytes: int
    read_bytes_total: int
    write_bytes_total: int
    def __init__(self, path: _Optional[str] = ..., total_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., read_bytes_total: _Optional[int] = ..., write_bytes_total: _Optional[int] = ...) -> None: ...

class TaskUsage(_message.Message):
    __slots__ = ("task_id", "cpu_util", "rss_bytes", "gpu_mem_bytes", "gpu_util_share", "power_share_w", "energy_share_j")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CPU_UTIL_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_MEM_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_UTIL_SHARE_FIELD_NUMBER: _ClassVar[int]
    POWER_SHARE_W_FIELD_NUMBER: _ClassVar[int]
    ENERGY_SHARE_J_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    cpu_util: float
    rss_bytes: int
    gpu_mem_bytes: int
    gpu_util_share: float
    power_share_w: float
    energy_share_j: float
    def __init__(self, task_id: _Optional[str] = ..., cpu_util: _Optional[float] = ..., rss_bytes: _Optional[int] = ..., gpu_mem_bytes: _Optional[int] = ..., gpu_util_share: _Optional[float] = ..., power_share_w: _Optional[float] = ..., energy_share_j: _Optional[float] = ...) -> None: ...

class TaskQos(_message.Message):
    __slots__ = ("task_id", "latency_p95_s", "ttft_p95_s", "tokens_per_s", "requests_running", "requests_waiting", "window_s", "metrics_unavailable", "scraped_unix_s")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    LATENCY_P95_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_P95_S_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_WAITING_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    METRICS_UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    SCRAPED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    latency_p95_s: float
    ttft_p95_s: float
    tokens_per_s: float
    requests_running: float
    requests_waiting: float
    window_s: float
    metrics_unavailable: str
    scraped_unix_s: float
    def __init__(self, task_id: _Optional[str] = ..., latency_p95_s: _Optional[float] = ..., ttft_p95_s: _Optional[float] = ..., tokens_per_s: _Optional[float] = ..., requests_running: _Optional[float] = ..., requests_waiting: _Optional[float] = ..., window_s: _Optional[float] = ..., metrics_unavailable: _Optional[str] = ..., scraped_unix_s: _Optional[float] = ...) -> None: ...

class HostSample(_message.Message):
    __slots__ = ("cpu_util", "load1", "load5", "load15", "mem_used_bytes", "mem_total_bytes", "disks", "net_rx_bytes_total", "net_tx_bytes_total", "cpu_power_w", "tasks", "simulated", "cpu_util_max", "mem_used_bytes_max", "cpu_power_w_max")
    CPU_UTIL_FIELD_NUMBER: _ClassVar[int]
    LOAD1_FIELD_NUMBER: _ClassVar[int]
    LOAD5_FIELD_NUMBER: _ClassVar[int]
    LOAD15_FIELD_NUMBER: _ClassVar[int]
    MEM_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEM_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISKS_FIELD_NUMBER: _ClassVar[int]
    NET_RX_BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NET_TX_BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CPU_POWER_W_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    SIMULATED_FIELD_NUMBER: _ClassVar[int]
    CPU_UTIL_MAX_FIELD_NUMBER: _ClassVar[int]
    MEM_USED_BYTES_MAX_FIELD_NUMBER: _ClassVar[int]
    CPU_POWER_W_MAX_FIELD_NUMBER: _ClassVar[int]
    cpu_util: float
    load1: float
    load5: float
    load15: float
    mem_used_bytes: int
    mem_total_bytes: int
    disks: _containers.RepeatedCompositeFieldContainer[DiskSample]
    net_rx_bytes_total: int
    net_tx_bytes_total: int
    cpu_power_w: float
    tasks: _containers.RepeatedCompositeFieldContainer[TaskUsage]
    simulated: bool
    cpu_util_max: float
    mem_used_bytes_max: int
    cpu_power_w_max: float
    def __init__(self, cpu_util: _Optional[float] = ..., load1: _Optional[float] = ..., load5: _Optional[float] = ..., load15: _Optional[float] = ..., mem_used_bytes: _Optional[int] = ..., mem_total_bytes: _Optional[int] = ..., disks: _Optional[_Iterable[_Union[DiskSample, _Mapping]]] = ..., net_rx_bytes_total: _Optional[int] = ..., net_tx_bytes_total: _Optional[int] = ..., cpu_power_w: _Optional[float] = ..., tasks: _Optional[_Iterable[_Union[TaskUsage, _Mapping]]] = ..., simulated: _Optional[bool] = ..., cpu_util_max: _Optional[float] = ..., mem_used_bytes_max: _Optional[int] = ..., cpu_power_w_max: _Optional[float] = ...) -> None: ...

class TelemetrySample(_message.Message):
    __slots__ = ("time_unix_s", "gpus", "host", "simulated", "task_qos", "summarised_samples", "summary_of_s", "task_uid_room", "task_ports_free", "health_check")
    TIME_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    SIMULATED_FIELD_NUMBER: _ClassVar[int]
    TASK_QOS_FIELD_NUMBER: _ClassVar[int]
    SUMMARISED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_OF_S_FIELD_NUMBER: _ClassVar[int]
    TASK_UID_ROOM_FIELD_NUMBER: _ClassVar[int]
    TASK_PORTS_FREE_FIELD_NUMBER: _ClassVar[int]
    HEALTH_CHECK_FIELD_NUMBER: _ClassVar[int]
    time_unix_s: float
    gpus: _containers.RepeatedCompositeFieldContainer[GpuSample]
    host: HostSample
    simulated: bool
    task_qos: _containers.RepeatedCompositeFieldContainer[TaskQos]
    summarised_samples: int
    summary_of_s: float
    task_uid_room: int
    task_ports_free: int
    health_check: NodeHealthCheck
    def __init__(self, time_unix_s: _Optional[float] = ..., gpus: _Optional[_Iterable[_Union[GpuSample, _Mapping]]] = ..., host: _Optional[_Union[HostSample, _Mapping]] = ..., simulated: _Optional[bool] = ..., task_qos: _Optional[_Iterable[_Union[TaskQos, _Mapping]]] = ..., summarised_samples: _Optional[int] = ..., summary_of_s: _Optional[float] = ..., task_uid_room: _Optional[int] = ..., task_ports_free: _Optional[int] = ..., health_check: _Optional[_Union[NodeHealthCheck, _Mapping]] = ...) -> None: ...

class UsageRow(_message.Message):
    __slots__ = ("queue", "user", "gpu_model", "gpu_s", "cpu_core_s", "energy_j", "tasks")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    GPU_S_FIELD_NUMBER: _ClassVar[int]
    CPU_CORE_S_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    user: str
    gpu_model: str
    gpu_s: float
    cpu_core_s: float
    energy_j: float
    tasks: int
    def __init__(self, queue: _Optional[str] = ..., user: _Optional[str] = ..., gpu_model: _Optional[str] = ..., gpu_s: _Optional[float] = ..., cpu_core_s: _Optional[float] = ..., energy_j: _Optional[float] = ..., tasks: _Optional[int] = ...) -> None: ...

class UsageBucket(_message.Message):
    __slots__ = ("hour_unix_s", "rows")
    HOUR_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    hour_unix_s: int
    rows: _containers.RepeatedCompositeFieldContainer[UsageRow]
    def __init__(self, hour_unix_s: _Optional[int] = ..., rows: _Optional[_Iterable[_Union[UsageRow, _Mapping]]] = ...) -> None: ...

class UsageMarks(_message.Message):
    __slots__ = ("accounted_until_unix_s", "task_energy_j")
    class TaskEnergyJEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ACCOUNTED_UNTIL_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    TASK_ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    accounted_until_unix_s: float
    task_energy_j: _containers.ScalarMap[str, float]
    def __init__(self, accounted_until_unix_s: _Optional[float] = ..., task_energy_j: _Optional[_Mapping[str, float]] = ...) -> None: ...

class Reservation(_message.Message):
    __slots__ = ("name", "gpus", "gpu_model", "nodes", "start_unix_s", "end_unix_s", "queue", "users", "created_by", "created_unix_s", "revision")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    START_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    END_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    USERS_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    name: str
    gpus: int
    gpu_model: str
    nodes: _containers.RepeatedScalarFieldContainer[str]
    start_unix_s: float
    end_unix_s: float
    queue: str
    users: _containers.RepeatedScalarFieldContainer[str]
    created_by: str
    created_unix_s: float
    revision: int
    def __init__(self, name: _Optional[str] = ..., gpus: _Optional[int] = ..., gpu_model: _Optional[str] = ..., nodes: _Optional[_Iterable[str]] = ..., start_unix_s: _Optional[float] = ..., end_unix_s: _Optional[float] = ..., queue: _Optional[str] = ..., users: _Optional[_Iterable[str]] = ..., created_by: _Optional[str] = ..., created_unix_s: _Optional[float] = ..., revision: _Optional[int] = ...) -> None: ...
