"""The run store on PostgreSQL: the protocols of :mod:`kvjudge.retention.store.interfaces` on a database server
that several hosts and processes write at once (psycopg 3 and its pool), composed into the same ``Store`` as the
SQLite file's parts. ``Store.open("postgresql://…")`` takes it; nothing else needs to name it."""

from kvjudge.retention.store.postgres.parts import open_postgres, postgres_parts

__all__ = ["open_postgres", "postgres_parts"]
