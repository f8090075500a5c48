"""The task state machine table (pure; no etcd)."""

from __future__ import annotations

import itertools

import pytest

from common.errors import IllegalTransition
from common.types import TERMINAL_STATES, TaskState
from coordinator.sync.state_machine import LEGAL_TRANSITIONS, Conflict, allowed_from, check_transition, is_legal

S = TaskState

# The life cycle written out edge by edge, independently of the table under test.
EXPECTED = {
    (S.PENDING, S.SCHEDULED),
    (S.SCHEDULED, S.STARTING),
    (S.STARTING, S.RUNNING),
    (S.RUNNING, S.SUCCEEDED),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.PAUSED),
    (S.PAUSED, S.RUNNING),
    # preemption from every state that holds (or is about to hold) resources, then back in line
    (S.SCHEDULED, S.PREEMPTED),
    (S.STARTING, S.PREEMPTED),
    (S.RUNNING, S.PREEMPTED),
    (S.PAUSED, S.PREEMPTED),
    (S.PREEMPTED, S.PENDING),
    # failure once placed; re-queue by the restart policy
    (S.SCHEDULED, S.FAILED),
    (S.STARTING, S.FAILED),
    (S.PAUSED, S.FAILED),
    (S.FAILED, S.PENDING),
    # a time limit reached once it started (final, like a cancel)
    (S.STARTING, S.TIMEOUT),
    (S.RUNNING, S.TIMEOUT),
    (S.PAUSED, S.TIMEOUT),
    # cancel from every non-terminal state
    *((s, S.CANCELLED) for s in TaskState if s not in TERMINAL_STATES),
}


class TestStateMachine:
    """LEGAL_TRANSITIONS and its helpers."""

    def test_table_covers_every_state(self) -> None:
        """Every TaskState has an entry, even the final ones."""
        assert set(LEGAL_TRANSITIONS) == set(TaskState)

    @pytest.mark.parametrize(("src", "dst"), list(itertools.product(TaskState, TaskState)), ids=lambda s: s.name)
    def test_every_pair_matches_the_life_cycle(self, src: TaskState, dst: TaskState) -> None:
        """Each (from, to) pair is legal exactly when the written-out life cycle has that edge."""
        assert is_legal(src, dst) is ((src, dst) in EXPECTED)

    def test_final_states_have_no_way_out(self) -> None:
        """SUCCEEDED and CANCELLED allow nothing; FAILED allows only the re-queue."""
        assert allowed_from(S.SUCCEEDED) == frozenset()
        assert allowed_from(S.CANCELLED) == frozenset()
        assert allowed_from(S.TIMEOUT) == frozenset()
        assert allowed_from(S.FAILED) == frozenset({S.PENDING})

    def test_illegal_transition_message(self) -> None:
        """The error names the task, both states, and what is allowed instead."""
        with pytest.raises(IllegalTransition) as info:
            check_transition("t-1", S.RUNNING, S.PENDING)
        assert str(info.value) == (
            "task t-1: RUNNING → PENDING is not allowed (from RUNNING: SUCCEEDED, FAILED, CANCELLED, PAUSED, "
            "PREEMPTED, TIMEOUT)"
        )

    def test_final_state_message(self) -> None:
        """Leaving a final state says that nothing is allowed from it."""
        with pytest.raises(IllegalTransition, match=r"SUCCEEDED → RUNNING is not allowed \(from SUCCEEDED: nothing"):
            check_transition("t-2", S.SUCCEEDED, S.RUNNING)

    def test_legal_transition_passes(self) -> None:
        """A legal change returns None."""
        assert check_transition("t-3", S.PAUSED, S.RUNNING) is None

    def test_conflict_is_an_illegal_transition(self) -> None:
        """A lost revision race can be caught as IllegalTransition too."""
        assert issubclass(Conflict, IllegalTransition)
