"""Job spec files (`hivemux.cli.jobfile.parse_jobs`): one job, a list, or `{jobs: [...]}`, in
YAML or JSON, validated into `JobSubmission`s with readable errors."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from importlib.resources import files
from pathlib import Path

import pytest

from hivemux.cli.jobfile import JobFileError, parse_jobs
from hivemux.events import JobKind, JobSubmission, Priority

ROOT = Path(__file__).resolve().parents[3]
AT = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)

OFFLINE = "job_id: off-1\nvc: vc-a\nkind: offline\nworkload: {model: resnet50, batch_size: 32, iterations: 100}\n"
TRAINING = (
    "job_id: train-1\nvc: vc-b\nkind: training\npods: 2\ngpus_per_pod: 4\npriority: guaranteed\n"
    "priority_value: 100\naffinity_cell_type: node\nworkload: {model: bert, batch_size: 32, iterations: 5000}\n"
    "estimates: {gpu_memory_mib: 9000}\n"
)


def indented(text: str, first: str = "  - ", rest: str = "    ") -> str:
    lines = text.splitlines()
    return "\n".join([first + lines[0], *(rest + line for line in lines[1:])]) + "\n"


def write(tmp_path: Path, text: str, name: str = "jobs.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_single_job(tmp_path: Path) -> None:
    [job] = parse_jobs(write(tmp_path, TRAINING), source="test-cli", at=AT)
    assert isinstance(job, JobSubmission)
    assert (job.job_id, job.vc, job.kind, job.pods, job.gpus_per_pod) == ("train-1", "vc-b", JobKind.TRAINING, 2, 4)
    assert (job.priority, job.priority_value, job.affinity_cell_type) == (Priority.GUARANTEED, 100, "node")
    assert (job.workload.model, job.workload.batch_size, job.workload.iterations) == ("bert", 32, 5000)
    assert job.estimates.gpu_memory_mib == 9000
    assert (job.occurred_at, job.source) == (AT, "test-cli")


def test_event_fields_are_filled_in(tmp_path: Path) -> None:
    [job] = parse_jobs(write(tmp_path, OFFLINE))
    assert job.source == "cli"
    assert job.occurred_at.tzinfo is not None
    [a], [b] = parse_jobs(write(tmp_path, OFFLINE), at=AT), parse_jobs(write(tmp_path, OFFLINE), at=AT)
    assert a.event_id != b.event_id  # each submission is a new event


@pytest.mark.parametrize(
    "text",
    [
        indented(OFFLINE) + indented(TRAINING),
        "jobs:\n" + indented(OFFLINE) + indented(TRAINING),
        "# two jobs\njobs:\n" + indented(OFFLINE) + indented(TRAINING) + "note: ignored\n",
    ],
    ids=["list", "jobs-mapping", "jobs-mapping-with-comment"],
)
def test_several_jobs_in_file_order(tmp_path: Path, text: str) -> None:
    jobs = parse_jobs(write(tmp_path, text), at=AT)
    assert [(j.job_id, j.kind) for j in jobs] == [("off-1", JobKind.OFFLINE), ("train-1", JobKind.TRAINING)]


@pytest.mark.parametrize(
    "payload",
    [
        {"job_id": "off-json", "vc": "vc-a", "kind": "offline", "workload": {"model": "vgg16", "batch_size": 16, "iterations": 10}},
        {"jobs": [{"job_id": "off-json", "vc": "vc-a", "kind": "offline", "workload": {"model": "vgg16", "batch_size": 16, "iterations": 10}}]},
    ],
    ids=["single", "jobs-mapping"],
)
def test_json_file(tmp_path: Path, payload: object) -> None:
    [job] = parse_jobs(write(tmp_path, json.dumps(payload), "jobs.json"), at=AT)
    assert (job.job_id, job.kind, job.workload.model) == ("off-json", JobKind.OFFLINE, "vgg16")


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("jobs.yaml", "job_id: [unclosed\n", "not valid YAML"),
        ("jobs.json", "{\"job_id\": ", "not valid JSON"),
        ("jobs.yaml", OFFLINE.replace("kind: offline", "kind: batch"), "job off-1: kind: Input should be 'online', 'offline' or 'training'"),
        ("jobs.yaml", OFFLINE + "pods: 2\n", "job off-1: offline jobs share one GPU: pods and gpus_per_pod must be 1"),
        ("jobs.yaml", indented(OFFLINE) + indented(OFFLINE), "duplicate job ids off-1"),
        ("jobs.yaml", "", "no jobs in the file"),
        ("jobs.yaml", "# nothing but a comment\n", "no jobs in the file"),
        ("jobs.yaml", "jobs: []\n", "no jobs in the file"),
        ("jobs.yaml", "jobs:\n", "no jobs in the file"),
        ("jobs.yaml", "[]\n", "no jobs in the file"),
        ("jobs.yaml", indented(OFFLINE) + "  - just a string\n", "job #2: expected a mapping, got str"),
        ("jobs.yaml", "just a string\n", "job #1: expected a mapping, got str"),
        ("jobs.yaml", OFFLINE + "colour: blue\n", "job off-1: colour: Extra inputs are not permitted"),
        ("jobs.yaml", OFFLINE.replace("vc: vc-a\n", ""), "job off-1: vc: Field required"),
    ],
    ids=[
        "bad-yaml", "bad-json", "unknown-kind", "offline-with-two-pods", "duplicate-ids", "empty-file",
        "only-comment", "empty-jobs-list", "null-jobs", "empty-list", "non-mapping-item", "scalar-file",
        "unknown-field", "missing-field",
    ],
)  # fmt: skip
def test_errors_say_where_and_why(tmp_path: Path, name: str, text: str, expected: str) -> None:
    path = write(tmp_path, text, name)
    with pytest.raises(JobFileError) as error:
        parse_jobs(path, at=AT)
    message = str(error.value)
    assert message.startswith(f"{path}: ")
    assert expected in message


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    bad = indented(OFFLINE.replace("kind: offline", "kind: batch")) + "  - 42\n" + indented(TRAINING)
    with pytest.raises(JobFileError) as error:
        parse_jobs(write(tmp_path, bad), at=AT)
    message = str(error.value)
    assert "job off-1: kind:" in message and "job #2: expected a mapping, got int" in message
    assert message.count(" | ") == 1


@pytest.mark.parametrize("missing", ["missing.yaml", "missing.json", "."], ids=["no-yaml", "no-json", "a-directory"])
def test_unreadable_file(tmp_path: Path, missing: str) -> None:
    path = tmp_path / missing
    with pytest.raises(JobFileError, match="cannot read: (No such file or directory|Is a directory)") as error:
        parse_jobs(path)
    assert str(error.value).startswith(str(path))


def test_demo_jobs_parse() -> None:
    path = Path(str(files("hivemux.cli") / "demo_jobs.yaml"))
    assert path == ROOT / "libs" / "hivemux" / "cli" / "demo_jobs.yaml"
    jobs = parse_jobs(path, at=AT)
    kinds = {j.kind for j in jobs}
    assert kinds == {JobKind.ONLINE, JobKind.OFFLINE, JobKind.TRAINING}
    assert {j.vc for j in jobs if j.kind is JobKind.ONLINE} == {"vc-a", "vc-b"}  # online services of two VCs (issue 19)
    assert len({j.job_id for j in jobs}) == len(jobs) >= 2


EXAMPLES = sorted((ROOT / "examples" / "jobs").glob("*.yaml"))


def test_examples_exist() -> None:
    assert EXAMPLES, "examples/jobs/*.yaml is empty"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_job_files_parse(path: Path) -> None:
    jobs = parse_jobs(path, at=AT)
    assert jobs and all(isinstance(j, JobSubmission) for j in jobs)


def test_duplicates_in_a_large_file_are_each_named_once(tmp_path: Path) -> None:
    """The duplicate check counts ids once (linear: a 20,000-job file parses in about a second,
    `benchmarks/lifecycle.py`; the pairwise check it replaced took minutes)."""
    items = [{"job_id": f"j-{i % 4998}", "vc": "vc-a", "kind": "offline", "workload": {"model": "vgg16", "batch_size": 8, "iterations": 1}}
             for i in range(5000)]  # fmt: skip
    path = write(tmp_path, json.dumps({"jobs": items}), "jobs.json")
    with pytest.raises(JobFileError) as error:
        parse_jobs(path, at=AT)
    assert str(error.value).endswith("duplicate job ids j-0, j-1")


# -- issue 28 item 7: absurd input is a one-line error naming the field, never a traceback ------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (OFFLINE + "priority_value: 1000\n", "job off-1: priority_value: an opportunistic job has priority_value -1 (or none), not 1000"),
        (OFFLINE + "priority: opportunistic\npriority_value: 0\n", "not 0"),
        (OFFLINE.replace("iterations: 100}", "iterations: 100, command: [" + ", ".join(["x" * 4000] * 260) + "]}"),
         "workload.command: 1040260 bytes, more than the 131072 a command line may take"),
        (OFFLINE.replace("iterations: 100}", "iterations: 100, command: [" + "y" * 1_000_000 + "]}"),
         "workload.command.0: String should have at most 4096 characters"),
        ("job_id: a\nvc: [" * 2000 + "x", "not valid YAML"),
        ("key: 'unterminated\n  more: [\n", "not valid YAML"),
    ],
    ids=["opportunistic-priority-1000", "opportunistic-priority-0", "command-of-1MB-in-args", "command-argument-of-1MB",
         "nested-deep", "broken-yaml"],
)  # fmt: skip
def test_absurd_job_files_give_one_line_naming_the_field(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(JobFileError) as error:
        parse_jobs(write(tmp_path, text), at=AT)
    message = str(error.value)
    assert expected in message and "\n" not in message and len(message) < 2000, message


def test_an_opportunistic_job_gets_priority_minus_one_and_keeps_it_on_the_log(tmp_path: Path) -> None:
    from hivemux.bus.codec import decode_value, encode_value
    from hivemux.topics import JOBS_SUBMITTED

    [job] = parse_jobs(write(tmp_path, OFFLINE), at=AT)
    assert (job.priority, job.priority_value) == (Priority.OPPORTUNISTIC, -1)
    assert decode_value(JOBS_SUBMITTED, encode_value(job)).priority_value == -1
    # a record written before the rule (no priority_value: the default left out) reads as -1
    old = json.loads(encode_value(job))
    del old["priority_value"]
    assert decode_value(JOBS_SUBMITTED, json.dumps(old).encode()).priority_value == -1


def test_binary_and_huge_files_are_one_line_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = tmp_path / "jobs.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage\x80")
    with pytest.raises(JobFileError, match="not UTF-8 text"):
        parse_jobs(binary, at=AT)
    import hivemux.cli.jobfile as jobfile

    monkeypatch.setattr(jobfile, "MAX_FILE_BYTES", 10)
    with pytest.raises(JobFileError, match="more than the 10 a job file may hold"):
        parse_jobs(write(tmp_path, OFFLINE), at=AT)


def test_many_bad_jobs_are_named_in_a_bounded_line(tmp_path: Path) -> None:
    text = "".join(indented(OFFLINE.replace("off-1", f"off-{i}") + "pods: 2\n") for i in range(50))
    with pytest.raises(JobFileError) as error:
        parse_jobs(write(tmp_path, text), at=AT)
    assert "job off-9:" in str(error.value) and "job off-10:" not in str(error.value) and "and 40 more jobs" in str(error.value)
