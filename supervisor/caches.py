"""The compile caches dflashd owns, and clearing them after an early death."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path


def clear_owned_cache(cache_dir: Path, home_root: Path) -> bool:
    """Move ``cache_dir`` aside (one rename: the next child never sees half a cache), then delete it.

    Refuses anything that is not inside the home directory. Returns True when a cache was cleared.
    """
    cache = cache_dir.resolve()
    home = home_root.resolve()
    if cache == home or home not in cache.parents:
        raise ValueError(f"refusing to clear {cache}: not inside the dflashd home {home}")
    if not cache.exists():
        cache.mkdir(parents=True, exist_ok=True)
        return False
    aside = cache.with_name(f"{cache.name}.cleared-{os.getpid()}-{time.monotonic_ns()}")
    os.rename(cache, aside)
    cache.mkdir(parents=True, exist_ok=True)
    # Deleting a large cache can take seconds: do it off the daemon's loop.
    threading.Thread(
        target=shutil.rmtree, args=(aside, True), name="dflashd-rm-cache", daemon=True
    ).start()
    return True
