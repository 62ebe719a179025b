"""The stream ``/open1b/fraudproof/1.0.0``: fetch a fraud proof's body by its digest, for a proof
that travels as a reference (node/fraud_proof_refs.py, docs/protocol.md §18.7).

Request: one frame, canonical CBOR ``{"run": <32 bytes>, "digest": <32 bytes>}`` (≤
:data:`MAX_FETCH_REQUEST` bytes). Response: one frame, the encoded proof, or an empty frame if the
node keeps none of that digest; then the stream is closed.

:class:`ProofFetcher` is the node's side of it, and of the references (the statements'
:attr:`~.statements.Statements.proof_refs`):

- **Judging.** A reference is judged by :func:`~.fraud_proof_refs.judge_fraud_proof_ref`; its
  refusals are counted in ``Statements.validation`` (``fraud_proof_ref/<outcome>/<code>``, from
  sync ``sync/<outcome>/<code>``), and a provably invalid one counts against its sender. On
  gossip a reference is never forwarded (IGNORE to the router), only this node's own: a node
  announces a proof once it holds and has judged the body, so every reference it hears comes from
  a peer that holds what it names.
- **Fetching.** A reference that passed its rules, from gossip or a sync response, is *wanted*
  from the peer that sent it. At most
  :data:`MAX_WANTED` references wait, :data:`MAX_WANTED_PER_PEER` from one peer, one per digest;
  beyond, a reference is dropped (the next announcement or sync round brings it again). One body
  is fetched at a time, within :data:`FETCH_TIMEOUT_S`. The frame is read with the reference's
  ``size`` as its bound, so no more is ever read than announced, and a piece at a time
  (:meth:`~.p2p.Stream.receive_pieces`) into an unnamed temporary file in the node's
  ``fraudproofs/`` directory, hashed as it comes: a body is up to ``MAX_FRAUD_PROOF_SIZE``
  (128 MiB), and the transfer holds a few hundred KiB of it. Then size and digest are checked,
  and the body is judged by :func:`~.fraud_proofs.judge_fraud_proof` exactly as a gossiped proof
  is (with the referee's bound, ``MAX_FRAUD_PROOF_SIZE``; read from the file and judged in a
  worker thread, :mod:`.referee_worker`: the referee decodes the whole proof, so judging holds it
  in memory with its decoded value, then the re-executed op's input arrays: up to ~3x its size,
  one such proof at a time node-wide); it must
  convict whom the reference says (``ref_mismatch``). A proof so judged is stored like the node's
  own (:meth:`~.statements.Statements.add_own`: judged already).
- **Blame.** A frame over the announced size, a body whose size or digest is not the reference's,
  a body the referee refuses or that convicts others than announced: provably the sender's
  fault, penalised (``fraud_proof_ref/reject/<code>`` counted). An empty answer, a failed or slow
  stream, a proof that cannot be judged yet, one whose convictions the store came to hold while
  it was fetched (``held``): ignored.
- **Re-announcing.** A body stored is gossiped through the outbox as a reference of this node's
  own, so the next node fetches it from here: a reference is never forwarded unverified.
- **Serving.** A peer's request is answered from the store, one stream per peer and
  :data:`MAX_SERVING` at once (more are reset unanswered), each within :data:`FETCH_TIMEOUT_S`
  (then reset: a peer that stops reading holds no slot). The body is read from the store and
  written a piece at a time (:meth:`~.fraud_proof_store.FraudProofs.open_body`,
  :meth:`~.p2p.Stream.send_pieces`), never whole.

The response is one frame either way: the same bytes on the wire as a frame written or read
whole, so peers that do either talk to each other unchanged.
"""

from __future__ import annotations

import logging
import tempfile
from collections import Counter
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Awaitable, BinaryIO, Callable

import trio

from open1b.protocol import Outcome
from open1b.protocol.codec import decode, encode
from open1b.protocol.dispute import MAX_FRAUD_PROOF_SIZE
from open1b.protocol.dispute.trace import Pieces
from open1b.protocol.errors import InvalidStatementError, ProtocolError
from open1b.protocol.hashing import hasher
from open1b.protocol.schema import Bytes, check_map
from open1b.protocol.validation import Verdict

from .fraud_proof_refs import FraudProofRef, judge_fraud_proof_ref
from .fraud_proofs import ProvenFraud
from .p2p import P2P, FrameTooLarge, NetworkError, Stream
from .statements import Statements

log = logging.getLogger("open1b.node.fraud_proof_fetch")

