"""Credentials for a server or a pool: an API key read from an environment variable the settings name, sent as a
bearer token. The key itself is never kept in a setting, a repr, a message or a record; only the variable's name."""

from __future__ import annotations

import os
import re

from kvjudge.errors import AuthRefused, UsageError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Credentials:
    """The API key in ``$env``, read when a client is made (so a key exported after the settings were read counts)."""

    __slots__ = ("env", "_key")

    def __init__(self, env: str) -> None:
        if not _ENV_NAME.match(env or ""):
            raise UsageError(f"api_key_env {env!r} is not an environment variable name; name one like "
                             f"JUDGE_API_KEY")
        key = os.environ.get(env, "")
        if not key.strip():
            raise UsageError(f"the judge's API key is read from ${env}, which is not set; export {env}=<key> (or "
                             f"drop [judge] api_key_env / --api-key-env)")
        self.env = env
        self._key = key.strip()

    def __repr__(self) -> str:  # the key stays out of every repr, log and traceback
        return f"Credentials(env={self.env!r})"

    def headers(self) -> dict[str, str]:
        """The request headers that carry the key."""
        return {"Authorization": f"Bearer {self._key}"}

    def redact(self, text: str) -> str:
        """``text`` with the key blanked (a server's error message may echo what it was sent)."""
        return text.replace(self._key, "***")


def credentials_from(env: str | None) -> Credentials | None:
    """The credentials named by ``[judge] api_key_env`` / ``--api-key-env`` (None: send no key)."""
    return Credentials(env) if env else None


def auth_refused(url: str, status: int, credentials: Credentials | None) -> AuthRefused:
    """The one-line error for HTTP 401/403: which variable the key came from, or that none was sent."""
    if credentials is None:
        return AuthRefused(f"the server {url} asks for an API key (HTTP {status}); export the key in a variable and "
                           f"name it with [judge] api_key_env = \"NAME\" or --api-key-env NAME")
    return AuthRefused(f"the server {url} refused the API key in ${credentials.env} (HTTP {status}); set "
                       f"{credentials.env} to a key this server accepts")
