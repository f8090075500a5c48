"""Configuration: TOML file, then ``GPTRM_*`` environment, then command-line flags.

Each process describes its settings as a frozen dataclass whose fields carry
:func:`option` metadata. :func:`load_config` builds the argparse parser from it, reads the
TOML file named by ``--config`` (or ``GPTRM_CONFIG``), overlays the environment and then
the flags (later sources win), converts and validates every value, and returns the frozen
instance. Every error is a :class:`~common.errors.ConfigError` naming the field, the bad
value and where it came from, so ``main()`` can print one line and exit.

A setting declared with ``path=True`` (a file or directory: state directories, certificates,
data paths) is made absolute against the directory the process started in (``~`` expanded), so
nothing depends on the working directory later: a task's wrapper, for one, runs in the task's
own working directory and would not find a relative path.

Example::

    @dataclass(frozen=True, slots=True)
    class AgentConfig:
        interval_s: float = option(1.0, "sampling interval", flag="interval", check=positive)

    cfg = load_config(AgentConfig, argv, prog="gptrm-agent")
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import tomllib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from common.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["ConfigSource", "absolute_path", "host_port", "load_config", "non_negative", "option", "positive",
           "unit_interval"]

T = TypeVar("T", bound="DataclassInstance")
Check = Callable[[Any], str | None]
"""A validator: returns a problem description, or None when the value is fine."""

ConfigSource = str
"""Where a value came from: ``default``, ``file FILE``, ``env GPTRM_X`` or ``flag --x``."""

_ENV_PREFIX = "GPTRM_"


def option(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    choices: Sequence[str] | None = None,
    check: Check | None = None,
    metavar: str | None = None,
    path: bool = False,
) -> Any:
    """Declare one setting of a config dataclass.

    :param default: value when no source sets it (lists/dicts are copied per instance).
    :param help: the flag's help text.
    :param flag: flag/TOML/env name when it differs from the field name (``interval`` for
        ``interval_s``); the TOML key is the flag name with ``_``, the env var upper-case.
    :param choices: allowed values for strings.
    :param check: extra validation, see :data:`Check`.
    :param path: the value is a path (or, for a list, paths), made absolute when loaded; "" stays "".
    """
    meta = {"help": help, "flag": flag, "choices": tuple(choices) if choices else None, "check": check,
            "metavar": metavar, "path": path}
    if isinstance(default, (list, dict)):
        shared: list[Any] | dict[Any, Any] = default

        def fresh() -> list[Any] | dict[Any, Any]:
            return type(shared)(shared)

        return dataclasses.field(default_factory=fresh, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def positive(value: float) -> str | None:
    """Check: value > 0 and finite."""
    return None if math.isfinite(value) and value > 0 else "must be a positive number"


def non_negative(value: float) -> str | None:
    """Check: value ≥ 0 and finite."""
    return None if math.isfinite(value) and value >= 0 else "must be zero or positive"


def unit_interval(value: float) -> str | None:
    """Check: 0 < value ≤ 1."""
    return None if math.isfinite(value) and 0 < value <= 1 else "must be in (0, 1]"


def host_port(value: str) -> str | None:
    """Check: ``HOST:PORT`` (or empty to disable) with a port in 0..65535."""
    if value == "":
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        return f"expected HOST:PORT, got {value!r}"
    return None


def absolute_path(value: str) -> str:
    """``value`` with ``~`` expanded, made absolute against the current directory and normalised; "" stays ""."""
    return os.path.abspath(os.path.expanduser(value)) if value else value


def _absolute(value: Any) -> Any:
    if isinstance(value, list):
        return [absolute_path(v) for v in value]
    return absolute_path(value)


def _key(field: dataclasses.Field) -> str:
    return field.metadata.get("flag") or field.name


def _base_type(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _base_type(args[0])
    return origin or tp


def _convert(value: Any, tp: Any, from_text: bool) -> Any:
    base = _base_type(tp)
    if base is bool:
        if isinstance(value, bool):
            return value
        if from_text and str(value).strip().lower() in ("1", "true", "yes", "on"):
            return True
        if from_text and str(value).strip().lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError("expected a boolean (true/false)")
    if base is int:
        if isinstance(value, bool) or (not from_text and not isinstance(value, int)):
            raise ValueError("expected an integer")
        return int(value)
    if base is float:
        if isinstance(value, bool) or (not from_text and not isinstance(value, (int, float))):
            raise ValueError("expected a number")
        return float(value)
    if base is str:
        if not isinstance(value, str):
            raise ValueError("expected a string")
        return value
    if base is list:
        if isinstance(value, str) and from_text:
            return [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError("expected a list of strings")
        return list(value)
    if base is dict:
        if isinstance(value, str) and from_text:
            out = {}
            for item in filter(None, (v.strip() for v in value.split(","))):
                k, sep, v = item.partition("=")
                if not sep or not k:
                    raise ValueError(f"expected KEY=VALUE pairs, got {item!r}")
                out[k.strip()] = v.strip()
            return out
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise ValueError("expected a table of strings")
        return dict(value)
    raise TypeError(f"unsupported config type {tp!r}")


def _read_toml(path: str) -> dict[str, Any]:
    try:
        with Path(path).open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path!r} is not valid TOML: {e}") from None
    except OSError as e:
        raise ConfigError(f"config file {path!r} cannot be read: {e.strerror}") from None


def build_parser(cls: type, prog: str, description: str) -> argparse.ArgumentParser:
    """The argparse parser for a config dataclass; every default is None so unset flags are visible."""
    hints = typing.get_type_hints(cls)
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", metavar="FILE", default=None, help="TOML config file (env GPTRM_CONFIG)")
    for f in dataclasses.fields(cls):
        key = _key(f)
        base = _base_type(hints[f.name])
        kwargs: dict[str, Any] = {"default": None, "dest": f.name}
        default = f.default if f.default is not dataclasses.MISSING else "-"
        help_text = f"{f.metadata['help']} (default: {default}; env {_ENV_PREFIX}{key.upper()})"
        if base is bool:
            parser.add_argument(f"--{key.replace('_', '-')}", action=argparse.BooleanOptionalAction, help=help_text,
                                **kwargs)
            continue
        parser.add_argument(f"--{key.replace('_', '-')}", metavar=f.metadata.get("metavar") or key.upper(),
                            help=help_text, **kwargs)
    return parser


def load_config(
    cls: type[T],
    argv: Sequence[str] | None = None,
    *,
    prog: str,
    description: str = "",
    env: Mapping[str, str] | None = None,
) -> T:
    """Merge defaults, TOML file, ``GPTRM_*`` environment and flags into ``cls``.

    :param cls: a dataclass whose fields were declared with :func:`option`.
    :param argv: command-line arguments (without the program name).
    :param env: environment (default ``os.environ``).
    :returns: the validated, frozen config.
    :raises ConfigError: unknown TOML key, unparsable or invalid value, unreadable file.
    :raises SystemExit: on ``--help`` or a flag argparse itself rejects (exit code 2).
    """
    env = os.environ if env is None else env
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    by_key = {_key(f): f for f in fields.values()}
    parser = build_parser(cls, prog, description)
    ns = parser.parse_args(argv)

    values: dict[str, tuple[Any, bool, ConfigSource]] = {}
    config_path = ns.config or env.get(f"{_ENV_PREFIX}CONFIG")
    if config_path:
        for raw_key, raw in _read_toml(config_path).items():
            f = by_key.get(raw_key) or by_key.get(raw_key.replace("-", "_"))
            if f is None:
                known = ", ".join(sorted(by_key))
                raise ConfigError(f"config file {config_path!r}: unknown key {raw_key!r} (known keys: {known})")
            values[f.name] = (raw, False, f"file {config_path}")
    for key, f in by_key.items():
        name = f"{_ENV_PREFIX}{key.upper()}"
        if name in env:
            values[f.name] = (env[name], True, f"env {name}")
    for name, f in fields.items():
        raw = getattr(ns, name)
        if raw is not None:
            values[name] = (raw, not isinstance(raw, bool), f"flag --{_key(f).replace('_', '-')}")

    final: dict[str, Any] = {}
    for name, (raw, from_text, source) in values.items():
        f = fields[name]
        label = _key(f)
        try:
            value = _convert(raw, hints[name], from_text)
        except ValueError as e:
            raise ConfigError(f"{label}: {e}, got {raw!r} (from {source})") from None
        choices = f.metadata.get("choices")
        if choices and value not in choices:
            raise ConfigError(f"{label}: must be one of {', '.join(choices)}, got {value!r} (from {source})")
        check = f.metadata.get("check")
        problem = check(value) if check else None
        if problem:
            raise ConfigError(f"{label}: {problem}, got {raw!r} (from {source})")
        final[name] = _absolute(value) if f.metadata.get("path") else value
    defaults = cls()
    for name, f in fields.items():
        if f.metadata.get("path") and name not in final:   # a default given relative (XDG_STATE_HOME=state)
            default = getattr(defaults, name)
            if _absolute(default) != default:
                final[name] = _absolute(default)
    return cls(**final)
