"""The one table of error codes (batchinfer/error_codes.py): every code validation and the API answer with is in it,
every code in it is documented, and ours (where OpenAI has no code) are named as ours."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from batchinfer import error_codes

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]
DOCS = "".join((ROOT / "docs" / name).read_text() for name in ("batch-format.md", "api.md", "endpoints.md"))
# where a code is written: a validation problem, LineError, InvalidRequest/JobConflict code=..., APIError(status, msg, code)
WRITTEN = re.compile(r'_Rejected\(\("(\w+)"|LineError\([^,]+, "(\w+)"|code="(\w+)"|E\.code\("(\w+)"\)')


def _written_codes() -> set[str]:
    found = set()
    for path in (ROOT / "batchinfer").rglob("*.py"):
        for match in WRITTEN.finditer(path.read_text()):
            found.add(next(g for g in match.groups() if g))
    return found


def test_every_code_written_in_the_product_is_in_the_table():
    written = _written_codes()
    assert written and written - set(error_codes.TABLE) == set()


def test_every_code_is_documented_and_ours_are_named_as_ours():
    undocumented = [c for c in error_codes.TABLE if f"`{c}`" not in DOCS]
    assert undocumented == []
    differences = (ROOT / "docs" / "endpoints.md").read_text().split("## Where we differ from OpenAI")[1]
    assert [c for c, e in error_codes.TABLE.items() if e.ours and f"`{c}`" not in differences] == []


def test_a_code_not_in_the_table_fails_where_it_is_written():
    with pytest.raises(KeyError, match="not in batchinfer.error_codes.TABLE"):
        error_codes.code("invalid_field")
