"""The built wheel installs every package folder under the dflashd namespace, and the CLI basics."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from dflashd.supervisor import __version__

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_contains_every_package_folder(tmp_path: Path) -> None:
    """supervisor/, trainer/ and logs/ land as dflashd.supervisor, dflashd.trainer, dflashd.logs (and nothing bare)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    wheel = next(tmp_path.glob("dflashd-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in ("supervisor", "trainer", "logs"):
        sources = {str(p.relative_to(ROOT / folder)) for p in (ROOT / folder).rglob("*.py")}
        prefix = f"dflashd/{folder}/"
        packaged = {
            n.removeprefix(prefix) for n in names if n.startswith(prefix) and n.endswith(".py")
        }
        assert sources == packaged, f"{folder}: missing {sources - packaged}"
    assert not any(n.startswith(("supervisor/", "trainer/", "logs/")) for n in names)
    assert not any(
        n == "dflashd/__init__.py" for n in names
    )  # a namespace: never shadowed by a folder
    assert "dflashd/__main__.py" in names  # python -m dflashd
    assert "dflashd/supervisor/design.md" in names  # the design --help names
    # the types of what dflashd.logs imports on first use, for a type checker of the user's
    assert "dflashd/logs/__init__.pyi" in names
    # the license travels with the wheel, and the metadata names it (pip show's License)
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "License-Expression: Apache-2.0" in text and "License-File: LICENSE" in text
    assert any(n.endswith("licenses/LICENSE") for n in names)


def test_version_and_help_are_fast_and_torch_free() -> None:
    """`dflashd --version` works, and the supervisor never imports torch."""
    out = subprocess.run(
        [sys.executable, "-m", "dflashd.supervisor", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == f"dflashd, version {__version__}"
    probe = (
        "import sys, dflashd.supervisor.client.cli, dflashd.supervisor.daemon, dflashd.supervisor.watch.nvml; "
        "print('torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_python_dash_m_dflashd_and_help_name_the_shipped_design() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dflashd", "--help"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0 and "Usage: dflashd" in result.stdout
    named = result.stdout.split("contracts:", 1)[1].split()[0]
    assert Path(named).name == "design.md" and Path(named).is_file()
