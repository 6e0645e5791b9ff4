"""Table and property tests for the line framer."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflashd.logs.framer import Frame, LineFramer
from dflashd.logs.records import LineRecord, reassemble


def frame_all(chunks: list[bytes], max_line_bytes: int = 64) -> list[LineRecord]:
    """Run chunks through a framer and turn the frames into line records."""
    framer = LineFramer(max_line_bytes)
    frames: list[Frame] = []
    for chunk in chunks:
        frame = framer.feed(chunk)
        if frame is not None:
            frames.append(frame)
    last = framer.flush()
    if last is not None:
        frames.append(last)
    records = []
    for frame in frames:
        flags = frame.flags or [(False, None)] * len(frame.lines)
        for line, (partial, eol) in zip(frame.lines, flags, strict=True):
            records.append(LineRecord("t", 0, 1, "stdout", line, partial, eol))
    return records


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        ([b"a\nb\n"], [("a", False, None), ("b", False, None)]),
        ([b"a", b"b\n"], [("ab", False, None)]),
        ([b"win\r\n"], [("win", False, "\r\n")]),
        ([b"win\r", b"\nnext\n"], [("win", False, "\r\n"), ("next", False, None)]),
        ([b"10%\r20%\r30%\n"], [("10%", False, "\r"), ("20%", False, "\r"), ("30%", False, None)]),
        ([b"no eol"], [("no eol", True, None)]),
        ([b"\n\n"], [("", False, None), ("", False, None)]),
        ([b"a\xffb\n"], [("a\ufffdb", False, None)]),
        ([b"x" * 10 + b"\n"], [("x" * 8, True, None), ("xx", False, None)]),
        ([b"cr end\r"], [("cr end", False, "\r")]),
    ],
)
def test_framer_table(chunks: list[bytes], expected: list[tuple[str, bool, str | None]]) -> None:
    """Each input frames into exactly the expected (line, partial, eol) records."""
    got = [(r.line, r.partial, r.eol) for r in frame_all(chunks, max_line_bytes=8)]
    assert got == expected


def test_overlong_line_is_cut_at_character_boundary() -> None:
    """A cut never splits a multi-byte character, so every piece decodes cleanly."""
    text = "é" * 20 + "\n"  # 2 bytes per character
    records = frame_all([text.encode()], max_line_bytes=7)
    assert all("\ufffd" not in r.line for r in records)
    assert all(len(r.line.encode()) <= 7 for r in records)
    assert reassemble(records) == text


def test_progress_bar_redraws_never_build_a_giant_line() -> None:
    """tqdm-style output (\\r redraws, no newline for a long time) stays in bounded records."""
    framer = LineFramer(1024)
    longest = 0
    for i in range(10_000):
        frame = framer.feed(f"\r{i / 100:6.2f}% |{'#' * (i % 50)}|".encode())
        if frame is not None:
            longest = max(longest, *(len(line) for line in frame.lines))
        assert framer.pending_bytes <= 1024
    assert 0 < longest <= 1024


def test_unterminated_flood_is_cut_into_partials() -> None:
    """Megabytes without a newline come out as partial records of at most max_line_bytes."""
    framer = LineFramer(4096)
    pieces = []
    for _ in range(256):
        frame = framer.feed(b"z" * 4000)
        if frame is not None:
            assert frame.flags is not None and all(partial for partial, _ in frame.flags)
            pieces.extend(frame.lines)
        assert framer.pending_bytes <= 4096
    rest = framer.flush()
    assert rest is not None
    assert "".join(pieces) + rest.lines[0] == "z" * 4000 * 256


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=400),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=12),
    max_line=st.integers(min_value=4, max_value=80),
)
def test_any_valid_utf8_comes_back_whole(text: str, cuts: list[int], max_line: int) -> None:
    """Valid UTF-8 chunked any way reassembles to exactly the input."""
    data = text.encode()
    bounds = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in pairwise(bounds)]
    records = frame_all(chunks, max_line_bytes=max_line)
    assert reassemble(records) == text
    assert all(len(r.line.encode()) <= max_line for r in records)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=600), cuts=st.lists(st.integers(0, 600), max_size=10))
def test_any_bytes_never_crash_and_keep_line_structure(data: bytes, cuts: list[int]) -> None:
    """Arbitrary bytes never raise; newline count and valid text survive, bad bytes become U+FFFD."""
    bounds = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in pairwise(bounds)]
    records = frame_all(chunks, max_line_bytes=4096)
    out = reassemble(records)
    assert out.count("\n") == data.count(b"\n")
    assert out == data.decode("utf-8", "replace")


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12)),
    n=st.integers(0, 30),
)
def test_a_frames_last_lines_are_its_last_lines(lines: list[str], n: int) -> None:
    """``last_lines`` of a scanned frame (bytes, decoded only at its end) is the list's tail."""
    frame = LineFramer(4096).feed("".join(f"{line}\n" for line in lines).encode())
    if frame is None:
        assert lines == []
        return
    assert frame.last_lines(n) == (lines[-n:] if n else [])
    assert frame.last_lines(n) == (frame.lines[-n:] if n else [])
