"""The home directory (docs/design.md, "Home"): its paths, and the one-daemon-per-home lock."""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


def default_home() -> Path:
    """``$DFLASHD_HOME``, else ``$XDG_STATE_HOME/dflashd``, else ``~/.local/state/dflashd``;
    inside a Slurm job ``dflashd-slurm-<job>-node<N>`` there instead of ``dflashd``."""
    explicit = os.environ.get("DFLASHD_HOME")
    if explicit:
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / (slurm_home_name(os.environ) or "dflashd")


def slurm_home_name(env: Mapping[str, str]) -> str | None:
    """The default home's name inside a Slurm job: one per job and node, so two jobs (or two
    nodes of one job on a shared home directory) never share one; None outside Slurm."""
    job_id = env.get("SLURM_JOB_ID", "").strip()
    if not job_id or not job_id.replace("_", "").isalnum():
        return None
    node = env.get("SLURM_NODEID", "").strip()
    return f"dflashd-slurm-{job_id}" + (f"-node{node}" if node.isdigit() else "")


@dataclass(frozen=True, slots=True)
class Home:
    """Every file the daemon keeps, under one directory."""

    root: Path

    @property
    def lock(self) -> Path:
        return self.root / "dflashd.lock"

    @property
    def control_socket(self) -> Path:
        return self.root / "control.sock"

    @property
    def notify_socket(self) -> Path:
        return self.root / "notify.sock"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def daemon_log(self) -> Path:
        return self.root / "daemon.log"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def runs_db(self) -> Path:
        return self.root / "runs.sqlite"

    @property
    def id_file(self) -> Path:
        return self.root / "id"

    @property
    def id(self) -> str:
        """This home's id: the mark its runs' processes carry (not its path: links differ).

        Made once (random, 32 hex digits) and kept in ``id``; empty when unreadable.
        """
        try:
            text = self.id_file.read_text().strip()
        except FileNotFoundError:
            text = ""
        except OSError:
            return ""
        if len(text) == 32 and all(c in "0123456789abcdef" for c in text):
            return text
        made = os.urandom(16).hex()  # not secrets: it loads OpenSSL's libcrypto (3.4 MiB)
        tmp = self.root / f".id.{os.urandom(6).hex()}.tmp"
        try:  # a new file (never an existing one, never through a link), renamed into place
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(tmp, flags, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(made + "\n")
            os.replace(tmp, self.id_file)
        except OSError:
            return ""
        return made

    def create(self) -> None:
        """Make the home owner-only, or check that an existing one is safe (HomeError if not).

        A directory the user passed is never chmod-ed: one that another user owns, or that
        group or others may write (where they could plant links or sockets), is refused.
        """
        try:
            self.root.parent.mkdir(parents=True, exist_ok=True)
            self.root.mkdir(mode=0o700)
        except FileExistsError:
            pass
        except NotADirectoryError:
            raise HomeError(f"home {self.root}: a parent is not a directory") from None
        except OSError as exc:
            raise HomeError(f"cannot create home {self.root}: {exc.strerror}") from None
        check_private_dir(self.root, "home")
        for sub in (self.logs, self.cache):
            try:
                sub.mkdir(mode=0o700)
            except FileExistsError:
                pass
            except OSError as exc:
                raise HomeError(f"cannot create {sub}: {exc.strerror}") from None
            check_private_dir(sub, sub.name)


SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes, one of them the terminating NUL


def unusable_path(root: Path) -> str | None:
    """Why a home at ``root`` cannot work, before anything is made there (None: it can).

    Its path must be UTF-8 text (it goes into records, the child's environment and status)
    and short enough for its sockets' paths to fit a Unix socket address.
    """
    text = str(root)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(text)
        return (
            f"home {shown!r} is not UTF-8 text: dflashd names it in UTF-8 records and "
            "status; use a home whose path is UTF-8"
        )
    longest = max(len(os.fsencode(root / name)) for name in ("control.sock", "notify.sock"))
    if longest > SOCKET_PATH_MAX:
        return (
            f"home {root} is too long: its sockets' paths ({longest} bytes) pass the "
            f"{SOCKET_PATH_MAX}-byte limit of a Unix socket address; use a shorter --home"
        )
    return None


def untrusted_home(root: Path) -> str | None:
    """Why a client must not read or talk to the home at ``root`` (None: it may).

    A home is never a symlink (the daemon refuses one at start), so a link there now was put
    in its place: its state, logs and sockets are whatever the link's owner planted.  A home
    of another user is read by root only.  A home that does not exist yet is fine.
    """
    try:
        st = os.lstat(root)
    except PermissionError:  # a directory above it is closed to this user
        return f"home {root}: you may not read it (permission denied on a directory above it)"
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return (
            f"home {root} is a symlink (owned by uid {st.st_uid}): a home is never a link, "
            "so its state and sockets are not the daemon's; refusing it (use the real path)"
        )
    euid = os.geteuid()
    if stat.S_ISDIR(st.st_mode) and euid not in (0, st.st_uid):
        owner = _user_name(st.st_uid)
        return (
            f"home {root} belongs to {owner} (uid {st.st_uid}), not to you: it is not read "
            f"for you; its owner can (sudo -u {owner} dflashd status --home {root})"
        )
    return None


def _user_name(uid: int) -> str:
    """The user's name, else the number (a uid with no passwd entry)."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def held_path(dir_fd: int | None, name: str, fallback: Path) -> str:
    """A path that names ``name`` inside the directory held by ``dir_fd``, whatever the
    directory's own path names now: ``/proc/self/fd/N/name`` (the kernel resolves the magic
    link to the held directory).  For the calls that take no ``dir_fd`` (binding a Unix
    socket); ``fallback`` where there is no held directory or no /proc."""
    if dir_fd is None or dir_fd < 0 or not os.path.isdir(f"/proc/self/fd/{dir_fd}"):
        return str(fallback)
    return f"/proc/self/fd/{dir_fd}/{name}"


class HomeError(Exception):
    """The home is unusable or unsafe; the message says why (exit 2)."""


def check_private_dir(path: Path, what: str) -> None:
    """A real directory (not a link), ours, not writable by group or others."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise HomeError(f"{what} {path}: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise HomeError(f"{what} {path} is a symlink: refusing it (use the real path)")
    if not stat.S_ISDIR(st.st_mode):
        raise HomeError(f"{what} {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise HomeError(f"{what} {path} belongs to uid {st.st_uid}, not to you: refusing it")
    if st.st_mode & 0o022:
        raise HomeError(
            f"{what} {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}): "
            "refusing it; use a private directory (chmod 700) or another --home"
        )


class AlreadyRunning(Exception):
    """Another daemon holds this home's lock; carries its pid when known."""

    def __init__(self, pid: int | None) -> None:
        super().__init__(pid)
        self.pid = pid


class HomeLock:
    """An flock on ``dflashd.lock`` held for the daemon's life; the file records the holder's pid."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`AlreadyRunning`."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise HomeError(f"cannot open the lock {self.path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AlreadyRunning(read_lock_pid(self.path)) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (the kernel also drops it when the process dies)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_lock_pid(path: Path) -> int | None:
    """The pid written by the lock's holder, if readable."""
    try:
        return int(path.read_text().strip() or "0") or None
    except (OSError, ValueError):
        return None


def already_running_message(home: Home) -> str:
    """What a second start says: who holds the home, and what to do instead."""
    return (
        f"already running (pid {read_lock_pid(home.lock)}) on {home.root}: "
        f"`dflashd status --home {home.root}` shows its run; "
        "`dflashd restart` starts it again; another --home runs a second job"
    )


def lock_is_held(path: Path) -> bool:
    """True when a live daemon holds the lock (probe with a non-blocking shared lock)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
