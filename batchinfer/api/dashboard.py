"""What the dashboard (static/) needs beyond the Batches API: who the key is, an ended batch's latency
figures (computed once, then cached: the page costs the database no more than `status`), and, for admin
keys, the workers."""
from __future__ import annotations

import threading
from collections import OrderedDict

from fastapi import APIRouter, Depends

from batchinfer.api.auth import api_key, context
from batchinfer.api.errors import APIError
from batchinfer.context import AppContext
from batchinfer.db.models import ApiKey, JobStatus
from batchinfer.jobs import service
from batchinfer.jobs.views.batch_stats import batch_stats
from batchinfer.cluster.registry import open_registry

router = APIRouter(prefix="/v1/dashboard")
_CACHE_SIZE = 256
_stats_cache: OrderedDict[str, dict] = OrderedDict()
_cache_lock = threading.Lock()


@router.get("/me")
def me(key: ApiKey = Depends(api_key)) -> dict:
    return {"id": key.id, "name": key.name, "admin": bool(key.is_admin)}


@router.get("/batches/{batch_id}/stats")
def stats(batch_id: str, ctx: AppContext = Depends(context), key: ApiKey = Depends(api_key)) -> dict:
    job = service.get(ctx, batch_id, owner=service.ANY_OWNER if key.is_admin else key.id)
    if job.status not in JobStatus.TERMINAL or not job.kept_key():
        return {"batch_id": batch_id, "final": False}
    with _cache_lock:
        if batch_id in _stats_cache:
            _stats_cache.move_to_end(batch_id)
            return _stats_cache[batch_id]
    figures = {"batch_id": batch_id, "final": True, **batch_stats(ctx.storage, job.kept_key() or "").to_dict()}
    with _cache_lock:
        _stats_cache[batch_id] = figures
        while len(_stats_cache) > _CACHE_SIZE:
            _stats_cache.popitem(last=False)
    return figures


@router.get("/workers")
def workers(ctx: AppContext = Depends(context), key: ApiKey = Depends(api_key)) -> dict:
    if not key.is_admin:
        raise APIError(403, "Only an admin key sees the workers (batchinfer keys create --admin).", "not_admin")
    if ctx.settings.embedded:
        return {"object": "list", "data": []}
    registry = open_registry(ctx.settings)
    live, dead = registry.live(), registry.dead()
    return {"object": "list", "data": [_worker(w, True) for w in live] + [_worker(w, False) for w in dead]}


def _worker(state, alive: bool) -> dict:
    return {"name": state.name, "model": state.model, "alive": alive, "busy": state.busy and alive, "unit_id": state.unit_id if alive else None,
            "tokens_per_s": state.decode_tokens_per_s or state.prefill_tokens_per_s,
            "prefix_groups": list(state.prefix_keys), "units_done": state.units_done, "beat_at": state.beat_at}
