"""The suite's own schedule (tests/conftest.py): the longest tests start first on every worker."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from tests.conftest import LONGEST_FIRST, dealt_longest_first

ROOT = Path(__file__).resolve().parent.parent


def test_every_longest_first_name_is_a_test_of_the_suite() -> None:
    for prefix in LONGEST_FIRST:
        path, name = prefix.split("::")
        source = (ROOT / path).read_text()
        assert re.search(rf"^def {re.escape(name)}", source, re.M), f"no test {prefix}"


@dataclass(frozen=True)
class _Named:
    nodeid: str


def test_each_worker_starts_on_its_share_of_the_longest_tests() -> None:
    short = [_Named(f"tests/test_x.py::test_short_{i}") for i in range(40)]
    longest = [_Named(prefix + "_case") for prefix in LONGEST_FIRST[:7]]
    collected = cast(list[pytest.Item], short[:13] + longest[::-1] + short[13:])
    ordered = dealt_longest_first(collected, 3)
    assert sorted(i.nodeid for i in ordered) == sorted(i.nodeid for i in collected)
    # worksteal's parts: 47 tests over 3 workers are 15, 16 and 16
    parts = [ordered[:15], ordered[15:31], ordered[31:]]
    fronts = [[i.nodeid for i in part if i in longest] for part in parts]
    assert fronts == [
        [longest[0].nodeid, longest[3].nodeid, longest[6].nodeid],
        [longest[1].nodeid, longest[4].nodeid],
        [longest[2].nodeid, longest[5].nodeid],
    ]
    for part, front in zip(parts, fronts, strict=True):
        assert [i.nodeid for i in part[: len(front)]] == front  # first in the part
    rest = [i for i in ordered if i not in longest]
    assert rest == short  # every other test keeps its order
