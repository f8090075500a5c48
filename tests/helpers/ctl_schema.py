"""Validate gptrmctl's ``-o json`` documents against the schemas shipped in ``coordinator/ctl/schemas``."""

from __future__ import annotations

from functools import cache
from typing import Any

import jsonschema
from referencing import Registry, Resource

from coordinator.ctl.jsondoc import load_schemas


@cache
def _registry() -> Registry:
    schemas = load_schemas()
    return Registry().with_resources((name, Resource.from_contents(doc)) for name, doc in schemas.items())


def validate(doc: Any, schema: str) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``doc`` matches ``schemas/<schema>.json``."""
    registry = _registry()
    contents = registry.contents(f"{schema}.json")
    jsonschema.Draft202012Validator(contents, registry=registry).validate(doc)
