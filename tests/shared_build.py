"""Session fixtures built once per test run, however many pytest-xdist workers run it.

Under pytest-xdist each worker is a pytest session of its own, so a ``scope="session"`` fixture runs once in every
worker that asks for it. For a slow artefact that tests only read (the session's `kvjudge demo`), that repeats
minutes of work. :func:`build_once` follows pytest-xdist's documented pattern: the first worker to ask builds it
in a directory all workers of the run share, under a file lock, and records what the build returned; a worker
that asks meanwhile waits on the lock and then reads the record. Without xdist it simply builds in this session's
temporary directory.

How a session fixture uses it::

    @pytest.fixture(scope="session")
    def thing(tmp_path_factory):
        directory, made = build_once(tmp_path_factory, "thing", lambda root: make_thing(root))  # made: JSON
        return Thing(directory, **made)

The build gets an empty directory and returns what the fixture needs besides the files (JSON-serialisable). It
must write nothing outside that directory that another worker would need. Servers are not shared this way: a
server's process would outlive the worker that started it, and the last user would have to stop it; a server
fixture stays per worker (``scope="session"``, as tests/seaweed.py's is), which costs one start per worker.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

_RECORD = ".built.json"


def build_once(tmp_path_factory: pytest.TempPathFactory, name: str,
               build: Callable[[Path], Any]) -> tuple[Path, Any]:
    """``(directory, what build returned)``: ``build(directory)`` run once per test run, in a directory that every
    xdist worker of the run sees (``name`` must be unique among the run's shared builds)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        directory = tmp_path_factory.mktemp(name, numbered=True)
        return directory, build(directory)
    # Each worker's basetemp is a folder of the run's own basetemp (…/pytest-N/gw0): the parent is the run's.
    directory = tmp_path_factory.getbasetemp().parent / name
    with FileLock(str(directory) + ".lock"):
        record = directory / _RECORD
        if record.exists():
            return directory, json.loads(record.read_text())
        shutil.rmtree(directory, ignore_errors=True)  # a build that failed half-way in another worker
        directory.mkdir()
        made = build(directory)
        record.write_text(json.dumps(made))
        return directory, made
