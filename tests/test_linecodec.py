"""The log path's inner loops: the C build and the Python reference agree, byte for byte.

Where the C module was not built (no compiler at install time) the comparisons are skipped,
visibly; CI sets ``DFLASHD_REQUIRE_C_LINES=1`` so a silent fallback there fails instead.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflashd.logs import linecodec
from dflashd.logs.drain import grow_pipe, pending_bytes
from dflashd.logs.framer import Frame, LineFramer
from dflashd.logs.limits import MIN_LINE_BYTES
from dflashd.logs.records import LineRecord, decode, encode_frame, reassemble

try:
    _lines = importlib.import_module("dflashd.logs._lines")
except ImportError:  # the build had no compiler
    _lines = None

needs_c = pytest.mark.skipif(_lines is None, reason="the C inner loops were not built here")

# Mostly the bytes a log is made of, with every troublesome one in reach.
LOG_BYTES = st.binary(max_size=400) | st.text(
    alphabet=st.sampled_from([*"abc xyz019=:,.", "\n", '"', "\\", "\t", "\x1b", "\x7f", "é"]),
    max_size=400,
).map(str.encode)


def test_ci_runs_the_c_loops_when_it_says_so() -> None:
    if os.environ.get("DFLASHD_REQUIRE_C_LINES") == "1":
        assert linecodec.CODEC.implementation == "c"
    else:
        assert linecodec.CODEC.implementation in {"c", "python"}


def test_pure_python_is_chosen_when_asked() -> None:
    env = {**os.environ, "DFLASHD_PURE_PYTHON": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from dflashd.logs.linecodec import CODEC; print(CODEC.implementation)",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "python"


@needs_c
@settings(max_examples=500, deadline=None)
@given(data=LOG_BYTES, max_line=st.integers(0, 64))
def test_scan_agrees(data: bytes, max_line: int) -> None:
    assert _lines.scan(data, max_line) == linecodec.scan_python(data, max_line)


WORDS = st.lists(
    st.binary(max_size=6) | st.sampled_from([b"nan", b"inf", b"poch", b"loss"]), max_size=3
)


@needs_c
@settings(max_examples=500, deadline=None)
@given(
    data=LOG_BYTES | st.lists(st.sampled_from(b"nafipochls x\n"), max_size=300).map(bytes),
    words=WORDS,
)
def test_mentions_agrees(data: bytes, words: list[bytes]) -> None:
    """Words of every length (none, shorter than the three bytes compared at once, longer),
    anywhere: at the start, across a 64-byte block's end, in the last bytes."""
    assert _lines.mentions(data, tuple(words)) == linecodec.mentions_python(data, tuple(words))


@needs_c
@settings(max_examples=500, deadline=None)
@given(
    data=LOG_BYTES,
    head=st.binary(max_size=40),
    mid=st.binary(max_size=40),
    tail=st.binary(max_size=8),
    seq0=st.integers(0, 2**63 - 2**20),
)
def test_encode_agrees(data: bytes, head: bytes, mid: bytes, tail: bytes, seq0: int) -> None:
    count = data.count(b"\n") + 1
    assert _lines.encode(data, count, head, seq0, mid, tail) == linecodec.encode_python(
        data, count, head, seq0, mid, tail
    )


@pytest.mark.parametrize(
    "encode",
    [
        pytest.param(linecodec.encode_python, id="python"),
        pytest.param(getattr(_lines, "encode", None), id="c", marks=needs_c),
    ],
)
def test_encode_refuses_a_wrong_count(encode: linecodec.Encode) -> None:
    for count in (0, 1, 3):
        with pytest.raises(ValueError):
            encode(b"one\ntwo", count, b"", 1, b"", b"")


@needs_c
@settings(max_examples=500, deadline=None)
@given(data=LOG_BYTES, head=st.binary(max_size=40))
def test_prefix_agrees(data: bytes, head: bytes) -> None:
    count = data.count(b"\n") + 1
    want = b"".join(head + line + b"\n" for line in data.split(b"\n"))
    assert _lines.prefix(data, count, head) == linecodec.prefix_python(data, count, head) == want


@needs_c
def test_the_c_loops_agree_at_every_length_around_their_16_byte_steps() -> None:
    """The C loops move 16 bytes a step where the machine has SSE2 (the last step overlapping
    the one before): lines and heads of every length from 0 to past 256, a bound at every
    length around a line's, an unsafe byte at every offset of a block."""
    lines = [bytes((65 + i % 26,)) * i for i in range(300)]
    data = b"\n".join(lines)
    for head_n in (0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 70):
        head = bytes(range(97, 97 + 26)) * 3
        head = head[:head_n]
        assert _lines.encode(data, 300, head, 7, b',"m":"', b'"}\n') == linecodec.encode_python(
            data, 300, head, 7, b',"m":"', b'"}\n'
        )
        assert _lines.prefix(data, 300, head) == linecodec.prefix_python(data, 300, head)
    for bound in (0, 1, 15, 16, 17, 255, 298, 299, 300):
        assert _lines.scan(data, bound) == linecodec.scan_python(data, bound)
    for at in range(40):
        spoiled = data[: 1000 + at] + b"\x1b" + data[1001 + at :]
        assert _lines.scan(spoiled, 300) == linecodec.scan_python(spoiled, 300) == -1


