"""The queue tree: :class:`Queue`, :class:`Budget` and :class:`QueueConfig`.

A queue belongs to at most one parent (an organisation above its teams); tasks are submitted to
leaf queues. Per GPU **pool** a queue has

- ``gpus`` (its *quota*): GPUs guaranteed to it; a missing entry means 0;
- ``limit``: the most GPUs it may hold, borrowed ones included; ``None`` (no entry) is unlimited;
- ``lend``: how much of its idle quota other queues may borrow; ``None`` (no entry) is all of it.

Pools. The keys of those three maps are GPU model names (``"NVIDIA H100 80GB HBM3"``) or ``"*"``
(``""`` is read as ``"*"``). Every model that some queue of the configuration names is a pool of
its own; ``"*"`` is one pool made of every other model (:meth:`QueueConfig.pool_of`). A quota
entry counts only in its own pool (``gpus = {"*" = 4}`` guarantees 4 GPUs among the models that no
queue names), whereas ``limit`` and ``lend`` fall back to their ``"*"`` entry for a named pool
the queue has no entry for, so a queue's ``limit = {"*" = 8}`` bounds it in every pool.

A parent's quota bounds its children: where a parent has a quota entry, the children's entries
for that key must not add up to more (the same for ``cpu`` and ``mem_gib``). A parent's ``limit``
bounds what its whole subtree holds, so a parent whose limit equals its quota keeps its children's
borrowing among themselves (:mod:`coordinator.queues.admission`). Only leaf queues take tasks and
lend; an inner queue with a ``lend`` entry is refused, since nothing would honour it.

``weight`` is a leaf queue's share of what nobody is guaranteed (:mod:`coordinator.queues.fairshare`;
an inner queue's weight is not used); ``cpu`` and ``mem_gib`` are optional hard caps on the cores
and memory the tasks of the queue (of its subtree, for an inner queue) ask for in all.

Access: ``members`` may submit to the queue (``"*"`` = anyone), and so may every identity the queue
is the default of (``default_for``, where ``"*"`` makes it everyone's default unless they have
their own). An identity is the default of at most one queue.

Containers: ``mount_allowed`` lists host directories (absolute, normalized; at most
:data:`MAX_MOUNT_ROOTS`) below which the tasks of the queue and of the queues below it may mount
host paths into their containers, beyond the coordinator's cluster-wide ``--mount-allowed``
(``docs/containers.md``).

A configuration without queues is the cluster as it was before queues: one implicit ``default``
queue that everyone may use, with no quota and no limit; admission lets everything through and
nothing is reclaimed (:data:`DEFAULT_QUEUE`).

:class:`QueueConfig` is immutable and always valid: it is validated whole when built, and
:meth:`~QueueConfig.set` and :meth:`~QueueConfig.remove` return a new, validated configuration.
Validation errors are :class:`~common.errors.ValidationError` naming the field by the queue's
index in the configuration, e.g. ``queue[1].limit["*"]: 2 is below its quota 4``.

Bounds. A tree comes from admins, a TOML file and etcd, none of which is trusted, and every leader
duty (the scheduling cycle, ``gptrmctl queues``, ``/metrics``) walks it; so a tree is refused past
:data:`MAX_QUEUES` queues or :data:`MAX_DEPTH` levels, a GPU model name past
:data:`MAX_MODEL_CHARS` characters (or :data:`MAX_MODELS` per table), more than
:data:`MAX_IDENTITIES` members (or ``default_for`` entries) or an identity past
:data:`MAX_IDENTITY_CHARS` characters, and numbers beyond :data:`MAX_GPUS` GPUs,
:data:`MAX_CORES` cores, :data:`MAX_MEM_GIB` GiB, :data:`MAX_WEIGHT` or :data:`MAX_AMOUNT`.
Every walk over the tree is iterative, and validating a tree is linear in its size.
``to_dict``/``from_dict`` turn a queue or a whole configuration into plain JSON/TOML data and back
(the layout of :mod:`coordinator.queues.toml`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

from common.errors import NotFound, ValidationError
from common.oci import host_root
from coordinator.run_limits import MAX_TIME_LIMIT_S

__all__ = [
    "ANY_MODEL",
    "DEFAULT_HALF_LIFE_H",
    "DEFAULT_QUEUE",
    "MAX_AMOUNT",
    "MAX_CORES",
    "MAX_DEPTH",
    "MAX_GPUS",
    "MAX_IDENTITIES",
    "MAX_IDENTITY_CHARS",
    "MAX_MEM_GIB",
    "MAX_MODELS",
    "MAX_MODEL_CHARS",
    "MAX_QUEUES",
    "MAX_WEIGHT",
    "NAME_PATTERN",
    "Budget",
    "BudgetAction",
    "BudgetKind",
    "BudgetPeriod",
    "Queue",
    "QueueConfig",
    "normalise_model",
]

ANY_MODEL = "*"
"""The key that stands for every GPU model no queue names explicitly (``""`` means the same)."""
DEFAULT_HALF_LIFE_H = 24.0
"""Half-life of the decayed past usage that fair share weighs, in hours."""
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
"""What a queue name must match, whole."""
MAX_QUEUES = 1000
"""The most queues a tree holds."""
MAX_DEPTH = 16
"""The most levels a tree has (a root alone is one level)."""
MAX_MODELS = 64
"""The most GPU models one of a queue's ``gpus``/``limit``/``lend`` tables names."""
MAX_MODEL_CHARS = 128
"""The longest GPU model name."""
MAX_IDENTITIES = 1000
"""The most identities a queue's ``members`` (and its ``default_for``) lists."""
MAX_IDENTITY_CHARS = 256
"""The longest identity in ``members`` or ``default_for``."""
MAX_MOUNT_ROOTS = 32
"""The most host roots a queue's ``mount_allowed`` lists."""
MAX_GPUS = 1_000_000
"""The largest GPU count of a quota, limit or lend entry."""
MAX_CORES = 10_000_000.0
"""The largest ``cpu`` cap, in cores."""
MAX_MEM_GIB = 1_000_000_000.0
"""The largest ``mem_gib`` cap, in GiB."""
MAX_WEIGHT = 1_000_000.0
"""The largest ``weight``."""
MAX_AMOUNT = 1e15
"""The largest budget amount (GPU-hours, kWh or currency) and ``half_life_h``."""

