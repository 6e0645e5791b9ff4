"""The real foreground daemon with a scripted GPU sampler injected (no NVML on CPU machines).

    python tests/scripted_daemon.py GPU_SCRIPT HOME CONFIG [-- CMD ARG...]

The production code has no test hook: this runner checks the start as ``dflashd start
--foreground`` does, then serves the daemon program in this process (no exec),
with a :class:`ScriptedSampler` factory for its GPUs.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: find tests/

from dflashd.supervisor.client.start import prepare
from dflashd.supervisor.daemon import Daemon
from dflashd.supervisor.foreground import serve_handed_over
from dflashd.supervisor.host.handover import Handover
from dflashd.supervisor.host.home import Home
from tests.harness import ScriptedSampler


def main() -> int:
    script, home_dir, config_path, *rest = sys.argv[1:]
    command = tuple(rest[1:] if rest and rest[0] == "--" else rest)
    home = Home(Path(home_dir).absolute())
    config = prepare(home, Path(config_path), command)
    handover = Handover(home, config, None, echo=False)
    sampler = lambda child_pid: ScriptedSampler(Path(script), child_pid)  # noqa: E731
    return serve_handed_over(handover, Daemon, sampler)


if __name__ == "__main__":
    sys.exit(main())
