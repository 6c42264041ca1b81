"""Where a store lives: a SQLite file's path or a PostgreSQL URL, parsed once, and shown without its password.

``--store``, ``KVJUDGE_STORE``, ``[store] url`` and ``[retention] store`` all name a location;
:meth:`StoreLocation.parse` tells which kind it is. A URL may carry a password (accepted, never repeated): :attr:`StoreLocation.display` is the
URL without it, and that is the only form any message, repr, report or manifest shows.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from kvjudge.errors import StoreError

POSTGRES_SCHEMES = ("postgresql", "postgres")
#: libpq's query parameters that hold a secret (removed from what is shown).
_SECRET_PARAMS = ("password", "sslpassword")


@dataclass(frozen=True)
class StoreLocation:
    """A parsed store location: ``path`` for a SQLite file, else ``url`` (PostgreSQL, password included, for the
    driver only). ``display`` is what may be shown anywhere."""

    display: str
    path: Path | None = None
    url: str | None = field(default=None, repr=False)

    @property
    def is_postgres(self) -> bool:
        return self.url is not None

    def __str__(self) -> str:
        return self.display

    @classmethod
    def parse(cls, location: str | os.PathLike[str]) -> StoreLocation:
        """A path (SQLite) or a ``postgresql://`` / ``postgres://`` URL; another ``scheme://`` is a StoreError, and so
        is a path that is a directory."""
        text = os.fspath(location)
        scheme, sep, _ = text.partition("://")
        if sep and scheme.isascii() and scheme.replace("+", "").replace("-", "").isalnum():
            if scheme.lower() not in POSTGRES_SCHEMES:
                raise StoreError(f"{scheme}://… is not a store location kvjudge knows; pass a SQLite file's path or "
                                 f"a postgresql://user@host:port/dbname URL")
            return cls(display=without_password(text), url=text)
        path = Path(text).expanduser()
        if path.is_dir():
            raise StoreError(f"{path} is a directory; --store takes the path of a store file (or a postgresql:// URL)")
        return cls(display=str(path), path=path)


def without_password(url: str) -> str:
    """``url`` with any password removed (from its user part and its query); the rest as given."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        netloc = f"{userinfo.partition(':')[0]}@{hostport}"
    query = "&".join(pair for pair in parts.query.split("&")
                     if pair and pair.partition("=")[0].lower() not in _SECRET_PARAMS)
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def url_password(url: str) -> str | None:
    """The password a URL carries (in its user part or its query), None when it has none: so that no message ever
    repeats it (see :func:`scrub`)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password:
        return urllib.parse.unquote(parts.password)
    for key, value in urllib.parse.parse_qsl(parts.query):
        if key.lower() == "password":
            return value
    return None


def scrub(text: str, *secrets: str | None) -> str:
    """``text`` with every occurrence of each secret replaced by ``***`` (a driver's message may echo one)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
            quoted = urllib.parse.quote(secret, safe="")
            if quoted != secret:
                text = text.replace(quoted, "***")
    return text
