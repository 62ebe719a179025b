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
- **Verdicts are re-judged only when the referee changed**, and not while the store opens (a
  referee run is up to seconds a proof): each row names the referee
  (:data:`~.fraud_proofs.REFEREE`) that judged it, and a row judged by another is *pending*. It
  keeps its place in what the store keeps (its convictions, the run's ranking and bounds: a new
  referee seldom changes a verdict), but nothing reads it out — coverage, sync, the API and
  fetches by digest (:meth:`FraudProofs.of_run`, :meth:`FraudProofs.body`) see it once it is
  judged again. The daemon judges the pending rows in the background, one at a time in the
  referee's worker thread (:meth:`.referee_worker.RefereeWorker.judge_stored_again`, through
  :meth:`FraudProofs.next_stale` and :meth:`FraudProofs.judged_again`), publisher's convictions
  first: a row that still convicts the same keys is read out from then on, any other is dropped
  (also when its bytes are damaged: they no longer hash to its digest). The rows of the layout
  before r25 (one per conviction, no verdict) are carried over the same way, each added as a
  new proof once judged. A pending row that the new referee drops may have kept out another
  proof of its conviction meanwhile: the next sync brings that one again.

A body is read whole only where it is small or judged (sync's proofs, within the gossip bound);
a peer fetching one by digest, and the API, are served from :meth:`FraudProofs.open_body`,
SQLite's incremental BLOB I/O, a piece at a time: a body can be ``MAX_FRAUD_PROOF_SIZE``
(128 MiB), and a node serves two at once.
"""

from __future__ import annotations

import logging
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from open1b.protocol import Conviction, Open1bError, RunManifest

from .fraud_proofs import REFEREE, FraudRecord, ProvenFraud, Ranked

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
        # a CLI may read a store its daemon (of this version) has not opened yet: no proof there is
        # read out, as none of the old layout is once the daemon opens it, until judged again
        self._readable = read_only is False or self._has_table("fraud_proof_bodies")
        if not read_only:
            db.executescript(SCHEMA)
            pending = db.execute("SELECT COUNT(*) FROM fraud_proof_bodies WHERE referee != ?", (REFEREE,)).fetchone()[0]
            old = self._has_table(_OLD_TABLE)
            if pending or old:
                log.info("%d fraud proofs judged by another referee than %s%s: not read out until judged again",
                         pending, REFEREE, ", and the layout before r25" if old else "")

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
        """A run's fraud proofs as the referee judged them when they arrived (no bytes read); not
        the pending ones (module doc)."""
        if not self._readable:
            return []
        rows = self._db.execute(f"SELECT {_RECORD} FROM fraud_proof_bodies WHERE run_id = ? AND referee = ? "
                                "ORDER BY step, digest", (run_id, REFEREE))
        return [_record(r) for r in rows.fetchall()]

    def convictions(self, run_id: bytes) -> list[Conviction]:
        """What :meth:`of_run`'s proofs show, for coverage (§8.3 step 9) and earned trust."""
        return [c for proof in self.of_run(run_id) for c in proof.convictions()]

    def body(self, run_id: bytes, digest: bytes) -> bytes | None:
        """The stored proof of ``run_id`` whose digest is ``digest`` (what sync sends: a proof
        within the gossip bound; a peer's fetch and the API read a body in pieces,
        :meth:`open_body`), or None (also while it is pending)."""
        row = self._db.execute("SELECT encoded FROM fraud_proof_bodies WHERE digest = ? AND run_id = ? AND referee = ?",
                               (digest, run_id, REFEREE)).fetchone()
        return row[0] if row else None

    @contextmanager
    def open_body(self, run_id: bytes, digest: bytes) -> Iterator[StoredBody | None]:
        """The stored proof of ``run_id`` whose digest is ``digest``, to be read in pieces while
        the block runs (one BLOB handle: reading on from where it is costs nothing, where opening
        a handle for each piece walks the row's overflow pages from the start each time), or
        None (also while it is pending)."""
        row = self._db.execute("SELECT rowid FROM fraud_proof_bodies WHERE digest = ? AND run_id = ? AND referee = ?",
                               (digest, run_id, REFEREE)).fetchone()
        if row is None:
            yield None
            return
        with self._db.blobopen("fraud_proof_bodies", "encoded", row[0], readonly=True) as blob:
            yield StoredBody(blob)

    # -- a new referee -------------------------------------------------------------------------------
    def _has_table(self, name: str) -> bool:
        return self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                (name,)).fetchone() is not None

    def next_stale(self) -> Stale | None:
        """The next stored proof to judge again (module doc): a pending row, the run's publisher's
        convictions and earlier steps first, then a row of the layout before r25; None when none
        is left (the old layout's table is dropped then)."""
        row = self._db.execute("SELECT digest, encoded FROM fraud_proof_bodies WHERE referee != ? "
                               "ORDER BY others, step, digest LIMIT 1", (REFEREE,)).fetchone()
        if row is not None:
            return Stale(row[0], row[1])
        if not self._has_table(_OLD_TABLE):
            return None
        row = self._db.execute(f"SELECT encoded FROM {_OLD_TABLE} LIMIT 1").fetchone()
        if row is None:
            self._db.execute(f"DROP TABLE {_OLD_TABLE}")
            return None
        return Stale(None, row[0])

    def judged_again(self, stale: Stale, fraud: ProvenFraud | None) -> ProvenFraud | None:
        """Keep or drop ``stale`` by this referee's verdict on its bytes: ``fraud``, or None if it
        convicts no one. A pending row that still convicts the same keys is read out from now on;
        a row of the old layout is added as a new proof is. The proof so kept (news for coverage),
        or None."""
        if stale.digest is None:
            self._db.execute(f"DELETE FROM {_OLD_TABLE} WHERE encoded = ?", (stale.encoded,))  # each of its convictions
            return fraud if fraud is not None and self.add(fraud) else None
        row = self._db.execute("SELECT run_id, guilty FROM fraud_proof_bodies WHERE digest = ? AND referee != ?",
                               (stale.digest, REFEREE)).fetchone()
        if row is None:
            return None  # dropped meanwhile: a proof ranked before it filled the run's bound
        if fraud is not None and fraud.digest == stale.digest and b"".join(fraud.guilty) == row[1]:
            self._db.execute("UPDATE fraud_proof_bodies SET referee = ? WHERE digest = ?", (REFEREE, stale.digest))
            return fraud
        log.warning("a stored fraud proof is dropped: this referee (%s) no longer convicts its keys with its bytes",
                    REFEREE)
        with self._transaction():
            self._drop(row[0], [stale.digest])
        return None


@dataclass(frozen=True)
class Stale:
    """A stored proof to judge again: ``digest``, its pending row's, or None for a row of the
    layout before r25; ``encoded``, its bytes."""

    digest: bytes | None
    encoded: bytes = field(repr=False)
