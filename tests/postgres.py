"""The suite's real PostgreSQL server (:mod:`kvjudge.testing.postgres_server`, which the benchmarks start too): one
per test session (kept in ``config.stash``, started by the first test that asks), and a fresh database per test
(``createdb`` from template0, dropped after).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvjudge.testing.postgres_server import PASSWORD, PASSWORD_ROLE, SUPERUSER, PostgresServer, postgres_bin

__all__ = ["PASSWORD", "PASSWORD_ROLE", "SUPERUSER", "PostgresServer", "postgres_bin", "postgres_server",
           "postgres_url"]

_STASH_KEY: pytest.StashKey[PostgresServer] = pytest.StashKey()


@pytest.fixture(scope="session")
def postgres_server(request: pytest.FixtureRequest) -> PostgresServer:
    """One PostgreSQL server for the whole session (started on first use, stopped at the end)."""
    server = request.config.stash.get(_STASH_KEY, None)
    if server is None:
        server = PostgresServer().start()
        request.config.stash[_STASH_KEY] = server
        request.config.add_cleanup(server.stop)
    return server


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """The URL of a fresh, empty database on the session's server (the superuser's, no password), dropped after."""
    name = postgres_server.new_database()
    yield postgres_server.url(name)
    postgres_server.drop_database(name)
