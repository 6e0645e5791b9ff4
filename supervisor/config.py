"""The TOML config of DESIGN §7: every key has a default, an unknown key is an error that names it."""

from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Final

from dflashd.supervisor.verdicts import ALERTABLE, Verdict


class ConfigError(ValueError):
    """A config problem, phrased as one line for the user (exit 2)."""


def default_command() -> tuple[str, ...]:
    """The embedded trainer, run by the interpreter dflashd itself runs on (so a venv needs no activation)."""
    return (sys.executable, "-m", "dflashd.trainer")


@dataclass(frozen=True)
class RestartConfig:
    """The ``[restart]`` table."""

    early_retries: int = 3
    runtime_retries: int = 10
    stable_after_s: float = 600.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 300.0
    clear_cache_on_early_death: bool = True
    no_restart_exit_codes: tuple[int, ...] = (78,)
    stop_timeout_s: float = 30.0


@dataclass(frozen=True)
class LogsConfig:
    """The ``[logs]`` table."""

    max_bytes: int = 100 * 1024 * 1024
    backups: int = 10
    max_line_bytes: int = 65536


@dataclass(frozen=True)
class AlertsConfig:
    """The ``[alerts]`` table."""

    webhook_url: str = ""
    command: tuple[str, ...] = ()
    on: tuple[str, ...] = (*(v.value for v in ALERTABLE), "fatal", "recovered")


@dataclass(frozen=True)
class Config:
    """The whole config; ``command`` may be replaced by ``dflashd start -- CMD``."""

    command: tuple[str, ...] = field(default_factory=default_command)
    cwd: str = "."
    env: dict[str, str] = field(default_factory=dict)
    gpus: str | tuple[int, ...] = "all"
    gpu_poll_s: float = 2.0
    vram_grace_s: float = 300.0
    gpu_release_timeout_s: float = 60.0
    first_step_timeout_s: float = 3600.0
    stall_timeout_s: float = 900.0
    first_step_pattern: str = ""
    step_pattern: str = ""
    metrics_listen: str = ""
    restart: RestartConfig = field(default_factory=RestartConfig)
    logs: LogsConfig = field(default_factory=LogsConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)

    @property
    def gpus_enabled(self) -> bool:
        """False when ``gpus = "none"``: NVML is never touched."""
        return self.gpus != "none"


_TABLES: Final[dict[str, type]] = {
    "restart": RestartConfig,
    "logs": LogsConfig,
    "alerts": AlertsConfig,
}
_POSITIVE: Final = {
    "gpu_poll_s",
    "vram_grace_s",
    "gpu_release_timeout_s",
    "first_step_timeout_s",
    "stall_timeout_s",
    "stable_after_s",
    "backoff_max_s",
    "stop_timeout_s",
    "max_bytes",
    "max_line_bytes",
}
_NON_NEGATIVE: Final = {"early_retries", "runtime_retries", "backoff_initial_s", "backups"}


def _check_type(where: str, value: Any, expected: Any) -> Any:
    """Coerce/validate one value against its field's annotation; raise ConfigError naming ``where``."""
    if expected in ("float", float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if expected in ("int", int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if expected in ("bool", bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if expected in ("str", str):
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if expected == "tuple[str, ...]":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: expected a list of strings, got {value!r}")
        return tuple(value)
    if expected == "tuple[int, ...]":
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise ConfigError(f"{where}: expected a list of integers, got {value!r}")
        return tuple(value)
    if expected == "dict[str, str]":
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise ConfigError(f"{where}: expected a table of strings, got {value!r}")
        return dict(value)
    if expected == "str | tuple[int, ...]":
        if value in ("all", "none"):
            return value
        if isinstance(value, list) and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
        ):
            return tuple(value)
        raise ConfigError(
            f'{where}: expected "all", "none" or a list of GPU indices, got {value!r}'
        )
    raise ConfigError(f"{where}: unsupported type {expected}")  # pragma: no cover


def _build(cls: type, data: dict[str, Any], prefix: str) -> Any:
    known = {f.name: f for f in fields(cls)}
    values: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{prefix}{key}"
        if key not in known:
            if prefix == "" and key in _TABLES:
                pass
            else:
                raise ConfigError(f"unknown config key {where!r}")
        if key in _TABLES and prefix == "":
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: expected a table")
            values[key] = _build(_TABLES[key], value, f"{key}.")
            continue
        checked = _check_type(where, value, known[key].type)
        if key in _POSITIVE and checked <= 0:
            raise ConfigError(f"{where}: must be greater than 0, got {value!r}")
        if key in _NON_NEGATIVE and checked < 0:
            raise ConfigError(f"{where}: must not be negative, got {value!r}")
        values[key] = checked
    return cls(**values)


def _validate(config: Config) -> Config:
    if not config.command:
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
    if config.metrics_listen:
        from dflashd.supervisor.metrics import parse_listen

        try:
            parse_listen(config.metrics_listen)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    verdicts = {v.value for v in Verdict} | {"fatal", "recovered"}
    for name in config.alerts.on:
        if name not in verdicts:
            raise ConfigError(f"alerts.on: unknown verdict {name!r}")
    if config.restart.backoff_initial_s > config.restart.backoff_max_s:
        raise ConfigError("restart.backoff_initial_s: must not exceed restart.backoff_max_s")
    return config


def parse_config(data: dict[str, Any]) -> Config:
    """A Config from already-parsed TOML data."""
    return _validate(_build(Config, data, ""))


def load_config(path: Path | None, command: tuple[str, ...] = ()) -> Config:
    """Read and validate ``path`` (defaults when None); ``command`` overrides the config's."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    config = parse_config(data)
    if command:
        config = replace(config, command=command)
    return config


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
