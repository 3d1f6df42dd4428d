"""Pydantic's errors on an input line, translated into the problems validation reports: code, param, message."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from batchinfer.errors import shown
from batchinfer.jobs.endpoints.batch_line import InputLine
from batchinfer.jobs.endpoints.kinds import MODELS

# pydantic's error type -> our code (our own validators raise with our code as the type); else FIELD_CODES
ERROR_CODES = {"missing": "missing_field", "invalid_field": "invalid_field"}
FIELD_CODES = {"url": "unsupported_url"}  # any other field that is wrong is an invalid_field
OBJECT_TYPES = ("model_type", "model_attributes_type", "dict_type")
RULES = {name: info.description for model in (InputLine, *MODELS) for name, info in model.model_fields.items()}


@dataclass(frozen=True)
class Problem:
    code: str
    param: str
    message: str
    path: tuple[str | int, ...]  # the param as steps into the line: field names and list indexes


def problems(exc: ValidationError, data: Any, prefix: str = "", model: type[BaseModel] | None = None) -> list[Problem]:
    """model: whose own top-level field rules win (two bodies may describe a field of one name differently)."""
    own = {name: info.description for name, info in model.model_fields.items()} if model else {}
    return [_problem(error, data, prefix, own) for error in exc.errors(include_url=False)]


def first(found: list[Problem]) -> Problem:
    """The one problem reported for an object's fields: objects in order, a missing field before a bad value."""
    parents = list(dict.fromkeys(p.path[:-1] for p in found))
    return min(found, key=lambda p: (parents.index(p.path[:-1]), p.code != "missing_field"))


def one_per_param(found: list[Problem]) -> list[Problem]:
    """A field that fails every member of a union yields an error per member: report the field once."""
    kept: dict[str, Problem] = {}
    for problem in found:
        kept.setdefault(problem.param, problem)
    return list(kept.values())


def _problem(error: ErrorDetails, data: Any, prefix: str, own: dict[str, str | None]) -> Problem:
    path = _path(error["loc"])
    param = _param(prefix, path)
    field = next((step for step in reversed(path) if isinstance(step, str)), "")
    kind = error["type"]
    if len(path) < len(error["loc"]):  # under a union member: the field's own value is wrong, whatever the member said
        kind = "union"
    code = ERROR_CODES.get(kind) or FIELD_CODES.get(field, "invalid_field")
    if kind == "missing":
        message = f"missing field '{param}'"
    elif kind in OBJECT_TYPES:
        message = f"{param} must be an object"
    elif kind in ERROR_CODES:
        message = f"{param} {error['msg']}, got {shown(_value_at(data, path))}"
    else:
        rule = own.get(field) if len(path) == 1 else None
        message = f"{param} must be {rule or RULES.get(field) or error['msg']}, got {shown(_value_at(data, path))}"
    return Problem(code, param, message, path)


def _path(loc: tuple) -> tuple[str | int, ...]:
    """The loc up to the first step that is neither one of our fields nor an index: pydantic's union member
    tags ('str', 'list[TextPart]') and what lies under them belong to the field above."""
    path = []
    for step in loc:
        if not (isinstance(step, int) or step in RULES):
            break
        path.append(step)
    return tuple(path)


def _param(prefix: str, path: tuple[str | int, ...]) -> str:
    text = prefix
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text


def _value_at(data: Any, path: tuple[str | int, ...]) -> Any:
    for step in path:
        data = data[step]
    return data
