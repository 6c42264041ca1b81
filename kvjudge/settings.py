"""Settings: one typed object read from ``kvjudge.toml``, the environment and command-line flags.

Precedence, lowest first: the defaults below, the config file (``--config PATH``, else ``KVJUDGE_CONFIG``, else
``./kvjudge.toml`` when it exists), then the flags a command was given (:meth:`Settings.with_overrides`). Every
value is checked once, here, against the schema's types and limits; an unknown key is an error naming the key
and the nearest known one (``[retention] ceilng`` → "did you mean ceiling?"), so a typo never falls back to a
default without a word.

Sections (every key optional)::

    [memory]              provider = "token_budget", context_tokens = N, threshold_pct = 0.8
    [context.estimation]  chars_per_token = 4 | counter = "chars" | "tiktoken" | "model", template = "model" | "chatml"
    [probe]               memory_budget = "6GiB", staleness_days = 30
    [store]               url = "path.sqlite" | "postgresql://user@host:port/dbname",
                          password_env = "NAME" (the environment variable holding the database password),
                          lease_seconds = 900 (how long a claim on a unit of a shared job lives unrenewed)
    [retention]           ceiling = 200000, counter = "model" | "tiktoken" | "chars",
                          store = "path.sqlite" (the older spelling of [store] url: set one, or both the same),
                          cold = "file:///path" | "s3://bucket/prefix", endpoint_url = "http://..."
    [retention.tenants.NAME]  ceiling = N
    [judge]               model = "path.gguf", server = "http://host:port" | servers = ["http://…", …],
                          tokenizer_model = "path.gguf", parallel = 2, timeout = 600, margin = 0.05,
                          template = "auto" | "chat" | "raw", threads = N,
                          api_key_env = "NAME" (the environment variable holding the servers' API key),
                          protocol = "letter" | "pairwise-scale" | "pointwise", levels = 10, repeats = 1,
                          rubric = ["name: text", …] | "rubric.toml", min_label_mass = 0.5,
                          jury = ["http://…", "path.gguf", "http://a,http://b", …]

Locations are environment settings, not file settings: the capability cache and the assembled models live in
the user cache dir (``KVJUDGE_CACHE_DIR``), the store in the user data dir (``KVJUDGE_DATA_DIR``). The store's
location is also ``KVJUDGE_STORE``: it beats the file's ``[store] url`` and ``[retention] store``; ``--store`` beats
it. A database password is never a setting: libpq's own (PGPASSWORD, ~/.pgpass, PGSERVICE) or ``password_env``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs

from kvjudge.errors import ConfigError

CONFIG_FILENAME = "kvjudge.toml"
APP_NAME = "kvjudge"
# The tie margin on |p_a - 0.5| a verdict is decided with, unless [judge] margin says otherwise (the rule that uses
# it: kvjudge.judge.verdict).
DEFAULT_MARGIN = 0.05
DEFAULT_PARALLEL = 2  # requests in flight per judge server
DEFAULT_TIMEOUT_S = 600.0  # seconds one judge-server request may take
# The judge protocol unless [judge] protocol says otherwise (the registry: kvjudge.judge.protocols; why this one:
# the README's judge-protocols figures).
DEFAULT_PROTOCOL = "letter"
DEFAULT_LEVELS = 10  # levels of a scale protocol's letter scale (why: kvjudge.judge.scale)
DEFAULT_MIN_LABEL_MASS = 0.5  # the least probability a scale reading must put on the levels (why: kvjudge.judge.scale)
MAX_REPEATS = 8  # question variants a protocol has (kvjudge.judge.protocols.base)
# How long a claim on a unit of a shared job lives without renewal (kvjudge.retention.shared_job): longer than the
# default time-out of a judge call, so no lease expires under a live call; a killed worker's units wait this long.
DEFAULT_LEASE_S = 900.0


def cache_dir() -> Path:
    """Re-creatable files (capability cache, assembled models): ``KVJUDGE_CACHE_DIR`` or the user cache dir."""
    override = os.environ.get("KVJUDGE_CACHE_DIR")
    return Path(override) if override else Path(platformdirs.user_cache_dir(APP_NAME))


def data_dir() -> Path:
    """Data a user would miss (the run store): ``KVJUDGE_DATA_DIR`` or the user data dir."""
    override = os.environ.get("KVJUDGE_DATA_DIR")
    return Path(override) if override else Path(platformdirs.user_data_dir(APP_NAME))


def _limit(check: Any, says: str) -> dict[str, Any]:
    """Field metadata: a value must pass ``check``; ``says`` completes "must be …" in the error."""
    return {"check": check, "says": says}


def _positive(value: float) -> bool:
    return value > 0


@dataclass(frozen=True)
class MemorySettings:
    """``[memory]``: the conversation budget (TokenBudget)."""

    provider: str = field(default="token_budget", metadata=_limit(lambda v: v == "token_budget", '"token_budget"'))
    context_tokens: int | None = field(default=None, metadata=_limit(_positive, "a positive number of tokens"))
    # TokenBudget clamps to [0.1, 0.99]; a value outside (0, 1] is a mistake (80 meant as 80 %), not a choice.
    threshold_pct: float = field(default=0.8, metadata=_limit(lambda v: 0 < v <= 1, "a fraction like 0.8"))


@dataclass(frozen=True)
class EstimationSettings:
    """``[context.estimation]``: how the budget estimates text the backend has not counted."""

    chars_per_token: float | None = field(default=None, metadata=_limit(_positive, "a positive number"))
    counter: str | None = field(default=None, metadata=_limit(lambda v: v in ("chars", "tiktoken", "model"),
                                                              'one of "chars", "tiktoken", "model"'))
    template: str | None = field(default=None, metadata=_limit(lambda v: v in ("model", "chatml"),
                                                               'one of "model", "chatml"'))


@dataclass(frozen=True)
class ContextSettings:
    """``[context]``."""

    estimation: EstimationSettings = field(default_factory=EstimationSettings)


@dataclass(frozen=True)
class ProbeSettings:
    """``[probe]``."""

    memory_budget: str | int | None = None  # a size ("6GiB") or bytes; parsed by the probe
    staleness_days: float | None = field(default=None, metadata=_limit(_positive, "a positive number of days"))


@dataclass(frozen=True)
class TenantSettings:
    """``[retention.tenants.NAME]``."""

    ceiling: int | None = field(default=None, metadata=_limit(_positive, "a positive number of tokens"))


@dataclass(frozen=True)
class RetentionSettings:
    """``[retention]``: the configured ceiling (the hardware bound still applies), counting, store, cold store."""

    ceiling: int = field(default=200_000, metadata=_limit(_positive, "a positive number of tokens"))
    counter: str = field(default="model", metadata=_limit(lambda v: v.partition(":")[0] in ("model", "tiktoken",
                                                                                            "chars"),
                                                           'one of "model", "tiktoken", "chars"'))
    store: str | None = None
    cold: str | None = None
    endpoint_url: str | None = None
    tenants: Mapping[str, TenantSettings] = field(default_factory=dict)

    def ceiling_for(self, tenant: str | None) -> int:
        """The configured ceiling of ``tenant`` (its own, else the default one)."""
        own = self.tenants.get(tenant) if tenant is not None else None
        return own.ceiling if own is not None and own.ceiling is not None else self.ceiling


_ENV_NAME = _limit(lambda v: bool(re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", v)), "an environment variable name")


@dataclass(frozen=True)
class StoreSettings:
    """``[store]``: where the run store is (a SQLite file's path or a ``postgresql://`` URL), the NAME of the
    environment variable that holds its database password (the password itself is never a setting), and how long
    a claim of a process sharing its work lives unrenewed."""

    url: str | None = field(default=None, metadata=_limit(lambda v: bool(v.strip()), "a path or a URL"))
    password_env: str | None = field(default=None, metadata=_ENV_NAME)
    # How long a claim on a unit of a job shared by several processes lives unrenewed (kvjudge.retention.shared_job).
    lease_seconds: float = field(default=DEFAULT_LEASE_S, metadata=_limit(_positive, "a positive number of seconds"))


@dataclass(frozen=True)
class JudgeSettings:
    """``[judge]``: which judge (a local GGUF, OpenAI-compatible servers of one model, or another ``backend``) and how
    it is asked."""

    model: str | None = None
    server: str | None = None
    servers: tuple[str, ...] | None = field(default=None, metadata=_limit(lambda v: len(v) > 0 and all(v),
                                                                          "a non-empty list of URLs"))
    tokenizer_model: str | None = None
    parallel: int = field(default=DEFAULT_PARALLEL, metadata=_limit(lambda v: v >= 1, "at least 1"))
    timeout: float = field(default=DEFAULT_TIMEOUT_S, metadata=_limit(_positive, "a positive number of seconds"))
    margin: float = field(default=DEFAULT_MARGIN, metadata=_limit(lambda v: 0 <= v < 0.5, "in [0, 0.5)"))
    template: str = field(default="auto", metadata=_limit(lambda v: v in ("auto", "chat", "raw"),
                                                          'one of "auto", "chat", "raw"'))
    threads: int | None = field(default=None, metadata=_limit(_positive, "a positive number"))
    # The NAME of the environment variable that holds the servers' API key: the key itself is never a setting.
    api_key_env: str | None = field(default=None, metadata=_ENV_NAME)
    protocol: str = field(default=DEFAULT_PROTOCOL, metadata=_limit(lambda v: bool(v.strip()), "a protocol name"))
    levels: int = field(default=DEFAULT_LEVELS, metadata=_limit(lambda v: 2 <= v <= 26, "2 to 26 levels"))
    repeats: int = field(default=1, metadata=_limit(lambda v: 1 <= v <= MAX_REPEATS, f"1 to {MAX_REPEATS}"))
    rubric: tuple[str, ...] | str | None = None  # "name: text" criteria, or a rubric file's path
    min_label_mass: float = field(default=DEFAULT_MIN_LABEL_MASS, metadata=_limit(lambda v: 0 <= v <= 1,
                                                                                   "in [0, 1]"))
    jury: tuple[str, ...] | None = field(default=None, metadata=_limit(lambda v: len(v) >= 2 and all(v),
                                                                       "a list of at least two judges"))
    # The backend kind (kvjudge/judge/backend_registry.py checks the name); None: servers when any, else in-process.
    backend: str | None = field(default=None, metadata=_limit(lambda v: bool(v.strip()), "a judge backend name"))

    @property
    def server_urls(self) -> tuple[str, ...]:
        """``servers``, else ``server`` alone, else none (judge in-process)."""
        if self.servers:
            return tuple(self.servers)
        return (self.server,) if self.server else ()


@dataclass(frozen=True)
class Settings:
    """Every setting of kvjudge, checked. ``source`` is the config file read (None: none, all defaults)."""

    memory: MemorySettings = field(default_factory=MemorySettings)
    context: ContextSettings = field(default_factory=ContextSettings)
    probe: ProbeSettings = field(default_factory=ProbeSettings)
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    judge: JudgeSettings = field(default_factory=JudgeSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    source: Path | None = field(default=None, compare=False)

    @property
    def store_location(self) -> str | None:
        """The store's path or URL: ``[store] url`` (or ``--store``, or ``KVJUDGE_STORE``), else ``[retention] store``;
        None: the default file in the data dir."""
        return self.store.url or self.retention.store

    def store_password(self) -> str | None:
        """The database password from the variable ``[store] password_env`` names (None: not named — libpq's own
        conventions apply); a ConfigError when the variable is named but not set."""
        name = self.store.password_env
        if name is None:
            return None
        if name not in os.environ:
            raise ConfigError(f"[store] password_env names {name}, which is not set; export it or drop the setting")
        return os.environ[name]

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> Settings:
        """The config file at ``path``, else ``KVJUDGE_CONFIG``, else ``./kvjudge.toml`` (may be absent)."""
        explicit = path is not None or "KVJUDGE_CONFIG" in os.environ
        candidate = Path(path if path is not None else os.environ.get("KVJUDGE_CONFIG", CONFIG_FILENAME))
        if not candidate.exists():
            if explicit:
                raise ConfigError(f"config file {candidate} does not exist; create it or drop --config")
            return cls()._with_store_env()
        try:
            with candidate.open("rb") as handle:
                data = tomllib.load(handle)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{candidate} is not valid TOML ({exc}); fix the file or pass another --config") from exc
        except OSError as exc:
            raise ConfigError(f"cannot read config file {candidate}: {exc.strerror}; check its permissions") from exc
        return cls.from_mapping(data, source=candidate)._with_store_env()

    def _with_store_env(self) -> Settings:
        """These settings with ``KVJUDGE_STORE`` (when set) as the store's location: the environment beats the file."""
        chosen = os.environ.get("KVJUDGE_STORE")
        if not chosen:
            return self
        return dataclasses.replace(self, store=dataclasses.replace(self.store, url=chosen))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: Path | None = None) -> Settings:
        """Settings from a parsed TOML document (every key checked; unknown keys are errors)."""
        where = str(source) if source else "the settings"
        built = _build(cls, data, (), where)
        if built.store.url and built.retention.store and built.store.url != built.retention.store:
            raise ConfigError(f"{where}: [store] url and [retention] store name different stores; keep [store] url "
                              f"([retention] store is its older spelling)")
        return dataclasses.replace(built, source=source)

    def with_overrides(self, values: Mapping[str, Any], flags: Mapping[str, str] | None = None, *,
                       unset: tuple[str, ...] = ()) -> Settings:
        """These settings with ``{"judge.model": …, "retention.store": …}`` set (None values are skipped: a flag
        not given), each checked like the file; ``flags`` names the option a value came from, for errors
        (``{"judge.parallel": "--parallel"}``). ``unset`` names keys put back to their defaults first (``--model``
        judges in-process: ``("judge.server", "judge.servers")``)."""
        given = {key: value for key, value in values.items() if value is not None}
        if not given and not unset:
            return self
        merged = _as_mapping(self)
        for dotted in unset:
            *parents, leaf = dotted.split(".")
            node = merged
            for part in parents:
                node = node.get(part, {})
            node.pop(leaf, None)
        for dotted, value in given.items():
            single: dict[str, Any] = {}
            for target in (merged, single):
                node = target
                *parents, leaf = dotted.split(".")
                for part in parents:
                    node = node.setdefault(part, {})
                node[leaf] = list(value) if isinstance(value, tuple) else value
            _build(Settings, single, (), (flags or {}).get(dotted, f"the option for {dotted}"))
        built = _build(Settings, merged, (), "the options")
        return dataclasses.replace(built, source=self.source)


