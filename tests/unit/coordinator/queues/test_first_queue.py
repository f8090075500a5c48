"""The first queue set on a cluster without queues keeps the implicit ``default`` queue (the tree built by
``coordinator.queues.admin``, and the sentence its reply carries)."""

from __future__ import annotations

import pytest

from common.errors import ValidationError
from coordinator.queues import DEFAULT_QUEUE, Queue, QueueConfig
from coordinator.queues.admin import _set_keeping_default, _stranded


def test_the_first_queue_keeps_default_for_its_work_and_for_submits_without_a_queue() -> None:
    config, notes = _set_keeping_default(QueueConfig(), Queue("vision", gpus={"*": 4}, limit={"*": 6}))
    assert config.names == ("default", "vision") and config.get("default") == DEFAULT_QUEUE
    assert config.default_queue("anyone") == "default" and config.may_submit("anyone", "default")
    assert len(notes) == 1 and "submits without --queue still go to it" in notes[0]
    assert _stranded(QueueConfig(), config, "default") == ""


def test_a_first_queue_claiming_every_default_takes_it_and_says_so() -> None:
    config, notes = _set_keeping_default(QueueConfig(), Queue("vision", members=("*",), default_for=("*",)))
    assert config.default_queue("anyone") == "vision" and config.get("default").default_for == ()
    assert "still go to it" not in notes[0]
    assert notes[1] == "Submits without --queue now go to queue vision instead of queue default."


def test_a_default_an_admin_changed_keeps_its_default_for() -> None:
    config = QueueConfig(queues=(Queue("default", gpus={"*": 2}, members=("*",), default_for=("*",)),))
    with pytest.raises(ValidationError, match="already has queue default as default"):
        _set_keeping_default(config, Queue("vision", default_for=("*",)))
    assert _set_keeping_default(config, Queue("vision"))[1] == []


def test_setting_default_itself_first_replaces_the_implicit_one() -> None:
    config, notes = _set_keeping_default(QueueConfig(), Queue("default", gpus={"*": 2}, members=("*",)))
    assert config.names == ("default",) and config.get("default").quota_in("*") == 2 and notes == []