FRAUD_PROOF_PROTOCOL = "/open1b/fraudproof/1.0.0"
MAX_FETCH_REQUEST = 128
MAX_WANTED = 64
MAX_WANTED_PER_PEER = 4
MAX_SERVING = 2
FETCH_TIMEOUT_S = 120.0
"""A body of MAX_FRAUD_PROOF_SIZE (128 MiB) at ~1.1 MB/s; loopback moves 50–80 MB/s."""
_REQUEST = {"run": Bytes(32), "digest": Bytes(32)}
SPOOL_DIR = "fraudproofs"
"""Under the data dir: the bodies being fetched (unnamed files; the directory stays empty)."""

BodyOpener = Callable[[bytes, bytes], AbstractContextManager[Pieces | None]]


async def serve_fraud_proof(stream: Stream, open_body: BodyOpener) -> None:
    """Answer one request with the body ``open_body(run, digest)`` gives (empty if None), written
    in pieces (module doc)."""
    request = decode(await stream.receive(MAX_FETCH_REQUEST), max_size=MAX_FETCH_REQUEST)
    check_map(_REQUEST, request, "fraud proof request")
    with open_body(request["run"], request["digest"]) as body:
        if body is None:
            await stream.send(b"")
        else:
            await stream.send_pieces(body)
    await stream.close()


async def fetch_fraud_proof(p2p: P2P, peer: str, ref: FraudProofRef, spool: BinaryIO) -> bool:
    """Write the body ``ref`` names, from ``peer``, to ``spool`` (an empty file), a piece at a
    time, hashed as it comes; False if the peer keeps none. Raises
    :class:`InvalidStatementError` (``ref_body``) for a frame over ``ref.size`` (refused before a
    byte of it is read) or a body that is not the bytes named — the peer announced what it does
    not serve — and :class:`NetworkError` for a failed stream."""
    digest = hasher()  # B2 of the body, a piece at a time

    def write(piece: bytes) -> None:
        digest.update(piece)
        spool.write(piece)

    stream = await p2p.open_stream(peer, FRAUD_PROOF_PROTOCOL)
    try:
        await stream.send(encode({"run": ref.run, "digest": ref.digest}))
        size = await stream.receive_pieces(ref.size, write)
    except FrameTooLarge as exc:
        raise InvalidStatementError(f"{exc} (the size announced)", code="ref_body") from exc
    finally:
        await stream.close()
    if not size:
        return False
    if size != ref.size or digest.digest() != ref.digest:
        raise InvalidStatementError(f"{size} bytes that are not the proof announced", code="ref_body")
    return True


def _read_all(spool: BinaryIO) -> bytes:
    spool.seek(0)
    return spool.read()


