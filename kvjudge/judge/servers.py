"""Opening judge servers: each identified and checked to serve one model, its window read from the capability
cache (:func:`kvjudge.judge.window.served_window`), a local tokenizer chosen
(:mod:`kvjudge.judge.server_tokenizer`), the whole a :class:`~kvjudge.judge.server_pool.ServerPool`.

One server is a :class:`~kvjudge.judge.server_backend.ServerBackend`; its answers are read by
:mod:`kvjudge.judge.server_logprobs`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from kvjudge.errors import JudgeError, ServerError, ServerUnavailable, UsageError
from kvjudge.judge.server_backend import ServerBackend
from kvjudge.judge.server_logprobs import DEFAULT_TOP_LOGPROBS
from kvjudge.judge.server_pool import ServerPool
from kvjudge.judge.server_tokenizer import local_tokenizer
from kvjudge.judge.window import served_window
from kvjudge.server_client import Credentials, RetryPolicy, ServerClient, ServerInfo, normalize_url
from kvjudge.settings import DEFAULT_PARALLEL, DEFAULT_TIMEOUT_S


def open_servers(urls: Sequence[str], *, n_ctx: int | None = None, tokenizer_model: str | Path | None = None,
                 parallel: int = DEFAULT_PARALLEL, timeout_s: float = DEFAULT_TIMEOUT_S, top_logprobs: int = DEFAULT_TOP_LOGPROBS, retry: RetryPolicy | None = None,
                 cache_path: str | Path | None = None, staleness_days: float | None = None,
                 on_drop: Callable[[str, str], None] | None = None,
                 credentials: Credentials | None = None) -> ServerPool:
    """A :class:`ServerPool` over ``urls``: each identified, checked to serve one model, windowed from the
    capability cache (``kvjudge probe --server``) or ``n_ctx``. A server unreachable now is dropped (``on_drop``
    hears of it); none reachable is an error."""
    if not urls:
        raise UsageError("name at least one judge server (--server URL or [judge] servers)")
    if len({normalize_url(url) for url in urls}) != len(urls):
        raise UsageError(f"a judge server is named twice ({', '.join(urls)}); use --parallel for more requests "
                         f"per server")
    retry = retry or RetryPolicy()
    infos: list[ServerInfo] = []
    dropped: dict[str, str] = {}
    for url in urls:
        client = ServerClient(url, timeout_s=timeout_s, retry=retry, credentials=credentials)
        try:
            infos.append(client.identify())
        except ServerUnavailable as exc:
            dropped[client.url] = str(exc)
            if on_drop is not None:
                on_drop(client.url, str(exc))
        except ServerError as exc:
            raise JudgeError(f"cannot use the judge server {client.url}: {exc}") from exc
        finally:
            client.close()
    if not infos:
        raise JudgeError(f"no judge server is reachable ({'; '.join(dropped.values())})")
    window, source = served_window(infos, n_ctx, cache_path, staleness_days, credentials)
    backends = [ServerBackend(url=info.url, n_ctx=window, n_ctx_source=source, info=info,
                              top_logprobs=top_logprobs, timeout_s=timeout_s, retry=retry, credentials=credentials)
                for info in infos]
    first = backends[0]
    assert first.info is not None
    tokenizer = local_tokenizer(first.info, first.client, tokenizer_model)
    return ServerPool(backends, parallel=parallel, tokenizer=tokenizer, dropped=dropped)
