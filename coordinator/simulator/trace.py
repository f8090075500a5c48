"""Job and node traces: CSV parsing and validation (schema in docs/simulator.md, "Traces").

A jobs file has one row per job (``job_id, submit_s, duration_s, gpus, gpu_share, cpu_cores,
mem_gib, group, status, orig_submit``); a nodes file one row per server (``node_id, gpus,
gpu_model, gpu_mem_gib, cpu_cores, mem_gib``). Empty cells mean "the source does not say".
Synthetic traces may add ``kind`` and ``params_b`` (an LLM task kind and model size in billions
of parameters), which the profiler turns into a demand.

Every problem stops the read with a :class:`TraceError` that names the file, the line (the
header is line 1) and the column, so a bad cell in an 11,000-row file is found at once.

Example::

    jobs = read_jobs(Path("philly_jobs.csv"))
    nodes = select_nodes(read_nodes(Path("philly_nodes.csv")), limit=100)
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from common.errors import GptrmError

__all__ = [
    "JOB_COLUMNS",
    "NODE_COLUMNS",
    "TRACES_ENV",
    "TraceError",
    "TraceJob",
    "TraceNode",
    "read_jobs",
    "read_nodes",
    "select_nodes",
    "traces_dir",
    "write_jobs",
    "write_nodes",
]

JOB_COLUMNS: tuple[str, ...] = (
    "job_id", "submit_s", "duration_s", "gpus", "gpu_share", "cpu_cores", "mem_gib", "group", "status", "orig_submit",
)
"""Columns every jobs file must have (in any order)."""
NODE_COLUMNS: tuple[str, ...] = ("node_id", "gpus", "gpu_model", "gpu_mem_gib", "cpu_cores", "mem_gib")
"""Columns every nodes file must have (in any order)."""
_OPTIONAL_JOB_COLUMNS = ("kind", "params_b")
_NEVER_RAN = "pending"  # openb pods that never ran: their duration is deletion − creation

T = TypeVar("T")


class TraceError(GptrmError):
    """A trace file is malformed.

    :param path: the file.
    :param line: 1-based line number (1 is the header; 0 when the file cannot be read at all).
    :param column: the offending column's name ("" when the whole row is wrong).
    :param problem: what is wrong, with the value.
    """

    def __init__(self, path: Path, line: int, column: str, problem: str) -> None:
        where = (f"{path}:{line}" if line > 0 else f"{path}") + (f": column {column!r}" if column else "")
        super().__init__(f"{where}: {problem}")
        self.path = path
        self.line = line
        self.column = column
        self.problem = problem


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace.

    :param job_id: stable id.
    :param submit_s: submission, seconds from the window start.
    :param duration_s: run time once placed.
    :param gpus: whole GPUs requested (0: CPU-only); above a node's width it is a gang.
    :param gpu_share: fraction of each GPU (< 1: GPU sharing), 0 for CPU-only.
    :param cpu_cores: host cores requested, None when the source does not say.
    :param mem_gib: host memory requested in GiB, None when the source does not say.
    :param group: virtual cluster / QoS class.
    :param status: the source's final pod phase ("" when none).
    :param kind: synthetic LLM task kind (``training``, ``fine-tuning``, ``inference``), "" for real traces.
    :param params_b: synthetic model size in billions of parameters, 0 for real traces.
    """

    job_id: str
    submit_s: float
    duration_s: float
    gpus: int
    gpu_share: float = 1.0
    cpu_cores: float | None = None
    mem_gib: float | None = None
    group: str = ""
    status: str = ""
    kind: str = ""
    params_b: float = 0.0


@dataclass(frozen=True, slots=True)
class TraceNode:
    """One server of a trace.

    :param node_id: stable id.
    :param gpus: GPUs on the server.
    :param gpu_model: GPU model name, "" when the source does not say.
    :param gpu_mem_gib: memory of each GPU in GiB, None when the source does not say.
    :param cpu_cores: host cores, None when the source does not say.
    :param mem_gib: host memory in GiB, None when the source does not say.
    """

    node_id: str
    gpus: int
    gpu_model: str = ""
    gpu_mem_gib: float | None = None
    cpu_cores: float | None = None
    mem_gib: float | None = None