BudgetKind = Literal["gpu_hours", "kwh", "cost"]
BudgetPeriod = Literal["day", "week", "month"]
BudgetAction = Literal["lowest", "hold"]
_KINDS: tuple[str, ...] = get_args(BudgetKind)
_PERIODS: tuple[str, ...] = get_args(BudgetPeriod)
_ACTIONS: tuple[str, ...] = get_args(BudgetAction)


def normalise_model(model: str) -> str:
    """A GPU model key as stored: ``""`` becomes :data:`ANY_MODEL`, other names stay as given."""
    return ANY_MODEL if model in ("", ANY_MODEL) else model


def _quoted(key: str) -> str:
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


# ---------------------------------------------------------------------------------------------
# Budgets


@dataclass(frozen=True)
class Budget:
    """How much a queue may consume per period, and what happens past it.

    :param kind: ``gpu_hours``, ``kwh`` (energy) or ``cost`` (in the currency of the coordinator's
        ``--price-gpu-hour``/``--price-kwh`` flags, as usage reports compute it).
    :param amount: the allowance per period, in the kind's unit; positive.
    :param period: ``day``, ``week`` (from Monday) or ``month``, calendar periods in UTC.
    :param action: past 100 %: ``lowest`` lets new work run only on capacity no other queue waits
        for, at the lowest priority; ``hold`` holds new work until the next period.
    """

    kind: BudgetKind
    amount: float
    period: BudgetPeriod = "month"
    action: BudgetAction = "hold"

    def validate(self, where: str) -> None:
        """Raise :class:`ValidationError` for the first invalid field, named under ``where``."""
        if self.kind not in _KINDS:
            raise ValidationError(f"{where}.kind", f"{self.kind!r} is not one of {', '.join(_KINDS)}")
        if isinstance(self.amount, bool) or not isinstance(self.amount, int | float) \
                or not math.isfinite(self.amount) or not 0 < self.amount <= MAX_AMOUNT:
            raise ValidationError(f"{where}.amount", f"{self.amount!r} is not a positive number up to {MAX_AMOUNT:g}")
        if self.period not in _PERIODS:
            raise ValidationError(f"{where}.period", f"{self.period!r} is not one of {', '.join(_PERIODS)}")
        if self.action not in _ACTIONS:
            raise ValidationError(f"{where}.action", f"{self.action!r} is not one of {', '.join(_ACTIONS)}")

    def to_dict(self) -> dict[str, Any]:
        """Plain data: ``{"kind", "amount", "period", "action"}``."""
        return {"kind": self.kind, "amount": self.amount, "period": self.period, "action": self.action}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "budget") -> Budget:
        """The budget in ``data`` (as :meth:`to_dict` writes it), validated."""
        _no_unknown_keys(data, {"kind", "amount", "period", "action"}, where)
        if "kind" not in data or "amount" not in data:
            raise ValidationError(where, "needs kind and amount")
        budget = cls(kind=data["kind"], amount=data["amount"], period=data.get("period", "month"),
                     action=data.get("action", "hold"))
        budget.validate(where)
        return budget


