"""The drain's scan at each width the CPU offers (logs/_lines.c: SSE2, AVX2, AVX-512BW, chosen
once at import; ``DFLASHD_SIMD`` holds it lower): every one must count what the Python
reference counts, at every place a 64-byte block can cut a line, a bound or an unsafe byte.
Each width runs in a process of its own (the choice is made at import)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

try:
    _lines = importlib.import_module("dflashd.logs._lines")
except ImportError:  # the build had no compiler
    _lines = None

needs_c = pytest.mark.skipif(_lines is None, reason="the C inner loops were not built here")

# Run in a child with DFLASHD_SIMD set: prints the width in use and the cases that disagreed.
CHECK = r"""
import json, random
from dflashd.logs import _lines
from dflashd.logs.linecodec import scan_python

cases = []
rng = random.Random(53)
# lines of every length around a block (63, 64, 65, ...), at every offset in the block
for first in range(0, 130):
    for length in (0, 1, 62, 63, 64, 65, 66, 127, 128, 129, 200):
        data = b"a" * first + b"\n" + b"b" * length + b"\n" + b"c" * 70
        for bound in (64, 65, length - 1, length, length + 1, first - 1, first, 300):
            if bound >= 64:
                cases.append((data, bound))
# an unsafe byte at every offset of three blocks, with newlines around it
base = b"\n".join(b"x" * n for n in (10, 63, 64, 65, 1, 0, 40))
for at in range(len(base)):
    for bad in (b"\x1b", b'"', b"\\", b"\x80", b"\xff", b"\x00", b"\t", b"\r"):
        if base[at:at + 1] != b"\n":
            cases.append((base[:at] + bad + base[at + 1:], 64))
# random logs: mostly safe lines, sometimes an unsafe byte or a long line
alphabet = b"abc xyz019=:,.\n"
for _ in range(3000):
    n = rng.randrange(0, 700)
    data = bytearray(rng.choice(alphabet) for _ in range(n))
    for _ in range(rng.randrange(0, 3)):
        if data:
            data[rng.randrange(len(data))] = rng.choice(b'"\\\x1b\x7f\xc3\n')
    cases.append((bytes(data), rng.choice((64, 65, 100, 128, 250, 700))))
wrong = [
    [data.hex(), bound, _lines.scan(data, bound), scan_python(data, bound)]
    for data, bound in cases
    if _lines.scan(data, bound) != scan_python(data, bound)
]
print(json.dumps({"simd": _lines.simd, "cases": len(cases), "wrong": wrong[:5]}))
"""


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@needs_c
@pytest.mark.parametrize(
    ("cap", "flag"), [("sse2", "sse2"), ("avx2", "avx2"), ("avx512", "avx512bw")]
)
def test_each_width_of_the_scan_counts_what_the_reference_counts(cap: str, flag: str) -> None:
    if flag not in cpu_flags():
        pytest.skip(f"this CPU has no {flag}")
    env = {**os.environ, "DFLASHD_SIMD": cap}
    done = subprocess.run(
        [sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, check=True
    )
    result = json.loads(done.stdout)
    assert result["simd"] == {"avx512": "avx512bw"}.get(cap, cap)  # the width asked is the one run
    assert result["cases"] > 10_000
    assert result["wrong"] == []


@needs_c
def test_the_widest_scan_is_chosen_by_default() -> None:
    flags = cpu_flags()
    want = "avx512bw" if {"avx512bw", "avx512f"} <= flags else "avx2" if "avx2" in flags else "sse2"
    if "sse2" not in flags:  # not x86: the portable loops
        want = "none"
    assert _lines.simd == want