class ProofFetcher:
    def __init__(self, p2p: P2P, statements: Statements, regossip: Callable[[ProvenFraud], Awaitable[None]],
                 spool_dir: Path) -> None:
        """Answers requests from construction on, and takes the references ``statements`` hears
        (as its :attr:`~.statements.Statements.proof_refs`); ``regossip``: the outbox's, which
        gossips a large proof as a reference; ``spool_dir``: where bodies are fetched to (created,
        and emptied of what a crash may have left)."""
        self.p2p, self.statements, self.regossip = p2p, statements, regossip
        self.spool_dir = spool_dir
        spool_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for leftover in spool_dir.iterdir():  # the files are unnamed: only a fallback's could be here
            leftover.unlink(missing_ok=True)
        self._send, self._receive = trio.open_memory_channel[tuple[FraudProofRef, str]](MAX_WANTED)
        self._wanted: set[bytes] = set()  # digests queued or being fetched
        self._per_peer: Counter[str] = Counter()
        self._serving: set[str] = set()
        # outcome -> count: stored, refused (by the referee), held, empty, failed, rejected (NodeStats.proof_fetches)
        self.fetched: Counter[str] = statements.stats.proof_fetches
        statements.proof_refs = self
        p2p.set_stream_handler(FRAUD_PROOF_PROTOCOL, self._serve)

    def _judge(self, data: bytes) -> Verdict[FraudProofRef]:
        return judge_fraud_proof_ref(data, self.statements.bearing)

    def _refused(self, verdict: Verdict, peer: str, where: str) -> None:
        self.statements.validation[f"{where}/{verdict.outcome.value}/{verdict.code}"] += 1
        if verdict.outcome is Outcome.REJECT:
            self.p2p.penalise(peer)

    def gossiped(self, author: str, data: bytes) -> Outcome:
        """The references topic's validator: a good reference is wanted from its author, and
        ignored by the router (module doc); this node's own is accepted (the router validates
        what we publish too)."""
        if author == self.p2p.peer_id:
            return Outcome.ACCEPT
        verdict = self._judge(data)
        self.statements.stats.record_gossip(FraudProofRef.KIND, verdict.outcome.value)
        if not verdict.accepted:  # a REJECT is counted against the deliverer by the router
            self.statements.validation[f"{FraudProofRef.KIND}/{verdict.outcome.value}/{verdict.code}"] += 1
            return verdict.outcome
        self.want(verdict.message, author)
        return Outcome.IGNORE

    def synced(self, data: bytes, source: str) -> None:
        verdict = self._judge(data)
        if verdict.accepted:
            self.want(verdict.message, source)
        else:
            self._refused(verdict, source, "sync")

    def want(self, ref: FraudProofRef, peer: str) -> None:
        """Queue a fetch of ``ref`` from ``peer`` (never blocks; dropped beyond the bounds)."""
        if ref.digest in self._wanted or self._per_peer[peer] >= MAX_WANTED_PER_PEER:
            return
        try:
            self._send.send_nowait((ref, peer))
        except trio.WouldBlock:
            log.info("fraud proof %s from %s dropped: %d fetches waiting", ref.digest.hex()[:12], peer, MAX_WANTED)
            return
        self._wanted.add(ref.digest)
        self._per_peer[peer] += 1

    async def serve_fetcher(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Fetch the wanted bodies, one at a time, in the order wanted."""
        task_status.started()
        async for ref, peer in self._receive:
            try:
                await self.fetch(ref, peer)
            finally:
                self._wanted.discard(ref.digest)
                self._per_peer[peer] -= 1
                if not self._per_peer[peer]:
                    del self._per_peer[peer]

    async def fetch(self, ref: FraudProofRef, peer: str) -> None:
        """One wanted body: fetched, checked, judged, stored and announced, or its outcome counted."""
        if self.statements.store.fraud.holds(ref.run, ref.step, ref.guilty, ref.digest):  # arrived while this waited
            self.fetched["held"] += 1
            return
        try:
            with tempfile.TemporaryFile(dir=self.spool_dir) as spool:
                body = await self._download(ref, peer, spool)
        except OSError as exc:  # the spool file: our disk's failure, never the peer's
            log.warning("fetching fraud proof %s from %s failed on this node's disk: %s", ref.digest.hex()[:12], peer, exc)
            self.fetched["failed"] += 1
            return
        if body is None:
            return
        verdict = await self.statements.referee.judge(body, max_size=MAX_FRAUD_PROOF_SIZE)  # the referee off the loop
        if verdict.code == "held":  # the same conviction arrived by gossip or sync meanwhile
            self.fetched["held"] += 1
            return
        if verdict.accepted and not ref.describes(verdict.message):
            verdict = Verdict(Outcome.REJECT, "the proof convicts others than announced", code="ref_mismatch")
        if not verdict.accepted:
            log.info("fraud proof %s from %s: %s (%s)", ref.digest.hex()[:12], peer, verdict.outcome.value, verdict.reason)
            self._refused(verdict, peer, ProvenFraud.KIND)
            self.fetched["refused"] += 1
            return
        if not self.statements.add_own(verdict.message):
            self.fetched["held"] += 1
            return
        self.fetched["stored"] += 1
        log.info("fraud proof %s (%d bytes) fetched from %s", ref.digest.hex()[:12], ref.size, peer)
        await self.regossip(verdict.message)

    async def _download(self, ref: FraudProofRef, peer: str, spool: BinaryIO) -> bytes | None:
        """The body ``ref`` names, from ``peer`` through ``spool``, size and digest checked; None,
        its outcome counted, if there is none to judge."""
        try:
            with trio.fail_after(FETCH_TIMEOUT_S):
                found = await fetch_fraud_proof(self.p2p, peer, ref, spool)
        except ProtocolError as exc:
            log.info("fraud proof %s from %s: %s", ref.digest.hex()[:12], peer, exc)
            self._refused(Verdict(Outcome.REJECT, str(exc), code=exc.code), peer, FraudProofRef.KIND)
            self.fetched["rejected"] += 1
            return None
        except (NetworkError, trio.TooSlowError) as exc:  # the peer's failure, not provably a lie
            log.info("fetching fraud proof %s from %s failed: %s", ref.digest.hex()[:12], peer, exc)
            self.fetched["failed"] += 1
            return None
        if not found:
            self.fetched["empty"] += 1
            return None
        return await trio.to_thread.run_sync(_read_all, spool)  # the referee decodes the whole proof

    async def _serve(self, stream: Stream) -> None:
        if stream.peer_id in self._serving or len(self._serving) >= MAX_SERVING:
            await stream.reset()
            return
        self._serving.add(stream.peer_id)
        try:
            with trio.move_on_after(FETCH_TIMEOUT_S) as waited:
                await serve_fraud_proof(stream, self.statements.store.fraud.open_body)
            if waited.cancelled_caught:  # the fetcher gave up by now
                await stream.reset()
        finally:
            self._serving.discard(stream.peer_id)
