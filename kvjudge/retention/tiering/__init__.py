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

from kvjudge.retention.tiering.checks import tier_check, verify_checks, verify_tiered_run
from kvjudge.retention.tiering.manifest import Manifest, ManifestEntry, RemoteObject
from kvjudge.retention.tiering.move import (
    TIER_POINTS,
    TierGate,
    TierPlan,
    TierResult,
    local_body_bytes,
    pending_runs,
    plan_all,
    recover,
    recover_run,
    tier_run,
    tier_runs,
)
from kvjudge.retention.tiering.reader import ColdReader, fallback_reader
from kvjudge.retention.tiering.rehydrate import REHYDRATE_POINTS, RehydrateResult, rehydrate_run
from kvjudge.retention.tiering.requested import TierOutcome, TierProgress, tier_requested
from kvjudge.retention.tiering.targets import ColdStores, default_cold_target, resolve_endpoint, resolve_cold_target
from kvjudge.retention.tiering.transfer import check_remote, fetch_body

__all__ = [
    "REHYDRATE_POINTS", "TIER_POINTS", "ColdReader", "ColdStores", "Manifest", "ManifestEntry", "RehydrateResult",
    "RemoteObject", "TierGate", "TierOutcome", "TierPlan", "TierProgress", "TierResult", "check_remote",
    "default_cold_target", "fallback_reader", "fetch_body", "local_body_bytes", "pending_runs", "plan_all", "recover",
    "recover_run", "rehydrate_run", "resolve_endpoint", "resolve_cold_target", "tier_check", "tier_requested", "tier_run",
    "tier_runs", "verify_checks", "verify_tiered_run",
]
