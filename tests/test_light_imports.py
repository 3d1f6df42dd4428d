"""`submit`, `status` and the API never import torch: 50 concurrent `batchinfer submit` processes each paid
~230 MiB and seconds of CPU for it (`batchinfer bench load`). Only a process that builds a model may."""
from __future__ import annotations

import subprocess
import sys

from jobfiles import chat_line

PROBE = """
import io, sys
import batchinfer.cli.app, batchinfer.api.app, workers.tasks
from batchinfer.context import AppContext
from batchinfer.jobs import service
from batchinfer.settings import Settings
ctx = AppContext.create(Settings(data_dir=sys.argv[1], model_cache=sys.argv[2], broker_url="redis://127.0.0.1:1/0"), migrate=True)
job = service.submit(ctx, io.BytesIO(sys.argv[3].encode()), "probe.jsonl")
service.get(ctx, job.id)
print(job.status, "torch" in sys.modules)
"""


def test_validating_a_file_and_reading_status_never_import_torch(tmp_path, model_cache):
    done = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "data"), model_cache, chat_line("a", "Hi") + "\n"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["queued", "False"]
