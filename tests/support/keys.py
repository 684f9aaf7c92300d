"""The test suite's keys (`hivemux.bus.signing`): one private key per signer, all in one file,
so whatever a test publishes (with the project's `Publisher`, the audit `Recorder`, or a raw
producer through `signed_headers`) is signed as the principal its ``source`` names, and every
service the test runs, in process or as a subprocess, verifies with the matching keyring.

`tests/conftest.py` makes them once per session and points ``HIVEMUX_SIGNING_KEY`` and
``HIVEMUX_KEYRING`` at them (subprocesses and `hivemux up` inherit them), and makes them this
process's keys. A forgery test sends records without these headers, or signed by another key.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hivemux.bus import signing


def install(directory: Path) -> tuple[Path, Path]:
    """Write the suite's keys into `directory`, export their paths, use them in this process."""
    keys = signing.generate(signing.signers())
    private = signing.write_private(directory / "suite.key", keys)
    keyring = directory / "keyring.json"
    keyring.write_text(json.dumps(signing.public_keyring(keys)))
    os.environ["HIVEMUX_SIGNING_KEY"] = str(private)
    os.environ["HIVEMUX_KEYRING"] = str(keyring)
    signing.configure(str(private), str(keyring))
    return private, keyring


def signed_headers(topic: str, key: bytes | None, value: bytes | None, source: str | None = None) -> list[tuple[str, bytes]]:
    """The headers the project's publisher would give this record (for raw producers): signed as
    `source`, by default the one the value's JSON claims (a test sending hostile *content* as a
    writer that may write the topic, not a forged writer)."""
    if source is None:
        try:
            claimed = json.loads(value or b"").get("source")
        except (ValueError, AttributeError, RecursionError):
            claimed = None
        source = claimed if isinstance(claimed, str) else "cli"
    return signing.process_signer().sign([(topic, key, value, source)])[0]
