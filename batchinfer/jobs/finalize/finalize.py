"""A job's finalize: once no request of it is open, its output and error files are assembled and it ends."""
from __future__ import annotations

import time
from functools import partial

from batchinfer.context import AppContext
from batchinfer.db.session import retrying
from batchinfer.jobs import outage
from batchinfer.jobs.faults import service_of
from batchinfer.jobs.finalize.assembly import assemble
from batchinfer.jobs.state import ending


def try_finalize(ctx: AppContext, job_id: str) -> bool:
    """Assemble the files once no request is open. A conditional UPDATE lets one caller at a time do it; a
    finalize that an outage stops is tried again every outage_backoff_s until the service answers; one that
    fails otherwise is retried by the sweep with backoff, and fails the job at the end."""
    claimed = retrying(ctx.sessions, lambda session: ending.claim_finalize(session, job_id, time.time()))
    if claimed is None:
        return False
    try:
        retrying(ctx.sessions, lambda session: ending.end_finalized(session, job_id, claimed,
                                                                    *assemble(session, ctx.storage, job_id)))
        return True
    except Exception as exc:  # storage or database still failing after retries: try again later
        service = service_of(exc)
        if service is not None:
            outage.report_down(ctx, service, exc)
        retrying(ctx.sessions, partial(ending.finalize_failed, job_id=job_id, claimed=claimed, exc=exc,
                                       outage_s=ctx.settings.outage_backoff_s if service else None))
        return False
