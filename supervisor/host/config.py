"""The TOML config (docs/design.md, "Config"): every key has a default and a stated bound.

An unknown key, a value of the wrong type or one outside its bound is a :class:`ConfigError`
naming the key (the CLI exits 2 and launches nothing).  Each bound sits next to its field, in
the field's metadata, and comes from the mechanism that needs it (the log writer's minimum
file size, the framer's minimum piece, ``select()``'s finite timeouts).  Values are parsed
by their real type (``typing.get_type_hints``), not by annotation strings.
"""

from __future__ import annotations

import math
import os
import re
import sys
import tomllib
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Final, get_type_hints

from dflashd.logs.limits import MIN_LINE_BYTES, MIN_MAX_BYTES
from dflashd.supervisor.model.bounds import bounded_field, seconds_field
from dflashd.supervisor.model.policy import RestartConfig
from dflashd.supervisor.model.rules import ALERTED_BY_DEFAULT, ALL_ALERT_KINDS, any_alert_kind
from dflashd.supervisor.model.verdicts import AlertKind


class ConfigError(ValueError):
    """A config problem, phrased as one line for the user (exit 2)."""


def default_command() -> tuple[str, ...]:
    """The embedded trainer, run by the interpreter dflashd itself runs on (so a venv needs no activation)."""
    return (sys.executable, "-m", "dflashd.trainer")


_key, _seconds = bounded_field, seconds_field


@dataclass(frozen=True)
class LogsConfig:
    """The ``[logs]`` table."""

    max_bytes: int = _key(100 * 1024 * 1024, low=MIN_MAX_BYTES)  # the writer's minimum file
    backups: int = _key(10, low=0, high=1000)
    max_line_bytes: int = _key(65536, low=MIN_LINE_BYTES, high=16 * 1024 * 1024)  # framer
    compress: bool = True  # rotated run-log files: .N.zst, by a low-priority helper process
    daemon_max_bytes: int = _key(10 * 1024 * 1024, low=MIN_MAX_BYTES)  # daemon.log, rotated too
    daemon_backups: int = _key(3, low=0, high=1000)
    history_runs: int = _key(100_000, low=100)  # runs.sqlite keeps the newest this many runs


@dataclass(frozen=True)
class AlertsConfig:
    """The ``[alerts]`` table."""

    webhook_url: str = ""
    command: tuple[str, ...] = ()
    file: str = ""  # an absolute path: each alert appended as one JSON line (0600, no link)
    on: tuple[AlertKind, ...] = ALERTED_BY_DEFAULT


@dataclass(frozen=True)
class Config:
    """The whole config; ``command`` may be replaced by ``dflashd start -- CMD``."""

    command: tuple[str, ...] = _key(factory=default_command)
    cwd: str = "."
    env: dict[str, str] = _key(factory=dict)
    gpus: str | tuple[int, ...] = "all"
    # a GPU the pre-flight finds unusable (model/preflight.py): relaunch on the others (true),
    # or stop for an operator with exit code 75 (false: a job sized for its GPUs)
    gpu_fallback: bool = False
    # a python script or module job: keep the next run's interpreter ready, its heavy imports
    # (torch) done, while a run trains (host/standby.py); a relaunch then skips that cold start
    warm_standby: bool = False
    gpu_poll_s: float = _seconds(2.0, above=None, low=0.05)  # an NVML poll costs ~0.05 ms
    vram_grace_s: float = _seconds(300.0)
    gpu_release_timeout_s: float = _seconds(60.0, above=None, low=0.0)
    gpu_busy_pct: float = _key(60.0, above=0.0, high=100.0)  # GPU activity as evidence of training
    gpu_busy_s: float = _seconds(30.0)
    first_step_timeout_s: float = _seconds(3600.0)
    stall_timeout_s: float = _seconds(900.0)
    # a steady run with no new step for max(this, 6 x its typical interval) is sampled for a
    # hang (stacks, I/O); only a proven hang ends it early (hang.py); 0 turns the sampling off
    hang_suspect_s: float = _seconds(12.0, above=None, low=0.0)
    # a run found waiting on work elsewhere (every rank here in a collective while the job's
    # world reaches other nodes; a lock or a pipe whose other end is outside the run) is never
    # ended for it: one `waiting` alert after this long, and the stall window has the last word
    remote_wait_s: float = _seconds(300.0, above=None, low=0.0)
    first_step_pattern: str = ""
    step_pattern: str = ""
    builtin_formats: bool = True  # recognise the step lines of common trainers
    # `dflashd start` waits this long for the first step (or a death): a torch import and more
    start_wait_s: float = _seconds(30.0, above=None, low=0.0)
    metrics_listen: str = ""
    # a loss that goes NaN/infinite, or leaves its range and stays out (model/divergence.py):
    # "alert" (one alert, the run goes on) or "stop" (the run is ended, never relaunched)
    on_diverge: str = "alert"
    node: str = (
        ""  # this node's name in status and metrics (a node of a larger job); "": the host name
    )
    restart: RestartConfig = _key(factory=RestartConfig)
    logs: LogsConfig = _key(factory=LogsConfig)
    alerts: AlertsConfig = _key(factory=AlertsConfig)

    @property
    def node_name(self) -> str:
        """``node``, or the host name."""
        import socket

        return self.node or socket.gethostname()

    @property
    def gpus_enabled(self) -> bool:
        """False when ``gpus = "none"``: NVML is never touched."""
        return self.gpus != "none"


