"""Cutting a log stream into bounded chunks with its head and tail kept (`hivemux.jobs.log_bound`)."""

from __future__ import annotations

import random

import pytest

from hivemux.jobs.log_bound import LogBound, cut, decode, plan_read

SMALL = LogBound(head_bytes=10, tail_bytes=8, chunk_bytes=4)


@pytest.mark.parametrize(
    ("offset", "size", "planned"),
    [
        (0, 0, ()),
        (0, 5, ((0, 5),)),
        (0, 18, ((0, 18),)),  # head and tail meet: nothing dropped
        (0, 30, ((0, 10), (22, 30))),  # the docstring's example: 10..22 dropped
        (10, 30, ((22, 30),)),
        (30, 31, ((30, 31),)),
        (30, 30, ()),
        (4, 12, ((4, 12),)),
    ],
    ids=["empty", "small", "head-meets-tail", "burst", "past-head-burst", "one-byte", "nothing-new", "head-and-after"],
)
def test_plan_read_keeps_what_is_left_of_the_head_and_at_most_the_tail(offset: int, size: int, planned: tuple) -> None:
    assert plan_read(offset, size, SMALL) == planned


def read(data: bytes, offset: int, bound: LogBound, *, final: bool = False):  # type: ignore[no-untyped-def]
    ranges = tuple((s, data[s:e]) for s, e in plan_read(offset, len(data), bound))
    return cut(ranges, bound, offset=offset, final=final)


def test_the_docstring_example_ships_head_and_tail_and_says_where_the_gap_is() -> None:
    data = bytes(range(65, 95))  # 30 ASCII bytes
    made = read(data, 0, SMALL)
    assert [(p.offset, p.length) for p in made.pieces] == [(0, 4), (4, 4), (8, 2), (22, 4), (26, 4)]
    assert "".join(p.text for p in made.pieces) == (data[:10] + data[22:]).decode()
    assert made.next_offset == 30


def test_a_stream_read_a_little_at_a_time_is_shipped_whole_and_in_order() -> None:
    rng = random.Random(7)
    text = "".join(rng.choice(["a", "é", "€", "𝄞", "\n"]) for _ in range(400)).encode()
    bound = LogBound(head_bytes=1 << 20, tail_bytes=1 << 20, chunk_bytes=16)
    offset, shipped, size = 0, [], 0
    while size < len(text):
        size = min(len(text), size + rng.randint(1, 40))  # the file grows in arbitrary steps, mid-character too
        made = read(text[:size], offset, bound, final=size == len(text))
        assert all(p.length <= 16 for p in made.pieces)
        assert all(a.offset + a.length == b.offset for a, b in zip(made.pieces, made.pieces[1:]))
        shipped += made.pieces
        offset = made.next_offset
    assert offset == len(text)
    assert "".join(p.text for p in shipped) == text.decode()  # no character was ever split
    assert "\ufffd" not in "".join(p.text for p in shipped)


def test_an_incomplete_character_waits_unless_the_stream_ended() -> None:
    data = "ab€".encode()[:-1]  # the euro sign's last byte is not written yet
    waiting = read(data, 0, SMALL)
    assert ("".join(p.text for p in waiting.pieces), waiting.next_offset) == ("ab", 2)
    ended = read(data, 2, SMALL, final=True)
    assert ([p.text for p in ended.pieces], ended.next_offset) == (["\ufffd"], 4)


def test_invalid_utf8_and_nul_are_replaced_and_control_characters_kept_for_the_reader_to_escape() -> None:
    assert decode(b"ok\xff\x00\x1b[31mred\n") == "ok\ufffd\ufffd\x1b[31mred\n"


def test_a_burst_past_the_head_keeps_the_tail_and_starts_at_a_character_boundary() -> None:
    bound = LogBound(head_bytes=0, tail_bytes=5, chunk_bytes=4)
    data = "x" * 20 + "€€"  # the tail's first byte falls inside the first euro sign (3 bytes each)
    made = read(data.encode(), 0, bound)
    assert "".join(p.text for p in made.pieces) == "€"
    assert made.pieces[0].offset == 23 and made.next_offset == 26


def test_whatever_a_workload_prints_at_most_head_plus_tail_is_shipped() -> None:
    rng = random.Random(3)
    bound = LogBound(head_bytes=100, tail_bytes=50, chunk_bytes=16)
    offset, size, shipped = 0, 0, 0
    for _ in range(200):
        size += rng.randint(0, 400)
        made = read(b"y" * size, offset, bound)
        shipped_now = sum(p.length for p in made.pieces)
        assert shipped_now <= max(0, 100 - offset) + 50
        shipped += shipped_now
        offset = made.next_offset
    assert offset == size
    assert shipped < size


def test_a_bound_needs_room_for_a_character() -> None:
    with pytest.raises(ValueError):
        LogBound(chunk_bytes=3)
