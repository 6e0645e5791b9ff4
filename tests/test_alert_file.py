"""The ``file`` alert sink (issue 42's trial of a new sink: ``host/config.py``,
``speak/alertfile.py`` and one line of ``speak/alerts.py``): each alert one JSON line appended
to a file of the user's, 0600, never through a link; a relative path is a config error."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

from dflashd.supervisor.host.config import ConfigError, parse_config
from dflashd.supervisor.speak.alertfile import append_alert
from tests.conftest import Daemon, child

Start = Callable[..., Daemon]


def test_a_crash_loop_appends_its_alerts_one_line_each(start_daemon: Start, tmp_path: Path) -> None:
    alerts = tmp_path / "alerts.jsonl"
    daemon = start_daemon(
        child("import_error.py"), restart={"early_retries": 1}, alerts={"file": str(alerts)}
    )
    assert daemon.wait(60) == 4
    sent = [json.loads(line) for line in alerts.read_text().splitlines()]
    assert [a["verdict"] for a in sent] == ["fatal"]  # an ImportError is fatal at once: one page
    assert sent[0]["home"] == str(daemon.home) and sent[0]["run"] == 1
    assert stat.S_IMODE(alerts.stat().st_mode) == 0o600
    delivered = [a.fields for a in daemon.events("alert")]
    assert delivered and all(d["sink"] == "file" and d["ok"] for d in delivered)


def test_a_link_in_the_alert_files_place_is_refused_and_its_target_untouched(
    tmp_path: Path,
) -> None:
    target = tmp_path / "passwd-like"
    target.write_text("root:x:0:0\n")
    link = tmp_path / "alerts.jsonl"
    link.symlink_to(target)
    ok, detail = append_alert(str(link), {"verdict": "fatal"})
    assert not ok and "symlink" in detail
    assert target.read_text() == "root:x:0:0\n"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    ok, detail = append_alert(str(fifo), {})  # no reader: refused at once, never blocks
    assert not ok and str(fifo) in detail


def test_a_relative_alert_file_is_a_config_error() -> None:
    try:
        parse_config({"alerts": {"file": "alerts.jsonl"}})
    except ConfigError as exc:
        assert "alerts.file: must be an absolute path" in str(exc)
    else:
        raise AssertionError("a relative alerts.file was accepted")
