"""The change stream's rendering (`hivemux.api.changes.ChangeBatch`) and a token's scope
(`hivemux.store.tokens.Principal`), without a database: each principal gets its VCs' jobs, every
GPU (another tenant's offline job name hidden), its VCs' summaries; nothing for it, no message."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from hivemux.api.changes import ChangeBatch
from hivemux.store.tokens import Principal

AT = datetime(2026, 11, 26, 5, 0, tzinfo=UTC)


def batch(**overrides: object) -> ChangeBatch:
    fields: dict[str, object] = {
        "cursor": 42, "at": AT,
        "jobs": [{"job_id": "a-1", "vc": "vc-a"}, {"job_id": "b-1", "vc": "vc-b"}],
        "gpus": [{"gpu_id": "n0/gpu-0", "health": "Healthy", "offline_job": "b-1", "offline_vc": "vc-b", "changed_at": AT}],
        "vcs": [{"vc": "vc-a", "queue": 1}, {"vc": "vc-b", "queue": 2}],
    }  # fmt: skip
    return ChangeBatch(**(fields | overrides))  # type: ignore[arg-type]


def body(message: str | None) -> dict[str, object]:
    assert message is not None
    lines = message.splitlines()
    assert lines[:2] == ["id: 42", "event: change"] and message.endswith("\n\n")
    return json.loads(lines[2].removeprefix("data: "))


@pytest.mark.parametrize(
    ("scope", "jobs", "offline_job", "vcs"),
    [(None, ["a-1", "b-1"], "b-1", ["vc-a", "vc-b"]), (("vc-a",), ["a-1"], "(other tenant)", ["vc-a"]),
     (("vc-b",), ["b-1"], "b-1", ["vc-b"])],
    ids=["admin", "tenant-a", "tenant-b"],
)  # fmt: skip
def test_each_scope_sees_its_jobs_and_vcs_and_every_gpu(scope: tuple[str, ...] | None, jobs: list[str], offline_job: str, vcs: list[str]) -> None:
    shown = body(batch().render(scope))
    assert [j["job_id"] for j in shown["jobs"]] == jobs  # type: ignore[index]
    assert [(g["gpu_id"], g["offline_job"]) for g in shown["gpus"]] == [("n0/gpu-0", offline_job)]  # type: ignore[index]
    assert "offline_vc" not in shown["gpus"][0]  # type: ignore[index]
    assert [v["vc"] for v in shown["vcs"]] == vcs  # type: ignore[index]
    assert shown["cursor"] == 42 and shown["resync"] is False


def test_nothing_for_a_scope_is_no_message_and_renders_are_cached_per_scope() -> None:
    only_b = batch(gpus=[], vcs=None, jobs=[{"job_id": "b-1", "vc": "vc-b"}])
    assert only_b.render(("vc-a",)) is None
    first = only_b.render(("vc-b",))
    assert only_b.render(("vc-b",)) is first
    assert body(batch(jobs=[], gpus=[], vcs=None, resync=True).render(("vc-a",)))["resync"] is True


def test_a_principal_acts_on_its_vcs_and_an_admin_on_all() -> None:
    tenant, admin = Principal("acme", "1f2e3d4c", ("vc-a",), False), Principal("ops", "0a0b0c0d", (), True)
    assert tenant.name == "acme:1f2e3d4c" and tenant.scope() == ("vc-a",) and admin.scope() is None
    assert tenant.may_act_on("vc-a") and not tenant.may_act_on("vc-b") and not tenant.may_act_on(None)
    assert admin.may_act_on("vc-b") and admin.may_act_on(None)
