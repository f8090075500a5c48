"""The queue configuration file (TOML): :func:`load_toml`, :func:`loads_toml`, :func:`dumps_toml`.

Format (every key optional except each queue's ``name``)::

    half_life_h = 24                  # half-life of the decayed usage fair share weighs, hours

    [[queue]]
    name = "org"                      # [a-z0-9][a-z0-9-]{0,62}, unique
    gpus = { "*" = 16 }               # bounds the children's quotas

    [[queue]]
    name = "a"
    parent = "org"                    # must exist; no cycles
    weight = 1.0                      # share of what nobody is guaranteed (> 0; default 1)
    gpus = { "*" = 4 }                # quota: GPUs guaranteed per model ("*" or "" = models no queue names)
    limit = { "*" = 8 }               # most GPUs held, borrowed included (no entry: unlimited)
    lend = { "*" = 4 }                # idle quota others may borrow (no entry: all of it)
    cpu = 64                          # cores its tasks may ask for in all (no entry: no cap)
    mem_gib = 512                     # memory its tasks may ask for in all, GiB
    default_for = ["alice", "team-a-ci"]   # identities whose default queue this is ("*" = everyone)
    members = ["alice", "bob"]        # identities that may submit ("*" = anyone)
    budget = { kind = "gpu_hours", amount = 1000, period = "month", action = "hold" }

Meaning and validation: :mod:`coordinator.queues.model`. A file that is not TOML, or cannot be
read, is a :class:`~common.errors.ConfigError` naming the file; a file whose content is invalid is a
:class:`~common.errors.ValidationError` naming the field (``queue[1].limit["*"]``). Prices are not
part of this file: a ``[prices]`` table is refused, since prices are the coordinator's flags
``--price-gpu-hour`` and ``--price-kwh``.
:func:`dumps_toml` writes a configuration back in this format (without the comments);
``loads_toml(dumps_toml(c)) == c``.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.errors import ConfigError
from coordinator.queues.model import QueueConfig

__all__ = ["dumps_toml", "load_toml", "loads_toml"]


def load_toml(path: str | Path) -> QueueConfig:
    """The configuration in the TOML file at ``path``, validated."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"queue configuration {path}: cannot be read: {e.strerror or e}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"queue configuration {path}: not TOML: {e}") from e
    return QueueConfig.from_dict(data)


def loads_toml(text: str, source: str = "<string>") -> QueueConfig:
    """The configuration in the TOML ``text`` (``source`` names it in errors), validated."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"queue configuration {source}: not TOML: {e}") from e
    return QueueConfig.from_dict(data)


def dumps_toml(config: QueueConfig) -> str:
    """``config`` as a TOML document in the format above."""
    data = config.to_dict()
    lines = [f"half_life_h = {_value(data['half_life_h'])}"]
    for queue in data["queue"]:
        lines += ["", "[[queue]]"]
        lines += [f"{_key(k)} = {_value(v)}" for k, v in queue.items()]
    return "\n".join(lines) + "\n"


def _key(key: str) -> str:
    bare = key and all(c.isascii() and (c.isalnum() or c in "-_") for c in key)
    return key if bare else _string(key)


def _string(text: str) -> str:
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} has no TOML form here")
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(str(k))} = {_value(v)}" for k, v in value.items()) + " }" if value else "{}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")
