"""The dataclasses' compiled methods kept between starts (supervisor/host/codecache.py): a class made
from kept code is the class made from its source, and a file that is torn, foreign or writable by
others is never run.  Each start is a real interpreter of its own."""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Makes a few dataclasses of every kind the daemon uses and says how they behave.
CLASSES = r"""
import dataclasses, json, sys
from pathlib import Path
from dflashd.supervisor.host import codecache
cache = codecache.install(Path(sys.argv[1]))

@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    step: int
    loss: float | None = None
    marks: tuple[int, ...] = ()

@dataclasses.dataclass
class Counts:
    seen: int = 0
    names: list[str] = dataclasses.field(default_factory=list)

@dataclasses.dataclass(eq=False)
class Handle:
    fd: int

a, b = Step(3, 2.5), Step(3, 2.5)
try:
    a.step = 4
    frozen = False
except dataclasses.FrozenInstanceError:
    frozen = True
counts = Counts()
counts.names.append("x")
print(json.dumps({
    "repr": [repr(a), repr(counts), repr(Handle(1)).split(" at ")[0]],
    "eq": [a == b, a == Step(4), Counts() == Counts(), Handle(1) == Handle(1)],
    "hash": hash(a) == hash(b),
    "frozen": frozen,
    "replace": repr(dataclasses.replace(a, loss=1.0)),
    "fields": [f.name for f in dataclasses.fields(Step)],
    "slots": list(Step.__slots__),
    "fresh_default": Counts().names,
    "compiled": None if cache is None else cache.compiled,
}))
"""


