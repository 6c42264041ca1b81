"""Several judge servers of one model as one judge backend: scheduling calls over them.

:class:`ServerPool` spreads many calls over the servers: ``parallel`` requests in flight per server, each request
retried with back-off on connection errors, 429 and 5xx (see :mod:`kvjudge.server_client`). It takes the calls as
they are prepared (the caller prepares the next pair while requests are in flight), and sends the two orders of a
pair to the same server one after the other, so that the server's prompt cache can reuse what they share
(instructions and the block of text common to both runs). A server that stops accepting connections is dropped and
its requests go to the others (as is one whose calls keep failing after their retries); a request that failed on
every live server is an ``error`` outcome, never a score. Neither the cache keys nor the manifest name a server,
so a pool's verdicts are keyed exactly as one server's.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvjudge.errors import AuthRefused, JudgeError, ServerError, ServerUnavailable, UsageError
from kvjudge.judge.affinity import affinity_key
from kvjudge.judge.labels import LabelScore, ResultFn
from kvjudge.judge.ledger import Ledger
from kvjudge.judge.prompt import Framing, Prompt
from kvjudge.judge.scale import Scale
from kvjudge.judge.server_backend import ServerBackend
from kvjudge.server_client.failures import retryable
from kvjudge.settings import DEFAULT_PARALLEL

if TYPE_CHECKING:
    from kvjudge.tokens import ModelTokenizer

# A server whose calls failed this many times in a row (each after its retries) is dropped from the pool.
DROP_AFTER_FAILURES = 3


def _timed(call: Callable[[Sequence[str], Scale | None, str | None], LabelScore], segments: Sequence[str],
           scale: Scale | None, affinity: str | None) -> tuple[LabelScore, float]:
    started = time.perf_counter()
    return call(segments, scale, affinity), time.perf_counter() - started


@dataclass
class _Job:
    """One prompt of a group: ``group`` and ``position`` name it to the caller; ``then`` is the group's next prompt,
    sent when this one is settled, to the server that settled it (``prefer``) while that server is live."""

    group: int
    position: int
    segments: Sequence[str]
    affinity: str | None = None
    scale: Scale | None = None
    then: _Job | None = None
    prefer: str | None = None
    tried: set[str] = field(default_factory=set)
    last_failure: str = ""


def _chain(group: int, prompts: Sequence[Prompt]) -> _Job | None:
    """The group's prompts as jobs, each followed by the next."""
    first: _Job | None = None
    key = affinity_key(prompts) if prompts else None
    for position in reversed(range(len(prompts))):
        first = _Job(group, position, prompts[position].segments, key, prompts[position].scale, then=first)
    return first


InFlight = dict["Future[tuple[LabelScore, float]]", "tuple[_Job, ServerBackend]"]


