"""The probe for a served model: what an OpenAI-compatible server really holds, in the same capability cache.

Identify (``/v1/models``; llama.cpp's ``/props`` for the model path and per-slot ``n_ctx``; vLLM's
``max_model_len``; llama-cpp-python reports no context size, so the refusal of a prompt longer than any context it
could serve names it — a measured figure, and cheap: the server refuses before evaluating anything). Then certify
with real requests of measured token counts (the server's own ``usage.prompt_tokens``), at most three:

1. a prompt of the served context less a small reserve: it runs → ``max_ok_input``;
2. a prompt just over the served context: the refusal confirms the boundary (a measured overflow).

A context-length refusal is a measured overflow. A time-out or a 5xx is not: certification stops there and no
figure is derived from it. ``max_context_tokens`` of a served entry is the served context (what the retention
ceiling halves); ``safe_context`` is that context less the local probe's 10 % headroom.

The entry is fingerprinted by server URL, model id, served context and backend kind/version, and follows the
local entries' staleness rules; ``kvjudge cache refresh`` re-probes it through its URL.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvjudge.errors import ContextRefused, KvjudgeError, ProbeError, ServerError, ServerUnavailable
from kvjudge.probe.cache import CapabilityCache, CapabilityEntry, utc_now
from kvjudge.probe.certify import PROMPT_RESERVE, default_timeout, safe_context_for
from kvjudge.probe.core import fingerprint_of
from kvjudge.server_client import Credentials, RetryPolicy, ServerClient, ServerInfo, normalize_url

MAX_SERVED_TRIALS = 3
# When a server names no context size: a prompt longer than any context it could serve (it is refused before
# any evaluation, and the refusal names the real size). Twice the trained context when that is known.
DISCOVERY_TOKENS = 262_144
# Rounds of aiming a prompt at a token count with the server's tokenizer (the count that ran is the server's).
_AIM_ROUNDS = 4
# A probe request is retried once on a connection error: the certification itself must not hammer a server.
_PROBE_RETRY = RetryPolicy(attempts=2)

ProgressFn = Callable[[str], None]


@dataclass(frozen=True)
class ServedTrial:
    """One request of a served certification."""

    target_tokens: int
    prompt_tokens: int | None     # the server's own count (usage, or the refusal's figure), else our aim
    outcome: str                  # ok | overflow | timed_out | server_error | refused
    seconds: float
    n_ctx_reported: int | None = None   # the context size a refusal named
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ServedProbeReport:
    """What ``kvjudge probe --server`` found; ``as_dict`` is its ``--json`` object."""

    info: ServerInfo
    entry: CapabilityEntry
    cached: bool
    notes: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        entry = self.entry
        return {"server": self.info.as_dict() | {"n_ctx": entry.max_context_tokens,
                                                 "n_ctx_source": entry.server.get("n_ctx_source")},
                "model_sha256": entry.model_sha256, "max_context_tokens": entry.max_context_tokens,
                "max_ok_input": entry.max_ok_input, "safe_context": entry.safe_context,
                "certified": entry.certified, "certified_at": entry.certified_at, "method": entry.method,
                "cached": self.cached, "stale": entry.stale, "trials": entry.trials,
                "fingerprint": entry.fingerprint, "notes": list(self.notes)}


def served_components(info: ServerInfo, n_ctx: int | None) -> dict[str, Any]:
    """What a served entry's fingerprint is made of."""
    return {"server": info.url, "model_id": info.model_id, "served_n_ctx": n_ctx, "backend_kind": info.kind,
            "backend_version": info.version}


def _local_model(info: ServerInfo) -> Path | None:
    """The served GGUF when the server names a file readable here (a server on this host)."""
    if info.model_path:
        path = Path(info.model_path)
        if path.is_file():
            return path
    return None


def _n_ctx_train(info: ServerInfo) -> int | None:
    if info.n_ctx_train:
        return info.n_ctx_train
    path = _local_model(info)
    if path is None:
        return None
    from kvjudge.probe.gguf_shape import read_model_shape

    try:
        return read_model_shape(path).n_ctx_train
    except KvjudgeError:
        return None