# ---------------------------------------------------------------------------------------------
# Queues


@dataclass(frozen=True)
class Queue:
    """One queue of the tree; see the module docstring for what each field means.

    Build it through :meth:`from_dict` or inside a :class:`QueueConfig`, which validates it; the
    GPU maps' keys are normalised (``""`` → ``"*"``) on construction.
    """

    name: str
    parent: str | None = None
    weight: float = 1.0
    gpus: Mapping[str, int] = field(default_factory=dict)
    limit: Mapping[str, int] = field(default_factory=dict)
    lend: Mapping[str, int] = field(default_factory=dict)
    cpu: float | None = None
    mem_gib: float | None = None
    members: tuple[str, ...] = ()
    default_for: tuple[str, ...] = ()
    budget: Budget | None = None
    mount_allowed: tuple[str, ...] = ()
    default_time_limit_s: float | None = None
    max_time_limit_s: float | None = None
    default_min_runtime_s: float | None = None
    grace_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("gpus", "limit", "lend"):
            values = getattr(self, name)
            if isinstance(values, Mapping):
                object.__setattr__(self, name, {normalise_model(str(k)): v for k, v in values.items()})
        object.__setattr__(self, "members", tuple(self.members))
        object.__setattr__(self, "default_for", tuple(self.default_for))
        object.__setattr__(self, "mount_allowed", tuple(self.mount_allowed))

    # -- per pool --------------------------------------------------------------------------

    def quota_in(self, pool: str) -> int:
        """GPUs guaranteed in ``pool`` (0 without an entry for exactly that pool)."""
        return self.gpus.get(pool, 0)

    def limit_in(self, pool: str) -> int | None:
        """Most GPUs it may hold in ``pool``; the ``"*"`` entry stands in; ``None`` = unlimited."""
        return self.limit.get(pool, self.limit.get(ANY_MODEL))

    def lend_in(self, pool: str) -> int:
        """How much of its quota in ``pool`` others may borrow while idle (at most the quota)."""
        quota = self.quota_in(pool)
        lend = self.lend.get(pool, self.lend.get(ANY_MODEL))
        return quota if lend is None else min(lend, quota)

    def admits_member(self, identity: str) -> bool:
        """Whether ``identity`` is listed in ``members`` or ``default_for`` (``"*"`` = anyone)."""
        return any(who in (identity, "*") for who in (*self.members, *self.default_for))

    # -- checks and plain data -------------------------------------------------------------

    def validate(self, where: str) -> None:
        """Check this queue alone (the tree is :class:`QueueConfig`'s); fields named under ``where``."""
        if not isinstance(self.name, str) or not NAME_PATTERN.fullmatch(self.name):
            raise ValidationError(f"{where}.name", f"{_short(self.name)} does not match {NAME_PATTERN.pattern}")
        if self.parent is not None and (not isinstance(self.parent, str) or not NAME_PATTERN.fullmatch(self.parent)):
            raise ValidationError(f"{where}.parent", f"{_short(self.parent)} is not a queue name")
        if self.parent == self.name:
            raise ValidationError(f"{where}.parent", f"queue {self.name} cannot be its own parent")
        if isinstance(self.weight, bool) or not isinstance(self.weight, int | float) \
                or not math.isfinite(self.weight) or not 0 < self.weight <= MAX_WEIGHT:
            raise ValidationError(f"{where}.weight", f"{self.weight!r} is not a positive number up to {MAX_WEIGHT:g}")
        for name in ("gpus", "limit", "lend"):
            values = getattr(self, name)
            if not isinstance(values, Mapping):
                raise ValidationError(f"{where}.{name}", "is not a table of GPU model = count")
            if len(values) > MAX_MODELS:
                raise ValidationError(f"{where}.{name}", f"names {len(values)} GPU models; at most {MAX_MODELS}")
            for model, count in values.items():
                if len(model) > MAX_MODEL_CHARS:
                    raise ValidationError(f"{where}.{name}[{_quoted(model[:32])}…]",
                                          f"a GPU model of {len(model)} characters; at most {MAX_MODEL_CHARS}")
                if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_GPUS:
                    raise ValidationError(f"{where}.{name}[{_quoted(model)}]",
                                          f"{_short(count)} is not a whole number of GPUs ≥ 0 and ≤ {MAX_GPUS}")
        for model, quota in self.gpus.items():
            limit = self.limit_in(model)
            if limit is not None and limit < quota:
                key = model if model in self.limit else ANY_MODEL
                raise ValidationError(f"{where}.limit[{_quoted(key)}]", f"{limit} is below its quota {quota}"
                                      + ("" if key == model else f" for {_quoted(model)}"))
        for model, lend in self.lend.items():
            if model == ANY_MODEL and ANY_MODEL not in self.gpus:
                continue            # only a fallback for the named pools, capped by each quota there
            quota = self.quota_in(model)
            if lend > quota:
                raise ValidationError(f"{where}.lend[{_quoted(model)}]", f"{lend} is above its quota {quota}")
        for name, most in (("cpu", MAX_CORES), ("mem_gib", MAX_MEM_GIB)):
            value = getattr(self, name)
            if value is not None:
                _non_negative_number(value, f"{where}.{name}", most)
        for name in ("members", "default_for"):
            identities = getattr(self, name)
            if len(identities) > MAX_IDENTITIES:
                raise ValidationError(f"{where}.{name}",
                                      f"lists {len(identities)} identities; at most {MAX_IDENTITIES}")
            for i, who in enumerate(identities):
                if not isinstance(who, str) or not who:
                    raise ValidationError(f"{where}.{name}[{i}]", f"{_short(who)} is not an identity")
                if len(who) > MAX_IDENTITY_CHARS:
                    raise ValidationError(f"{where}.{name}[{i}]",
                                          f"an identity of {len(who)} characters; at most {MAX_IDENTITY_CHARS}")
        if self.budget is not None:
            self.budget.validate(f"{where}.budget")
        if len(self.mount_allowed) > MAX_MOUNT_ROOTS:
            raise ValidationError(f"{where}.mount_allowed", f"lists {len(self.mount_allowed)} roots; at most "
                                                            f"{MAX_MOUNT_ROOTS}")
        for i, root in enumerate(self.mount_allowed):
            host_root(root, f"{where}.mount_allowed[{i}]")
        for name in _TIME_KEYS:
            value = getattr(self, name)
            if value is not None:
                _non_negative_number(value, f"{where}.{name}", _MAX_GRACE_S if name == "grace_s" else MAX_TIME_LIMIT_S)
        if self.default_time_limit_s and self.max_time_limit_s and self.default_time_limit_s > self.max_time_limit_s:
            raise ValidationError(f"{where}.default_time_limit_s", f"{self.default_time_limit_s:g} s is above its "
                                  f"max_time_limit_s {self.max_time_limit_s:g} s")

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON or TOML), leaving out fields at their defaults; see :meth:`from_dict`."""
        data: dict[str, Any] = {"name": self.name}
        if self.parent is not None:
            data["parent"] = self.parent
        if self.weight != 1.0:
            data["weight"] = self.weight
        for name in ("gpus", "limit", "lend"):
            if getattr(self, name):
                data[name] = dict(getattr(self, name))
        if self.cpu is not None:
            data["cpu"] = self.cpu
        if self.mem_gib is not None:
            data["mem_gib"] = self.mem_gib
        if self.members:
            data["members"] = list(self.members)
        if self.default_for:
            data["default_for"] = list(self.default_for)
        if self.budget is not None:
            data["budget"] = self.budget.to_dict()
        if self.mount_allowed:
            data["mount_allowed"] = list(self.mount_allowed)
        for name in _TIME_KEYS:
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "queue") -> Queue:
        """The queue in ``data`` (a ``[[queue]]`` table, or :meth:`to_dict`'s output), validated alone."""
        if not isinstance(data, Mapping):
            raise ValidationError(where, "is not a table")
        _no_unknown_keys(data, _QUEUE_KEYS, where)
        if "name" not in data:
            raise ValidationError(f"{where}.name", "is missing")
        for name in ("members", "default_for", "mount_allowed"):
            if name in data and (isinstance(data[name], str) or not isinstance(data[name], Iterable)):
                raise ValidationError(f"{where}.{name}", "is not a list of identities" if name != "mount_allowed"
                                      else "is not a list of paths")
        budget = data.get("budget")
        if budget is not None and not isinstance(budget, Mapping):
            raise ValidationError(f"{where}.budget", "is not a table")
        queue = cls(
            name=data["name"], parent=data.get("parent"), weight=data.get("weight", 1.0),
            gpus=data.get("gpus", {}), limit=data.get("limit", {}), lend=data.get("lend", {}),
            cpu=data.get("cpu"), mem_gib=data.get("mem_gib"),
            members=tuple(data.get("members", ())), default_for=tuple(data.get("default_for", ())),
            budget=None if budget is None else Budget.from_dict(budget, f"{where}.budget"),
            mount_allowed=tuple(data.get("mount_allowed", ())),
            **{name: data[name] for name in _TIME_KEYS if name in data})
        queue.validate(where)
        return queue


_TIME_KEYS = ("default_time_limit_s", "max_time_limit_s", "default_min_runtime_s", "grace_s")
"""A queue's run-time settings, seconds (None: not set): its tasks' default time limit, the most they may ask
for, their default protected run time, and their checkpoint grace (docs/limits-and-reservations.md)."""
_MAX_GRACE_S = 86_400.0
_QUEUE_KEYS = frozenset({"name", "parent", "weight", "gpus", "limit", "lend", "cpu", "mem_gib", "members",
                         "default_for", "budget", "mount_allowed", *_TIME_KEYS})

DEFAULT_QUEUE = Queue(name="default", members=("*",), default_for=("*",))
"""The implicit queue of a configuration without queues: everyone's, no quota, no limit."""


# ---------------------------------------------------------------------------------------------
# The configuration


@dataclass(frozen=True)
class QueueConfig:
    """Every queue and the fair-share half-life; validated whole when built.

    With no queues it holds the implicit :data:`DEFAULT_QUEUE` (:attr:`managed` is then False).
    """

    queues: tuple[Queue, ...] = ()
    half_life_h: float = DEFAULT_HALF_LIFE_H
    _by_name: dict[str, Queue] = field(init=False, repr=False, compare=False)
    _children: dict[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)
    _named_models: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "queues", tuple(self.queues))
        self._validate()
        by_name = {q.name: q for q in self.all_queues}
        children: dict[str, list[str]] = {q.name: [] for q in self.all_queues}
        for q in self.all_queues:
            if q.parent is not None:
                children[q.parent].append(q.name)
        named = sorted({m for q in self.all_queues for maps in (q.gpus, q.limit, q.lend) for m in maps} - {ANY_MODEL})
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_children", {k: tuple(sorted(v)) for k, v in children.items()})
        object.__setattr__(self, "_named_models", tuple(named))

    # -- the tree --------------------------------------------------------------------------

    @property
    def managed(self) -> bool:
        """Whether queues are configured; False means the implicit ``default`` queue only."""
        return bool(self.queues)

    @property
    def all_queues(self) -> tuple[Queue, ...]:
        """The configured queues, or ``(DEFAULT_QUEUE,)`` when there are none."""
        return self.queues or (DEFAULT_QUEUE,)

    @property
    def names(self) -> tuple[str, ...]:
        """Every queue name, in configuration order."""
        return tuple(q.name for q in self.all_queues)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __iter__(self) -> Iterator[Queue]:
        return iter(self.all_queues)

    @property
    def _index(self) -> dict[str, Queue]:
        return self._by_name

    def get(self, name: str) -> Queue:
        """The queue called ``name``; :class:`NotFound` if there is none."""
        try:
            return self._index[name]
        except KeyError:
            raise NotFound(f"no queue named {name!r}") from None

    def children(self, name: str) -> tuple[str, ...]:
        """Names of the queues whose parent is ``name``, sorted."""
        self.get(name)
        return self._children[name]

    def is_leaf(self, name: str) -> bool:
        """Whether ``name`` has no children (only leaves take tasks)."""
        return not self.children(name)

    def leaves(self) -> tuple[str, ...]:
        """Names of the leaf queues, in configuration order."""
        return tuple(q.name for q in self.all_queues if self.is_leaf(q.name))

    def ancestors(self, name: str) -> tuple[str, ...]:
        """``name``'s parent, its parent's parent, … up to the root (``name`` itself not included)."""
        out: list[str] = []
        parent = self.get(name).parent
        while parent is not None:
            out.append(parent)
            parent = self.get(parent).parent
        return tuple(out)

    def descendants(self, name: str) -> tuple[str, ...]:
        """Every queue below ``name`` (depth first, children sorted); iterative, however deep the tree."""
        out: list[str] = []
        stack = list(reversed(self.children(name)))
        while stack:
            child = stack.pop()
            out.append(child)
            stack.extend(reversed(self._children[child]))
        return tuple(out)

    def tree_order(self) -> tuple[Queue, ...]:
        """Every queue, each parent before its children, siblings (and roots) by name; iterative."""
        out: list[Queue] = []
        roots = sorted(q.name for q in self.all_queues if q.parent is None)
        stack = list(reversed(roots))
        while stack:
            name = stack.pop()
            out.append(self._by_name[name])
            stack.extend(reversed(self._children[name]))
        return tuple(out)

    # -- pools -----------------------------------------------------------------------------

    @property
    def named_models(self) -> tuple[str, ...]:
        """The GPU models some queue names explicitly (each a pool of its own), sorted."""
        return self._named_models

    def pool_of(self, model: str) -> str:
        """The pool a GPU model belongs to: the model itself if some queue names it, else ``"*"``."""
        model = normalise_model(model)
        return model if model in self.named_models else ANY_MODEL

    def pools(self, models: Iterable[str]) -> tuple[str, ...]:
        """The distinct pools of ``models`` (e.g. a cluster's), sorted with ``"*"`` last."""
        found = {self.pool_of(m) for m in models}
        return tuple(sorted(found - {ANY_MODEL})) + ((ANY_MODEL,) if ANY_MODEL in found else ())

    # -- access ----------------------------------------------------------------------------

    def may_submit(self, identity: str, queue: str) -> bool:
        """Whether ``identity`` may submit to ``queue``: it exists, is a leaf, and lists the identity
        (or ``"*"``) in ``members`` or ``default_for``."""
        q = self._index.get(queue)
        return q is not None and self.is_leaf(queue) and q.admits_member(identity)

    def default_queue(self, identity: str) -> str:
        """The queue ``identity`` submits to when it names none: the one whose ``default_for``
        lists it, else the one listing ``"*"``; :class:`NotFound` when neither exists."""
        wildcard: str | None = None
        for q in self.all_queues:
            if identity in q.default_for:
                return q.name
            if "*" in q.default_for:
                wildcard = q.name
        if wildcard is None:
            raise NotFound(f"no default queue for {identity!r}; name one with --queue")
        return wildcard

    # -- changes ---------------------------------------------------------------------------

    def set(self, queue: Queue) -> QueueConfig:
        """A new configuration with ``queue`` added, or replacing the queue of the same name (on a
        configuration without queues, the implicit ``default`` queue gives way to the one set)."""
        queues = list(self.queues)
        for i, q in enumerate(queues):
            if q.name == queue.name:
                queues[i] = queue
                break
        else:
            queues.append(queue)
        return replace(self, queues=tuple(queues))

    def remove(self, name: str) -> QueueConfig:
        """A new configuration without ``name``; refuses a queue that has children."""
        if name not in (q.name for q in self.queues):
            raise NotFound(f"no queue named {name!r}")
        if self.children(name):
            raise ValidationError(f"queue[{self.names.index(name)}]",
                                  f"queue {name} has children ({', '.join(self.children(name))}); remove them first")
        return replace(self, queues=tuple(q for q in self.queues if q.name != name))

    # -- plain data ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain data in the layout of the TOML file (``half_life_h``, ``queue``)."""
        return {"half_life_h": self.half_life_h, "queue": [q.to_dict() for q in self.queues]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QueueConfig:
        """The configuration in ``data`` (a parsed TOML file or :meth:`to_dict`'s output), validated."""
        if not isinstance(data, Mapping):
            raise ValidationError("queues", "is not a table")
        if "prices" in data:
            raise ValidationError("prices", "is not part of the queue configuration: prices are the coordinator's "
                                  "flags --price-gpu-hour and --price-kwh")
        _no_unknown_keys(data, {"half_life_h", "queue"}, "")
        raw = data.get("queue", [])
        if not isinstance(raw, list):
            raise ValidationError("queue", "is not an array of tables ([[queue]])")
        if len(raw) > MAX_QUEUES:
            raise ValidationError("queue", f"{len(raw)} queues; at most {MAX_QUEUES}")
        return cls(queues=tuple(Queue.from_dict(q, f"queue[{i}]") for i, q in enumerate(raw)),
                   half_life_h=data.get("half_life_h", DEFAULT_HALF_LIFE_H))

    # -- validation ------------------------------------------------------------------------

    def _validate(self) -> None:
        h = self.half_life_h
        if isinstance(h, bool) or not isinstance(h, int | float) or not math.isfinite(h) or not 0 < h <= MAX_AMOUNT:
            raise ValidationError("half_life_h", f"{_short(h)} is not a positive number of hours up to {MAX_AMOUNT:g}")
        if len(self.queues) > MAX_QUEUES:
            raise ValidationError("queue", f"{len(self.queues)} queues; at most {MAX_QUEUES}")
        where = {q.name: f"queue[{i}]" for i, q in enumerate(self.queues)}
        seen: set[str] = set()
        for i, q in enumerate(self.queues):
            if not isinstance(q, Queue):
                raise ValidationError(f"queue[{i}]", "is not a Queue")
            q.validate(f"queue[{i}]")
            if q.name in seen:
                raise ValidationError(f"queue[{i}].name", f"{q.name} is defined twice")
            seen.add(q.name)
        parents = {q.name: q.parent for q in self.queues}
        for i, q in enumerate(self.queues):
            if q.parent is not None and q.parent not in parents:
                raise ValidationError(f"queue[{i}].parent", f"no queue named {q.parent!r}")
        _check_depth(self.queues, parents)
        defaults: dict[str, str] = {}
        for i, q in enumerate(self.queues):
            for who in q.default_for:
                if who in defaults:
                    raise ValidationError(f"queue[{i}].default_for",
                                          f"{who} already has queue {defaults[who]} as default")
                defaults[who] = q.name
        kids_of: dict[str, list[Queue]] = {}
        for q in self.queues:
            if q.parent is not None:
                kids_of.setdefault(q.parent, []).append(q)
        for parent in self.queues:
            kids = kids_of.get(parent.name)
            if not kids:
                continue
            if parent.lend:
                raise ValidationError(f"{where[parent.name]}.lend",
                                      f"queue {parent.name} has child queues; only leaf queues lend")
            for model, quota in parent.gpus.items():
                total = sum(k.gpus.get(model, 0) for k in kids)
                if total > quota:
                    raise ValidationError(f"{where[parent.name]}.gpus[{_quoted(model)}]",
                                          f"its children's quotas add up to {total}, more than its {quota}")
            for name in ("cpu", "mem_gib"):
                quota_value = getattr(parent, name)
                if quota_value is None:
                    continue
                total_value = sum(getattr(k, name) or 0 for k in kids)
                if total_value > quota_value:
                    raise ValidationError(f"{where[parent.name]}.{name}",
                                          f"its children's quotas add up to {total_value:g}, more than its "
                                          f"{quota_value:g}")


def _check_depth(queues: tuple[Queue, ...], parents: Mapping[str, str | None]) -> None:
    """Refuse a cycle of parents or a tree deeper than :data:`MAX_DEPTH`, in one pass: each queue's
    level is found once (walking up to the nearest queue whose level is known) and remembered."""
    level: dict[str, int] = {}
    for i, q in enumerate(queues):
        path: list[str] = []
        on_path: set[str] = set()
        node: str | None = q.name
        while node is not None and node not in level:
            if node in on_path:
                cycle = path[path.index(node):]
                raise ValidationError(f"queue[{i}].parent", "cycle " + " -> ".join([*cycle, node]))
            path.append(node)
            on_path.add(node)
            if len(path) > MAX_DEPTH:
                break
            node = parents[node]
        base = 0 if node is None or node not in level else level[node]
        if len(path) > MAX_DEPTH or base + len(path) > MAX_DEPTH:
            raise ValidationError(f"queue[{i}].parent",
                                  f"queue {q.name} would lie more than {MAX_DEPTH} levels deep; at most {MAX_DEPTH}")
        for depth, name in enumerate(reversed(path), start=base + 1):
            level[name] = depth


def _no_unknown_keys(data: Mapping[str, Any], known: Iterable[str], where: str) -> None:
    unknown = sorted(set(map(str, data)) - set(known))
    if unknown:
        raise ValidationError(f"{where}.{unknown[0]}" if where else unknown[0], "is not a known field")


def _non_negative_number(value: object, where: str, most: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not 0 <= value <= most:
        raise ValidationError(where, f"{_short(value)} is not a number ≥ 0 and ≤ {most:g}")


def _short(value: object) -> str:
    """``repr(value)`` cut to 40 characters, so an error never echoes a hostile value whole."""
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"
