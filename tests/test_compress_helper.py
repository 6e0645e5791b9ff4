"""The compression helper (logs/squeeze.py) as the daemon starts it: isolated, without site,
zstandard's backend loaded from its file, its priority set from outside, and giving up when
the daemon that wanted the work is gone."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import zstandard

from dflashd.logs.compress import (
    SQUEEZE,
    Compressor,
    helper_argv,
    helper_env,
    lowest_priority,
)
from dflashd.logs.packed import zstd_home

_SYS_IOPRIO_GET = 252  # x86_64
_IOPRIO_WHO_PROCESS = 1


def _helper(args: list[str], pass_fds: tuple[int, ...] = ()) -> subprocess.CompletedProcess[str]:
    home = zstd_home()
    assert home is not None
    return subprocess.run(
        helper_argv(args[0], int(args[1]), args[2:]),
        env=helper_env(home),
        pass_fds=pass_fds,
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_helper_loads_zstandards_backend_without_its_package_imports() -> None:
    home = zstd_home()
    assert home is not None
    code = (
        f"import sys; sys.path.insert(0, {str(SQUEEZE.parent)!r}); import squeeze;"
        "m = squeeze.zstd_backend(); print(m.__name__, 'platform' in sys.modules,"
        " 'typing' in sys.modules, 'ctypes' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code],
        env={"DFLASHD_ZSTD_HOME": home},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == ["zstandard.backend_c", "False", "False", "False"]


def test_the_helper_writes_a_whole_zst_that_decompresses_to_the_file(tmp_path: Path) -> None:
    plain = tmp_path / "dflashd.jsonl.1"
    data = b"".join(b'{"seq":%d,"line":"step %d"}\n' % (i, i) for i in range(200_000))
    plain.write_bytes(data)
    out = tmp_path / "out.zst"
    with open(plain, "rb") as fh:
        done = _helper(["zstd", str(os.getpid()), f"{fh.fileno()}={out}"], (fh.fileno(),))
    assert done.returncode == 0, done.stderr
    assert not Path(f"{out}.part").exists()
    packed = out.read_bytes()
    assert len(packed) * 10 < len(data)
    assert zstandard.ZstdDecompressor().decompress(packed) == data  # content size in the header


def test_the_helper_gives_up_when_its_daemon_is_gone(tmp_path: Path) -> None:
    """Its parent is not the daemon it was started for (that daemon died): no output at all."""
    plain = tmp_path / "dflashd.jsonl.1"
    plain.write_bytes(b"x" * (3 << 20))
    out = tmp_path / "out.zst"
    with open(plain, "rb") as fh:
        not_my_parent = os.getpid() + 1_000_000
        done = _helper(["zstd", str(not_my_parent), f"{fh.fileno()}={out}"], (fh.fileno(),))
    assert done.returncode == 1
    assert not out.exists()  # a .part at most, which the next daemon removes


def test_lowest_priority_is_the_idle_policy_nice_19_and_the_idle_io_class() -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        lowest_priority(sleeper.pid)
        # the idle policy: a CPU running only the helper counts as idle where a waking drain
        # is placed, so the drains do not take turns with the job on its CPU (issue 53)
        assert os.sched_getscheduler(sleeper.pid) == os.SCHED_IDLE
        assert os.getpriority(os.PRIO_PROCESS, sleeper.pid) == 19
        if os.uname().machine == "x86_64":
            libc = ctypes.CDLL(None, use_errno=True)
            ioprio = libc.syscall(_SYS_IOPRIO_GET, _IOPRIO_WHO_PROCESS, sleeper.pid)
            assert ioprio >> 13 == 3  # IOPRIO_CLASS_IDLE
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_packed_file_takes_its_place_without_freeing_the_plain_one_under_the_writers_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plain file's pages (100 MiB of records: ~6 ms on ext4) are freed when its last
    descriptor closes; the compressor closes its own after the placing, outside the writer's
    lock, so the unlink under the lock only drops a name (issue 53)."""
    plain = tmp_path / "dflashd.jsonl.1"
    plain.write_bytes(b'{"seq":1,"line":"step 1"}\n' * 50_000)
    lock = threading.Lock()
    seen: list[tuple[bool, bool]] = []  # (the writer's lock held, the plain file still open)
    real_unlink = os.unlink

    def unlink(name: str, *, dir_fd: int | None = None) -> None:
        if name == plain.name:
            seen.append((lock.locked(), str(plain) in _open_paths()))
        real_unlink(name, dir_fd=dir_fd)

    monkeypatch.setattr(os, "unlink", unlink)
    rotated = lambda _dir_fd: [plain.name] if plain.exists() else []  # noqa: E731
    compressor = Compressor(tmp_path, lock, rotated, codec="zstd")
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        compressor.submit_name(dir_fd, plain.name)
    finally:
        os.close(dir_fd)
    assert compressor.drain(60)
    compressor.close(5)
    assert compressor.compressed == 1
    assert (tmp_path / "dflashd.jsonl.1.zst").exists() and not plain.exists()
    assert seen == [(True, True)]  # under the lock, only a name went: the file was still open


def _open_paths() -> set[str]:
    """What this process's descriptors name now (one closing meanwhile is left out)."""
    paths = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            paths.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    return paths
