"""The queue configuration file: the documented format loads, errors name the field or the file,
and dumps_toml writes back what loads_toml reads (also as a hypothesis property)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import ConfigError, ValidationError
from coordinator.queues import Budget, Queue, QueueConfig, dumps_toml, load_toml, loads_toml

EXAMPLE = """
half_life_h = 24          # decayed-usage half-life for fair share

[[queue]]
name = "org"
gpus = { "*" = 16 }

[[queue]]
name = "a"
parent = "org"
weight = 1.0
gpus = { "*" = 4 }        # quota per GPU model
limit = { "*" = 8 }
lend = { "*" = 4 }
cpu = 64
mem_gib = 512
default_for = ["alice", "team-a-ci"]  # identities whose default queue this is
members = ["alice", "bob"]            # identities allowed to submit ("*" = anyone)
budget = { kind = "gpu_hours", amount = 1000, period = "month", action = "hold" }

[[queue]]
name = "b"
parent = "org"
weight = 2
gpus = { "" = 4 }
members = ["*"]
"""


def test_the_documented_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "queues.toml"
    path.write_text(EXAMPLE)
    config = load_toml(path)
    assert config.half_life_h == 24
    assert config.names == ("org", "a", "b")
    a = config.get("a")
    assert a.parent == "org"
    assert (a.quota_in("*"), a.limit_in("*"), a.lend_in("*")) == (4, 8, 4)
    assert (a.cpu, a.mem_gib) == (64, 512)
    assert a.default_for == ("alice", "team-a-ci")
    assert a.members == ("alice", "bob")
    assert a.budget == Budget("gpu_hours", 1000, "month", "hold")
    assert config.get("b").gpus == {"*": 4}
    assert config.get("b").weight == 2
    assert config.default_queue("team-a-ci") == "a"


def test_an_empty_file_is_the_default_queue() -> None:
    assert loads_toml("") == QueueConfig()
    assert not loads_toml("").managed


def test_validation_error_names_the_queue_index_and_key() -> None:
    text = '[[queue]]\nname = "x"\n[[queue]]\nname = "a"\ngpus = { "*" = 4 }\nlimit = { "*" = 2 }\n'
    with pytest.raises(ValidationError) as excinfo:
        loads_toml(text)
    assert str(excinfo.value) == 'queue[1].limit["*"]: 2 is below its quota 4'


@pytest.mark.parametrize(("text", "field"), [
    ('colour = "red"', "colour"),
    ('queue = "a"', "queue"),
    ('[[queue]]\nname = "a"\nbudget = 3', "queue[0].budget"),
    ('[[queue]]\nname = "a"\ngpus = 3', "queue[0].gpus"),
])
def test_malformed_sections_name_the_field(text: str, field: str) -> None:
    with pytest.raises(ValidationError) as excinfo:
        loads_toml(text)
    assert excinfo.value.field == field


@pytest.mark.parametrize("text", [
    '[prices]\nper_kwh = 0.25\nper_gpu_hour = { "*" = 1.0 }\n\n[[queue]]\nname = "a"\n',
    '[prices]\n',
    'prices = 3',
])
def test_prices_are_refused_as_coordinator_flags(text: str) -> None:
    with pytest.raises(ValidationError) as excinfo:
        loads_toml(text)
    assert excinfo.value.field == "prices"
    assert "--price-gpu-hour" in str(excinfo.value) and "--price-kwh" in str(excinfo.value)


def test_unreadable_or_non_toml_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        load_toml(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[[queue]\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: not TOML"):
        load_toml(bad)


def test_dumps_toml_round_trips_the_example() -> None:
    config = loads_toml(EXAMPLE)
    assert loads_toml(dumps_toml(config)) == config


# -- hypothesis: any valid configuration survives dumps_toml -> loads_toml ---------------------

names = st.from_regex(r"[a-z0-9][a-z0-9-]{0,10}", fullmatch=True)
models = st.sampled_from(["*", "NVIDIA H100 80GB HBM3", 'odd "model" \\ name', "L4"])
identities = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=8)
numbers = st.one_of(st.integers(0, 1000), st.floats(0, 1e6, allow_nan=False, allow_infinity=False))


@st.composite
def configs(draw: st.DrawFn) -> QueueConfig:
    queue_names = draw(st.lists(names, min_size=0, max_size=5, unique=True))
    queues: list[Queue] = []
    defaults: set[str] = set()
    for i, name in enumerate(queue_names):
        gpus = draw(st.dictionaries(models, st.integers(0, 16), max_size=2))
        limit = {m: q + draw(st.integers(0, 8)) for m, q in gpus.items() if draw(st.booleans())}
        if "*" in limit:                            # the "*" limit stands in for models without their own
            limit["*"] = max(limit["*"], *(q for m, q in gpus.items() if m not in limit), 0)
        lend = {m: draw(st.integers(0, q)) for m, q in gpus.items() if draw(st.booleans())}
        default_for = tuple(w for w in draw(st.lists(identities, max_size=2, unique=True)) if w not in defaults)
        defaults.update(default_for)
        budget = draw(st.none() | st.builds(Budget, st.sampled_from(["gpu_hours", "kwh", "cost"]),
                                            st.floats(0.5, 1e6), st.sampled_from(["day", "week", "month"]),
                                            st.sampled_from(["lowest", "hold"])))
        queues.append(Queue(
            name=name, parent=queue_names[i - 1] if i and draw(st.booleans()) and not queues[i - 1].gpus else None,
            weight=draw(st.floats(0.01, 100)), gpus=gpus, limit=limit, lend=lend,
            cpu=draw(st.none() | numbers), mem_gib=draw(st.none() | numbers),
            members=tuple(draw(st.lists(identities, max_size=3))), default_for=default_for, budget=budget))
    # a parent with quotas or caps must bound its children's; drop those of parents for simplicity
    parents = {q.parent for q in queues}
    queues = [Queue(**{**q.__dict__, "cpu": None, "mem_gib": None}) if q.name in parents else q for q in queues]
    return QueueConfig(queues=tuple(queues), half_life_h=draw(st.floats(0.01, 1000)))


@settings(max_examples=150, deadline=None)
@given(configs())
def test_toml_round_trip(config: QueueConfig) -> None:
    assert loads_toml(dumps_toml(config)) == config
    assert QueueConfig.from_dict(config.to_dict()) == config