class _Row:
    """One CSV row with typed, validated accessors that name the file, line and column on error."""

    def __init__(self, path: Path, line: int, cells: dict[str, str]) -> None:
        self.path = path
        self.line = line
        self.cells = cells

    def fail(self, column: str, problem: str) -> TraceError:
        """An error about ``column`` of this row."""
        return TraceError(self.path, self.line, column, problem)

    def text(self, column: str, *, required: bool = False) -> str:
        """The stripped cell (required: must not be empty)."""
        value = (self.cells.get(column) or "").strip()
        if required and not value:
            raise self.fail(column, "empty value")
        return value

    def number(self, column: str, *, minimum: float = 0.0, default: float | None = None) -> float:
        """A finite float ≥ ``minimum``; an empty cell gives ``default`` (an error when None)."""
        value = self.optional(column, minimum=minimum)
        if value is None:
            if default is None:
                raise self.fail(column, "empty value")
            return default
        return value

    def optional(self, column: str, *, minimum: float = 0.0) -> float | None:
        """A finite float ≥ ``minimum``, or None for an empty cell."""
        raw = self.text(column)
        if not raw:
            return None
        try:
            value = float(raw)
        except ValueError:
            raise self.fail(column, f"not a number: {raw!r}") from None
        if not math.isfinite(value):
            raise self.fail(column, f"not a finite number: {raw!r}")
        if value < minimum:
            raise self.fail(column, f"must be ≥ {minimum:g}, got {raw}")
        return value

    def count(self, column: str) -> int:
        """A non-negative whole number (``8`` or ``8.0``)."""
        value = self.number(column)
        if not value.is_integer():
            raise self.fail(column, f"not a whole number: {self.text(column)!r}")
        return int(value)