_TABLES: Final[dict[str, type]] = {
    "restart": RestartConfig,
    "logs": LogsConfig,
    "alerts": AlertsConfig,
}


def _number(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"{where}: expected a finite number, got {value!r}")
    return float(value)


def _integer(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    return value


def _boolean(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    return value


def _string(where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    if "\0" in value:
        raise ConfigError(f"{where}: must not contain a NUL character")
    return value


def _strings(where: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):  # command = "python train.py": a shell line, not argv
        raise ConfigError(
            f"{where}: expected a list of strings, got the string {value!r} "
            f"(write {where} = {value.split()!r})"
        )
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: expected a list of strings, got {value!r}")
    return tuple(_string(where, v) for v in value)


def _integers(where: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected a list of integers, got {value!r}")
    return tuple(_integer(where, v) for v in value)


def _string_table(where: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigError(f"{where}: expected a table of strings, got {value!r}")
    for key in value:
        if not key or "=" in key:  # the environment's own syntax: NAME=value
            raise ConfigError(f"{where}: variable name {key!r} must be non-empty, without '='")
    return {_string(where, k): _string(where, v) for k, v in value.items()}


def _gpus(where: str, value: Any) -> str | tuple[int, ...]:
    if value in ("all", "none"):
        return str(value)
    if isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        return tuple(value)
    raise ConfigError(f'{where}: expected "all", "none" or a list of GPU indices, got {value!r}')


def _alert_kinds(where: str, value: Any) -> tuple[AlertKind, ...]:
    names = _strings(where, value)
    known = {k.value for k in ALL_ALERT_KINDS}
    for name in names:
        if name not in known:
            raise ConfigError(
                f"{where}: unknown alert kind {name!r} (known: {', '.join(sorted(known))})"
            )
    return tuple(any_alert_kind(n) for n in names)


_PARSERS: Final[dict[Any, Callable[[str, Any], Any]]] = {
    float: _number,
    int: _integer,
    bool: _boolean,
    str: _string,
    tuple[str, ...]: _strings,
    tuple[int, ...]: _integers,
    dict[str, str]: _string_table,
    str | tuple[int, ...]: _gpus,
    tuple[AlertKind, ...]: _alert_kinds,
}


def _check_bound(where: str, value: float, meta: Any) -> None:
    low, above, high = meta.get("low"), meta.get("above"), meta.get("high")
    if low is not None and value < low:
        raise ConfigError(f"{where}: must be at least {low:g}, got {value:g}")
    if above is not None and value <= above:
        raise ConfigError(f"{where}: must be greater than {above:g}, got {value:g}")
    if high is not None and value > high:
        raise ConfigError(f"{where}: must be at most {high:g}, got {value:g}")


def _build(cls: type, data: dict[str, Any], prefix: str) -> Any:
    known = {f.name: f for f in fields(cls)}
    hints = get_type_hints(cls)
    values: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{prefix}{key}"
        if key not in known:
            raise ConfigError(f"unknown config key {where!r}")
        if prefix == "" and key in _TABLES:
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: expected a table")
            values[key] = _build(_TABLES[key], value, f"{key}.")
            continue
        checked = _PARSERS[hints[key]](where, value)
        if isinstance(checked, int | float) and not isinstance(checked, bool):
            _check_bound(where, checked, known[key].metadata)
        values[key] = checked
    return cls(**values)


_URL_CHARS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]*")


def _check_webhook(url: str) -> None:
    """An http(s) URL with a host, of RFC 3986's characters only (a stray space or a control
    character is refused here, not at the first alert); the message never repeats the URL
    (it is a secret)."""
    if _URL_CHARS.fullmatch(url) is None:
        raise ConfigError(
            "alerts.webhook_url: holds a space, a control or a non-ASCII character "
            "(not shown: the URL is a secret); percent-encode it or remove it"
        )
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname
        _ = parts.port  # a port that is not a number raises here
    except ValueError:
        raise ConfigError(
            "alerts.webhook_url: not a valid URL (not shown: it is a secret)"
        ) from None
    if parts.scheme not in ("http", "https") or not host:
        raise ConfigError("alerts.webhook_url: must be an http:// or https:// URL with a host")


def _validate(config: Config) -> Config:
    if not config.command or not config.command[0]:
        raise ConfigError("command: must not be empty")
    for key in ("first_step_pattern", "step_pattern"):
        pattern = getattr(config, key)
        if not pattern:
            continue
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"{key}: not a valid regex: {exc}") from None
        if key == "step_pattern" and compiled.groups < 1:
            raise ConfigError("step_pattern: needs one group that captures the step number")
    if config.on_diverge not in ("alert", "stop"):
        raise ConfigError(f'on_diverge: must be "alert" or "stop", got {config.on_diverge!r}')
    if config.metrics_listen:
        try:
            parse_listen(config.metrics_listen)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if config.alerts.webhook_url:
        _check_webhook(config.alerts.webhook_url)
    if config.alerts.file and not os.path.isabs(config.alerts.file):
        raise ConfigError(f"alerts.file: must be an absolute path, got {config.alerts.file!r}")
    if config.restart.backoff_initial_s > config.restart.backoff_max_s:
        raise ConfigError("restart.backoff_initial_s: must not exceed restart.backoff_max_s")
    return config


def parse_config(data: dict[str, Any]) -> Config:
    """A Config from already-parsed TOML data."""
    return _validate(_build(Config, data, ""))


MAX_CONFIG_BYTES = 1024 * 1024


def _read_config_text(path: Path) -> str:
    """A regular file of at most ``MAX_CONFIG_BYTES``: never a FIFO or a device (it could
    block the start forever), never a file too large to be a config."""
    import os
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(path)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"config is not a regular file: {path}")
        if st.st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"config is larger than {MAX_CONFIG_BYTES // 1024} KiB: {path}")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    finally:
        os.close(fd)
    return raw.decode("utf-8")


def load_config(path: Path | None, command: tuple[str, ...] = ()) -> Config:
    """Read and validate ``path`` (defaults when None); ``command`` overrides the config's."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(_read_config_text(path))
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except IsADirectoryError:
            raise ConfigError(f"config is a directory: {path}") from None
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{path}: not UTF-8 text") from None
        except RecursionError:
            raise ConfigError(f"{path}: nested too deeply") from None
    if command:
        if "command" in data:  # the file's own command is checked even when the CLI's wins
            _strings("command", data["command"])
        data = {**data, "command": list(command)}
    return parse_config(data)


def config_to_dict(config: Config) -> dict[str, Any]:
    """A JSON-friendly view (for state.json and the spawn record); secrets masked."""
    out: dict[str, Any] = {}
    for f in fields(config):
        value = getattr(config, f.name)
        if f.name in _TABLES:
            table = {g.name: getattr(value, g.name) for g in fields(value)}
            if f.name == "alerts" and table["webhook_url"]:
                table["webhook_url"] = "<set>"
            out[f.name] = table
        else:
            out[f.name] = value
    return out


def parse_listen(listen: str) -> tuple[str, int]:
    """``"127.0.0.1:9464"``, ``":9464"`` or ``"9464"`` -> (host, port); a bare port binds loopback."""
    host, sep, port = listen.rpartition(":")
    if not sep:
        host, port = "", listen
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"metrics_listen: expected host:port, got {listen!r}")
    return host, int(port)
