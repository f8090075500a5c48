"""GPT Task Profiler: a task spec → a per-node demand vector and QoS requirements.

Memory model (bytes; ``P`` parameters, ``b`` bytes per parameter of the precision — fp32 4,
bf16/fp16 2, fp8/int8 1, int4 0.5; ``L`` layers, ``H`` hidden size, ``S`` context length,
``B`` batch size; ``L`` and ``H`` default from ``P ≈ 12·L·H²`` with ``H = 128·L``, the shape of
common decoder-only models, e.g. 7B → 33 layers × 4224):

* weights ``W = P · b``
* **inference**: ``W + KV``, KV cache ``= 2 · L · H · S · B · b`` (keys and values for every
  layer and token; S defaults to 4096, B to 1)
* **training** (Adam, mixed precision): ``16 · P`` for bf16 weights (2) + gradients (2) + fp32
  master weights (4) + two Adam moments (8) — pure fp32 Adam is 4 + 4 + 8 = 16 too — plus
  activations ``34 · L · H · S · B`` (bytes per layer of a transformer in half precision: the
  inputs each layer keeps for its backward pass, with no recomputation of the attention
  scores; S defaults to 4096, B to 1)
* **fine-tuning**, LoRA-like: frozen weights ``W`` + 1 % of the parameters trained with Adam
  (``0.01 · 16 · P``) + the same activations (back-propagation still runs through every layer)

then × 1.10 for allocator fragmentation, × the learned correction for the model name (below).
GPUs: each GPU of the target model (default 80 GiB) holds its memory minus 1 GiB (CUDA context
and runtime). A task that fits in half a GPU and may share one gets a share rounded up to 1/16 of
a GPU (dyadic, so reservations add without rounding); otherwise the GPU count is
``ceil(total / usable)``, rounded up to a power of two on one node (tensor-parallel degrees) or
spread evenly over the gang's nodes. Host side per node: 2 cores + 4 per GPU (2 for a share);
memory ``16 GiB + W / nodes`` (checkpoint staging) + 8 GiB per GPU; disk ``10 GiB + W`` for
inference, ``50 GiB + 2 · 16 · P / nodes`` for training (two checkpoints with optimizer state),
``50 GiB + W`` for fine-tuning. Every non-zero field of an explicit demand overrides the profile.
A task that declares no kind (``unspecified``) is sized as inference (:func:`profiled_kind`); one
without a model gets 1 CPU core and nothing else unless its explicit demand says more.

Learning: :meth:`Profiler.observe` takes a finished task's measured peak GPU memory (per GPU)
and mean GPU utilization; an exponentially weighted ratio (α = 0.3, clamped to 0.25..4) of
measured to predicted memory then scales later tasks of the same model name, and the learned
utilization sets a floor on the share of shared inference tasks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from common.pb.gptrm.v1 import types_pb2
from common.types import TaskKind
from coordinator.domain import Request, Resources, TaskSpecData
from coordinator.profiler.taskspec import gpus_used, spec_data, spec_from_mapping, spec_to_proto
from coordinator.profiler.validation import validate_profiled_demand, validate_spec

__all__ = [
    "BYTES_PER_PARAM",
    "DEFAULT_GPU_MEM_BYTES",
    "Profiler",
    "QosRequirements",
    "TaskProfile",
    "estimate_gpu_memory_bytes",
    "model_shape",
    "profiled_kind",
    "run_key",
    "spec_data",
    "spec_from_mapping",
    "spec_to_proto",
    "validate_profiled_demand",
    "validate_spec",
]

GIB = 1024**3
DEFAULT_GPU_MEM_BYTES = 80 * GIB
"""Memory of one GPU of the target model when the spec does not constrain it."""
BYTES_PER_PARAM = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
"""Bytes per parameter of each precision."""
ADAM_BYTES_PER_PARAM = 16.0
ACTIVATION_BYTES = 34.0
LORA_TRAINABLE = 0.01
OVERHEAD = 1.10
GPU_CONTEXT_BYTES = 1 * GIB
SHARE_STEP = 1 / 16
DEFAULT_CONTEXT = 4096
ALPHA = 0.3
CORRECTION_RANGE = (0.25, 4.0)


@dataclass(frozen=True, slots=True)
class QosRequirements:
    """What the QoS manager holds a task to; None means "no target".

    :param priority: higher runs first.
    :param deadline_s: finish-by time (unix seconds).
    :param max_latency_ms: per-request latency target.
    :param min_tokens_per_s: throughput target.
    """

    priority: int = 0
    deadline_s: float | None = None
    max_latency_ms: float | None = None
    min_tokens_per_s: float | None = None


@dataclass(frozen=True, slots=True)
class TaskProfile:
    """The profiler's answer for one spec.

    :param demand: resources on each node (``gpu_mem_total_bytes`` is the node total).
    :param gpu_mem_per_gpu_bytes: memory each of its GPUs must have free.
    :param nodes: gang size.
    :param estimated_gpu_mem_bytes: the whole task's GPU memory estimate, after correction.
    :param qos: QoS requirements.
    :param allow_sharing: whether ``demand.gpus`` is a shared fraction.
    """

    demand: Resources
    gpu_mem_per_gpu_bytes: int
    nodes: int
    estimated_gpu_mem_bytes: int
    qos: QosRequirements = field(default_factory=QosRequirements)
    allow_sharing: bool = False

    def to_proto(self) -> types_pb2.ResourceVector:
        """The wire vector (``gpu_mem_bytes`` per GPU), as stored in ``Task.demand``.

        :returns: a new ``ResourceVector``.
        """
        d = self.demand
        return types_pb2.ResourceVector(
            gpus=d.gpus, gpu_mem_bytes=self.gpu_mem_per_gpu_bytes, cpu_cores=d.cpu_cores, mem_bytes=d.mem_bytes,
            disk_bytes=d.disk_bytes,
        )  # fmt: skip


def model_shape(params_billions: float, layers: int = 0, hidden_size: int = 0) -> tuple[int, int]:
    """Layers and hidden size, estimated from the parameter count where not given.

    :param params_billions: parameters, in billions.
    :param layers: known layer count, or 0.
    :param hidden_size: known hidden size, or 0.
    :returns: ``(layers, hidden_size)``, both ≥ 1.
    """
    params = params_billions * 1e9
    if layers <= 0 and hidden_size > 0:
        layers = max(1, round(params / (12 * hidden_size**2)))
    if layers <= 0:
        layers = max(1, round((params / (12 * 128**2)) ** (1 / 3)))
    if hidden_size <= 0:
        hidden_size = max(128, round(math.sqrt(params / (12 * layers)) / 128) * 128)
    return layers, hidden_size


def profiled_kind(kind: TaskKind) -> TaskKind:
    """The kind a task is sized as: its own, or inference when it declared none.

    Inference is the smallest footprint (weights + KV cache, no optimizer state), so an
    undeclared task is not over-reserved; tasks that train should say so.
    """
    return TaskKind.INFERENCE if kind == TaskKind.UNSPECIFIED else kind


def estimate_gpu_memory_bytes(spec: TaskSpecData) -> float:
    """GPU memory the whole task needs before overhead and correction (see the module docstring).

    :param spec: the plain spec.
    :returns: bytes.
    """
    m = spec.model
    params = m.params_billions * 1e9
    bpp = BYTES_PER_PARAM.get(m.precision.lower(), 2.0)
    layers, hidden = model_shape(m.params_billions, m.layers, m.hidden_size)
    context, batch = m.context_length or DEFAULT_CONTEXT, m.batch_size or 1
    weights = params * bpp
    if profiled_kind(spec.kind) == TaskKind.INFERENCE:
        return weights + 2 * layers * hidden * context * batch * bpp
    activations = ACTIVATION_BYTES * layers * hidden * context * batch
    if spec.kind == TaskKind.TRAINING:
        return ADAM_BYTES_PER_PARAM * params + activations
    return weights + LORA_TRAINABLE * ADAM_BYTES_PER_PARAM * params + activations


def run_key(spec: types_pb2.TaskSpec) -> str:
    """What the profiler learns run times by: the model's name, else the task's name."""
    return spec.model.name or spec.name


def _gpu_count(total: float, spec: TaskSpecData, usable: float) -> int:
    """Whole GPUs per node for a task needing ``total`` bytes of GPU memory."""
    if spec.gpus_per_node > 0:
        return spec.gpus_per_node
    overall = max(1, math.ceil(total / usable))
    if spec.nodes > 1:
        return math.ceil(overall / spec.nodes)
    return 1 << (overall - 1).bit_length()


def _host(spec: TaskSpecData, gpus: float, weights: float) -> tuple[float, int, int]:
    """CPU cores, host memory and disk per node."""
    whole = gpus_used(gpus) if gpus >= 1 else 0
    cores = 2.0 + (4.0 * whole if whole else 2.0)
    mem = 16 * GIB + weights / spec.nodes + 8 * GIB * whole
    if spec.kind == TaskKind.TRAINING:
        disk = 50 * GIB + 2 * ADAM_BYTES_PER_PARAM * spec.model.params_billions * 1e9 / spec.nodes
    else:
        disk = (10 if profiled_kind(spec.kind) == TaskKind.INFERENCE else 50) * GIB + weights
    return cores, math.ceil(mem), math.ceil(disk)


def _override(profile: TaskProfile, explicit: Resources) -> TaskProfile:
    """Replace each profiled dimension the explicit demand sets (non-zero) with its value."""
    d = profile.demand
    gpus = explicit.gpus or d.gpus
    count = max(1, gpus_used(gpus)) if gpus > 0 else 0
    if explicit.gpu_mem_total_bytes:
        per_gpu = explicit.gpu_mem_total_bytes // max(1, count)
    else:
        per_gpu = profile.gpu_mem_per_gpu_bytes if count else 0
    demand = Resources(
        gpus=gpus,
        gpu_mem_total_bytes=per_gpu * count,
        cpu_cores=explicit.cpu_cores or d.cpu_cores,
        mem_bytes=explicit.mem_bytes or d.mem_bytes,
        disk_bytes=explicit.disk_bytes or d.disk_bytes,
    )
    return replace(profile, demand=demand, gpu_mem_per_gpu_bytes=per_gpu, allow_sharing=0 < gpus < 1)


class Profiler:
    """Profiles specs and learns per-model corrections from finished tasks.

    :param gpu_model_mem_bytes: memory of one GPU of the target model.
    """

    def __init__(self, gpu_model_mem_bytes: int = DEFAULT_GPU_MEM_BYTES) -> None:
        self.gpu_model_mem_bytes = gpu_model_mem_bytes
        self._mem_ratio: dict[str, float] = {}
        self._util: dict[str, float] = {}
        self._predicted: dict[str, float] = {}  # model name → last uncorrected per-GPU prediction
        self._run_s: dict[str, float] = {}      # model name (or task name) → smoothed run time of tasks that succeeded

    def expected_run_s(self, spec: types_pb2.TaskSpec) -> float | None:
        """How long a task of this model (or, without one, this name) ran when it succeeded; None: never seen."""
        return self._run_s.get(run_key(spec))

    def expected_run_s_of(self, key: str) -> float | None:
        """:meth:`expected_run_s` of the specs whose :func:`run_key` is ``key``."""
        return self._run_s.get(key)

    def observe_run(self, spec: types_pb2.TaskSpec, seconds: float) -> None:
        """Learn from a task that succeeded after running ``seconds`` (smoothed like the memory correction)."""
        key = run_key(spec)
        if not key or not seconds > 0:
            return
        old = self._run_s.get(key)
        self._run_s[key] = seconds if old is None else 0.5 * old + 0.5 * seconds

    def correction(self, model_name: str) -> float:
        """The learned memory correction for a model name (1.0 when nothing was observed).

        :param model_name: the model name.
        :returns: measured / predicted, smoothed.
        """
        return self._mem_ratio.get(model_name, 1.0)

    def profile(self, spec: types_pb2.TaskSpec | TaskSpecData) -> TaskProfile:
        """Demand and QoS requirements of a spec (see the module docstring for the formulas).

        :param spec: the spec (validate it first with :func:`validate_spec`).
        :returns: the profile.
        :raises ValidationError: on an unknown task kind.
        """
        data = spec_data(spec)
        profile = self._estimate(data) if data.model.params_billions > 0 else self._empty(data)
        if data.demand is not None:
            profile = _override(profile, data.demand)
        q = data.qos
        qos = QosRequirements(
            priority=data.priority,
            deadline_s=q.deadline_unix_s or None,
            max_latency_ms=q.max_latency_ms or None,
            min_tokens_per_s=q.min_tokens_per_s or None,
        )
        return replace(profile, qos=qos)

    def _empty(self, data: TaskSpecData) -> TaskProfile:
        """A profile for a spec without a model (its explicit demand fills it in)."""
        return TaskProfile(demand=Resources(cpu_cores=1.0), gpu_mem_per_gpu_bytes=0, nodes=data.nodes,
                           estimated_gpu_mem_bytes=0, allow_sharing=data.allow_gpu_sharing)  # fmt: skip

    def _predicted_per_gpu(self, data: TaskSpecData) -> float:
        """Per-GPU memory predicted for a spec without any learned correction."""
        if data.model.params_billions <= 0:
            return 0.0
        return float(self._estimate(data, corrected=False).gpu_mem_per_gpu_bytes)

    def _estimate(self, data: TaskSpecData, *, corrected: bool = True) -> TaskProfile:
        """The model-based profile."""
        total = estimate_gpu_memory_bytes(data) * OVERHEAD
        if corrected:
            self._predicted[data.model.name] = self._predicted_per_gpu(data)
            total *= self.correction(data.model.name)
        usable = self.gpu_model_mem_bytes - GPU_CONTEXT_BYTES
        sharing = data.allow_gpu_sharing and profiled_kind(data.kind) == TaskKind.INFERENCE and data.nodes == 1
        if sharing and total <= usable / 2 and data.gpus_per_node == 0:
            fraction = max((total + GPU_CONTEXT_BYTES) / self.gpu_model_mem_bytes, self._util.get(data.model.name, 0.0))
            gpus = min(1.0, math.ceil(fraction / SHARE_STEP) * SHARE_STEP)
            per_gpu = math.ceil(total) + GPU_CONTEXT_BYTES
            node_mem = per_gpu
        else:
            count = _gpu_count(total, data, usable)
            gpus = float(count)
            per_gpu = min(self.gpu_model_mem_bytes, math.ceil(total / (count * data.nodes)) + GPU_CONTEXT_BYTES)
            node_mem = per_gpu * count
        weights = data.model.params_billions * 1e9 * BYTES_PER_PARAM.get(data.model.precision.lower(), 2.0)
        cores, mem, disk = _host(data, gpus, weights)
        return TaskProfile(
            demand=Resources(gpus, node_mem, cores, mem, disk),
            gpu_mem_per_gpu_bytes=per_gpu,
            nodes=data.nodes,
            estimated_gpu_mem_bytes=math.ceil(total),
            allow_sharing=gpus < 1,
        )

    def request(self, task_id: str, spec: types_pb2.TaskSpec | TaskSpecData, *, submit_s: float = 0.0) -> Request:
        """Profile a spec into the request the placement engine takes.

        :param task_id: the task's id.
        :param spec: the spec.
        :param submit_s: when it was submitted.
        :returns: the request.
        """
        data = spec_data(spec)
        p = self.profile(data)
        return Request(
            task_id=task_id, demand=p.demand, nodes=p.nodes, gpu_mem_per_gpu_bytes=p.gpu_mem_per_gpu_bytes,
            priority=data.priority, submit_s=submit_s, deadline_s=p.qos.deadline_s, gpu_model=data.gpu_model,
            node_selector=dict(data.node_selector), allow_sharing=p.allow_sharing,
        )  # fmt: skip

    def observe(
        self,
        model: str | types_pb2.TaskSpec | TaskSpecData,
        measured_peak_gpu_mem_bytes: int,
        measured_util: float,
    ) -> None:
        """Learn from a finished task: its peak GPU memory (per GPU) and mean GPU utilization.

        Given a spec, the prediction to compare with is recomputed from it; given only a model
        name, the prediction for the last spec of that name profiled is used (nothing is learned
        about memory for a name never profiled).

        :param model: the task's spec, or its model name.
        :param measured_peak_gpu_mem_bytes: the highest memory used on any of its GPUs.
        :param measured_util: its mean GPU utilization, 0..1.
        """
        if isinstance(model, str):
            name, predicted = model, self._predicted.get(model, 0.0)
        else:
            data = spec_data(model)
            name = data.model.name
            predicted = self._predicted_per_gpu(data)
        if not name:
            return
        if predicted > 0 and measured_peak_gpu_mem_bytes > 0:
            ratio = min(max(measured_peak_gpu_mem_bytes / predicted, CORRECTION_RANGE[0]), CORRECTION_RANGE[1])
            old = self._mem_ratio.get(name, 1.0)
            self._mem_ratio[name] = (1 - ALPHA) * old + ALPHA * ratio
        if math.isfinite(measured_util) and 0.0 <= measured_util <= 1.0:
            old_util = self._util.get(name, measured_util)
            self._util[name] = (1 - ALPHA) * old_util + ALPHA * measured_util
