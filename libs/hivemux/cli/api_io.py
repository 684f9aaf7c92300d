"""The CLI through the HTTP API: when HIVEMUX_API_URL is set, `hivemux jobs ...` asks the API
(with HIVEMUX_TOKEN) instead of the bus and the database, and prints the same output."""

from __future__ import annotations

import os
from typing import Any

import click

from ..api.client import ApiClient, ApiError


def api_client() -> ApiClient | None:
    url = os.environ.get("HIVEMUX_API_URL")
    if not url:
        return None
    token = os.environ.get("HIVEMUX_TOKEN")
    if not token:
        raise click.ClickException("HIVEMUX_API_URL is set but HIVEMUX_TOKEN is not: set it to a token from `hivemux tokens create`")
    return ApiClient(url, token)


def api_call(client: ApiClient, method: str, path: str, **kwargs: Any) -> Any:
    try:
        return client.request(method, path, **kwargs)
    except ApiError as error:
        raise click.ClickException(str(error)) from error
