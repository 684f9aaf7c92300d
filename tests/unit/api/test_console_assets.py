"""The web console's files (issue 17 item 3): served by the API app without a token or a database,
with the types a browser loads ES modules with, and nothing fetched from elsewhere (no CDN): every
script, stylesheet and import is a path on the API's own origin."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from hivemux.api.app import ApiConfig, create_app
from hivemux.api.routers.console import CONSOLE_DIR

# TestClient outside `with` runs no lifespan: no database, no broker (the console needs neither).
client = TestClient(create_app(ApiConfig(postgres_dsn="postgresql://unused", kafka_bootstrap_servers="unused:9092")))
ASSETS = sorted(p.name for p in CONSOLE_DIR.iterdir() if p.suffix in (".js", ".css", ".html"))


def test_root_redirects_to_the_console_page() -> None:
    response = client.get("/", follow_redirects=False)
    assert response.status_code == 307 and response.headers["location"] == "/console"
    page = client.get("/console")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/console/static/app.js">' in page.text


def test_every_asset_is_served_with_its_type() -> None:
    assert {"app.js", "api.js", "charts.js", "dom.js", "gpus.js", "jobs.js", "services.js", "lanes.js", "vcs.js", "console.css", "index.html"} <= set(ASSETS)
    for name in ASSETS:
        response = client.get(f"/console/static/{name}")
        assert response.status_code == 200, name
        kind = {"js": "javascript", "css": "text/css", "html": "text/html"}[name.rsplit(".", 1)[1]]
        assert kind in response.headers["content-type"], (name, response.headers["content-type"])
    assert client.get("/console/static/../routers/console.py").status_code == 404


def test_nothing_is_loaded_from_another_origin() -> None:
    for name in ASSETS:
        text = (CONSOLE_DIR / name).read_text()
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", text), name
        assert not re.search(r"""\bimport\b[^;]*from\s*["'](?!\./)""", text), name  # ES imports: relative modules only
        assert not re.search(r"@import|url\(\s*['\"]?(https?:)?//", text), name
        assert "innerHTML" not in text and "insertAdjacentHTML" not in text, name  # API text goes in as text nodes


def test_the_console_and_its_files_are_outside_the_openapi_document() -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert not any(p == "/" or p.startswith("/console") for p in paths)