@needs_c
def test_the_seqs_counted_up_in_place_carry_as_numbers_do() -> None:
    """The C encoder counts each record's seq up in its digits (a carry at a time), not by
    converting each afresh: across every carry, a new digit, and the end of the range."""
    data = b"\n".join(b"line %d" % i for i in range(120))
    for seq0 in (0, 1, 8, 9, 10, 89, 99, 990, 9_999, 99_999_950, 10**18 - 60, 2**64 - 121):
        assert _lines.encode(data, 120, b"<", seq0, b">", b"\n") == linecodec.encode_python(
            data, 120, b"<", seq0, b">", b"\n"
        ), seq0


@pytest.mark.parametrize(
    "prefix",
    [
        pytest.param(linecodec.prefix_python, id="python"),
        pytest.param(getattr(_lines, "prefix", None), id="c", marks=needs_c),
    ],
)
def test_prefix_refuses_a_wrong_count(prefix: linecodec.Prefix) -> None:
    for count in (0, 1, 3):
        with pytest.raises(ValueError):
            prefix(b"one\ntwo", count, b"r1 out | ")


def test_scan_counts_only_json_safe_lines_within_the_bound() -> None:
    assert linecodec.CODEC.scan(b"step 1\nstep 2", 6) == 2
    assert linecodec.CODEC.scan(b"", 6) == 1  # one empty line
    assert linecodec.CODEC.scan(b"step 10\nstep 2", 6) == -1  # a line longer than the bound
    for unsafe in (b'"', b"\\", b"\t", b"\x1b", b"\r", "é".encode()):
        assert linecodec.CODEC.scan(b"step " + unsafe, 64) == -1


