"""The worst-case cost of matching one line (issue 21): adversarial lines of max_line_bytes.

Each line is matched by the built-in formats (``match_line``); the baseline, in the same
run, is one ``str.find`` of a keyword over the same line (what any scan must pay).  The
lines are the issue's: 50 KB of digits ending in ``it/s``, 60,000 spaces after ``step``,
and random mixes of every format's keywords, digits and spaces.

    python tests/perf/match_cost.py [--bytes 65536] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import random
import time

from dflashd.supervisor.model.formats import FormatMatcher, match_line


def lines(size: int) -> dict[str, str]:
    rng = random.Random(21)
    keywords = [
        "step",
        "Step: ",
        "iter ",
        "iteration ",
        "Epoch 1: ",
        "it/s",
        " it [",
        "loss=",
        "%|",
        "|",
        "/",
    ]
    mixed = []
    while sum(map(len, mixed)) < size:
        mixed.append(
            rng.choice(
                [rng.choice(keywords), "9" * rng.randint(1, 3000), " " * rng.randint(1, 3000)]
            )
        )
    return {
        "digits_then_it_s": "1" * (size - 4) + "it/s",
        "step_then_spaces": "step" + " " * (size - 6) + "12",
        "spaces_then_step": " " * (size - 7) + "step 12",
        "pct_bars": ("5%|" + "#" * 50 + "| ") * (size // 56),
        "keyword_soup": "".join(mixed)[:size],
    }


def best_ms(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bytes", type=int, default=65536)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    matcher = FormatMatcher()
    out = {}
    for name, line in lines(args.bytes).items():
        match_ms = best_ms(lambda line=line: match_line(line), args.repeat)
        frame_ms = best_ms(lambda line=line: matcher.last_step([line]), args.repeat)
        scan_ms = best_ms(lambda line=line: line.find("loss"), args.repeat)
        out[name] = {
            "match_line_ms": round(match_ms, 3),
            "frame_ms": round(frame_ms, 3),
            "find_ms": round(scan_ms, 4),
        }
    out["worst_frame_ms"] = max(v["frame_ms"] for v in out.values() if isinstance(v, dict))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