def start(cache: Path, **env: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", CLASSES, str(cache)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stdout)
    return result


def read_cache(kept: Path) -> tuple[object, object, dict[int, list[tuple[int, ...]]], bytes]:
    """The file's parts: its header's (format, tag, index), then the blob."""
    data = kept.read_bytes()
    header_n = int.from_bytes(data[:8], "little")
    form, tag, index = marshal.loads(data[8 : 8 + header_n])
    return form, tag, index, data[8 + header_n :]


def write_cache(kept: Path, form: object, tag: object, index: object, blob: bytes) -> None:
    header = marshal.dumps((form, tag, index))
    kept.write_bytes(len(header).to_bytes(8, "little") + header + blob)


def behaviour(result: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in result.items() if k != "compiled"}


def test_a_class_made_from_kept_code_is_the_class_made_from_its_source(tmp_path: Path) -> None:
    kept = tmp_path / "cache.bin"
    plain = start(kept, DFLASHD_NO_CODE_CACHE="1")
    assert plain["compiled"] is None and not kept.exists()  # switched off: the plain exec
    first = start(kept, PYTHONDONTWRITEBYTECODE="")
    assert isinstance(first["compiled"], int) and first["compiled"] >= 10
    assert kept.exists()
    second = start(kept, PYTHONDONTWRITEBYTECODE="")
    assert second["compiled"] == 0  # every method's code came from the file
    assert behaviour(plain) == behaviour(first) == behaviour(second)
    assert behaviour(second)["eq"] == [True, False, True, False]


def test_nothing_is_written_where_python_writes_no_bytecode(tmp_path: Path) -> None:
    kept = tmp_path / "cache.bin"
    start(kept, PYTHONDONTWRITEBYTECODE="1")
    assert not kept.exists()


def _poisoned(kept: Path) -> None:
    """The file's every method replaced by code that ends the process, saying so."""
    form, tag, index, blob = read_cache(kept)
    poison = marshal.dumps(compile("raise SystemExit('ran the file')", "<poison>", "exec"))
    poisoned, new_index = bytearray(), {}
    for crc, entries in index.items():
        for at, text_n, _code_at, _code_n in entries:
            entry = (len(poisoned), text_n, len(poisoned) + text_n, len(poison))
            poisoned += blob[at : at + text_n] + poison
            new_index.setdefault(crc, []).append(entry)
    write_cache(kept, form, tag, new_index, bytes(poisoned))


def test_a_file_others_may_write_is_never_run_and_ours_is(tmp_path: Path) -> None:
    kept = tmp_path / "cache.bin"
    start(kept, PYTHONDONTWRITEBYTECODE="")
    _poisoned(kept)
    os.chmod(kept, 0o666)
    assert start(kept, PYTHONDONTWRITEBYTECODE="1")["compiled"] != 0  # not run: compiled anew
    os.chmod(kept, 0o644)
    done = subprocess.run(
        [sys.executable, "-c", CLASSES, str(kept)], capture_output=True, text=True, check=False
    )
    assert "ran the file" in done.stderr  # the same file, ours alone: it is what runs


SETTLED = r"""
import dataclasses, sys
from pathlib import Path
from dflashd.supervisor.host import codecache
cache = codecache.install(Path(sys.argv[1]))

@dataclasses.dataclass(frozen=True)
class Before:
    a: int

codecache.settle()  # what the daemon does before its loop
assert cache.blob == b"" and cache.new == {} and "exec" not in vars(dataclasses)  # let go: the plain compile

@dataclasses.dataclass(frozen=True)
class After:
    a: int

assert After(1) == After(1) and Before(2) != Before(3)
print("settled")
"""


def test_a_settled_start_has_saved_its_code_and_compiles_as_dataclasses_does(
    tmp_path: Path,
) -> None:
    kept = tmp_path / "cache.bin"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": ""}
    done = subprocess.run(
        [sys.executable, "-c", SETTLED, str(kept)], env=env, capture_output=True, text=True
    )
    assert done.stdout.strip() == "settled", done.stderr[-2000:]
    _form, _tag, index, _blob = read_cache(kept)
    assert (
        5 <= sum(map(len, index.values())) <= 8
    )  # Before's methods (six in 3.11), saved at settle; not After's


BECOMES_DAEMON = r"""
import dataclasses, sys
from pathlib import Path
from dflashd.supervisor.host import codecache, handover
from dflashd.supervisor.host.config import Config
from dflashd.supervisor.host.home import Home
codecache.install(Path(sys.argv[1]))

@dataclasses.dataclass(frozen=True)
class OnlyTheCommandMakes:
    word: str

home = Home(Path(sys.argv[2]))
home.create()
# the program it execs: an interpreter that says it ran (the daemon's own start is not tested here)
handover._argv = lambda fd, given: [sys.executable, "-c", "print('execd')"]
handover.become_daemon(handover.Handover(home, Config(command=("true",)), None))
"""


def test_the_command_that_becomes_the_daemon_keeps_its_code_before_the_exec(
    tmp_path: Path,
) -> None:
    """``start --foreground`` execs the daemon program, which runs no exit handler of the
    command: what the command compiled is saved before the exec (a unit's start never runs
    another command that would save it)."""
    kept = tmp_path / "cache.bin"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": ""}
    done = subprocess.run(
        [sys.executable, "-c", BECOMES_DAEMON, str(kept), str(tmp_path / "home")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.stdout.strip() == "execd", done.stderr[-2000:]
    _form, _tag, index, _blob = read_cache(kept)
    assert sum(map(len, index.values())) >= 5  # OnlyTheCommandMakes's methods among them


@pytest.mark.parametrize(
    "torn",
    [b"", b"\x00garbage", b"\xe3" * 7, b"\xff" * 8 + b"x", (9).to_bytes(8, "little") + b"\x00" * 9],
)
def test_a_torn_file_is_compiled_anew_and_replaced(tmp_path: Path, torn: bytes) -> None:
    kept = tmp_path / "cache.bin"
    kept.write_bytes(torn)
    os.chmod(kept, 0o644)
    result = start(kept, PYTHONDONTWRITEBYTECODE="")
    assert isinstance(result["compiled"], int) and result["compiled"] >= 10
    assert start(kept, PYTHONDONTWRITEBYTECODE="")["compiled"] == 0


@pytest.mark.parametrize("bad", [[(-5, 10**9, 7, -1)], [("x",)], None, [(0, 1, 2)], "abc"])
def test_entries_not_as_written_are_compiled_anew_and_the_file_mended(
    tmp_path: Path, bad: object
) -> None:
    kept = tmp_path / "cache.bin"
    start(kept, PYTHONDONTWRITEBYTECODE="")
    form, tag, index, blob = read_cache(kept)
    write_cache(kept, form, tag, dict.fromkeys(index, bad), blob)
    result = start(kept, PYTHONDONTWRITEBYTECODE="")
    assert isinstance(result["compiled"], int) and result["compiled"] >= 10
    assert start(kept, PYTHONDONTWRITEBYTECODE="")["compiled"] == 0


OTHER = r"""
import dataclasses, sys
from pathlib import Path
from dflashd.supervisor.host import codecache
cache = codecache.install(Path(sys.argv[1]))

@dataclasses.dataclass(frozen=True)
class Other:
    x: int
    y: str = "y"

print("made", cache.compiled, flush=True)
sys.stdin.readline()  # held here until the test lets it exit (and save)
"""


def test_two_starts_saving_at_once_both_keep_their_code(tmp_path: Path) -> None:
    """A start that read the file before another saved it merges, not overwrites: the file
    then holds both starts' code, and neither compiles again."""
    kept = tmp_path / "cache.bin"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": ""}
    argv = [sys.executable, "-c", OTHER, str(kept)]
    other = subprocess.Popen(
        argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert other.stdin is not None and other.stdout is not None
    assert int(other.stdout.readline().split()[1]) >= 3  # it read the file (empty), compiled
    assert start(kept, PYTHONDONTWRITEBYTECODE="")["compiled"] != 0  # this one saved first
    other.stdin.write("\n")
    other.stdin.close()
    assert other.wait(30) == 0  # ...then it saved, after it
    other.stdout.close()
    assert start(kept, PYTHONDONTWRITEBYTECODE="")["compiled"] == 0
    again = subprocess.run(argv, env=env, input="\n", capture_output=True, text=True, check=True)
    assert again.stdout.split() == ["made", "0"]


def test_install_reads_nothing_until_a_class_is_made(tmp_path: Path) -> None:
    """Installing costs nothing: the file is read at the first class made."""
    kept = tmp_path / "cache.bin"
    start(kept, PYTHONDONTWRITEBYTECODE="")  # a file to read
    script = (
        "import dataclasses, sys\n"
        "from pathlib import Path\n"
        "from dflashd.supervisor.host import codecache\n"
        "cache = codecache.install(Path(sys.argv[1]))\n"
        "before = cache.loaded\n"
        "@dataclasses.dataclass\n"
        "class Made:\n"
        "    a: int\n"
        "print(before, cache.loaded)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(kept)], capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["False", "True"]


WHO_INSTALLS = (
    "import sys\n"
    "sys.argv[:] = sys.argv[1:]\n"
    "import dflashd.supervisor, dataclasses\n"
    "print('exec' in vars(dataclasses))\n"
)


@pytest.mark.parametrize(
    ("argv", "installed"),
    [(["-m", "--handover-fd", "4"], True), (["-m", "status"], False), (["pytest"], False)],
)
def test_the_package_installs_the_cache_for_the_daemon_program_only(
    argv: list[str], installed: bool
) -> None:
    """The daemon program (``-m dflashd.supervisor.daemon --handover-fd N``: ``sys.argv`` while
    ``-m`` imports its package) gets the cache before ``daemon.py`` loads; the command gets it
    in ``__main__``, after its Ctrl-C handler, and a plain import never."""
    from dflashd.supervisor.host.handover import HANDOVER_OPTION

    assert HANDOVER_OPTION == "--handover-fd"  # as the package's __init__ spells it
    env = {**os.environ, "DFLASHD_NO_CODE_CACHE": ""}
    done = subprocess.run(
        [sys.executable, "-c", WHO_INSTALLS, *argv], env=env, capture_output=True, text=True
    )
    assert done.stdout.split() == [str(installed)], done.stderr


def test_the_command_sets_its_ctrl_c_handler_before_the_cache_loads_anything() -> None:
    """``dflashd``'s ``__main__``: the handler first, then the cache (whose import of
    ``dataclasses`` took ~10-20 ms, in which a Ctrl-C was Python's traceback), then the rest."""
    script = (
        "import sys\n"
        "import dflashd.supervisor.__main__ as m\n"
        "import dflashd.supervisor.host\n"
        "loaded = []\n"
        "m.hold_ctrl_c_while_loading = lambda _h=m.hold_ctrl_c_while_loading: (loaded.append(\n"
        "    'dataclasses' in sys.modules), _h())[1]\n"
        "try:\n"
        "    m.main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(loaded[0], 'exec' in vars(sys.modules['dataclasses']))\n"
    )
    env = {**os.environ, "DFLASHD_NO_CODE_CACHE": ""}
    done = subprocess.run(
        [sys.executable, "-c", script, "--version"], env=env, capture_output=True, text=True
    )
    assert done.stdout.split()[-2:] == ["False", "True"], (done.stdout, done.stderr)
