"""Parsing and checks of a spec's workflow parts: arrays, dependencies, start times
(coordinator/profiler/workflow_spec.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from common.errors import ValidationError
from common.pb.gptrm.v1 import types_pb2
from coordinator.profiler.taskspec import spec_from_mapping
from coordinator.profiler.validation import validate_spec
from coordinator.profiler.workflow_spec import (
    ARRAY_MAX_ELEMENTS,
    array_indices,
    array_ref,
    element_id,
    parse_after,
    parse_array,
    parse_begin,
)

NOW = 1_800_000_000.0
Dep, OK = types_pb2.Dependency, types_pb2.DEPENDENCY_KIND_OK


class TestParseArray:
    @pytest.mark.parametrize(("text", "expected"), [
        ("0-999", (0, 999, 1, 0)), ("0-999%64", (0, 999, 1, 64)), ("1-9:2", (1, 9, 2, 0)),
        ("1-9:2%3", (1, 9, 2, 3)), ("7", (7, 7, 1, 0)), (" 0-3 ", (0, 3, 1, 0)),
    ])
    def test_the_forms_slurm_users_write(self, text: str, expected: tuple[int, int, int, int]) -> None:
        a = parse_array(text)
        assert (a.first, a.last, a.step, a.max_running) == expected

    @pytest.mark.parametrize("text", ["", "a-b", "0-", "-3", "0-9%", "0-9:x", "0,1,2", "0-99999999999"])
    def test_other_shapes_are_refused_naming_the_field(self, text: str) -> None:
        with pytest.raises(ValidationError) as err:
            parse_array(text)
        assert err.value.field == "spec.array"

    def test_indices_follow_the_step(self) -> None:
        assert list(array_indices(parse_array("1-9:3"))) == [1, 4, 7]
        assert list(array_indices(types_pb2.ArraySpec(first=2, last=4))) == [2, 3, 4]   # step 0 → 1


class TestParseAfter:
    def test_kinds_and_several_ids(self) -> None:
        dep = parse_after("ok:t-1,a-2")
        assert (dep.kind, list(dep.ids)) == (types_pb2.DEPENDENCY_KIND_OK, ["t-1", "a-2"])
        assert parse_after("notok:t-1").kind == types_pb2.DEPENDENCY_KIND_NOTOK
        assert parse_after("ANY:t-1").kind == types_pb2.DEPENDENCY_KIND_ANY
        assert list(parse_after("ok:a-0123456789ab:3,t-1").ids) == ["a-0123456789ab_3", "t-1"]   # one element

    @pytest.mark.parametrize("text", ["t-1", "afterok:t-1", "ok:", "ok:,,"])
    def test_unknown_kinds_and_no_ids_are_refused(self, text: str) -> None:
        with pytest.raises(ValidationError) as err:
            parse_after(text)
        assert err.value.field == "spec.after"


class TestParseBegin:
    def test_relative_and_absolute(self) -> None:
        assert parse_begin("+5s", NOW) == NOW + 5
        assert parse_begin("2h", NOW) == NOW + 7200
        assert parse_begin("2027-01-15T08:00:00Z", NOW) == datetime(2027, 1, 15, 8, tzinfo=UTC).timestamp()

    def test_nonsense_is_refused(self) -> None:
        with pytest.raises(ValidationError) as err:
            parse_begin("tomorrow-ish", NOW)
        assert err.value.field == "spec.begin"


class TestElementIds:
    def test_array_and_index_name_one_element(self) -> None:
        assert element_id("a-0123456789ab", 7) == "a-0123456789ab_7"
        assert array_ref("a-0123456789ab:7") == "a-0123456789ab_7"
        assert array_ref("a-0123456789ab_7") == "a-0123456789ab_7"
        assert array_ref("t-0123456789") == "t-0123456789"
        assert array_ref("a-0123456789ab") == "a-0123456789ab"


class TestSpecFile:
    def test_array_after_and_begin_in_a_spec_file(self) -> None:
        spec = spec_from_mapping({"argv": ["train.py"], "array": "0-9%2", "after": ["ok:t-1", "any:a-2"],
                                  "begin": "+1h", "keep_unmet": True}, now=lambda: NOW)
        assert (spec.array.last, spec.array.max_running) == (9, 2)
        assert [d.kind for d in spec.after] == [types_pb2.DEPENDENCY_KIND_OK, types_pb2.DEPENDENCY_KIND_ANY]
        assert spec.begin_unix_s == NOW + 3600 and spec.keep_unmet

    def test_after_as_one_string_and_array_as_a_mapping(self) -> None:
        spec = spec_from_mapping({"argv": ["x"], "array": {"first": 1, "last": 3}, "after": "notok:t-1"})
        assert spec.array.first == 1 and spec.after[0].kind == types_pb2.DEPENDENCY_KIND_NOTOK

    def test_a_bad_after_entry_names_its_place(self) -> None:
        with pytest.raises(ValidationError) as err:
            spec_from_mapping({"argv": ["x"], "after": [3]})
        assert err.value.field == "spec.after[0]"


class TestValidate:
    def _spec(self, **fields: object) -> types_pb2.TaskSpec:
        return types_pb2.TaskSpec(argv=["true"], **fields)  # type: ignore[arg-type]

    @pytest.mark.parametrize(("spec", "field"), [
        (dict(array=types_pb2.ArraySpec(first=5, last=2)), "spec.array.last"),
        (dict(array=types_pb2.ArraySpec(first=0, last=ARRAY_MAX_ELEMENTS)), "spec.array"),
        (dict(after=[Dep(kind=types_pb2.DEPENDENCY_KIND_UNSPECIFIED, ids=["t-1"])]), "spec.after[0].kind"),
        (dict(after=[Dep(kind=OK, ids=[])]), "spec.after[0].ids"),
        (dict(after=[Dep(kind=OK, ids=["t-1"]), Dep(kind=OK, ids=["a b"])]),
         "spec.after[1].ids"),
        (dict(begin_unix_s=float("nan")), "spec.begin_unix_s"),
        (dict(begin_unix_s=-1.0), "spec.begin_unix_s"),
        (dict(begin_unix_s=4e9 * 10), "spec.begin_unix_s"),
    ])
    def test_refusals_name_the_field(self, spec: dict[str, object], field: str) -> None:
        with pytest.raises(ValidationError) as err:
            validate_spec(self._spec(**spec), 0, now=NOW)
        assert err.value.field == field

    def test_the_largest_array_passes(self) -> None:
        validate_spec(self._spec(array=types_pb2.ArraySpec(first=1, last=ARRAY_MAX_ELEMENTS)), 0, now=NOW)
