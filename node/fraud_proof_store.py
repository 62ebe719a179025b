"""The store's fraud proofs (``Store.fraud``, docs/protocol.md §18.7), in the store's database:
each proof the node judged, kept by digest with the referee's verdict (a
:class:`~.fraud_proofs.FraudRecord`), so that reading them back — coverage, the planner, sync,
the API — runs no referee and loads no proof's bytes; the bytes are read one proof at a time,
when one is sent.

What a run keeps, a function of the proofs the node was given whatever their order:

- **One proof per conviction**: per (run, step) for the run's publisher (each refutes its step,
  §8.3 step 11), per run for any other key, its earliest step (coverage flags such a key once,
  citing its lowest step, §8.3 step 9: its other convictions change nothing, and one counted key
  must not fill the run's bound with them); of two proofs of one conviction, the lower digest
  (the two parties of a dispute each build a proof, each with its own trace first, and every
  node must cite the same one). A proof kept for none of its keys is dropped.
- **A bound per run**: :data:`MAX_RUN_FRAUD_PROOFS` proofs and :data:`MAX_RUN_FRAUD_PROOF_BYTES`
  bytes. Proofs are ranked — those convicting the run's publisher first (each refutes a step,
  §8.3), then by step, then by digest — and a run keeps the longest prefix of that ranking that
  fits both bounds. A ranking of what the proofs say, not of when they came, so that every
  node given the same proofs keeps the same ones; the publisher's first, so that no number of
  convictions of others (each needs a key the node counts, and flags it) can crowd out a
  refutation; the earliest step first, as the one coverage cites (§8.3 step 9).
- **Verdicts are re-judged only when the referee changed**: each row names the referee
  (:data:`~.fraud_proofs.REFEREE`) that judged it; when the store opens, a row judged by another
  is judged again, and dropped if it no longer convicts the same keys (also when its bytes are
  damaged: they no longer hash to its digest).

A body is read whole only where it is small or judged (sync's proofs, within the gossip bound;
the API); a peer fetching one by digest is served from :meth:`FraudProofs.open_body`, SQLite's
incremental BLOB I/O, a piece at a time: a body can be ``MAX_FRAUD_PROOF_SIZE`` (128 MiB), and a
node serves two at once.
"""

from __future__ import annotations

import logging
import sqlite3
from contextlib import contextmanager
from typing import Iterator

from open1b.protocol import Open1bError, RunManifest

from .fraud_proofs import REFEREE, FraudRecord, ProvenFraud, Ranked, proven_fraud

log = logging.getLogger(__name__)

MAX_RUN_FRAUD_PROOFS = 64
"""Proofs one run keeps: a node keeps proofs only of keys it counts and of the publisher (one
per step), so an honest run holds a few; also the most a sync response carries whole
(node/sync.py's MAX_SYNC_FRAUD_PROOFS)."""
MAX_RUN_FRAUD_PROOF_BYTES = 256 << 20
"""Bytes of the proofs one run keeps: two at the referee's bound (128 MiB), dozens of the update's
at ``small`` (5.3 MB, §18.6)."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS fraud_proof_bodies (
    digest BLOB PRIMARY KEY, run_id BLOB NOT NULL, step INTEGER NOT NULL, others INTEGER NOT NULL,
    size INTEGER NOT NULL, op TEXT NOT NULL, position INTEGER NOT NULL, guilty BLOB NOT NULL,
    pre_state BLOB NOT NULL, post_states BLOB NOT NULL, referee TEXT NOT NULL, encoded BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS fraud_proof_bodies_by_rank ON fraud_proof_bodies (run_id, others, step, digest);
CREATE TABLE IF NOT EXISTS fraud_convictions (
    run_id BLOB NOT NULL, step INTEGER NOT NULL, guilty BLOB NOT NULL, digest BLOB NOT NULL,
    PRIMARY KEY (run_id, step, guilty));
"""
# ``others``: 0 for a proof that convicts the run's publisher, else 1 (the first term of the rank).
# ``guilty``, ``post_states``: the proof's keys and their traces' post_states, 32 bytes each, in order.
_RECORD = "run_id, step, op, position, guilty, pre_state, post_states, digest, size"
_OLD_TABLE = "fraud_proofs"  # before r25: one row per conviction, the bytes in each, judged on every read


def _keys(joined: bytes) -> tuple[bytes, ...]:
    return tuple(joined[i:i + 32] for i in range(0, len(joined), 32))


def _record(row: tuple) -> FraudRecord:
    run, step, op, position, guilty, pre, posts, digest, size = row
    return FraudRecord(run, step, op, position, _keys(guilty), pre, _keys(posts), digest, size)


class BodyDropped(Open1bError):
    """The proof was dropped (the run's bound, a lower digest) while its body was being read."""


