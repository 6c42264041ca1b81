"""The store's protocols (kvjudge/retention/store/interfaces.py), each tested by its reusable case
(``tests/store_cases.py``) against both implementations (a SQLite file, a database on the suite's real PostgreSQL
server), and the store object built of those parts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from store_cases import (
    BlobStoreCases,
    EventRecorderCases,
    JudgmentsCases,
    RunQueriesCases,
    TokenCountsCases,
    TransactionsCases,
)

from kvjudge.retention.store import BlobStore, EventRecorder, Judgments, RunQueries, Store, TokenCounts
from kvjudge.retention.store import interfaces


class SqliteParts:
    @pytest.fixture
    def parts(self, tmp_path: Path) -> Iterator[Store]:
        with Store.open(tmp_path / "store.sqlite") as store:
            yield store

    @pytest.fixture
    def reopen(self) -> Callable[[Path], Store]:
        return Store.open


class TestSqliteEventRecorder(SqliteParts, EventRecorderCases):
    pass


class TestSqliteBlobStore(SqliteParts, BlobStoreCases):
    pass


class TestSqliteRunQueries(SqliteParts, RunQueriesCases):
    pass


class TestSqliteTokenCounts(SqliteParts, TokenCountsCases):
    pass


class TestSqliteJudgments(SqliteParts, JudgmentsCases):
    pass


class TestSqliteTransactions(SqliteParts, TransactionsCases):
    pass


class PostgresParts:
    @pytest.fixture
    def parts(self, postgres_url: str) -> Iterator[Store]:
        with Store.open(postgres_url) as store:
            yield store

    @pytest.fixture
    def reopen(self) -> Callable[[str], Store]:
        return Store.open


class TestPostgresEventRecorder(PostgresParts, EventRecorderCases):
    pass


class TestPostgresBlobStore(PostgresParts, BlobStoreCases):
    pass


class TestPostgresRunQueries(PostgresParts, RunQueriesCases):
    pass


class TestPostgresTokenCounts(PostgresParts, TokenCountsCases):
    pass


class TestPostgresJudgments(PostgresParts, JudgmentsCases):
    pass


class TestPostgresTransactions(PostgresParts, TransactionsCases):
    pass


@pytest.mark.parametrize(("part", "protocol"), [("events", EventRecorder), ("blobs", BlobStore),
                                                ("runs", RunQueries), ("caches", TokenCounts),
                                                ("caches", Judgments)])
def test_each_part_has_every_method_of_its_protocol(tmp_path: Path, postgres_url: str, part: str,
                                                    protocol: type) -> None:
    # Structural: each implementation's part offers each name its protocol declares (a renamed method fails here).
    declared = {name for name in vars(protocol) if not name.startswith("_")} | set(protocol.__annotations__)
    for location in (str(tmp_path / "store.sqlite"), postgres_url):
        with Store.open(location) as store:
            assert declared and all(hasattr(getattr(store, part), name) for name in declared), location


def test_the_protocols_are_small() -> None:
    # A few methods each (the store was one class of about 45): a protocol that grows past this is two.
    for protocol in (interfaces.EventRecorder, interfaces.BlobStore, interfaces.RunQueries, interfaces.TokenCounts,
                     interfaces.Judgments, interfaces.Transactions):
        methods = [name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_")]
        assert 1 <= len(methods) <= 16, (protocol.__name__, methods)
