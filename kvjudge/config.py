"""Configuration: the TOML file and the default locations.

The config file is ``kvjudge.toml`` in the working directory, or the path given with ``--config``
(or ``KVJUDGE_CONFIG``). Every key is optional; a missing file means all defaults. A file that exists
but cannot be parsed, or holds a value of the wrong type, is an error naming the file and the key.

Sections::

    [memory]              provider = "token_budget", context_tokens = N, threshold_pct = 0.8
    [context.estimation]  chars_per_token = 4  |  counter = "chars" | "tiktoken" | "model"
    [retention]           ceiling = 200000, store = "path.sqlite", cold = "file:///path" | "s3://bucket/prefix",
                          counter = "model" | "tiktoken", endpoint_url = "http://..."
    [retention.tenants.NAME] ceiling = N
    [judge]               model = "path.gguf", server = "http://host:port" | servers = ["http://…", …],
                          parallel = 2, timeout = 600, margin = 0.05, threads = N
    [probe]               memory_budget = "6GiB", staleness_days = 30
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs

from kvjudge.errors import ConfigError

CONFIG_FILENAME = "kvjudge.toml"
APP_NAME = "kvjudge"


def cache_dir() -> Path:
    """Directory for re-creatable files (capability cache, assembled models): ``KVJUDGE_CACHE_DIR`` or the user cache dir."""
    override = os.environ.get("KVJUDGE_CACHE_DIR")
    return Path(override) if override else Path(platformdirs.user_cache_dir(APP_NAME))


def data_dir() -> Path:
    """Directory for data a user would miss (the run store): ``KVJUDGE_DATA_DIR`` or the user data dir."""
    override = os.environ.get("KVJUDGE_DATA_DIR")
    return Path(override) if override else Path(platformdirs.user_data_dir(APP_NAME))


@dataclass(frozen=True)
class Config:
    """The parsed config file: a read-only view with typed accessors.

    ``source`` is the file it came from, or ``None`` when no file exists (all defaults).
    """

    data: dict[str, Any] = field(default_factory=dict)
    source: Path | None = None

    def get(self, dotted: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        """The value at ``a.b.c``, checked to be of ``kind``; ``default`` when absent."""
        node: Any = self.data
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        # bool is an int in Python; a "true" where a number belongs is still a mistake.
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(node, bool) and bool not in kinds:
            node_ok = False
        else:
            node_ok = isinstance(node, kinds)
        if not node_ok:
            names = " or ".join(k.__name__ for k in kinds)
            raise ConfigError(
                f"{self.source}: [{dotted.rsplit('.', 1)[0] if '.' in dotted else ''}] "
                f"{dotted.rsplit('.', 1)[-1]} must be {names}, got {node!r}; fix the config file"
            )
        return node

    def section(self, dotted: str) -> dict[str, Any]:
        """The table at ``dotted`` (empty when absent)."""
        value = self.get(dotted, dict, {})
        return dict(value)


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Load the config from ``path``, ``KVJUDGE_CONFIG`` or ``./kvjudge.toml``.

    A path given explicitly must exist; the implicit ``./kvjudge.toml`` may be absent.
    """
    explicit = path is not None or "KVJUDGE_CONFIG" in os.environ
    candidate = Path(path if path is not None else os.environ.get("KVJUDGE_CONFIG", CONFIG_FILENAME))
    if not candidate.exists():
        if explicit:
            raise ConfigError(f"config file {candidate} does not exist; create it or drop --config")
        return Config()
    try:
        with candidate.open("rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{candidate} is not valid TOML ({exc}); fix the file or pass another --config") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read config file {candidate}: {exc.strerror}; check its permissions") from exc
    return Config(data=data, source=candidate)
