"""The CLI as a client of `batchinfer serve` (BATCHINFER_API_URL + BATCHINFER_API_KEY): HTTP only, so the
machine needs no database, broker, storage settings or model."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import BinaryIO, Sequence

import httpx

from batchinfer.db.models import JobStatus
from batchinfer.errors import BatchInferError, InvalidRequest, JobNotFound


class ApiClient:
    def __init__(self, url: str, key: str | None, timeout: float = 60.0, submit_wait_s: float = 600.0):
        if not key:
            raise BatchInferError("BATCHINFER_API_KEY is not set (make one with `batchinfer keys create` on the server)")
        self.http = httpx.Client(base_url=url.rstrip("/"), headers={"Authorization": f"Bearer {key}"}, timeout=timeout)
        self.submit_wait_s = submit_wait_s

    def _call(self, method: str, path: str, **kwargs) -> dict:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise BatchInferError(f"cannot reach the API at {self.http.base_url}: {exc}") from None
        if response.status_code >= 400:
            raise _error(response)
        return response.json()

    def submit(self, path: Path, metadata: dict, completion_window: str | None, skip_invalid: bool,
               strict: bool = False) -> dict:
        with open(path, "rb") as source:
            uploaded = self._call("POST", "/v1/files", files={"file": (path.name, source, "application/jsonl")},
                                  data={"purpose": "batch"})
        body = {"input_file_id": uploaded["id"], "endpoint": _endpoint_of(path),
                "completion_window": completion_window or "24h", "metadata": metadata or None,
                "skip_invalid": skip_invalid, "strict": strict}
        batch = self._call("POST", "/v1/batches", json=body)
        return self._wait_validated(batch)

    def _wait_validated(self, batch: dict) -> dict:
        """Validation runs on a worker: wait for its verdict, but not forever (no worker, or its broker down:
        the batch goes on by itself later), and never lose the batch id on the way out."""
        deadline = time.monotonic() + self.submit_wait_s
        while batch["status"] == JobStatus.VALIDATING:
            if time.monotonic() >= deadline:
                raise BatchInferError(f"batch {batch['id']} is created but still validating after {self.submit_wait_s:g} s "
                                      "(no worker has validated it yet: are the workers or their broker down?); it goes "
                                      f"on by itself once one does: follow it with `batchinfer status {batch['id']}`")
            time.sleep(0.5)
            try:
                batch = self.get(batch["id"])
            except BatchInferError as exc:
                raise BatchInferError(f"batch {batch['id']} is created; following its validation failed: {exc}") from None
        return batch

    def get(self, batch_id: str) -> dict:
        return self._call("GET", f"/v1/batches/{batch_id}")

    def prefix_groups(self, batch_id: str) -> list[dict]:
        return self._call("GET", f"/v1/batches/{batch_id}/prefix_groups")["data"]

    def list(self, limit: int, all_: bool = False) -> list[dict]:
        params = {"limit": min(limit, 100), **({"all": "true"} if all_ else {})}
        return self._call("GET", "/v1/batches", params=params)["data"]

    def cancel(self, batch_id: str) -> dict:
        return self._call("POST", f"/v1/batches/{batch_id}/cancel")

    def pause(self, batch_id: str) -> dict:
        return self._call("POST", f"/v1/batches/{batch_id}/pause")

    def resume(self, batch_id: str) -> dict:
        return self._call("POST", f"/v1/batches/{batch_id}/resume")

    def retry(self, batch_id: str, codes: Sequence[str], completion_window: str | None) -> dict:
        body = {"error_codes": codes or None, "completion_window": completion_window}
        return self._wait_validated(self._call("POST", f"/v1/batches/{batch_id}/retry", json=body))

    def download_merged(self, batch: dict, target: BinaryIO) -> bool:
        if batch["output_file_id"] is None:
            raise BatchInferError(f"batch {batch['id']} is {batch['status']}; its results are ready when it has ended")
        return self._stream(f"/v1/files/{batch['output_file_id']}/content", target, params={"merged": "true"})

    def plan(self, path: Path) -> dict:
        with open(path, "rb") as source:
            uploaded = self._call("POST", "/v1/files", files={"file": (path.name, source, "application/jsonl")},
                                  data={"purpose": "batch"})
        try:
            return self._call("POST", "/v1/batches/estimate", json={"input_file_id": uploaded["id"]})
        finally:
            self._call("DELETE", f"/v1/files/{uploaded['id']}")

    def download(self, batch: dict, target: BinaryIO, errors: bool = False) -> bool:
        file_id = batch["error_file_id" if errors else "output_file_id"]
        if file_id is None:
            if batch["status"] not in JobStatus.TERMINAL:
                raise BatchInferError(f"batch {batch['id']} is {batch['status']}; its results are ready when it has ended")
            return False
        return self._stream(f"/v1/files/{file_id}/content", target)

    def _stream(self, path: str, target: BinaryIO, **kwargs) -> bool:
        with self.http.stream("GET", path, **kwargs) as response:
            if response.status_code >= 400:
                response.read()
                raise _error(response)
            for chunk in response.iter_bytes(1024 * 1024):
                target.write(chunk)
        return True


def _endpoint_of(path: Path) -> str:
    """The batch's endpoint is its first line's url (the server checks every line)."""
    with open(path, "rb") as source:
        for raw in source:
            if raw.strip():
                try:
                    url = json.loads(raw).get("url")
                except (ValueError, AttributeError):
                    break
                return url if isinstance(url, str) and url.startswith("/v1/") else "/v1/chat/completions"
    return "/v1/chat/completions"


def _error(response: httpx.Response) -> BatchInferError:
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text[:300]
    if response.status_code == 404:
        return JobNotFound(message)
    if response.status_code == 400:
        return InvalidRequest(message)
    return BatchInferError(f"{message} (HTTP {response.status_code})")
