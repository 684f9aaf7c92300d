"""Workloads' output shipped off the node (issue 29 item 6): `JobLogChunk` on ``jobs.logs``.

A chunk is a bounded piece of one log stream: the output (stdout and stderr) of one pod of a
job on one node, numbered by byte offset in that node's log file (`hivemux.jobs.log_bound`
cuts them). The text is the bytes decoded as UTF-8 with invalid sequences (and NUL, which no
read model can store) replaced by U+FFFD; ``length`` is how many bytes of the file it stands
for, so the next chunk starts at ``offset + length`` unless bytes were left out between them
(the head/tail bound: the gap is what was dropped). The text is user output: untrusted, shown
escaped (console) or with control characters replaced (CLI).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from .base import Event, JobId, Name

# One record's bytes of output at most (its text has at most as many characters: each byte
# decodes to at most one character).
MAX_CHUNK_BYTES = 16 * 1024
# The largest head or tail a producer may claim to keep per stream (a hostile record cannot make
# the read model keep more than this per stream).
MAX_KEPT_BYTES = 64 * 1024 * 1024
MAX_OFFSET = 2**62


class JobLogChunk(Event):
    """Output of one pod of a job, ``offset .. offset + length`` of its log on ``node_id``."""

    job_id: JobId
    node_id: Name
    pod: int = Field(ge=0, le=4096, description="The pod (replica) index: its binding's `<job>/<index>`; 0 for a one-pod job")
    offset: int = Field(ge=0, le=MAX_OFFSET, description="Byte offset of this chunk in the pod's log on that node")
    length: int = Field(ge=1, le=MAX_CHUNK_BYTES, description="Bytes of the log this chunk stands for")
    text: str = Field(max_length=MAX_CHUNK_BYTES, description="Those bytes as UTF-8, invalid sequences and NUL replaced by U+FFFD")
    head_bytes: int = Field(ge=0, le=MAX_KEPT_BYTES, description="The stream's bound: its first head_bytes are kept")
    tail_bytes: int = Field(ge=0, le=MAX_KEPT_BYTES, description="... and its last tail_bytes; what lies between is dropped")

    @model_validator(mode="after")
    def _text_fits_its_bytes(self) -> "JobLogChunk":
        if len(self.text) > self.length:
            raise ValueError(f"{len(self.text)} characters cannot stand for {self.length} bytes")
        if "\x00" in self.text:
            raise ValueError("NUL in a log chunk's text (producers replace it with U+FFFD)")
        return self
