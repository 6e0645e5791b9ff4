"""The sink's bound lets a held drain go as soon as part of a batch is written (issue 53): it
waited for the whole batch, up to the bound (4 MiB), while the job's pipe filled behind it."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from dflashd.logs.framer import Frame, LineFramer
from dflashd.logs.sink import LogSink
from dflashd.logs.writer import RotatingLogWriter


class GatedWriter(RotatingLogWriter):
    """Each append of frames waits for its gate (the test's hand on a slow disk)."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.calls = 0
        self.entered = [threading.Event() for _ in range(8)]
        self.gates = [threading.Event() for _ in range(8)]

    def write_frames(self, batch: list[tuple[int, str, Frame, float]]) -> bool:
        call = self.calls
        self.calls += 1
        self.entered[call].set()
        assert self.gates[call].wait(30)
        return super().write_frames(batch)


def frame_of(nbytes: int, tag: str) -> Frame:
    line = f"{tag} step 1 loss 2.0 ".encode() + b"x" * 100 + b"\n"
    frame = LineFramer().feed(line * (nbytes // len(line)))
    assert frame is not None
    return frame


def test_a_drain_held_by_the_bound_goes_on_once_the_batchs_first_write_is_done(
    tmp_path: Path,
) -> None:
    writer = GatedWriter(tmp_path)
    big = [frame_of(300 * 1024, tag) for tag in ("a", "b", "c")]  # each its own write
    sink = LogSink(writer, max_queue_bytes=2 * big[0].nbytes, stall_s=60)
    sink.submit_frame(1, "stdout", frame_of(1024, "first"))
    assert writer.entered[0].wait(10)  # the writer is busy with the first frame
    sink.submit_frame(1, "stdout", big[0])
    sink.submit_frame(1, "stdout", big[1])  # the queue is at its bound now
    third_in = threading.Event()

    def drain() -> None:  # a drain thread handing on its next frame: held by the bound
        sink.submit_frame(1, "stdout", big[2])
        third_in.set()

    held = threading.Thread(target=drain)
    held.start()
    writer.gates[0].set()
    assert writer.entered[1].wait(10)  # the batch of the two large frames: its first write
    assert not third_in.is_set()  # still held: the bound counts the frames being written
    writer.gates[1].set()
    assert writer.entered[2].wait(10)  # the batch's second write begun, held at its gate...
    assert third_in.wait(10)  # ...and the drain already let go (it waited for both before)
    for gate in writer.gates:
        gate.set()
    held.join(10)
    assert sink.flush(30)
    sink.close()
    records = [json.loads(line) for line in (tmp_path / "dflashd.jsonl").read_bytes().splitlines()]
    lines: list[Any] = [r["line"].split(" ", 1)[0] for r in records if r.get("src") == "stdout"]
    order = [tag for i, tag in enumerate(lines) if i == 0 or lines[i - 1] != tag]
    assert order == ["first", "a", "b", "c"]  # every frame written, in order
    assert [r["seq"] for r in records] == list(
        range(records[0]["seq"], records[0]["seq"] + len(records))
    )
