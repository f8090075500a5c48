from common.pb.gptrm.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AgentMessage(_message.Message):
    __slots__ = ("register", "telemetry", "task_status", "decision_ack", "heartbeat", "log_chunk", "images", "session_chunk", "reports")
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    TASK_STATUS_FIELD_NUMBER: _ClassVar[int]
    DECISION_ACK_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    LOG_CHUNK_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    SESSION_CHUNK_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    register: Register
    telemetry: TelemetryBatch
    task_status: TaskStatus
    decision_ack: DecisionAck
    heartbeat: Heartbeat
    log_chunk: LogChunk
    images: ImagesHeld
    session_chunk: SessionChunk
    reports: Reports
    def __init__(self, register: _Optional[_Union[Register, _Mapping]] = ..., telemetry: _Optional[_Union[TelemetryBatch, _Mapping]] = ..., task_status: _Optional[_Union[TaskStatus, _Mapping]] = ..., decision_ack: _Optional[_Union[DecisionAck, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., log_chunk: _Optional[_Union[LogChunk, _Mapping]] = ..., images: _Optional[_Union[ImagesHeld, _Mapping]] = ..., session_chunk: _Optional[_Union[SessionChunk, _Mapping]] = ..., reports: _Optional[_Union[Reports, _Mapping]] = ...) -> None: ...

class Reports(_message.Message):
    __slots__ = ("decision_acks", "statuses")
    DECISION_ACKS_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    decision_acks: _containers.RepeatedCompositeFieldContainer[DecisionAck]
    statuses: _containers.RepeatedCompositeFieldContainer[TaskStatus]
    def __init__(self, decision_acks: _Optional[_Iterable[_Union[DecisionAck, _Mapping]]] = ..., statuses: _Optional[_Iterable[_Union[TaskStatus, _Mapping]]] = ...) -> None: ...

class ImagesHeld(_message.Message):
    __slots__ = ("refs",)
    REFS_FIELD_NUMBER: _ClassVar[int]
    refs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, refs: _Optional[_Iterable[str]] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("inventory", "tasks", "boot_id", "lost_leader_epoch", "reads_decisions")
    INVENTORY_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    LOST_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    READS_DECISIONS_FIELD_NUMBER: _ClassVar[int]
    inventory: _types_pb2.NodeInventory
    tasks: _containers.RepeatedCompositeFieldContainer[TaskStatus]
    boot_id: int
    lost_leader_epoch: int
    reads_decisions: bool
    def __init__(self, inventory: _Optional[_Union[_types_pb2.NodeInventory, _Mapping]] = ..., tasks: _Optional[_Iterable[_Union[TaskStatus, _Mapping]]] = ..., boot_id: _Optional[int] = ..., lost_leader_epoch: _Optional[int] = ..., reads_decisions: _Optional[bool] = ...) -> None: ...

class TelemetryBatch(_message.Message):
    __slots__ = ("samples", "dropped_samples_total")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DROPPED_SAMPLES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[_types_pb2.TelemetrySample]
    dropped_samples_total: int
    def __init__(self, samples: _Optional[_Iterable[_Union[_types_pb2.TelemetrySample, _Mapping]]] = ..., dropped_samples_total: _Optional[int] = ...) -> None: ...

class TaskStatus(_message.Message):
    __slots__ = ("task_id", "state", "pids", "exit_code", "has_exit_code", "reason", "log_tail", "time_unix_s", "event_seq", "decision_id")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    HAS_EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LOG_TAIL_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    EVENT_SEQ_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    state: _types_pb2.TaskState
    pids: _containers.RepeatedScalarFieldContainer[int]
    exit_code: int
    has_exit_code: bool
    reason: str
    log_tail: str
    time_unix_s: float
    event_seq: int
    decision_id: str
    def __init__(self, task_id: _Optional[str] = ..., state: _Optional[_Union[_types_pb2.TaskState, str]] = ..., pids: _Optional[_Iterable[int]] = ..., exit_code: _Optional[int] = ..., has_exit_code: _Optional[bool] = ..., reason: _Optional[str] = ..., log_tail: _Optional[str] = ..., time_unix_s: _Optional[float] = ..., event_seq: _Optional[int] = ..., decision_id: _Optional[str] = ...) -> None: ...

class DecisionAck(_message.Message):
    __slots__ = ("decision_id", "ok", "reason", "resulting_state", "task_id", "task_unknown", "no_room")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RESULTING_STATE_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    NO_ROOM_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    ok: bool
    reason: str
    resulting_state: _types_pb2.TaskState
    task_id: str
    task_unknown: bool
    no_room: bool
    def __init__(self, decision_id: _Optional[str] = ..., ok: _Optional[bool] = ..., reason: _Optional[str] = ..., resulting_state: _Optional[_Union[_types_pb2.TaskState, str]] = ..., task_id: _Optional[str] = ..., task_unknown: _Optional[bool] = ..., no_room: _Optional[bool] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("time_unix_s",)
    TIME_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    time_unix_s: float
    def __init__(self, time_unix_s: _Optional[float] = ...) -> None: ...

class CoordinatorMessage(_message.Message):
    __slots__ = ("welcome", "decision", "redirect", "event_ack", "log_request", "telemetry_rate", "session_request", "decisions")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    EVENT_ACK_FIELD_NUMBER: _ClassVar[int]
    LOG_REQUEST_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_RATE_FIELD_NUMBER: _ClassVar[int]
    SESSION_REQUEST_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    decision: Decision
    redirect: Redirect
    event_ack: EventAck
    log_request: LogRequest
    telemetry_rate: TelemetryRate
    session_request: SessionRequest
    decisions: Decisions
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., decision: _Optional[_Union[Decision, _Mapping]] = ..., redirect: _Optional[_Union[Redirect, _Mapping]] = ..., event_ack: _Optional[_Union[EventAck, _Mapping]] = ..., log_request: _Optional[_Union[LogRequest, _Mapping]] = ..., telemetry_rate: _Optional[_Union[TelemetryRate, _Mapping]] = ..., session_request: _Optional[_Union[SessionRequest, _Mapping]] = ..., decisions: _Optional[_Union[Decisions, _Mapping]] = ...) -> None: ...

class Decisions(_message.Message):
    __slots__ = ("decisions",)
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[Decision]
    def __init__(self, decisions: _Optional[_Iterable[_Union[Decision, _Mapping]]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("node_id", "sampling_interval_s", "leader_epoch", "coordinator_id", "heartbeat_interval_s", "report_interval_s", "accepts_reports")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    REPORT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_REPORTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    sampling_interval_s: float
    leader_epoch: int
    coordinator_id: str
    heartbeat_interval_s: float
    report_interval_s: float
    accepts_reports: bool
    def __init__(self, node_id: _Optional[str] = ..., sampling_interval_s: _Optional[float] = ..., leader_epoch: _Optional[int] = ..., coordinator_id: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ..., report_interval_s: _Optional[float] = ..., accepts_reports: _Optional[bool] = ...) -> None: ...

class TelemetryRate(_message.Message):
    __slots__ = ("report_interval_s",)
    REPORT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    report_interval_s: float
    def __init__(self, report_interval_s: _Optional[float] = ...) -> None: ...

class Redirect(_message.Message):
    __slots__ = ("leader_address", "leader_id")
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    leader_address: str
    leader_id: str
    def __init__(self, leader_address: _Optional[str] = ..., leader_id: _Optional[str] = ...) -> None: ...

class EventAck(_message.Message):
    __slots__ = ("up_to_seq",)
    UP_TO_SEQ_FIELD_NUMBER: _ClassVar[int]
    up_to_seq: int
    def __init__(self, up_to_seq: _Optional[int] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("decision_id", "leader_epoch", "start", "stop", "pause", "resume", "scale", "set_power_limit", "pull_image")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    PAUSE_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    SET_POWER_LIMIT_FIELD_NUMBER: _ClassVar[int]
    PULL_IMAGE_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    leader_epoch: int
    start: StartTask
    stop: StopTask
    pause: PauseTask
    resume: ResumeTask
    scale: ScaleTask
    set_power_limit: SetPowerLimit
    pull_image: PullImage
    def __init__(self, decision_id: _Optional[str] = ..., leader_epoch: _Optional[int] = ..., start: _Optional[_Union[StartTask, _Mapping]] = ..., stop: _Optional[_Union[StopTask, _Mapping]] = ..., pause: _Optional[_Union[PauseTask, _Mapping]] = ..., resume: _Optional[_Union[ResumeTask, _Mapping]] = ..., scale: _Optional[_Union[ScaleTask, _Mapping]] = ..., set_power_limit: _Optional[_Union[SetPowerLimit, _Mapping]] = ..., pull_image: _Optional[_Union[PullImage, _Mapping]] = ...) -> None: ...

class PullImage(_message.Message):
    __slots__ = ("image",)
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    image: str
    def __init__(self, image: _Optional[str] = ...) -> None: ...

class StartTask(_message.Message):
    __slots__ = ("task_id", "gpu_indices", "gpu_uuids", "argv", "env", "stop_grace_s", "gpu_share", "demand", "metrics_url", "metrics_mapping", "run_as_user", "nnodes", "node_rank", "local_world_size", "world_size", "master_addr", "master_port", "node_addresses", "node_ids", "image", "mounts", "workdir", "shm_bytes", "pty")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    GPU_UUIDS_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    STOP_GRACE_S_FIELD_NUMBER: _ClassVar[int]
    GPU_SHARE_FIELD_NUMBER: _ClassVar[int]
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    METRICS_URL_FIELD_NUMBER: _ClassVar[int]
    METRICS_MAPPING_FIELD_NUMBER: _ClassVar[int]
    RUN_AS_USER_FIELD_NUMBER: _ClassVar[int]
    NNODES_FIELD_NUMBER: _ClassVar[int]
    NODE_RANK_FIELD_NUMBER: _ClassVar[int]
    LOCAL_WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDR_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    NODE_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    MOUNTS_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    SHM_BYTES_FIELD_NUMBER: _ClassVar[int]
    PTY_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    gpu_uuids: _containers.RepeatedScalarFieldContainer[str]
    argv: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    stop_grace_s: float
    gpu_share: float
    demand: _types_pb2.ResourceVector
    metrics_url: str
    metrics_mapping: _types_pb2.MetricsMapping
    run_as_user: str
    nnodes: int
    node_rank: int
    local_world_size: int
    world_size: int
    master_addr: str
    master_port: int
    node_addresses: _containers.RepeatedScalarFieldContainer[str]
    node_ids: _containers.RepeatedScalarFieldContainer[str]
    image: str
    mounts: _containers.RepeatedScalarFieldContainer[str]
    workdir: str
    shm_bytes: int
    pty: bool
    def __init__(self, task_id: _Optional[str] = ..., gpu_indices: _Optional[_Iterable[int]] = ..., gpu_uuids: _Optional[_Iterable[str]] = ..., argv: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., stop_grace_s: _Optional[float] = ..., gpu_share: _Optional[float] = ..., demand: _Optional[_Union[_types_pb2.ResourceVector, _Mapping]] = ..., metrics_url: _Optional[str] = ..., metrics_mapping: _Optional[_Union[_types_pb2.MetricsMapping, _Mapping]] = ..., run_as_user: _Optional[str] = ..., nnodes: _Optional[int] = ..., node_rank: _Optional[int] = ..., local_world_size: _Optional[int] = ..., world_size: _Optional[int] = ..., master_addr: _Optional[str] = ..., master_port: _Optional[int] = ..., node_addresses: _Optional[_Iterable[str]] = ..., node_ids: _Optional[_Iterable[str]] = ..., image: _Optional[str] = ..., mounts: _Optional[_Iterable[str]] = ..., workdir: _Optional[str] = ..., shm_bytes: _Optional[int] = ..., pty: _Optional[bool] = ...) -> None: ...

class StopTask(_message.Message):
    __slots__ = ("task_id", "grace_s", "reason", "checkpoint_signal")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GRACE_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SIGNAL_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    grace_s: float
    reason: str
    checkpoint_signal: str
    def __init__(self, task_id: _Optional[str] = ..., grace_s: _Optional[float] = ..., reason: _Optional[str] = ..., checkpoint_signal: _Optional[str] = ...) -> None: ...

class PauseTask(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class ResumeTask(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class ScaleTask(_message.Message):
    __slots__ = ("task_id", "replicas")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    replicas: int
    def __init__(self, task_id: _Optional[str] = ..., replicas: _Optional[int] = ...) -> None: ...

class SetPowerLimit(_message.Message):
    __slots__ = ("gpu_index", "power_limit_w")
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    gpu_index: int
    power_limit_w: float
    def __init__(self, gpu_index: _Optional[int] = ..., power_limit_w: _Optional[float] = ...) -> None: ...

class LogRequest(_message.Message):
    __slots__ = ("request_id", "task_id", "tail_lines", "follow", "cancel")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TAIL_LINES_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    task_id: str
    tail_lines: int
    follow: bool
    cancel: bool
    def __init__(self, request_id: _Optional[str] = ..., task_id: _Optional[str] = ..., tail_lines: _Optional[int] = ..., follow: _Optional[bool] = ..., cancel: _Optional[bool] = ...) -> None: ...

class LogChunk(_message.Message):
    __slots__ = ("request_id", "task_id", "data", "eof", "error", "not_found")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    NOT_FOUND_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    task_id: str
    data: bytes
    eof: bool
    error: str
    not_found: bool
    def __init__(self, request_id: _Optional[str] = ..., task_id: _Optional[str] = ..., data: _Optional[bytes] = ..., eof: _Optional[bool] = ..., error: _Optional[str] = ..., not_found: _Optional[bool] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("session_id", "task_id", "open", "argv", "pty", "rows", "cols", "hangup_on_close", "data", "eof", "resize", "close", "output_acked", "principal")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    PTY_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    HANGUP_ON_CLOSE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    RESIZE_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_ACKED_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    task_id: str
    open: bool
    argv: _containers.RepeatedScalarFieldContainer[str]
    pty: bool
    rows: int
    cols: int
    hangup_on_close: bool
    data: bytes
    eof: bool
    resize: bool
    close: bool
    output_acked: int
    principal: str
    def __init__(self, session_id: _Optional[str] = ..., task_id: _Optional[str] = ..., open: _Optional[bool] = ..., argv: _Optional[_Iterable[str]] = ..., pty: _Optional[bool] = ..., rows: _Optional[int] = ..., cols: _Optional[int] = ..., hangup_on_close: _Optional[bool] = ..., data: _Optional[bytes] = ..., eof: _Optional[bool] = ..., resize: _Optional[bool] = ..., close: _Optional[bool] = ..., output_acked: _Optional[int] = ..., principal: _Optional[str] = ...) -> None: ...

class SessionChunk(_message.Message):
    __slots__ = ("session_id", "data", "stderr", "exited", "exit_code", "has_exit_code", "error", "input_acked")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    HAS_EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    INPUT_ACKED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    data: bytes
    stderr: bool
    exited: bool
    exit_code: int
    has_exit_code: bool
    error: str
    input_acked: int
    def __init__(self, session_id: _Optional[str] = ..., data: _Optional[bytes] = ..., stderr: _Optional[bool] = ..., exited: _Optional[bool] = ..., exit_code: _Optional[int] = ..., has_exit_code: _Optional[bool] = ..., error: _Optional[str] = ..., input_acked: _Optional[int] = ...) -> None: ...