def read_toml(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    """A TOML file a setting names (a rubric file), parsed here, by the one reader of TOML; a one-line error
    naming ``what`` when it cannot be read or parsed."""
    candidate = Path(path)
    try:
        with candidate.open("rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} {candidate}: {exc.strerror or exc}; check the path") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"the {what} {candidate} is not valid TOML ({exc}); fix the file") from exc


def _as_mapping(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _as_mapping(getattr(value, f.name)) for f in dataclasses.fields(value) if f.name != "source"
                and getattr(value, f.name) is not None}
    if isinstance(value, Mapping):
        return {key: _as_mapping(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return list(value)
    return value


def _table(path: tuple[str, ...]) -> str:
    return "[" + ".".join(path) + "]" if path else "the top level"


def _build(cls: type, data: Any, path: tuple[str, ...], where: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: {_table(path)} must be a table, got {data!r}; fix the config file")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "source"}
    values: dict[str, Any] = {}
    for key, raw in data.items():
        if key not in fields:
            near = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]}?" if near else f"; known keys: {', '.join(fields)}"
            raise ConfigError(f"{where}: unknown key {key!r} in {_table(path)}{hint}")
        values[key] = _value(hints[key], raw, (*path, key), where, fields[key])
    return cls(**values)


def _value(hint: Any, raw: Any, path: tuple[str, ...], where: str, spec: dataclasses.Field) -> Any:
    name = f"{_table(path[:-1])} {path[-1]}" if len(path) > 1 else _table(path)
    options = [arg for arg in typing.get_args(hint) if arg is not type(None)] \
        if typing.get_origin(hint) in (typing.Union, types.UnionType) else [hint]
    for option in options:
        converted = _convert(option, raw, path, where)
        if converted is not _NO:
            check = spec.metadata.get("check")
            if check is not None and not check(converted):
                raise ConfigError(f"{where}: {name} must be {spec.metadata['says']}, got {raw!r}; fix the value")
            return converted
    wanted = " or ".join(_describe(option) for option in options)
    raise ConfigError(f"{where}: {name} must be {wanted}, got {raw!r}; fix the value")


_NO = object()


def _convert(option: Any, raw: Any, path: tuple[str, ...], where: str) -> Any:
    origin = typing.get_origin(option)
    if dataclasses.is_dataclass(option):
        return _build(option, raw, path, where) if isinstance(raw, Mapping) else _NO
    if origin in (Mapping, dict) or option is Mapping:
        if not isinstance(raw, Mapping):
            return _NO
        item = typing.get_args(option)[1]
        return {str(key): _build(item, value, (*path, str(key)), where) for key, value in raw.items()}
    if origin is tuple:
        if not isinstance(raw, (list, tuple)) or not all(isinstance(item, str) for item in raw):
            return _NO
        return tuple(raw)
    if isinstance(raw, bool):  # bool is an int in Python; a "true" where a number belongs is still a mistake
        return raw if option is bool else _NO
    if option is float and isinstance(raw, (int, float)) and math.isfinite(raw):
        return float(raw)
    if option in (int, str) and isinstance(raw, option):
        return raw
    return _NO


def _describe(option: Any) -> str:
    if dataclasses.is_dataclass(option):
        return "a table"
    if typing.get_origin(option) is tuple:
        return "a list of strings"
    if typing.get_origin(option) in (Mapping, dict):
        return "a table of tables"
    return {int: "a whole number", float: "a number", str: "a string", bool: "true or false"}.get(option, str(option))