class StoredBody:
    """A stored proof's bytes, read in pieces from an open BLOB handle
    (:class:`open1b.protocol.dispute.trace.Pieces`)."""

    def __init__(self, blob: sqlite3.Blob) -> None:
        self._blob, self.nbytes = blob, len(blob)

    def read(self, offset: int, size: int) -> bytes:
        """Bytes ``[offset, offset + size)`` (fewer at its end); :class:`BodyDropped` if the row
        changed since it was opened (SQLite aborts the handle)."""
        try:
            return self._blob[offset:offset + size]
        except sqlite3.Error as exc:
            raise BodyDropped(f"the stored fraud proof changed while it was read: {exc}") from exc


class FraudProofs:
    def __init__(self, db: sqlite3.Connection, *, read_only: bool = False) -> None:
        """``read_only``: a CLI's view of a daemon's store (nothing is judged again or carried over)."""
        self._db = db
        self._publishers: dict[bytes, bytes | None] = {}
        if not read_only:
            db.executescript(SCHEMA)
            self._judge_again()

    # -- writing -------------------------------------------------------------------------------------
    def add(self, fraud: ProvenFraud) -> bool:
        """Keep ``fraud`` where it is the lowest digest of one of its convictions and the run's
        bound keeps it (module doc); True if it is kept and was not."""
        with self._transaction():
            publisher = self._publisher(fraud.run)
            better = [k for k in fraud.guilty if not self._convicted(fraud.run, fraud.step, k, fraud.digest)]
            if not better or not self.fits(fraud):
                return False
            for key in better:
                if key != publisher:  # its one conviction, at another step
                    self._db.execute("DELETE FROM fraud_convictions WHERE run_id = ? AND guilty = ?", (fraud.run, key))
            posts = b"".join(fraud.post_states)
            self._db.execute(
                "INSERT OR IGNORE INTO fraud_proof_bodies VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (fraud.digest, fraud.run, fraud.step, self._others(fraud), fraud.size, fraud.op, fraud.position,
                 b"".join(fraud.guilty), fraud.pre_state, posts, REFEREE, fraud.encoded))
            self._db.executemany("INSERT OR REPLACE INTO fraud_convictions VALUES (?, ?, ?, ?)",
                                 [(fraud.run, fraud.step, k, fraud.digest) for k in better])
            self._db.execute("DELETE FROM fraud_proof_bodies WHERE run_id = ? AND digest NOT IN "
                             "(SELECT digest FROM fraud_convictions WHERE run_id = ?)", (fraud.run, fraud.run))
            self._trim(fraud.run)
        return True

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """One transaction: the store's connection commits each statement alone (autocommit),
        and a proof's body, its convictions and the bound's drops must land together."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _trim(self, run: bytes) -> None:
        """Drop the proofs past the longest prefix of the run's ranking within its bounds."""
        count = size = 0
        rows = self._db.execute("SELECT digest, size FROM fraud_proof_bodies WHERE run_id = ? "
                                "ORDER BY others, step, digest", (run,)).fetchall()
        for n, (digest, length) in enumerate(rows):
            count, size = count + 1, size + length
            if count > MAX_RUN_FRAUD_PROOFS or size > MAX_RUN_FRAUD_PROOF_BYTES:
                self._drop(run, [d for d, _ in rows[n:]])
                return

    def _drop(self, run: bytes, digests: list[bytes]) -> None:
        for digest in digests:
            self._db.execute("DELETE FROM fraud_proof_bodies WHERE digest = ?", (digest,))
            self._db.execute("DELETE FROM fraud_convictions WHERE run_id = ? AND digest = ?", (run, digest))

    # -- the rules of what is kept -----------------------------------------------------------------
    def _publisher(self, run: bytes) -> bytes | None:
        if run not in self._publishers:  # a manifest never changes: decoded once
            row = self._db.execute("SELECT encoded FROM manifests WHERE run_id = ?", (run,)).fetchone()
            if row is None:
                return None  # not cached: the manifest may come later
            self._publishers[run] = RunManifest.decode(row[0]).publisher
        return self._publishers[run]

    def _others(self, fraud: Ranked) -> int:
        return int(self._publisher(fraud.run) not in fraud.guilty)

    def _convicted(self, run: bytes, step: int, key: bytes, digest: bytes) -> bool:
        """Whether a kept proof makes a conviction of ``key`` at ``step`` by the proof ``digest``
        add nothing: for the publisher, one at that step with a digest at most ``digest``; for
        another key, its one conviction, at an earlier step or at that step with such a digest."""
        if key == self._publisher(run):
            row = self._db.execute("SELECT step, digest FROM fraud_convictions WHERE run_id = ? AND step = ? "
                                   "AND guilty = ?", (run, step, key)).fetchone()
        else:
            row = self._db.execute("SELECT step, digest FROM fraud_convictions WHERE run_id = ? AND guilty = ?",
                                   (run, key)).fetchone()
        return row is not None and tuple(row) <= (step, digest)

    def convicts(self, run: bytes, key: bytes) -> bool:
        """Whether the store keeps a proof convicting ``key`` in ``run``."""
        return self._db.execute("SELECT 1 FROM fraud_convictions WHERE run_id = ? AND guilty = ? LIMIT 1",
                                (run, key)).fetchone() is not None

    def holds(self, run: bytes, step: int, guilty: tuple[bytes, ...], digest: bytes) -> bool:
        """Whether, for each key of ``guilty``, a kept proof makes its conviction by the proof
        ``digest`` add nothing (:meth:`_convicted`): the proof so named would replace nothing."""
        return all(self._convicted(run, step, k, digest) for k in guilty)

    def fits(self, fraud: Ranked) -> bool:
        """Whether the run's bound keeps a proof of this rank and size: it is kept already, or the
        proofs ranked before it leave room for it (module doc). What ranks after it does not
        matter: it would be dropped to make room."""
        if self._db.execute("SELECT 1 FROM fraud_proof_bodies WHERE digest = ?", (fraud.digest,)).fetchone():
            return True
        count, size = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM fraud_proof_bodies WHERE run_id = ? "
            "AND (others, step, digest) < (?, ?, ?)", (fraud.run, self._others(fraud), fraud.step, fraud.digest),
        ).fetchone()
        return count < MAX_RUN_FRAUD_PROOFS and size + fraud.size <= MAX_RUN_FRAUD_PROOF_BYTES

    # -- reading -------------------------------------------------------------------------------------
    def of_run(self, run_id: bytes) -> list[FraudRecord]:
        """A run's fraud proofs as the referee judged them when they arrived (no bytes read)."""
        rows = self._db.execute(f"SELECT {_RECORD} FROM fraud_proof_bodies WHERE run_id = ? ORDER BY step, digest",
                                (run_id,))
        return [_record(r) for r in rows.fetchall()]

    def body(self, run_id: bytes, digest: bytes) -> bytes | None:
        """The stored proof of ``run_id`` whose digest is ``digest`` (what sync sends: a proof
        within the gossip bound; a peer's fetch and the API read a body in pieces,
        :meth:`open_body`), or None."""
        row = self._db.execute("SELECT encoded FROM fraud_proof_bodies WHERE digest = ? AND run_id = ?",
                               (digest, run_id)).fetchone()
        return row[0] if row else None

    @contextmanager
    def open_body(self, run_id: bytes, digest: bytes) -> Iterator[StoredBody | None]:
        """The stored proof of ``run_id`` whose digest is ``digest``, to be read in pieces while
        the block runs (one BLOB handle: reading on from where it is costs nothing, where opening
        a handle for each piece walks the row's overflow pages from the start each time), or
        None."""
        row = self._db.execute("SELECT rowid FROM fraud_proof_bodies WHERE digest = ? AND run_id = ?",
                               (digest, run_id)).fetchone()
        if row is None:
            yield None
            return
        with self._db.blobopen("fraud_proof_bodies", "encoded", row[0], readonly=True) as blob:
            yield StoredBody(blob)

    # -- a new referee -------------------------------------------------------------------------------
    def _judge_again(self) -> None:
        """Judge again the proofs judged by another referee (module doc), and carry over those of
        the layout before r25."""
        stale = [r[0] for r in self._db.execute("SELECT digest FROM fraud_proof_bodies WHERE referee != ?", (REFEREE,))]
        for digest in stale:
            row = self._db.execute("SELECT encoded, guilty FROM fraud_proof_bodies WHERE digest = ?", (digest,)).fetchone()
            fraud = self._judged(row[0])
            with self._transaction():
                if fraud is None or fraud.digest != digest or b"".join(fraud.guilty) != row[1]:
                    run = self._db.execute("SELECT run_id FROM fraud_proof_bodies WHERE digest = ?", (digest,)).fetchone()[0]
                    self._drop(run, [digest])
                else:
                    self._db.execute("UPDATE fraud_proof_bodies SET referee = ? WHERE digest = ?", (REFEREE, digest))
        if self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (_OLD_TABLE,)).fetchone():
            old = [r[0] for r in self._db.execute(f"SELECT DISTINCT encoded FROM {_OLD_TABLE}")]
            for data in old:
                if (fraud := self._judged(data)) is not None:
                    self.add(fraud)
            self._db.execute(f"DROP TABLE {_OLD_TABLE}")
        if stale:
            log.info("fraud proofs judged again by referee %s: %d", REFEREE, len(stale))

    @staticmethod
    def _judged(data: bytes) -> ProvenFraud | None:
        try:
            return proven_fraud(data)
        except ValueError as exc:
            log.warning("a stored fraud proof is dropped: %s", exc)
            return None
