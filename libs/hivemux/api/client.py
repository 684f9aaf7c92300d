"""The API's client for the CLI (`hivemux jobs ...` with ``HIVEMUX_API_URL`` and
``HIVEMUX_TOKEN`` set): plain HTTP with the bearer token; a refusal is an `ApiError` carrying
the status and the API's reason."""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime
from typing import Any

import httpx

from ..errors import HivemuxError
from ..store.read_models import JobEventRecord, JobRow


class ApiError(HivemuxError):
    def __init__(self, status: int, detail: Any) -> None:
        self.status = status
        self.detail = detail
        if isinstance(detail, list):  # a 422: each field and what is wrong with it
            detail = "; ".join(f"{'.'.join(map(str, d.get('loc', ())))}: {d.get('msg')}" for d in detail if isinstance(d, dict))
        super().__init__(f"the API refused ({status}): {detail}")


class ApiClient:
    def __init__(self, url: str, token: str, *, timeout_s: float = 70.0) -> None:
        self._client = httpx.Client(base_url=url.rstrip("/"), headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as error:
            raise ApiError(0, f"cannot reach the API at {self._client.base_url}: {error}") from error
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise ApiError(response.status_code, detail)
        return response.json()

    def close(self) -> None:
        self._client.close()


def _at(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def job_row(d: dict[str, Any]) -> JobRow:
    """A job as the API sends it (`views.job_json`), back into the row the CLI prints."""
    known = {f.name for f in fields(JobRow)}  # a describe's extras (service, lane_gpu) are read apart
    return JobRow(**{**{k: v for k, v in d.items() if k in known}, "submitted_at": _at(d["submitted_at"]), "updated_at": _at(d["updated_at"])})


def event_record(d: dict[str, Any]) -> JobEventRecord:
    return JobEventRecord(**{**d, "occurred_at": _at(d["occurred_at"])})
