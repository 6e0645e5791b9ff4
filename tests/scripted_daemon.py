"""The real foreground daemon with a scripted GPU sampler injected (no NVML on CPU machines).

    python tests/scripted_daemon.py GPU_SCRIPT HOME CONFIG [-- CMD ARG...]

The production code has no test hook: this runner builds the daemon the way ``dflashd
start --foreground`` does and passes a :class:`ScriptedSampler` factory to it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: find tests/

from dflashd.supervisor.client.start import prepare, run_foreground
from dflashd.supervisor.host.home import Home
from tests.harness import ScriptedSampler


def main() -> int:
    script, home_dir, config_path, *rest = sys.argv[1:]
    command = tuple(rest[1:] if rest and rest[0] == "--" else rest)
    home = Home(Path(home_dir).absolute())
    config = prepare(home, Path(config_path), command)
    return run_foreground(
        home,
        config,
        None,
        echo=False,
        sampler_factory=lambda child_pid: ScriptedSampler(Path(script), child_pid),
    )


if __name__ == "__main__":
    sys.exit(main())