class ServerPool:
    """Several servers of one model as one judge backend (the Backend protocol, plus :meth:`score_many`).

    Every server must serve the same model id with the same backend kind and version (so every answer carries
    the same manifest). ``n_ctx`` is the judge's window on all of them.
    """

    window_fixed = True

    def __init__(self, backends: Sequence[ServerBackend], *, parallel: int = DEFAULT_PARALLEL,
                 tokenizer: ModelTokenizer | None = None, dropped: Mapping[str, str] | None = None) -> None:
        if not backends:
            raise JudgeError("no judge server is reachable; start one or check the URLs")
        if parallel < 1:
            raise UsageError(f"--parallel must be at least 1, got {parallel}")
        identities = {(b.info.model_id, b.info.kind, b.info.version) for b in backends if b.info is not None}
        if len(identities) != 1:
            listing = "; ".join(f"{b.url}: {b.info.model_id} ({b.info.kind} {b.info.version})" for b in backends
                                if b.info is not None)
            raise UsageError(f"the judge servers serve different models or versions ({listing}); a pool must serve "
                             f"one model with one server version")
        windows = {b.n_ctx for b in backends}
        if len(windows) != 1:
            raise UsageError(f"the judge servers were opened with different n_ctx ({sorted(windows)}); open them "
                             f"with one window")
        for backend in backends:
            backend.tokenizer = tokenizer if tokenizer is not None else backend.tokenizer
        self.backends = list(backends)
        self.parallel = parallel
        self.n_ctx = backends[0].n_ctx
        self.slack_tokens = backends[0].slack_tokens
        self.dropped: dict[str, str] = dict(dropped or {})
        self.resent = 0
        self.failed_tries = Ledger()  # tries that failed on a server before another answered (no tokens)
        self._failures: dict[str, int] = {}  # calls in a row that failed transiently, per server
        self._lock = threading.Lock()

    @property
    def urls(self) -> list[str]:
        return [b.url for b in self.backends]

    @property
    def servers(self) -> list[str]:
        return self.urls

    @property
    def model_path(self) -> Path | None:
        tokenizer = self.backends[0].tokenizer
        return None if tokenizer is None else tokenizer.path

    @property
    def counter_name(self) -> str:
        return self.backends[0].counter_name

    @property
    def live(self) -> list[ServerBackend]:
        return [b for b in self.backends if b.url not in self.dropped]

    @property
    def calls(self) -> int:
        return sum(b.calls for b in self.backends)

    @property
    def ledger(self) -> Ledger:
        """Every answered call of the pool's servers, and the tries that failed before a server answered."""
        total = Ledger()
        for backend in self.backends:
            total.merge(backend.ledger)
        total.merge(self.failed_tries)
        return total

    @property
    def tokens_saved(self) -> int:
        return sum(b.tokens_saved for b in self.backends)

    @property
    def label_limit(self) -> int:
        return self.backends[0].label_limit

    def manifest(self) -> dict[str, Any]:
        return self.backends[0].manifest()

    def framing(self, choice: str = "auto") -> Framing:
        return self.backends[0].framing(choice)

    def resize(self, n_ctx: int, *, source: str | None = None) -> None:
        self.backends[0].resize(n_ctx, source=source)

    @property
    def certified(self) -> bool:
        """The window was vouched for by every server's certified capability entry."""
        return self.backends[0].certified

    def measure_prefill(self, n_tokens: int = 256) -> float:
        raise JudgeError("the prefill speed of judge servers is not measured here")

    def count_prompt(self, segments: Sequence[str]) -> int:
        return sum(self.count(segment) for segment in segments)

    def _drop(self, url: str, reason: str) -> None:
        with self._lock:
            self.dropped.setdefault(url, reason)

    def count(self, text: str) -> int:
        """Tokens of ``text`` (the local tokenizer, else the first live server that answers)."""
        failures: list[str] = []
        for backend in self.live:
            if backend.tokenizer is not None:
                return backend.tokenizer.count(text)
            try:
                return backend.client.count(text)
            except ServerUnavailable as exc:
                failures.append(str(exc))
                if exc.reason == "connection":
                    self._drop(backend.url, str(exc))
            except ServerError as exc:
                raise JudgeError(f"cannot count tokens: {exc}") from exc
        raise JudgeError(f"no judge server could count tokens ({'; '.join(failures) or 'none is live'})")

    def score(self, segments: Sequence[str], shared: int = 0, scale: Scale | None = None) -> LabelScore:
        """One call through the pool (failover included)."""
        results: list[tuple[LabelScore | None, JudgeError | None]] = []
        self.score_many([[Prompt(segments, shared, scale)]],
                        lambda _g, _p, score, error, _url, _s: results.append((score, error)))
        score, error = results[0]
        if error is not None:
            raise error
        assert score is not None
        return score

    def score_many(self, groups: Iterable[Sequence[Prompt]], on_result: ResultFn) -> None:
        """Score every prompt of every group; ``on_result(group, position, score, error, server, seconds)`` is called
        once per prompt, in this thread.

        Up to ``parallel`` requests per live server are in flight; groups are taken from ``groups`` while fewer than
        that many requests wait to be sent, so preparing the next groups overlaps the requests in flight. A group's
        prompts go one after the other to the server that answered the first (while it is live). A request whose
        server cannot be reached (after the client's retries) goes to a live server that has not tried it; the
        unreachable server is dropped. When every live server has tried it, it fails with the last failure: an
        error, never a score.
        """
        source: Iterator[tuple[int, Sequence[Prompt]]] = iter(enumerate(groups))
        more = True
        ready: deque[_Job] = deque()
        in_flight: InFlight = {}
        busy: dict[str, int] = {b.url: 0 for b in self.backends}
        workers = max(1, self.parallel * len(self.backends))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kvjudge-judge") as executor:
            while True:
                self._dispatch(executor, ready, in_flight, busy)
                done = [future for future in in_flight if future.done()]
                if not done and more and len(ready) < workers:
                    pulled = next(source, None)  # prepares the group: the requests in flight go on meanwhile
                    if pulled is None:
                        more = False
                    elif (first := _chain(*pulled)) is not None:
                        ready.append(first)
                    continue
                if not done and in_flight:
                    done = list(wait(list(in_flight), return_when=FIRST_COMPLETED)[0])
                for future in done:
                    job, backend = in_flight.pop(future)
                    busy[backend.url] -= 1
                    self._settle(job, backend, future, ready, on_result)
                if done:
                    continue
                if ready:  # nothing could be sent: no live server is left that has not tried them
                    job = ready.popleft()
                    self._finish(job, None, JudgeError(self._gave_up(job)), None, 0.0, ready, on_result)
                    continue
                if not more:
                    return

    def _dispatch(self, executor: ThreadPoolExecutor, ready: deque[_Job], in_flight: InFlight,
                  busy: dict[str, int]) -> None:
        # Round-robin over the live servers, one request at a time, so the first server does not take every slot.
        live = {b.url for b in self.live}
        progress = True
        while ready and progress:
            progress = False
            for backend in self.live:
                if busy[backend.url] >= self.parallel:
                    continue
                job = next((j for j in ready if backend.url not in j.tried
                            and (j.prefer in (None, backend.url) or j.prefer not in live)), None)
                if job is None:
                    continue
                ready.remove(job)
                busy[backend.url] += 1
                in_flight[executor.submit(_timed, backend.request_score, job.segments, job.scale,
                                          job.affinity)] = (job, backend)
                progress = True

    def _finish(self, job: _Job, score: LabelScore | None, failure: JudgeError | None, url: str | None,
                seconds: float, ready: deque[_Job], on_result: ResultFn) -> None:
        """Report ``job``'s outcome, and put the group's next prompt first in line, for the same server."""
        on_result(job.group, job.position, score, failure, url, seconds)
        if job.then is not None:
            job.then.prefer = url
            ready.appendleft(job.then)

    def _settle(self, job: _Job, backend: ServerBackend, future: Future[tuple[LabelScore, float]],
                ready: deque[_Job], on_result: ResultFn) -> None:
        try:
            score, seconds = future.result()
        except AuthRefused:
            raise  # the credentials: a setting to fix, for every call alike (the command stops with one line)
        except ServerUnavailable as exc:
            job.tried.add(backend.url)
            job.last_failure = str(exc)
            for _ in range(backend.retry.attempts if retryable(exc) else 1):
                self.failed_tries.failed_try()
            self._failures[backend.url] = self._failures.get(backend.url, 0) + 1
            if exc.reason == "connection":
                self._drop(backend.url, str(exc))
            elif self._failures[backend.url] >= DROP_AFTER_FAILURES:
                # Alive but failing every call (5xx, 429, time-outs after retries): stop feeding it.
                self._drop(backend.url, f"{DROP_AFTER_FAILURES} calls in a row failed; last: {exc}")
            if any(b.url not in job.tried for b in self.live):
                self.resent += 1
                job.prefer = None
                ready.appendleft(job)  # first in line: it has waited longest
            else:
                self._finish(job, None, JudgeError(self._gave_up(job)), None, 0.0, ready, on_result)
            return
        except JudgeError as exc:  # a refusal, an overflow, a missing label: the same on every server
            self._finish(job, None, exc, backend.url, 0.0, ready, on_result)
            return
        except Exception as exc:  # noqa: BLE001 - a bug or a runtime crash is an outcome, never a score
            failure = JudgeError(f"the judge backend failed ({type(exc).__name__}: {exc})")
            self._finish(job, None, failure, backend.url, 0.0, ready, on_result)
            return
        self._failures[backend.url] = 0
        self._finish(job, score, None, backend.url, seconds, ready, on_result)

    def _gave_up(self, job: _Job) -> str:
        tried = ", ".join(sorted(job.tried)) or "none"
        return (f"every judge server failed this call (tried: {tried}; last: "
                f"{job.last_failure or 'no live server left'})")

    def stats(self) -> dict[str, Any]:
        """For the summary: the servers, those dropped and why, requests sent elsewhere, calls answered."""
        return {"servers": self.urls, "dropped": dict(self.dropped), "resent": self.resent,
                "calls": {b.url: b.calls for b in self.backends}, "parallel": self.parallel,
                "ledger": self.ledger.to_json()}

    def close(self) -> None:
        for backend in self.backends:
            backend.close()


__all__ = ["DROP_AFTER_FAILURES", "ServerPool"]
