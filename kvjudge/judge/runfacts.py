"""Facts derived from one run's folded state alone (what its views derive from, a baseline's inputs), kept in the
store's judgment cache under the digest of the state's bytes: a command that needs only the facts of its runs
decodes none of them — it hashes their stored states
(:meth:`~kvjudge.retention.store.interfaces.RunQueries.state_digests`) and looks every fact up at once.

A fact's key is the sha256 of its name, its arguments, the digest of the code computing it and the digest of the
run's state. Equal state bytes are one state (the fold is canonical) and any event that changes a run changes them;
a change to the code changes its digest: a kept fact is never stale, at most unused. A fact that depends on more
than the state (a view whose bodies could not all be read) is returned and not kept.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvjudge.retention import Store
    from kvjudge.retention.state import RunState

RUN_FACTS_KEY_PREFIX = "run-facts-v1:"


@dataclass(frozen=True)
class RunFacts:
    """One kind of fact: ``compute(state)`` gives ``(value, keep)`` — a JSON value, and whether it follows from the
    state alone (then it is kept). ``code``: the digest of the code computing it; ``args``: what else it depends
    on (JSON)."""

    name: str
    compute: Callable[[RunState], tuple[Any, bool]]
    code: str
    args: Mapping[str, Any] = field(default_factory=dict)

    def key(self, state_digest: str) -> str:
        """The cache key of this fact of the state whose digest is ``state_digest``."""
        blob = json.dumps({"fact": self.name, "args": dict(self.args), "code": self.code, "state": state_digest},
                          sort_keys=True)
        return RUN_FACTS_KEY_PREFIX + hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def of(self, store: Store, run_ids: Iterable[str], state: Callable[[str], RunState], *,
           use_cache: bool = True) -> dict[str, Any]:
        """The fact of each run of ``run_ids``, by id: kept ones read from ``store``, the others computed from
        ``state(run_id)`` (the folded run) and kept, in one transaction. ``use_cache=False``: every one computed,
        none kept."""
        wanted = list(dict.fromkeys(run_ids))
        if not use_cache:
            return {run_id: self.compute(state(run_id))[0] for run_id in wanted}
        digests = store.runs.state_digests(wanted)
        keys = {run_id: self.key(digests[run_id]) for run_id in wanted if run_id in digests}
        kept = store.caches.get_judgments(keys.values())
        facts: dict[str, Any] = {}
        new: dict[str, dict[str, Any]] = {}
        for run_id in wanted:
            key = keys.get(run_id)
            if key is not None and key in kept:
                facts[run_id] = kept[key]["value"]
                continue
            facts[run_id], keep = self.compute(state(run_id))  # a run the store lacks: its error, from state()
            if keep and key is not None:
                new[key] = {"value": facts[run_id]}
        if new:
            # A cache: an entry lost at a power cut is computed again.
            with store.transaction("put_run_facts", durable=False):
                for key, payload in new.items():
                    store.caches.put_judgment(key, payload)
        return facts


__all__ = ["RUN_FACTS_KEY_PREFIX", "RunFacts"]
