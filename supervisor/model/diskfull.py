"""``disk_full``: the job's writes failed for want of room (ENOSPC) or of quota (EDQUOT).

A relaunch into a disk that is still full dies the same way, at the same checkpoint, and
costs the steps since the last one each time: the relaunch waits until the filesystem the
error names (else the job's working directory) has room again.  A quota cannot be read from
the filesystem, so a quota's relaunch follows the restart policy alone.  Read from the last
traceback of the run's stderr (a warning printed and survived earlier is not the death) and
from the top frames of the stacks taken before its end.
"""

from __future__ import annotations

import re
from typing import Final

from dflashd.supervisor.model.verdicts import Found, Observations, RoomHold, Rule, RuleVerdict

_NO_ROOM: Final = re.compile(r"\[Errno 28\]|No space left on device|\bENOSPC\b")
_NO_QUOTA: Final = re.compile(r"\[Errno 122\]|Disk quota exceeded|\bEDQUOT\b")
_PATH: Final = re.compile(r"(?:No space left on device|Disk quota exceeded): '([^'\n]{1,4096})'")
_TRACEBACK: Final = "Traceback (most recent call last):"


def reads(obs: Observations, frames: tuple[str, ...]) -> Found | None:
    """ENOSPC or EDQUOT in the death's own lines: the reason names it and its path, if any."""
    tail = obs.stderr_tail
    starts = [i for i, line in enumerate(tail) if _TRACEBACK in line]
    text = "\n".join((*tail[starts[-1] if starts else 0 :], *frames))
    room, quota = _NO_ROOM.search(text), _NO_QUOTA.search(text)
    if room is None and quota is None:
        return None
    paths = _PATH.findall(text)
    path = paths[-1] if paths else ""
    why = "ENOSPC" if room is not None else "EDQUOT"
    reason = f"{why}:{path}" if path else why
    return Found(reason, RoomHold(path) if room is not None else None)


DISK_FULL: Final = Rule(
    RuleVerdict("disk_full"),
    reads,
    meaning="its writes failed: no space left on the device (ENOSPC) or over quota (EDQUOT)",
    colour="magenta",
    html_colour="#00838f",
)
