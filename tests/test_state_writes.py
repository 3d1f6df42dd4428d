"""Only the state machine (batchinfer/jobs/state) writes jobs, requests and work units: every other module of
the product may read them, never change them. Checked on the syntax tree of each module."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / "batchinfer" / "jobs" / "state"
MODELS = {"Job", "Request", "WorkUnit"}
TABLES = re.compile(r"\b(update|insert\s+into|delete\s+from)\s+(jobs|requests|work_units)\b", re.IGNORECASE)


def _product_modules() -> list[Path]:
    files = sorted((ROOT / "batchinfer").rglob("*.py")) + sorted((ROOT / "workers").rglob("*.py"))
    return [f for f in files if STATE not in f.parents]


def _imports_models(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.ImportFrom) and node.module == "batchinfer.db.models"
               and MODELS & {alias.name for alias in node.names} for node in ast.walk(tree))


def _writes(tree: ast.Module) -> list[str]:
    """Each write of a job, request or unit row in `tree`, as `line: what`."""
    found = []
    models = _imports_models(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            first = node.args[0] if node.args else None
            if node.func.id in {"update", "insert", "delete"} and isinstance(first, ast.Name) and first.id in MODELS:
                found.append(f"{node.lineno}: {node.func.id}({first.id})")
            if node.func.id in MODELS and models:
                found.append(f"{node.lineno}: new {node.func.id} row")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in {"update", "insert", "delete"}:
            target = node.func.value
            if isinstance(target, ast.Attribute) and target.attr == "__table__" and getattr(target.value, "id", None) in MODELS:
                found.append(f"{node.lineno}: {target.value.id}.__table__.{node.func.attr}()")  # type: ignore[attr-defined]
        if isinstance(node, (ast.Assign, ast.AugAssign)) and models:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for leaf in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    if isinstance(leaf, ast.Attribute) and leaf.attr == "status":
                        found.append(f"{node.lineno}: assigns .status")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and TABLES.search(node.value):
            found.append(f"{node.lineno}: SQL text {TABLES.search(node.value).group(0)!r}")  # type: ignore[union-attr]
    return found


def test_only_the_state_package_writes_jobs_requests_and_units():
    offenders = {str(f.relative_to(ROOT)): w for f in _product_modules() if (w := _writes(ast.parse(f.read_text())))}
    assert offenders == {}, "write through batchinfer.jobs.state instead: " + repr(offenders)


@pytest.mark.parametrize("source, what", [
    ("from batchinfer.db.models import Job\nsession.execute(update(Job).values(status='queued'))", "update(Job)"),
    ("from batchinfer.db.models import WorkUnit\nsession.add(WorkUnit(id='u', status='queued'))", "new WorkUnit row"),
    ("from batchinfer.db.models import Job\njob.status, job.queued_at = 'queued', 1.0", "assigns .status"),
    ("from batchinfer.db.models import Request\nsession.execute(delete(Request))", "delete(Request)"),
    ("text('UPDATE requests SET status = 1')", "SQL text"),
])
def test_the_check_sees_each_kind_of_write(source, what):
    assert any(what in w for w in _writes(ast.parse(source)))


def test_the_state_package_itself_is_seen_writing():
    """The check is not vacuous: the moves it exempts are found by it."""
    assert any(_writes(ast.parse(f.read_text())) for f in STATE.glob("*.py"))


STAGES = ("intake", "dispatch", "units", "finalize")  # a request's way, in order; state/ is the floor beneath
JOBS = ROOT / "batchinfer" / "jobs"


def _imports(tree: ast.Module) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_moves_its_rows_through_the_state_package(stage):
    """A stage is a package of its own, and what it changes of jobs, requests and units goes through state/:
    some module of it calls a move there, and none writes a row itself (the check above)."""
    modules = sorted((JOBS / stage).glob("*.py"))
    assert (JOBS / stage / "__init__.py") in modules and len(modules) > 1
    assert any(name.startswith("batchinfer.jobs.state") for f in modules for name in _imports(ast.parse(f.read_text())))


def _storage_keys(tree: ast.Module) -> list[str]:
    """String literals and f-strings that spell a key of the job system's own files (jobs/..., units/...)."""
    found = []
    for node in ast.walk(tree):
        head = node.values[0] if isinstance(node, ast.JoinedStr) and node.values else node
        if isinstance(head, ast.Constant) and isinstance(head.value, str) and head.value.startswith(("jobs/", "units/")):
            found.append(f"{node.lineno}: {head.value!r}")
    return found


def test_only_the_record_store_names_the_job_systems_files():
    """Every internal file (prepared parts, invalid lines, unit inputs and results, a job's output) has one owner:
    batchinfer/jobs/record_store.py says where it lives and reads and writes it."""
    store = JOBS / "record_store.py"
    offenders = {str(f.relative_to(ROOT)): keys for f in _product_modules()
                 if f != store and (keys := _storage_keys(ast.parse(f.read_text())))}
    assert offenders == {}, "name the file through batchinfer.jobs.record_store: " + repr(offenders)
    assert _storage_keys(ast.parse(store.read_text()))  # not vacuous
