"""The submit process of `batchinfer bench pipeline`: what `batchinfer submit FILE` does with a broker (store the
input, validate it, ask for a dispatch), with the clock read between the steps. Prints one JSON line."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(path: str) -> None:
    started = time.time()
    from batchinfer.context import AppContext
    from batchinfer.jobs import service
    from batchinfer.jobs.intake.validate_job import validate_job
    from batchinfer.settings import get_settings
    from workers.tasks import stream_dispatch, trigger_dispatch

    ctx = AppContext.create(get_settings(), migrate=False)
    imported = time.time()
    with open(path, "rb") as source:
        job = service.create_job(ctx, source=source, filename=Path(path).name)
    uploaded = time.time()
    job = validate_job(ctx, job.id, on_rows=stream_dispatch)  # used with BATCHINFER_STREAM_DISPATCH only
    validated = time.time()
    trigger_dispatch()
    print(json.dumps({"job_id": job.id, "status": job.status, "started": started, "imported": imported,
                      "uploaded": uploaded, "validated": validated, "dispatch_asked": time.time()}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
