"""Rotated run-log files, compressed by a helper process (never on the writer's, the child's
or the daemon's path).

The writer hands over each file it rotates as an open file (so a later rotation that renames
it changes nothing: the helper reads the inode it was given, through the inherited
descriptor).  One thread here starts the helper (logs/squeeze.py; it sets it to the idle CPU
policy, nice 19, idle I/O class) for each burst of files and waits for it (a wait holds no
GIL); the helper writes a temporary name outside the numbered set, then the thread asks the
writer, under the writer's lock, to put it in place: the file's current name (found by inode)
gets a ``.zst`` (or ``.gz``) twin and the plain file goes.  A file that rotated out of the set
meanwhile is simply dropped.
Readers see ``base.N`` or its packed twin (the plain one wins while both briefly exist).

At exit the daemon waits at most ``EXIT_WAIT_S`` (1 s); what is still plain goes to a
finisher (``squeeze.py finish``), a helper of its own session holding the set's compression
lock, which waits for the daemon to be gone and compresses the rest.  A later daemon's
compressor waits for that lock; its rotations and every placing of a packed file take the
rotation lock, so the finisher never renames a file a rotation is moving.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, Final

from dflashd.logs.packed import GZ_SUFFIX, ZST_SUFFIX, zstd_home

TMP_PREFIX: Final = ".compressing-"
LOCK_NAME: Final = ".compress.lock"  # held by whoever compresses the set (one at a time)
ROTATE_LOCK_NAME: Final = ".rotate.lock"  # held across a rotation and a packed file's placing
SQUEEZE: Final = Path(__file__).with_name("squeeze.py")
EXIT_WAIT_S: Final = 1.0
_LOCK_FLAGS: Final = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_STOP: Final = None


class Compressor:
    """Rotated files compressed one at a time by a helper process, in order.

    ``lock`` is the writer's (renames happen under it); ``rotated`` lists the set's numbered
    plain names as they are now.  ``codec``: ``zstd`` where the binding is installed, else
    ``gzip``.
    """

    def __init__(
        self,
        directory: Path,
        lock: threading.Lock,
        rotated: Callable[[int], list[str]],
        codec: str | None = None,
        dir_fd: int | None = None,
    ) -> None:
        self.directory, self._lock, self._rotated = directory, lock, rotated
        # The directory held open (the writer's): every name here is made, renamed and
        # removed relative to it, and the helpers work in it (fchdir), so a logs directory
        # swapped for a link never gets a byte from the compression either.
        self._dir_fd = os.dup(dir_fd) if dir_fd is not None else os.open(directory, _DIR_FLAGS)
        self._zstd_home = zstd_home()
        self.codec = codec or ("zstd" if self._zstd_home is not None else "gzip")
        self.suffix = ZST_SUFFIX if self.codec == "zstd" else GZ_SUFFIX
        self._jobs: queue.SimpleQueue[tuple[BinaryIO, tuple[int, int]] | None] = queue.SimpleQueue()
        self._idle = threading.Condition()
        self._pending = 0
        # One open file for the compression lock, held by this process while it squeezes:
        # flock belongs to the open file, so a finisher that inherits it holds it on.
        self._lock_fd = os.open(LOCK_NAME, _LOCK_FLAGS, 0o600, dir_fd=self._dir_fd)
        self._handed_over = False
        self._closing = self._thread_done = False  # who closes the directory: the last of the two
        self.finisher: subprocess.Popen[bytes] | None = None  # what finishes after the daemon
        self._thread = threading.Thread(target=self._run, name="log-compressor", daemon=True)
        self._thread.start()
        self.compressed = 0
        self.errors = 0
        self.helper_pid: int | None = None  # the helper at work (the daemon's reaper leaves it)

    def submit(self, fh: BinaryIO) -> None:
        """Compress this rotated file (opened by the caller; the compressor closes it)."""
        st = os.fstat(fh.fileno())
        with self._idle:
            self._pending += 1
        self._jobs.put((fh, (st.st_dev, st.st_ino)))

    def submit_name(self, dir_fd: int, name: str) -> None:
        """Compress the rotated file ``name`` in the directory ``dir_fd`` (opened now, never
        through a link, so later renames do not matter); gone already: nothing to do."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError:
            return
        self.submit(os.fdopen(fd, "rb"))

    def close(
        self, timeout_s: float = EXIT_WAIT_S, *, basename: str = "", backups: int = 0
    ) -> None:
        """Stop taking files; wait at most ``timeout_s`` for the one in hand.  Files still
        plain then (``basename``/``backups`` name the set) go to a finisher, a helper of its
        own session that outlives the daemon and compresses them once it has exited."""
        self._jobs.put(_STOP)
        self._thread.join(timeout_s)
        with self._idle:
            left = self._pending > 0
        with contextlib.suppress(OSError):
            # a helper that failed leaves files plain too
            left = left or bool(self._rotated(self._dir_fd))
        if left and basename and backups:
            self._hand_over(basename, backups)
        else:
            os.close(self._lock_fd)
        with self._idle:  # a finisher holds its own copy; a thread still at work closes it
            self._closing = True
            if self._thread_done:
                os.close(self._dir_fd)

    def _hand_over(self, basename: str, backups: int) -> None:
        """The finisher, holding this process's compression lock (its thread may hold it
        already: the same open file), started at the idle CPU policy, nice 19 and the idle I/O
        class."""
        self._handed_over = True  # the thread keeps the lock taken from here
        with contextlib.suppress(OSError):
            # Held by another daemon's finisher: this one still starts, and waits for the lock
            # in its own process (that finisher may have looked at the set for the last time
            # before these files were rotated: they would stay plain).
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        argv = [sys.executable, "-I", "-S", str(SQUEEZE), "finish", self.codec, str(os.getpid())]
        argv += [f"@{self._dir_fd}", basename, str(backups)]  # the held directory, not a path
        argv.append(str(self.helper_pid or 0))  # still at work: the finisher waits for it too
        argv.append(f"lock={self._lock_fd}")
        try:
            self.finisher = subprocess.Popen(
                argv,
                pass_fds=(self._lock_fd, self._dir_fd),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=helper_env(self._zstd_home),
                start_new_session=True,  # a stop's signal to the daemon's group spares it
            )
        except OSError:
            return  # the files stay plain: read as such, compressed by the next daemon
        lowest_priority(self.finisher.pid)

    def _take_lock(self) -> bool:
        """The set's compression lock (waits while a finisher of an earlier daemon works)."""
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        except OSError:
            return False
        return True

    def _release_lock(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _place(self, tmp: str, inode: tuple[int, int]) -> None:
        """The packed file takes the plain file's place, wherever a rotation has moved it since."""
        at = self._dir_fd
        with self._lock, rotation_lock(at):
            for name in self._rotated(at):
                try:
                    st = os.stat(name, dir_fd=at, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if (st.st_dev, st.st_ino) == inode:
                    os.replace(tmp, name + self.suffix, src_dir_fd=at, dst_dir_fd=at)
                    os.unlink(name, dir_fd=at)
                    return
            self._unlink(tmp)  # it rotated out of the set meanwhile

    def _unlink(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self._dir_fd)

    def _exists(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self._dir_fd, follow_symlinks=False)
        except OSError:
            return False
        return True

    def drain(self, timeout_s: float) -> bool:
        """Wait until every file handed over so far is done (tests, benchmarks)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout_s)

    def _squeeze(self, jobs: list[tuple[BinaryIO, str]]) -> None:
        """One helper for a burst of files; each output appears only when whole."""
        argv = helper_argv(
            self.codec, os.getpid(), [f"{fh.fileno()}={tmp}" for fh, tmp in jobs], self._dir_fd
        )
        helper = subprocess.Popen(
            argv,
            pass_fds=(self._dir_fd, *(fh.fileno() for fh, _ in jobs)),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=helper_env(self._zstd_home),
        )
        self.helper_pid = helper.pid
        lowest_priority(helper.pid)
        try:
            helper.wait()  # the exit status may be the reaper's: the files say what was done
        finally:
            self.helper_pid = None

    def _run(self) -> None:
        try:
            self._work()
        finally:
            with self._idle:
                self._thread_done = True
                if self._closing:
                    os.close(self._dir_fd)

    def _work(self) -> None:
        stopping = False
        while not stopping:
            batch = [self._jobs.get()]
            while not self._jobs.empty():
                batch.append(self._jobs.get())
            stopping = _STOP in batch
            jobs = [(fh, inode) for fh, inode in (j for j in batch if j is not _STOP)]
            if not jobs:
                continue
            outputs = [(fh, inode, f"{TMP_PREFIX}{inode[1]}{self.suffix}") for fh, inode in jobs]
            locked = self._take_lock()
            try:
                for _, _, tmp in outputs:
                    self._unlink(tmp)
                todo = [(fh, tmp) for fh, _, tmp in outputs if os.fstat(fh.fileno()).st_nlink]
                if todo:  # a file a finisher compressed meanwhile is gone: nothing to do
                    self._squeeze(todo)
            except OSError:
                pass
            for fh, inode, tmp in outputs:
                try:
                    if self._exists(tmp):
                        self._place(tmp, inode)
                        self.compressed += 1
                    else:
                        self.errors += 1
                except OSError:
                    self.errors += 1
                    with contextlib.suppress(OSError):
                        self._unlink(tmp)
                finally:
                    # closed after the placing, outside the writer's lock: the plain file's
                    # unlink under it only drops a name while this descriptor holds the inode,
                    # and its pages (100 MiB: ~6 ms on ext4) are freed here, not while the
                    # writer waits for its lock
                    fh.close()
            if locked and not self._handed_over:
                self._release_lock()
            with self._idle:
                self._pending -= len(jobs)
                self._idle.notify_all()


def helper_argv(codec: str, parent: int, jobs: list[str], dir_fd: int | None = None) -> list[str]:
    """The helper's command line: the script by its path, isolated and without site, so it
    imports nothing of dflashd (a start of ~25 ms instead of ~70); ``jobs``: ``FD=OUT``.
    With ``dir_fd`` (passed to it) the helper works in that directory: OUT is a name there."""
    where = [f"@{dir_fd}"] if dir_fd is not None else []
    return [sys.executable, "-I", "-S", str(SQUEEZE), codec, str(parent), *where, *jobs]


def helper_env(zstd_folder: str | None) -> dict[str, str]:
    """The helper's whole environment: where zstandard is (``zstd_home``), if anywhere."""
    return {"DFLASHD_ZSTD_HOME": zstd_folder} if zstd_folder else {}


_IOPRIO_WHO_PROCESS: Final = 1
_IOPRIO_CLASS_IDLE: Final = 3
_SYS_IOPRIO_SET: Final = {"x86_64": 251, "aarch64": 30}.get(os.uname().machine)


def lowest_priority(pid: int) -> None:
    """The idle CPU policy, nice 19 and the idle I/O class for ``pid`` (our unreaped helper:
    its pid is ours).

    ``SCHED_IDLE``, not nice 19 alone: Linux counts a CPU that runs only idle-policy tasks as
    idle when it places a waking thread, and a nice-19 task as busy.  Beside a nice-19 helper
    the daemon's drains, woken every millisecond of a line flood, were placed on the job's own
    CPU and took turns with it: a 2-core box's job printed lines 26 % slower beside a nice-19
    busy loop, 3 % beside an idle-policy one (issue 53, docs/measurements.md).  An idle-policy
    task still runs on a busy box, with a fifth of nice 19's share; where the policy is refused
    (a container's seccomp), nice 19 stays."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, 19)
    except OSError:
        return  # already gone
    with contextlib.suppress(OSError):
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
    if _SYS_IOPRIO_SET is not None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall(_SYS_IOPRIO_SET, _IOPRIO_WHO_PROCESS, pid, _IOPRIO_CLASS_IDLE << 13)


def remove_stale_tmp(dir_fd: int) -> None:
    """Temporary files a killed daemon (or helper) left behind in the directory held by
    ``dir_fd``; none while a finisher works (it holds the compression lock: its files are
    not stale)."""
    try:
        fd = os.open(LOCK_NAME, _LOCK_FLAGS, 0o600, dir_fd=dir_fd)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return
    try:
        for name in os.listdir(dir_fd):
            if name.startswith(TMP_PREFIX):
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=dir_fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def rotation_lock(dir_fd: int) -> Iterator[None]:
    """Across processes: a rotation of the set, or a packed file taking a plain one's place
    (a finisher of the previous daemon may place files while this one rotates).  The lock
    file lives in the directory held by ``dir_fd``, never where its path names now."""
    try:
        fd = os.open(ROTATE_LOCK_NAME, _LOCK_FLAGS, 0o600, dir_fd=dir_fd)
    except OSError:
        yield  # no lock file can be made (a full or read-only disk): the rename fails anyway
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
