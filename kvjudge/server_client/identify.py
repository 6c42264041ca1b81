"""Who a server is: the served model, the server family (llama.cpp, llama-cpp-python, vLLM, other) and version,
and the context it says it serves, from its model list and the family's own routes (no prompt is run)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from kvjudge.errors import ServerError

KINDS = ("llama.cpp", "llama-cpp-python", "vllm", "openai-compatible")


class _Asks(Protocol):
    url: str

    def request(self, method: str, path: str, body: dict[str, Any] | None = None, *, retry: bool = True,
                timeout_s: float | None = None) -> Any: ...

    def optional(self, path: str, timeout_s: float) -> Any: ...


@dataclass(frozen=True)
class ServerInfo:
    """Who a server is: what identifies a served model in the capability cache and in every verdict.

    ``n_ctx`` is the context the server says it serves (None when it does not say: llama-cpp-python's server);
    ``n_ctx_source`` says where it came from. ``model_path`` is the served file when the server names one.
    """

    url: str
    model_id: str
    kind: str
    version: str | None
    n_ctx: int | None
    n_ctx_source: str | None
    model_path: str | None = None
    n_ctx_train: int | None = None
    chat_template: str | None = None   # the template's source, where the server publishes it (llama.cpp)
    models: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        return {"url": self.url, "model_id": self.model_id, "kind": self.kind, "version": self.version,
                "n_ctx": self.n_ctx, "n_ctx_source": self.n_ctx_source, "model_path": self.model_path,
                "n_ctx_train": self.n_ctx_train, "chat_template": bool(self.chat_template),
                "models": list(self.models)}


def identify(client: _Asks, timeout_s: float) -> ServerInfo:
    """The server's identity, asked through ``client`` (a :class:`~kvjudge.server_client.ServerClient`)."""
    models = client.request("GET", "/v1/models", timeout_s=timeout_s)
    data = models.get("data") if isinstance(models, dict) else None
    if not data or not isinstance(data, list) or not isinstance(data[0], dict) or "id" not in data[0]:
        raise ServerError(f"{client.url}/v1/models lists no model; is this an OpenAI-compatible server?")
    card = data[0]
    ids = tuple(str(item.get("id")) for item in data if isinstance(item, dict))
    model_id = str(card["id"])
    meta = card.get("meta") if isinstance(card.get("meta"), dict) else {}
    n_ctx_train = meta.get("n_ctx_train") if isinstance(meta.get("n_ctx_train"), int) else None
    if "max_model_len" in card or card.get("owned_by") == "vllm":
        version = client.optional("/version", timeout_s)
        return ServerInfo(client.url, model_id, "vllm", (version or {}).get("version") if isinstance(version, dict)
                          else None, card.get("max_model_len"), "vLLM max_model_len", models=ids)
    props = client.optional("/props", timeout_s)
    if isinstance(props, dict) and ("default_generation_settings" in props or "n_ctx" in props):
        settings = props.get("default_generation_settings") or {}
        n_ctx = settings.get("n_ctx") or props.get("n_ctx")
        build = props.get("build_info")
        return ServerInfo(client.url, model_id, "llama.cpp", str(build) if build else None,
                          int(n_ctx) if n_ctx else None, "llama.cpp /props n_ctx (per slot)" if n_ctx else None,
                          model_path=props.get("model_path"), n_ctx_train=n_ctx_train,
                          chat_template=str(props.get("chat_template") or "") or None,
                          models=ids)
    api = client.optional("/openapi.json", timeout_s)
    info = api.get("info") if isinstance(api, dict) else None
    if isinstance(info, dict) and "llama.cpp Python" in str(info.get("title", "")):
        # llama-cpp-python names the model by the path it loaded; it does not report its context size.
        return ServerInfo(client.url, model_id, "llama-cpp-python", str(info.get("version") or "") or None,
                          None, None, model_path=model_id, models=ids)
    return ServerInfo(client.url, model_id, "openai-compatible", None, None, None, n_ctx_train=n_ctx_train,
                      models=ids)
