"""Pydantic's errors on an input line, translated into the problems validation reports: code, param, message, in
OpenAI's codes and wording (batchinfer.error_codes)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from batchinfer import error_codes as E
from batchinfer.errors import shown
from batchinfer.jobs.endpoints.batch_line import InputLine
from batchinfer.jobs.endpoints.kinds import MODELS, URLS

# pydantic's type errors -> the JSON type OpenAI's "Invalid type" message expects
EXPECTED_TYPES = {"string_type": "a string", "int_type": "an integer", "int_from_float": "an integer",
                  "float_type": "a number", "bool_type": "a boolean", "list_type": "an array", "dict_type": "an object",
                  "model_type": "an object", "model_attributes_type": "an object"}
BOUNDS = {"greater_than_equal": ("below_min", ">=", "ge"), "greater_than": ("below_min", ">", "gt"),
          "less_than_equal": ("above_max", "<=", "le"), "less_than": ("above_max", "<", "lt")}
MAX_PROBLEMS = 100  # params of one line translated: the rest are never reported, and each costs a repr
RULES = {name: info.description for model in (InputLine, *MODELS) for name, info in model.model_fields.items()}


@dataclass(frozen=True)
class Problem:
    code: str
    param: str
    message: str
    path: tuple[str | int, ...]  # the param as steps into the line: field names and list indexes


def problems(exc: ValidationError, data: Any, prefix: str = "", model: type[BaseModel] | None = None) -> list[Problem]:
    """model: whose own top-level field rules win (two bodies may describe a field of one name differently).
    One problem a param, the first (what first and one_per_param report), for the first MAX_PROBLEMS params: a union
    of lists fails each member on every item, and 60,000 items must not cost 60,000 messages."""
    own = {name: info.description for name, info in model.model_fields.items()} if model else {}
    kept: dict[str, ErrorDetails] = {}
    for error in exc.errors(include_url=False):
        param = _param(prefix, _path(error["loc"]))
        if param not in kept and len(kept) < MAX_PROBLEMS:
            kept[param] = error
    return [_problem(error, data, prefix, own) for error in kept.values()]


def first(found: list[Problem]) -> Problem:
    """The one problem reported for an object's fields: objects in order, a missing field before a bad value."""
    order: dict[tuple, int] = {}
    for p in found:
        order.setdefault(p.path[:-1], len(order))
    return min(found, key=lambda p: (order[p.path[:-1]], p.code != "missing_required_parameter"))


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
    value = None if kind == "missing" else _value_at(data, path)
    rule = (own.get(field) if len(path) == 1 else None) or RULES.get(field) or error["msg"]
    code, message = _openai(kind, param.removeprefix("body."), error, value, rule)
    return Problem(code, param, message, path)


def openai_problem(error: ErrorDetails, named: str, value: Any) -> tuple[str, str]:
    """OpenAI's code and wording for one of pydantic's errors on a request of the API itself."""
    return _openai(error["type"], named, error, value, error["msg"])


def _openai(kind: str, named: str, error: ErrorDetails, value: Any, rule: str) -> tuple[str, str]:
    """OpenAI's code and wording for one of pydantic's errors; `named` is the field as the endpoint itself names it
    (`messages[0].role`, without the line's `body.`)."""
    ctx = error.get("ctx") or {}
    if kind == "missing":
        return E.code("missing_required_parameter"), E.missing(named)
    if kind in EXPECTED_TYPES:
        return E.code("invalid_type"), E.invalid_type(named, EXPECTED_TYPES[kind], value)
    if kind == "none_required":
        return E.code("unsupported_parameter"), f"Unsupported parameter: {named!r} is not supported by this server."
    if kind == "extra_forbidden":  # a field Anthropic's params have and we do not serve (tools, thinking...)
        return E.code("unsupported_parameter"), f"Unsupported parameter: {named!r} is not supported by this server."
    if kind in BOUNDS:
        side, op, key = BOUNDS[kind]
        number = "decimal" if isinstance(ctx.get(key), float) else "integer"  # the field's kind, as its bound is
        word = "below minimum" if side == "below_min" else "above maximum"
        return (E.code(f"{number}_{side}_value"), f"Invalid {named!r}: {number} {word} value. Expected a value "
                f"{op} {ctx.get(key)}, but got {shown(value)} instead.")
    if kind in ("string_too_short", "too_short") and value == "":  # too_short: a length rule after our validator
        return E.code("empty_string"), (f"Invalid {named!r}: empty string. Expected a string with minimum length "
                                        f"{ctx.get('min_length')}, but got an empty string instead.")
    if kind == "string_too_long" or (kind == "too_long" and isinstance(value, str)):
        return E.code("string_above_max_length"), (f"Invalid {named!r}: string too long. Expected a string with maximum "
                                                   f"length {ctx.get('max_length')}, but got a string with length "
                                                   f"{len(value)} instead.")
    if kind == "too_short" and value == []:
        return E.code("empty_array"), (f"Invalid {named!r}: empty array. Expected an array with minimum length "
                                       f"{ctx.get('min_length')}, but got an empty array instead.")
    if kind == "too_long" and isinstance(value, list):
        return E.code("array_above_max_length"), (f"Invalid {named!r}: array too long. Expected an array with maximum "
                                                  f"length {ctx.get('max_length')}, but got an array with length "
                                                  f"{len(value)} instead.")
    if kind == "literal_error":
        return E.code("invalid_value"), f"Invalid value: {shown(value)}. Supported values are: {ctx.get('expected')}."
    if kind == "invalid_url":  # our own validator: not an endpoint served here
        return E.code("invalid_url"), (f"The URL provided for this request is not supported: {shown(value)}. Supported "
                                       f"values are: {E.listed(list(URLS))}.")
    if kind in ("invalid_field", "value_error"):  # our own validators' rules: the message says it
        reason = error["msg"].removeprefix("Value error, ")
        return E.code("invalid_value"), f"Invalid value for {named!r}: {reason} (got {shown(value)})."
    return E.code("invalid_value"), f"Invalid value for {named!r}: expected {rule}, but got {shown(value)}."


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
