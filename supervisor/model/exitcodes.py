"""dflashd's exit codes, in one stdlib-only leaf: the daemon and the CLI say the same numbers.

docs/design.md ("CLI") and the README name them; systemd's ``RestartPreventExitStatus=4`` names
:data:`EXIT_FATAL`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

EXIT_JOB_DIED: Final = 1  # `start`: the job died and is being restarted
EXIT_ALREADY_RUNNING: Final = 1  # `start`: a daemon already holds this home
EXIT_USAGE: Final = 2  # a bad config, home, option or command: nothing was launched
EXIT_NOT_RUNNING: Final = 3  # a command that needs the daemon found none
EXIT_FATAL: Final = 4  # the daemon gave up (fatal): not restarted by systemd
# a GPU the dead run held needs a reset or a reboot (model/preflight.py): EX_TEMPFAIL, which a
# scheduler can requeue on (Slurm's --requeue, a Kubernetes restart policy) on another node
EXIT_GPU_UNUSABLE: Final = 75
EXIT_INTERRUPTED: Final = 130  # Ctrl-C while `start` waits: 128 + SIGINT, as shells report it


_ROOT_CAUSE: Final = "Root Cause (first observed failure)"
_EXITCODE: Final = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")


def worker_exit_code(tail: Sequence[str]) -> int | None:
    """The first failed worker's exit code, from torchrun's ``ChildFailedError`` summary.

    torchrun itself exits 1 whatever its workers' codes were; this is how a worker's
    ``no_restart_exit_codes`` code (78, EX_CONFIG) still reaches the restart policy.
    """
    for index, line in enumerate(tail):
        if _ROOT_CAUSE in line:
            for later in tail[index + 1 :]:
                if (found := _EXITCODE.match(later)) is not None:
                    return int(found.group(1))
            return None
    return None
