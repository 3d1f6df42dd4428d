"""Run a peer's conformance suite for OpenAI's Batches API, unchanged, through the stock `openai` client against a
real `batchinfer serve` (PostgreSQL and Redis on 127.0.0.1, a private SeaweedFS S3, one worker).

    python scripts/peer_suite.py PATH/TO/llama-stack [pytest args...]

PATH is a checkout of Llama Stack (github.com/llamastack/llama-stack, now "ogx"); its tests/integration/batches is
copied as it is into a temporary folder and run with this file as a pytest plugin, which gives the fixtures the
suite takes from its own harness (openai_client, text_model_id, embedding_model_id) and the one name it imports
from its package (OpenAIFilePurpose). The result and every test that does not pass: docs/endpoints.md.
"""
from __future__ import annotations

import enum
import os
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"


class OpenAIFilePurpose(enum.StrEnum):  # as the peer's own: the form field is its value
    BATCH = "batch"


def _stub_packages() -> None:
    """The suite's conftest imports OpenAIFilePurpose from its package (renamed over time): each name resolves."""
    for name in ("ogx_api", "llama_stack_api", "llama_stack", "llama_stack.apis", "llama_stack.apis.files"):
        module = sys.modules.setdefault(name, types.ModuleType(name))
        module.OpenAIFilePurpose = OpenAIFilePurpose  # type: ignore[attr-defined]


_stub_packages()


@pytest.fixture(scope="session")
def _stack(tmp_path_factory):
    from api_stack import serve_stack
    from benchmarks.support.services import SeaweedS3

    s3 = SeaweedS3(tmp_path_factory.mktemp("seaweedfs"))
    try:
        model_cache = os.environ.get("BATCHINFER_MODEL_CACHE") or str(Path.home() / ".cache" / "batchinfer" / "models")
        with serve_stack(tmp_path_factory.mktemp("stack"), model_cache,
                         os.environ.get("BATCHINFER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"),
                         "redis://127.0.0.1:6379", s3.env, s3.create_bucket()) as stack:
            yield stack
    finally:
        s3.stop()


@pytest.fixture(scope="session")
def openai_client(_stack):
    from openai import OpenAI

    return OpenAI(base_url=f"{_stack.url}/v1", api_key=_stack.new_key("peer-suite"))


@pytest.fixture(scope="session")
def text_model_id() -> str:
    return MODEL


@pytest.fixture(scope="session")
def embedding_model_id() -> str:
    return MODEL


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    suite = Path(argv[0]) / "tests" / "integration" / "batches"
    if not suite.is_dir():
        print(f"no {suite}: give a checkout of llama-stack", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="peer-suite-") as tmp:
        shutil.copytree(suite, Path(tmp) / "batches", ignore=shutil.ignore_patterns("recordings", "__pycache__"))
        paths = [str(ROOT / "scripts"), str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
        return subprocess.call([sys.executable, "-m", "pytest", "-p", "peer_suite", "-p", "no:cacheprovider",
                                "--rootdir", tmp, "-c", os.devnull, "-rA", str(Path(tmp) / "batches"), *argv[1:]],
                               env=env, cwd=tmp)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
