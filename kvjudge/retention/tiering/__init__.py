"""Tiering: move the bodies of terminal runs to a cold store — moved, not copied; idempotent; crash-proof.

One module per job:

- :mod:`.targets` — the target URL and S3 endpoint a command resolves, and the cold stores it opens;
- :mod:`.manifest` — what one move carried and where each body went (its pack and offset), rebuilt from the log
  (never stored locally);
- :mod:`.transfer` — parallel uploads of packs, each checked right after; a body read back from its pack;
- :mod:`.move` — the move as events (``TierStarted`` → upload → manifest → ``Tiered`` → local delete) and its
  recovery after a crash;
- :mod:`.reader` — the store's fallback reader for tiered bodies;
- :mod:`.requested` — ``kvjudge tier RUN | --all`` as one call: crashed moves finished, runs picked and gated on
  their tenants' ceilings, then moved;
- :mod:`.rehydrate` — bodies back into the local store (``Rehydrated``);
- :mod:`.checks` — what ``kvjudge verify`` adds for tiered runs.
"""

from kvjudge.retention.tiering.checks import verify_checks
from kvjudge.retention.tiering.manifest import Manifest
from kvjudge.retention.tiering.move import TierGate, TierPlan, TierResult, plan_all, recover, tier_run, tier_runs
from kvjudge.retention.tiering.reader import ColdReader, fallback_reader
from kvjudge.retention.tiering.rehydrate import RehydrateResult, rehydrate_run
from kvjudge.retention.tiering.requested import TierOutcome, tier_requested
from kvjudge.retention.tiering.targets import ColdStores, default_cold_target, resolve_cold_target, resolve_endpoint

__all__ = [
    "ColdReader", "ColdStores", "Manifest", "RehydrateResult", "TierGate", "TierOutcome", "TierPlan", "TierResult",
    "default_cold_target", "fallback_reader", "plan_all", "recover", "rehydrate_run", "resolve_cold_target",
    "resolve_endpoint", "tier_requested", "tier_run", "tier_runs", "verify_checks",
]
