"""The node's durable store: a SQLite file in WAL mode holding validated signed statements.

Statements are immutable facts keyed by their digest, so every write is an idempotent
``INSERT OR IGNORE`` in its own transaction: a crash (even ``kill -9``) loses at most the
statement being written, never corrupts what is there, and merging two stores is set union.
Only validated statements are handed to this module; it re-decodes (and so re-verifies) what it
reads back, so a damaged file cannot make the node trust bytes it did not check. Fraud proofs
(node/fraud_proof_store.py) are the exception: the referee costs up to seconds a proof, so their
verdicts are kept as judged, and judged again only when the referee changes (by the daemon, after
the store opened).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path
from typing import Callable, Sequence

from open1b.protocol import Attestation, Claim, EvalStatement, RunManifest, SpotCheck, WitnessReveal

from .fraud_proof_store import FraudProofs

log = logging.getLogger(__name__)

STORE_FILE = "store.sqlite"  # in the data dir

_SCHEMA = """
CREATE TABLE IF NOT EXISTS manifests (
    run_id BLOB PRIMARY KEY, encoded BLOB NOT NULL, run_dir TEXT, received_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS attestations (
    digest BLOB PRIMARY KEY, run_id BLOB NOT NULL, step INTEGER NOT NULL, signer BLOB NOT NULL,
    verdict TEXT NOT NULL, encoded BLOB NOT NULL, received_ms INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS attestations_by_step ON attestations (run_id, step);
CREATE TABLE IF NOT EXISTS claims (
    digest BLOB PRIMARY KEY, run_id BLOB NOT NULL, step INTEGER NOT NULL, slot INTEGER NOT NULL,
    claimant BLOB NOT NULL, lease_expiry INTEGER NOT NULL, encoded BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS claims_by_step ON claims (run_id, step);
CREATE TABLE IF NOT EXISTS reveals (
    digest BLOB PRIMARY KEY, run_id BLOB NOT NULL, step INTEGER NOT NULL, encoded BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS reveals_by_step ON reveals (run_id, step);
CREATE TABLE IF NOT EXISTS evals (
    digest BLOB PRIMARY KEY, run_id BLOB NOT NULL, state INTEGER NOT NULL, encoded BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS evals_by_state ON evals (run_id, state);
CREATE TABLE IF NOT EXISTS spotchecks (
    digest BLOB PRIMARY KEY, run_id BLOB NOT NULL, step INTEGER NOT NULL, encoded BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS spotchecks_by_step ON spotchecks (run_id, step);
CREATE TABLE IF NOT EXISTS replay_witnesses (
    run_id BLOB NOT NULL, step INTEGER NOT NULL, witness BLOB NOT NULL, PRIMARY KEY (run_id, step));
"""
# Receipt order between a reveal and the attestations (earned trust, node/earned_trust.py): the
# highest attestation rowid when the reveal was stored. Attestations are never deleted, so rowids
# only grow. Reveals stored before this column existed read 0: no attestation counts as stored
# before them (the safe reading).
_REVEAL_ORDER = "ALTER TABLE reveals ADD COLUMN attestations_before INTEGER NOT NULL DEFAULT 0"


class Store:
    def __init__(self, path: Path, *, now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 read_only: bool = False) -> None:
        """``now_ms``: wall-clock milliseconds, recorded as when a statement arrived (a node passes
        its :class:`~.clock.Clock`'s, so tests on a mock clock record virtual times).
        ``read_only``: a CLI reading a store that its daemon may be writing (nothing is created)."""
        self.path, self.now_ms = path, now_ms
        self.full = False  # the last write failed for want of disk space
        if read_only:
            self._db = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
        else:
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        self._reveal_order = "attestations_before" in {r[1] for r in self._db.execute("PRAGMA table_info(reveals)")}
        self.fraud = FraudProofs(self._db, read_only=read_only)  # fraud proofs (docs/protocol.md §18.7)
        if not self._reveal_order and not read_only:
            self._db.execute(_REVEAL_ORDER)
            self._reveal_order = True

    def close(self) -> None:
        self._db.close()

    def _insert(self, sql: str, params: tuple) -> bool:
        """Run one write; False if nothing was added. A full disk degrades the store to read-only
        (:attr:`full`, logged once): the statement is not kept, reads keep working, and the
        next write that fits clears the state."""
        try:
            with self._db:
                added = self._db.execute(sql, params).rowcount == 1
        except sqlite3.OperationalError as exc:
            if "full" not in str(exc):
                raise
            if not self.full:
                log.error("storage full: %s; new statements are not kept until there is room (reads still work)",
                          self.path.parent)
            self.full = True
            return False
        self.full = False
        return added

    # -- manifests -------------------------------------------------------------------------
    def add_manifest(self, manifest: RunManifest, run_dir: Path | None = None) -> bool:
        added = self._insert(
            "INSERT OR IGNORE INTO manifests VALUES (?, ?, ?, ?)",
            (manifest.run_id, manifest.encoded, str(run_dir) if run_dir else None, self.now_ms() // 1000),
        )
        if run_dir is not None and not added:
            self._insert("UPDATE manifests SET run_dir = ? WHERE run_id = ?", (str(run_dir), manifest.run_id))
        return added

    def manifests(self) -> list[RunManifest]:
        rows = self._db.execute("SELECT encoded FROM manifests ORDER BY received_at, run_id").fetchall()
        return [RunManifest.decode(r[0]) for r in rows]

    def run_dir(self, run_id: bytes) -> Path | None:
        row = self._db.execute("SELECT run_dir FROM manifests WHERE run_id = ?", (run_id,)).fetchone()
        return Path(row[0]) if row and row[0] else None

    # -- attestations ----------------------------------------------------------------------
    def add_attestation(self, att: Attestation) -> bool:
        return self.add_attestations([att])[0]

    def add_attestations(self, atts: Sequence[Attestation]) -> list[bool]:
        """Store many statements in one transaction (one commit, where one each would cost a
        commit each); which of them were new, in order."""
        now = self.now_ms()
        with self._db:
            return [self._db.execute("INSERT OR IGNORE INTO attestations VALUES (?, ?, ?, ?, ?, ?, ?)",
                                     (att.digest, att.run, att.step, att.signer, att.verdict, att.encoded, now),
                                     ).rowcount == 1 for att in atts]  # fmt: skip

    def attestations(self, run_id: bytes, step: int | None = None) -> list[Attestation]:
        return [att for att, _ in self.attestations_received(run_id, step)]

    def attestations_received(self, run_id: bytes, step: int | None = None) -> list[tuple[Attestation, int]]:
        """Attestations with the time (Unix ms) this store first received each."""
        if step is None:
            rows = self._db.execute(
                "SELECT encoded, received_ms FROM attestations WHERE run_id = ? ORDER BY step, digest", (run_id,))
        else:
            rows = self._db.execute(
                "SELECT encoded, received_ms FROM attestations WHERE run_id = ? AND step = ? ORDER BY digest",
                (run_id, step))
        return [(Attestation.decode(r[0]), r[1]) for r in rows.fetchall()]

    def attestations_in_order(self, run_id: bytes) -> list[tuple[Attestation, int]]:
        """A run's attestations with their receipt sequence (rowid: larger = stored later)."""
        rows = self._db.execute(
            "SELECT encoded, rowid FROM attestations WHERE run_id = ? ORDER BY rowid", (run_id,))
        return [(Attestation.decode(r[0]), r[1]) for r in rows.fetchall()]

    def has_attestation(self, run_id: bytes, step: int, signer: bytes) -> bool:
        return self._db.execute("SELECT 1 FROM attestations WHERE run_id = ? AND step = ? AND signer = ? LIMIT 1",
                                (run_id, step, signer)).fetchone() is not None

    def attestation_count(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM attestations").fetchone()[0]

    # -- claims ----------------------------------------------------------------------------
    def add_claim(self, claim: Claim) -> bool:
        return self._insert(
            "INSERT OR IGNORE INTO claims VALUES (?, ?, ?, ?, ?, ?, ?)",
            (claim.digest, claim.run, claim.step, claim.slot, claim.claimant, claim.lease_expiry, claim.encoded),
        )

    def claims(self, run_id: bytes, *, live_at: int | None = None) -> list[Claim]:
        if live_at is None:
            rows = self._db.execute("SELECT encoded FROM claims WHERE run_id = ? ORDER BY digest", (run_id,))
        else:
            rows = self._db.execute(
                "SELECT encoded FROM claims WHERE run_id = ? AND lease_expiry > ? ORDER BY digest", (run_id, live_at))
        return [Claim.decode(r[0]) for r in rows.fetchall()]

    def slot_claims(self, run_id: bytes, step: int, slot: int) -> list[Claim]:
        """Every claim held for one redundancy slot (heard on gossip, read or made here)."""
        rows = self._db.execute("SELECT encoded FROM claims WHERE run_id = ? AND step = ? AND slot = ? ORDER BY digest",
                                (run_id, step, slot))
        return [Claim.decode(r[0]) for r in rows.fetchall()]

    # -- proof of replay -------------------------------------------------------------------
    def add_reveal(self, reveal: WitnessReveal) -> bool:
        return self._insert(
            "INSERT OR IGNORE INTO reveals (digest, run_id, step, encoded, attestations_before) "
            "VALUES (?, ?, ?, ?, (SELECT COALESCE(MAX(rowid), 0) FROM attestations))",
            (reveal.digest, reveal.run, reveal.step, reveal.encoded))

    def reveals(self, run_id: bytes, step: int | None = None) -> list[WitnessReveal]:
        if step is None:
            rows = self._db.execute("SELECT encoded FROM reveals WHERE run_id = ? ORDER BY step, digest", (run_id,))
        else:
            rows = self._db.execute(
                "SELECT encoded FROM reveals WHERE run_id = ? AND step = ? ORDER BY digest", (run_id, step))
        return [WitnessReveal.decode(r[0]) for r in rows.fetchall()]

    def reveals_in_order(self, run_id: bytes) -> list[tuple[WitnessReveal, int]]:
        """A run's reveals, each with the receipt sequence of the last attestation stored before
        it (an attestation with a sequence at most that was stored before the reveal)."""
        rows = self._db.execute(
            f"SELECT encoded, {'attestations_before' if self._reveal_order else 0} FROM reveals "
            "WHERE run_id = ? ORDER BY step, digest", (run_id,))
        return [(WitnessReveal.decode(r[0]), r[1]) for r in rows.fetchall()]

    def add_eval(self, ev: EvalStatement) -> bool:
        return self._insert("INSERT OR IGNORE INTO evals VALUES (?, ?, ?, ?)", (ev.digest, ev.run, ev.state, ev.encoded))

    def evals(self, run_id: bytes) -> list[EvalStatement]:
        rows = self._db.execute("SELECT encoded FROM evals WHERE run_id = ? ORDER BY state, digest", (run_id,))
        return [EvalStatement.decode(r[0]) for r in rows.fetchall()]

    def add_spotcheck(self, sc: SpotCheck) -> bool:
        return self._insert("INSERT OR IGNORE INTO spotchecks VALUES (?, ?, ?, ?)", (sc.digest, sc.run, sc.step, sc.encoded))

    def spotchecks(self, run_id: bytes) -> list[SpotCheck]:
        rows = self._db.execute("SELECT encoded FROM spotchecks WHERE run_id = ? ORDER BY step, digest", (run_id,))
        return [SpotCheck.decode(r[0]) for r in rows.fetchall()]

    def add_replay_witness(self, run_id: bytes, step: int, witness: bytes) -> bool:
        """W_step from this node's own replay (checked against the manifest's C_step by the caller).
        Kept so that a restarted node can still check later attestations' bindings; it is not a
        signed statement and is never served."""
        return self._insert("INSERT OR IGNORE INTO replay_witnesses VALUES (?, ?, ?)", (run_id, step, witness))

    def replay_witnesses(self, run_id: bytes) -> dict[int, bytes]:
        rows = self._db.execute("SELECT step, witness FROM replay_witnesses WHERE run_id = ?", (run_id,))
        return {r[0]: r[1] for r in rows.fetchall()}