def _aim(client: ServerClient, target: int, precise: bool) -> tuple[str, int | None]:
    """Real text (standard library source) of about ``target`` prompt tokens, and the tokenizer's count of it.

    The server adds a BOS of its own; the tokenizer's count leaves it out, so the aim is one below. Without a
    tokenize endpoint the text is cut at ~3.5 characters a token and only the server's answer tells the count.
    ``precise`` False (a prompt that only has to be far too long) skips the aiming.
    """
    from kvjudge.probe.trial import fill_text

    want = max(1, target - 1)
    length = int(want * 3.5)
    source = fill_text(2 * length + 1024)
    while len(source) < 2 * length:
        source += "\n" + source
    if not precise:
        return source[:length], None
    try:
        counted = client.count(source[:length])
        for _ in range(_AIM_ROUNDS):
            if counted == want or counted == 0:
                break
            length = max(1, length * want // counted)
            counted = client.count(source[:length])
        while counted > want and length > 1:  # never above the aim: trim a few characters at a time
            length = max(1, length - 2 * (counted - want))
            counted = client.count(source[:length])
    except ServerUnavailable:
        raise
    except ServerError:  # no tokenize endpoint: the server's own count will tell
        return source[:length], None
    return source[:length], counted + 1


def _trial(client: ServerClient, info: ServerInfo, target: int, timeout_s: float | None,
           progress: ProgressFn | None, label: str, *, precise: bool = True) -> ServedTrial:
    if progress:
        progress(f"{label}: a {target}-token prompt to {info.url}")
    text, aimed = _aim(client, target, precise)
    started = time.monotonic()
    timeout = timeout_s if timeout_s is not None else default_timeout(target)
    try:
        answer = client.complete(text, model=info.model_id, max_tokens=1, timeout_s=timeout)
    except ContextRefused as exc:
        return ServedTrial(target, exc.prompt_tokens or aimed, "overflow", round(time.monotonic() - started, 3),
                           exc.n_ctx, str(exc)[:300])
    except ServerUnavailable as exc:
        outcome = "timed_out" if exc.reason == "timeout" else "server_error"
        return ServedTrial(target, aimed, outcome, round(time.monotonic() - started, 3), None, str(exc)[:300])
    except ServerError as exc:
        return ServedTrial(target, aimed, "refused", round(time.monotonic() - started, 3), None, str(exc)[:300])
    usage = answer.get("usage") if isinstance(answer, dict) else None
    measured = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return ServedTrial(target, int(measured) if measured else aimed, "ok", round(time.monotonic() - started, 3))


@dataclass
class _Served:
    """The served context as learned so far, and the requests that taught it."""

    n_ctx: int | None
    source: str | None
    trials: list[ServedTrial] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def served_context(client: ServerClient, info: ServerInfo, *, expected: int | None = None,
                   progress: ProgressFn | None = None, timeout_s: float | None = None) -> _Served:
    """The context the server serves: reported, or named by its refusal of a longer prompt.

    ``expected`` (a cached entry's figure) makes the refusal check small: a prompt just over it. A server that
    runs that prompt holds more than the entry says (then its size is not known: ``n_ctx`` None).
    """
    if info.n_ctx:
        return _Served(int(info.n_ctx), info.n_ctx_source)
    train = _n_ctx_train(info)
    size = expected + PROMPT_RESERVE if expected else (2 * train if train else DISCOVERY_TOKENS)
    trial = _trial(client, info, size, timeout_s, progress, "context size", precise=expected is not None)
    served = _Served(None, None, [trial])
    if trial.outcome == "overflow" and trial.n_ctx_reported:
        served.n_ctx = trial.n_ctx_reported
        served.source = f"named by the server's refusal of a {trial.prompt_tokens or size}-token prompt (measured)"
    elif trial.outcome == "ok":
        served.notes.append(f"the server ran a {trial.prompt_tokens}-token prompt and does not report its context "
                            f"size")
    else:
        served.notes.append(f"the server does not report its context size and did not name it when asked "
                            f"({trial.outcome}: {trial.detail})")
    return served


def _certify(client: ServerClient, info: ServerInfo, served: _Served, progress: ProgressFn | None,
             timeout_s: float | None) -> tuple[int | None, bool]:
    """Run the certification requests (≤ 3 in all, counting a discovery); returns (max_ok_input, certified)."""
    assert served.n_ctx is not None
    trials, notes = served.trials, served.notes
    ok = _trial(client, info, served.n_ctx - PROMPT_RESERVE, timeout_s, progress, f"trial {len(trials) + 1}")
    trials.append(ok)
    if ok.outcome == "overflow" and ok.n_ctx_reported and ok.n_ctx_reported < served.n_ctx \
            and len(trials) < MAX_SERVED_TRIALS:
        # The server holds less than it reported (e.g. parallel slots share one context): believe the refusal.
        notes.append(f"the server reported n_ctx {served.n_ctx} but refused {ok.prompt_tokens} tokens, naming "
                     f"{ok.n_ctx_reported}")
        served.n_ctx, served.source = ok.n_ctx_reported, "named by the server's refusal (measured)"
        ok = _trial(client, info, served.n_ctx - PROMPT_RESERVE, timeout_s, progress, f"trial {len(trials) + 1}")
        trials.append(ok)
    if ok.outcome != "ok":
        what = {"overflow": "was refused as too long", "timed_out": "timed out", "server_error": "failed on the "
                "server", "refused": "was refused"}[ok.outcome]
        notes.append(f"certification stopped: the {ok.target_tokens}-token prompt {what} ({ok.detail}); "
                     + ("no figure is derived from a time-out or a server error" if ok.outcome in
                        ("timed_out", "server_error") else "run `kvjudge probe --server` again once it is fixed"))
        return None, False
    best = ok.prompt_tokens
    if ok.prompt_tokens is not None and ok.prompt_tokens < ok.target_tokens * 0.9:
        notes.append(f"the server counted {ok.prompt_tokens} tokens for a {ok.target_tokens}-token prompt: it may "
                     f"truncate long prompts; check its settings")
    if len(trials) < MAX_SERVED_TRIALS:
        edge = _trial(client, info, served.n_ctx + PROMPT_RESERVE, timeout_s, progress, f"trial {len(trials) + 1}")
        trials.append(edge)
        if edge.outcome == "ok":
            notes.append(f"the server ran {edge.prompt_tokens} tokens, over its reported context {served.n_ctx}: "
                         f"it may truncate prompts or serve more than it says")
            best = max(best or 0, edge.prompt_tokens or 0) or best
        elif edge.outcome != "overflow":
            notes.append(f"the boundary was not confirmed: the {edge.target_tokens}-token prompt {edge.outcome}")
    return best, True


def _fresh_entry(info: ServerInfo, served: _Served, max_ok: int | None, certified: bool,
                 sha: str | None) -> CapabilityEntry:
    components = served_components(info, served.n_ctx)
    now = utc_now()
    assert served.n_ctx is not None
    return CapabilityEntry(
        fingerprint=fingerprint_of(components), model_sha256=sha, model_path=info.model_path or info.model_id,
        device=f"server:{info.url}", max_context_tokens=int(served.n_ctx), max_ok_input=max_ok,
        safe_context=safe_context_for(int(served.n_ctx)) if certified else None, certified=certified,
        certified_at=now if certified else None, method="measured" if certified else "estimated",
        trials=[t.as_dict() for t in served.trials], probed_at=now, components=components,
        server={"url": info.url, "model_id": info.model_id, "kind": info.kind, "version": info.version,
                "n_ctx_source": served.source})


def _open(url: str, timeout_s: float | None = None, retry: RetryPolicy = _PROBE_RETRY,
          credentials: Credentials | None = None) -> ServerClient:
    return ServerClient(url, retry=retry, credentials=credentials, **({"timeout_s": timeout_s} if timeout_s else {}))


def _identify(client: ServerClient) -> ServerInfo:
    try:
        return client.identify()
    except ServerError as exc:
        raise ProbeError(f"cannot identify the served model: {exc}") from exc


def probe_server(url: str, *, certify: bool = True, cache_path: str | Path | None = None, refresh: bool = False,
                 progress: ProgressFn | None = None, timeout_s: float | None = None,
                 staleness_days: float | None = None, credentials: Credentials | None = None) -> ServedProbeReport:
    """Probe the model served at ``url`` and record it in the capability cache.

    A fresh certified entry with the same fingerprint is reused unless ``refresh``. Without ``certify`` only the
    identification (and, where the server does not report it, the refusal that names its context) is done.
    ``credentials``: the API key sent with every request.
    """
    cache = CapabilityCache(cache_path, staleness_days=staleness_days)
    client = _open(url, timeout_s, credentials=credentials)
    try:
        info = _identify(client)
        sha = _sha_of_local(info)
        previous = None if refresh else _newest(cache, info.url)
        expected = previous.max_context_tokens if previous is not None else None
        served = served_context(client, info, expected=expected, progress=progress, timeout_s=timeout_s)
        if served.n_ctx is None and expected is not None and served.trials and served.trials[0].outcome == "ok":
            served = served_context(client, info, progress=progress, timeout_s=timeout_s)  # it grew: find it
        if served.n_ctx is None:
            raise ProbeError(f"cannot learn the context size served at {info.url}: "
                             f"{'; '.join(served.notes) or 'no answer'}")
        fingerprint = fingerprint_of(served_components(info, served.n_ctx))
        existing = cache.get(fingerprint)
        if existing is not None and existing.certified and not existing.stale and not refresh:
            return ServedProbeReport(info, existing, True, tuple(served.notes))
        if not certify and existing is not None and existing.certified and not existing.stale:
            return ServedProbeReport(info, existing, True, tuple(served.notes))
        max_ok, certified = _certify(client, info, served, progress, timeout_s) if certify else (None, False)
        entry = cache.put(_fresh_entry(info, served, max_ok, certified, sha))
        return ServedProbeReport(info, entry, False, tuple(served.notes))
    finally:
        client.close()


def _sha_of_local(info: ServerInfo) -> str | None:
    path = _local_model(info)
    if path is None:
        return None
    from kvjudge.models import file_sha256

    return file_sha256(path)


def _newest(cache: CapabilityCache, url: str) -> CapabilityEntry | None:
    """The most recent entry recorded for ``url`` (certified first)."""
    matches = [e for e in cache.entries() if e.server.get("url") == url]
    matches.sort(key=lambda e: (e.certified, e.age_reference() or ""), reverse=True)
    return matches[0] if matches else None


@dataclass(frozen=True)
class ServedLookup:
    """A served entry as found: ``verified`` when the live server still has the entry's fingerprint."""

    url: str
    entry: CapabilityEntry | None
    verified: bool
    reason: str = ""


def lookup_served(url: str, *, cache_path: str | Path | None = None, staleness_days: float | None = None,
                  verify: bool = True, identified: ServerInfo | None = None,
                  credentials: Credentials | None = None) -> ServedLookup:
    """The cached entry for the model served at ``url`` (``stale`` set). Never certifies.

    With ``verify`` the server is asked who it is (and, if it does not report its context, one prompt just over
    the cached context checks it is still refused): an entry whose fingerprint no longer matches is not returned.
    An unreachable server leaves the most recent entry for the URL, unverified (a storage host that cannot
    reach the judge's server may still bound its ceiling with the judge host's figures), with ``reason`` saying so.
    ``identified``: what the caller's own ``identify()`` of this server just returned (not asked again).
    """
    url = normalize_url(url)
    cache = CapabilityCache(cache_path, staleness_days=staleness_days)
    newest = _newest(cache, url)
    if newest is None or not verify:
        return ServedLookup(url, newest, False, "" if newest is not None else "no entry")
    client = _open(url, retry=RetryPolicy(attempts=1), credentials=credentials)
    try:
        info = identified if identified is not None else client.identify()
        served = served_context(client, info, expected=newest.max_context_tokens)
    except ServerUnavailable as exc:
        return ServedLookup(url, newest, False, f"the server is unreachable ({exc.reason}), so the entry could not "
                                                f"be checked against it")
    except ServerError as exc:
        return ServedLookup(url, newest, False, f"the server could not be identified ({exc})")
    finally:
        client.close()
    if served.n_ctx is None:
        return ServedLookup(url, None, True, "the server now serves a context other than the cached one")
    fingerprint = fingerprint_of(served_components(info, served.n_ctx))
    exact = cache.get(fingerprint)
    if exact is None:
        return ServedLookup(url, None, True, "the served model, context or server version changed since the probe")
    return ServedLookup(url, exact, True)


def served_status(entry: CapabilityEntry, credentials: Credentials | None = None) -> str:
    """``fresh``, ``stale``, ``mismatch`` (the server now serves something else) or ``unreachable``."""
    if entry.stale:
        return "stale"
    client = _open(entry.server["url"], retry=RetryPolicy(attempts=1), credentials=credentials)
    try:
        info = client.identify()
        served = served_context(client, info, expected=entry.max_context_tokens)
    except ServerUnavailable:
        return "unreachable"
    except ServerError:
        return "mismatch"
    finally:
        client.close()
    return "fresh" if served.n_ctx is not None and served_components(info, served.n_ctx) == entry.components \
        else "mismatch"
