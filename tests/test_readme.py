"""The README is a newcomer's page (issue 44): short, and every command it shows runs as shown.

- Its everyday block runs, line by line, in a fresh ``$HOME`` with a plain ``train.py``, each
  command exiting 0 (``stacks`` only where py-spy can read the job).
- Its "one job, one home" block runs as a script.
- Every other ``dflashd …`` it names (inline, in tables, in the service recipe) parses: the
  command exists and takes those options.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from dflashd.supervisor.client.cli import main
from dflashd.supervisor.host.pyspy import find_py_spy

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()

TRAIN = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
step = 0
while True:
    step += 1
    print(f"step {step} loss {4.0 / (1 + step * 0.01):.4f}", flush=True)
    time.sleep(0.1)
"""


def block_after(heading: str) -> str:
    """The first ```bash block after ``heading``."""
    rest = README.split(heading, 1)[1]
    return rest.split("```bash\n", 1)[1].split("```", 1)[0]


def shell_env(tmp_path: Path) -> dict[str, str]:
    """A newcomer's shell: a fresh home directory, this venv's ``dflashd`` and ``python``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DFLASHD_", "XDG_"))}
    env["HOME"] = str(tmp_path / "me")
    env["PATH"] = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    (tmp_path / "me").mkdir()
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "eval.py").write_text(TRAIN.replace("while True", "while step < 30"))
    return env


def test_the_readme_is_a_page_a_newcomer_reads() -> None:
    lines = README.count("\n")
    assert lines < 300, f"README.md is {lines} lines"
    for doc in ("docs/guide.md", "docs/design.md", "docs/measurements.md", "CHANGELOG.md"):
        assert f"]({doc}" in README and (ROOT / doc).is_file(), doc
    for anchor in re.findall(r"\(docs/guide\.md#([a-z0-9-]+)\)", README):
        headings = re.findall(r"^## (.+)$", (ROOT / "docs" / "guide.md").read_text(), re.M)
        slugs = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}
        assert anchor in slugs, f"docs/guide.md has no section #{anchor}"


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory: a newcomer's ``~/.local/state/dflashd-eval`` must fit a socket path."""
    where = Path(tempfile.mkdtemp(prefix="rd", dir="/tmp"))
    yield where
    shutil.rmtree(where, ignore_errors=True)


def test_the_everyday_block_runs_as_shown(short_tmp: Path) -> None:
    tmp_path = short_tmp
    env = shell_env(tmp_path)
    spy = find_py_spy() is not None
    ran: list[str] = []
    try:
        for line in block_after("## Everyday use").splitlines():
            command = line.split("  #", 1)[0].strip()
            if not command:
                continue
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if command == "dflashd stacks" and not spy:
                continue  # no py-spy here: the command says so (tests/test_stacks.py)
            assert done.returncode == 0, (command, done.stdout, done.stderr)
            ran.append(command)
            if command == "dflashd status":
                assert "running" in done.stdout and "python train.py --lr 3e-4" in done.stdout
            if command.startswith("dflashd tail --since"):
                assert "loss" in done.stdout
    finally:
        subprocess.run(["bash", "-c", "dflashd stop"], cwd=tmp_path, env=env, check=False)
    assert ran[0].startswith("dflashd start") and ran[-1].startswith("dflashd report")
    assert (tmp_path / "runs.html").is_file()
    home = tmp_path / "me" / ".local" / "state" / "dflashd"
    assert (home / "logs" / "dflashd.jsonl").is_file()


def test_the_one_home_block_runs_as_shown(short_tmp: Path) -> None:
    tmp_path = short_tmp
    env = shell_env(tmp_path)
    script = block_after("## One job, one home")
    eval_home = tmp_path / "me" / ".local" / "state" / "dflashd-eval"
    try:
        done = subprocess.run(
            ["bash", "-e", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert (eval_home / "logs" / "dflashd.jsonl").is_file()
    finally:
        subprocess.run(
            ["bash", "-c", f"dflashd stop --home {eval_home}"], cwd=tmp_path, env=env, check=False
        )


def _commands_named() -> list[str]:
    """Every ``dflashd …`` the README shows: inline code, table cells, code blocks."""
    prose = re.sub(r"```.*?```", "", README, flags=re.S)
    inline = [code.strip() for code in re.findall(r"`([^`\n]+)`", prose)]
    found = [c for c in inline if c.startswith(("dflashd ", "sudo -u dflashd dflashd "))]
    for kind, block in re.findall(r"```(\w*)\n(.*?)```", README, re.S):
        for line in block.splitlines():
            if kind != "bash" and not line.startswith("$ "):
                continue  # output shown, not a command
            command = line.split("  #", 1)[0].strip().removeprefix("$ ")
            if command.startswith(("dflashd ", "sudo -u dflashd dflashd ")):
                found.append(command)
    return found


def _args(command: str) -> list[str]:
    """The words dflashd gets: no sudo, no pipe or redirection after them."""
    command = command.removeprefix("sudo -u dflashd ")
    words = shlex.split(command.split(" | ", 1)[0].replace("…", "x"))
    assert words[0] == "dflashd", command
    return [w for w in words[1:] if not re.fullmatch(r"\d?>&?\d?", w)]


@pytest.mark.parametrize("command", sorted(set(_commands_named())))
def test_every_command_the_readme_names_parses(command: str, tmp_path: Path) -> None:
    args = _args(command)
    for word in args:  # a config named in the example must exist to be parsed
        if word.endswith(".toml"):
            (tmp_path / word).write_text("")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        ctx = main.make_context("dflashd", list(args))
        rest = [*getattr(ctx, "_protected_args", ()), *ctx.args]  # click 8.2's split
        assert rest, command
        sub = main.get_command(ctx, rest[0])
        assert sub is not None, f"{command}: no command {rest[0]!r}"
        sub.make_context(rest[0], rest[1:], parent=ctx)
    except click.UsageError as exc:
        pytest.fail(f"{command}: {exc}")
    finally:
        os.chdir(cwd)