def _rows(path: Path, required: Sequence[str]) -> Iterator[_Row]:
    """The data rows of a CSV file, after checking that its header has every required column."""
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as e:
        raise TraceError(path, 0, "", f"cannot open: {e.strerror or e}") from e
    with handle:
        reader = csv.reader(handle)
        try:
            header = [name.strip() for name in next(reader)]
        except StopIteration:
            raise TraceError(path, 1, "", "empty file: no header") from None
        except csv.Error as e:
            raise TraceError(path, reader.line_num, "", f"bad CSV: {e}") from e
        missing = [name for name in required if name not in header]
        if missing:
            raise TraceError(path, 1, missing[0], f"missing column(s): {', '.join(missing)} (header: {header})")
        while True:
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                raise TraceError(path, reader.line_num, "", f"bad CSV: {e}") from e
            if not any(c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                raise TraceError(path, reader.line_num, "", f"{len(cells)} fields, the header has {len(header)}")
            yield _Row(path, reader.line_num, dict(zip(header, cells, strict=True)))


def _unique(path: Path, items: Iterable[tuple[_Row, T]], key: Callable[[T], str], column: str) -> list[T]:
    """Items in file order, refusing a repeated id."""
    seen: dict[str, int] = {}
    out: list[T] = []
    for row, item in items:
        ident = key(item)
        if ident in seen:
            raise TraceError(path, row.line, column, f"duplicate id {ident!r} (first on line {seen[ident]})")
        seen[ident] = row.line
        out.append(item)
    return out


def _job(row: _Row) -> TraceJob:
    """Parse and check one jobs row."""
    gpus = row.count("gpus")
    share = row.number("gpu_share", default=1.0 if gpus > 0 else 0.0)
    if gpus > 0 and not 0.0 < share <= 1.0:
        raise row.fail("gpu_share", f"must be in (0, 1] for a GPU job, got {row.text('gpu_share')}")
    if gpus > 1 and share < 1.0:
        raise row.fail("gpu_share", f"a share below 1 needs gpus = 1, got gpus = {gpus}")
    kind = row.text("kind").lower()
    if kind and kind not in ("training", "fine-tuning", "inference"):
        raise row.fail("kind", f"expected training, fine-tuning or inference, got {kind!r}")
    return TraceJob(
        job_id=row.text("job_id", required=True),
        submit_s=row.number("submit_s"),
        duration_s=row.number("duration_s"),
        gpus=gpus,
        gpu_share=share if gpus > 0 else 0.0,
        cpu_cores=row.optional("cpu_cores"),
        mem_gib=row.optional("mem_gib"),
        group=row.text("group"),
        status=row.text("status"),
        kind=kind,
        params_b=row.number("params_b", default=0.0),
    )


def read_jobs(path: Path, *, include_never_ran: bool = False) -> list[TraceJob]:
    """Read and validate a jobs file, sorted by submission time (ties keep file order).

    :param path: the CSV file.
    :param include_never_ran: keep rows whose ``status`` is ``Pending`` (openb pods that never ran).
    :returns: the jobs.
    :raises TraceError: naming file, line and column of the first problem (missing column, bad
        number, negative duration or submit time, duplicate id).
    """
    rows = ((row, _job(row)) for row in _rows(path, JOB_COLUMNS))
    jobs = _unique(path, rows, lambda j: j.job_id, "job_id")
    if not include_never_ran:
        jobs = [j for j in jobs if j.status.lower() != _NEVER_RAN]
    return sorted(jobs, key=lambda j: j.submit_s)


def _node(row: _Row) -> TraceNode:
    """Parse and check one nodes row."""
    gpus = row.count("gpus")
    mem = row.optional("gpu_mem_gib")
    if mem is not None and mem <= 0 and gpus > 0:
        raise row.fail("gpu_mem_gib", f"must be > 0 for a GPU node, got {row.text('gpu_mem_gib')}")
    return TraceNode(
        node_id=row.text("node_id", required=True),
        gpus=gpus,
        gpu_model=row.text("gpu_model"),
        gpu_mem_gib=mem,
        cpu_cores=row.optional("cpu_cores"),
        mem_gib=row.optional("mem_gib"),
    )


def read_nodes(path: Path) -> list[TraceNode]:
    """Read and validate a nodes file, in file order.

    :param path: the CSV file.
    :returns: the nodes.
    :raises TraceError: naming file, line and column of the first problem.
    """
    return _unique(path, ((row, _node(row)) for row in _rows(path, NODE_COLUMNS)), lambda n: n.node_id, "node_id")


def select_nodes(nodes: Sequence[TraceNode], limit: int | None) -> list[TraceNode]:
    """A deterministic subset of ``limit`` nodes: evenly spaced in file order.

    Evenly spaced rather than the first ``limit`` rows so the subset keeps the cluster's mix of
    server sizes and GPU models (trace files group similar servers together).

    :param nodes: all nodes, in file order.
    :param limit: how many to keep; None or ≥ len(nodes) keeps all.
    :returns: the subset, in file order.
    :raises ValueError: when ``limit`` < 1.
    """
    if limit is None or limit >= len(nodes):
        return list(nodes)
    if limit < 1:
        raise ValueError(f"nodes limit must be ≥ 1, got {limit}")
    return [nodes[(k * len(nodes)) // limit] for k in range(limit)]


TRACES_ENV = "GPTRM_TRACES"
"""The environment variable naming a directory of traces cut to this schema (``philly_jobs.csv``, ...): the
default of every ``--traces`` option. No trace ships with the repository (docs/simulator.md says where the
public ones come from)."""


def traces_dir(given: Path | None) -> Path:
    """The traces directory: ``given`` (a ``--traces`` option), else :data:`TRACES_ENV`.

    :raises GptrmError: neither names one.
    """
    if given is not None:
        return given
    env = os.environ.get(TRACES_ENV, "")
    if not env:
        raise GptrmError(f"--traces: no traces directory given, and {TRACES_ENV} is not set "
                         "(docs/simulator.md says where the public traces come from and how to cut them)")
    return Path(env)


def _fmt(value: float | None) -> str:
    """A cell: empty for None, no trailing ``.0`` for whole numbers."""
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def write_jobs(path: Path, jobs: Iterable[TraceJob]) -> None:
    """Write jobs in the trace schema (plus ``kind``/``params_b``).

    :param path: destination CSV (overwritten).
    :param jobs: the jobs.
    """
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow((*JOB_COLUMNS, *_OPTIONAL_JOB_COLUMNS))
        for j in jobs:
            writer.writerow((
                j.job_id, _fmt(j.submit_s), _fmt(j.duration_s), j.gpus, _fmt(j.gpu_share), _fmt(j.cpu_cores),
                _fmt(j.mem_gib), j.group, j.status, "", j.kind, _fmt(j.params_b) if j.params_b else "",
            ))


def write_nodes(path: Path, nodes: Iterable[TraceNode]) -> None:
    """Write nodes in the trace schema.

    :param path: destination CSV (overwritten).
    :param nodes: the nodes.
    """
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(NODE_COLUMNS)
        for n in nodes:
            writer.writerow((n.node_id, n.gpus, n.gpu_model, _fmt(n.gpu_mem_gib), _fmt(n.cpu_cores), _fmt(n.mem_gib)))
