"""The agent's durable record of the tasks it runs and the decisions it has carried out.

Written atomically (temp file, fsync, rename) after every change, so an agent killed at
any instant restarts with either the old or the new table, never a torn one.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypedDict

__all__ = ["DecisionOutcome", "TaskRecord", "TaskTable"]


class DecisionOutcome(TypedDict):
    """What a decision id's ack said, kept to answer its re-delivery the same way."""

    ok: bool
    reason: str
    state: int
    task_id: str

_MAX_DECISIONS = 10_000


@dataclass
class TaskRecord:
    """One task this agent started."""

    task_id: str
    decision_id: str
    pid: int
    create_time: float              # psutil create_time, to tell a recycled pid from ours
    gpu_indices: list[int]
    gpu_uuids: list[str]
    log_path: str
    exit_file: str
    stop_grace_s: float
    state: int                      # TaskState value last reported
    started_unix_s: float
    gpu_share: float = 1.0
    gpu_mem_bytes: int = 0
    stopping: bool = False
    metrics_url: str = ""           # the task's own Prometheus endpoint, "" when it declared none
    metrics_flavour: str = ""       # vllm | tgi | custom ("" → vllm)
    metrics_names: dict[str, str] = field(default_factory=dict)   # role → metric name overrides
    own_uid: int = -1               # the uid handed to this task alone (-1: a shared or the agent's user)
    cgroup: str = ""                # the task's own cgroup v2 directory ("" when it has none)
    piped: bool = False             # output goes through tasks/<id>/output.fifo to the log pump
    sim_load: float = -1.0          # simulated GPUs: the load its GPTRM_SIM_LOAD declared (-1: follows its CPU)
    image: str = ""                 # the image it runs in ("" on the host): its store entry is held until its end


@dataclass
class TaskTable:
    """Running tasks plus the outcome of every decision id seen (bounded)."""

    path: Path
    tasks: dict[str, TaskRecord] = field(default_factory=dict)
    decisions: dict[str, DecisionOutcome] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> TaskTable:
        """Read the table; a missing file is an empty table."""
        table = cls(path)
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            return table
        table.tasks = {k: TaskRecord(**v) for k, v in doc.get("tasks", {}).items()}
        table.decisions = dict(doc.get("decisions", {}))
        return table

    def save(self) -> None:
        """Atomically replace the file with the current table."""
        if len(self.decisions) > _MAX_DECISIONS:
            for key in list(self.decisions)[: len(self.decisions) - _MAX_DECISIONS]:
                del self.decisions[key]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"tasks": {k: asdict(v) for k, v in self.tasks.items()}, "decisions": self.decisions}
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tasks.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(doc, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