@pytest.fixture(params=["c", "python"])
def codec(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the framer and the encoder with one implementation, then put the default back."""
    if request.param == "c" and _lines is None:
        pytest.skip("the C inner loops were not built here")
    previous = linecodec.use(request.param)
    yield request.param
    linecodec.use(previous.implementation)


def _records(chunks: list[bytes], max_line: int) -> list[LineRecord]:
    framer = LineFramer(max_line)
    frames = [framer.feed(chunk) for chunk in chunks] + [framer.flush()]
    out: list[LineRecord] = []
    seq = 1
    for frame in frames:
        if frame is None or not len(frame):
            continue
        for raw in encode_frame(
            3, "stderr", frame, "2026-12-01T00:00:00.000000Z", seq
        ).splitlines():
            record = decode(raw)
            assert isinstance(record, LineRecord)
            out.append(record)
        seq += len(frame)
    assert [r.seq for r in out] == list(range(1, len(out) + 1))
    return out


@pytest.mark.parametrize(
    "text",
    [
        "step 1 loss 2.5\nstep 2 loss 2.4\n",  # the fast path
        'metrics {"loss": 2.5, "path": "C:\\\\x"}\n\ttabbed\n',  # escapes: the orjson path
        "Epoch 1: 50%|#####     | 5/10\rEpoch 1: 60%|######    | 6/10\r\n",  # redraws
        "naïve ünïcode ✓\n" * 3 + "no end",
    ],
)
def test_records_round_trip_with_either_implementation(codec: str, text: str) -> None:
    data = text.encode()
    for size in (1, 7, len(data) or 1):
        chunks = [data[i : i + size] for i in range(0, len(data), size)]
        assert reassemble(_records(chunks, 64)) == text


def test_a_frame_kept_as_text_encodes_as_orjson_would(codec: str) -> None:
    framer = LineFramer()
    frame = framer.feed(b"step 1 loss 2.5\nstep 2 loss 2.4\n")
    assert frame is not None and frame.text is not None  # the fast path took it
    encoded = encode_frame(1, "stdout", frame, "t", 41)
    expected = b"".join(
        orjson.dumps(
            {"ts": "t", "seq": 41 + i, "run": 1, "src": "stdout", "line": line},
            option=orjson.OPT_APPEND_NEWLINE,
        )
        for i, line in enumerate(["step 1 loss 2.5", "step 2 loss 2.4"])
    )
    assert encoded == expected


def test_the_status_page_warns_only_when_the_python_loops_run() -> None:
    from dflashd.supervisor.client.render import format_status

    def page(codec: str) -> str:
        status = {"state": "running", "run": 1, "log_codec": codec}
        return format_status(status, running=True, paint=lambda text, _style: text)

    assert "log codec" not in page("c")
    assert "python (no C build" in page("python")


@needs_c
def test_the_c_loops_agree_on_inputs_large_enough_to_leave_the_gil() -> None:
    """64 KiB and more run without the GIL (this input is over 256 KiB): the same answers, and
    a bad byte deep inside found."""
    lines = [
        b"step %09d loss %.3f tok/s 51,200 " % (i, i / 7) + b"x" * (i % 90) for i in range(6000)
    ]
    data = b"\n".join(lines)
    assert len(data) > 256 * 1024
    assert _lines.scan(data, 256) == linecodec.scan_python(data, 256) == 6000
    head, mid = b'{"ts":"t","seq":', b',"run":1,"src":"stdout","line":"'
    assert _lines.encode(data, 6000, head, 7, mid, b'"}\n') == linecodec.encode_python(
        data, 6000, head, 7, mid, b'"}\n'
    )
    assert _lines.prefix(data, 6000, b"r1 out | ") == linecodec.prefix_python(
        data, 6000, b"r1 out | "
    )
    assert not _lines.mentions(data, (b"nan", b"inf", b"poch"))
    for at in (0, 64 * 1024 - 2, 200_001, len(data) - 3):  # a word straddling a 64-byte block too
        marked = data[:at] + b"nan" + data[at + 3 :]
        assert _lines.mentions(marked, (b"inf", b"nan")) and linecodec.mentions_python(
            marked, (b"inf", b"nan")
        )
    for bad in (b'"', b"\\", b"\x1b", b"\xc3"):
        spoiled = data[:200_001] + bad + data[200_002:]
        assert _lines.scan(spoiled, 256) == linecodec.scan_python(spoiled, 256) == -1
    assert _lines.scan(data, 100) == linecodec.scan_python(data, 100) == -1  # lines over 100 bytes


def _frames_equal(a: object, b: object) -> bool:
    if a is None or b is None:
        return a is b
    assert isinstance(a, Frame) and isinstance(b, Frame)
    return (a.lines, a.flags, a.nbytes, len(a)) == (b.lines, b.flags, b.nbytes, len(b))


@needs_c
@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(LOG_BYTES | st.sampled_from([b"\r", b"\r\n", b"x" * 90]), max_size=8))
def test_read_lines_through_a_pipe_makes_the_frames_feed_makes(chunks: list[bytes]) -> None:
    """Each chunk written into a real pipe, then read by ``read_lines`` behind the held bytes and
    framed by ``take``: frame for frame what ``feed`` makes of the same chunk (\\r, non-ASCII,
    quotes, lines cut at the bound, bytes held across chunks)."""
    ours, reference = LineFramer(MIN_LINE_BYTES), LineFramer(MIN_LINE_BYTES)
    r, w = os.pipe()
    try:
        os.set_blocking(r, False)
        for chunk in [c for c in chunks if c]:
            os.write(w, chunk)
            text, rest, nread, count = _lines.read_lines(r, ours.held, 1 << 16, MIN_LINE_BYTES)
            assert nread == len(chunk)
            assert _frames_equal(ours.take(text, rest, count), reference.feed(chunk))
            assert ours.held == reference.held
        os.close(w)
        w = -1
        text, rest, nread, count = _lines.read_lines(r, ours.held, 1 << 16, MIN_LINE_BYTES)
        assert (nread, rest, text) == (0, None, reference.held)  # end of file: the held bytes
        assert _frames_equal(ours.flush(), reference.flush())
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


@needs_c
def test_read_lines_reads_a_flood_in_pieces_and_says_when_the_pipe_is_empty() -> None:
    """Over 256 KiB waiting: one read takes at most ``max_read`` of it (rounded to the granule),
    the frame's text is its complete lines exactly, and an empty pipe raises BlockingIOError as
    ``os.read`` does."""
    line = b"step %09d loss 1.250 tok/s 51,200 " + b"x" * 40 + b"\n"
    data = b"".join(line % i for i in range(6000))
    r, w = os.pipe()
    try:
        os.set_blocking(r, False)
        grow_pipe(w, 1 << 20)
        os.write(w, data)
        framer, frames, taken = LineFramer(), [], 0
        while taken < len(data):
            text, rest, nread, count = _lines.read_lines(r, framer.held, 256 * 1024, 65536)
            assert 0 < nread <= 256 * 1024 + 4096
            taken += nread
            frame = framer.take(text, rest, count)
            assert frame is not None and frame.text is not None and count == len(frame)
            assert frame.text.endswith(b"x" * 40)  # the last complete line's end
            frames.append(frame.text)
        assert len(frames) > 1 and framer.held == b""
        assert b"\n".join(frames) + b"\n" == data
        with pytest.raises(BlockingIOError):
            _lines.read_lines(r, b"", 256 * 1024, 65536)
    finally:
        os.close(r)
        os.close(w)


@needs_c
def test_pending_says_what_waits_in_a_pipe_as_the_python_ioctl_does() -> None:
    """``pending`` (the drain's gather asks it after every read it hands on, holding the GIL)
    counts the bytes a pipe holds, as the drain's ``fcntl.ioctl`` does, and 0 for a closed fd."""
    assert _lines is not None
    r, w = os.pipe()
    try:
        os.write(w, b"x" * 60_000)  # within the default 64 KiB pipe
        assert _lines.pending(r) == 60_000
        os.read(r, 40_000)
        previous = linecodec.use("python")
        try:
            assert pending_bytes(r) == 20_000
        finally:
            linecodec.use(previous.implementation)
        assert _lines.pending(r) == 20_000
    finally:
        os.close(r)
        os.close(w)
    assert _lines.pending(r) == 0  # closed: nothing to say, no exception in the drain's loop
