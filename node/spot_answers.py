"""The challenge stream ``/open1b/spotcheck/1.0.0`` (docs/protocol.md §5.5, §11.4): a verifier asks
for the trainer's answer to its spot-check challenge; a node that published the run answers.

Request: one frame, canonical CBOR ``{"run": hash, "step": uint, "challenge": signature}`` (at most
:data:`MAX_CHALLENGE_REQUEST` bytes). Response: one frame, ``{"answer": bytes}`` (the answer of
docs/run-format.md §10.2, at most ``MAX_ANSWER_SIZE`` bytes) or ``{"error": code}`` with a code of
:data:`ERRORS`; then the server closes the stream.

The server (:class:`AnswerServer`) checks the challenge before computing anything: it must be the
requesting peer's own signature over (run, step), so nobody makes a node recompute a step for a
challenge it did not sign. Answers are computed in a worker process of their own (not the one that
replays: a replay of a real step can outlast the answer deadline), one at a time, and at
most :data:`MAX_PENDING_ANSWERS` wait: a request beyond that is refused (``busy``) at once rather
than queued without bound.

One key must not pin the publisher's CPU nor turn honest verifiers away (one key sending 8
concurrent challenges for 30 s once got 1,038 answers computed at 92 % of a core, and every other
verifier ``busy``). So each peer has at most :data:`MAX_PENDING_PER_PEER` answer pending, and after
an answer that took *t* seconds of the worker its next one is computed no sooner than *t* seconds
later (``busy`` meanwhile): one peer gets at most half of the answer worker, and waits its turn
behind the others (the worker's lock is FIFO). Answers are kept (:data:`ANSWER_CACHE_BYTES`) by
(run, step, challenge): asking again costs no computation, and asking again within
:data:`REPEAT_INTERVAL_S` is counted as a reject of the peer — an honest verifier asks once per spot
check, and again only after a failure of its own.

The verifier (:func:`request_answer`) asks the peers it is connected to (the run's publisher
first), then the run's providers, until one answers or the answer deadline passes (``None``: the
verifier signs ``no_answer``). It believes no answer: an answer opens no commitment, so its chunks
bind only the peer that sent them. An answer that breaks a link is only that peer's failure unless
the peer is the run's publisher, and the verifier asks the others (:mod:`.spot_checker`).
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from pathlib import Path
from typing import Awaitable, Callable

import trio

from open1b.protocol import Open1bError, RunManifest, signing
from open1b.protocol.codec import decode, encode
from open1b.protocol.errors import SignatureError, WrongTypeError
from open1b.protocol.identity import SIGNATURE_SIZE, public_key_from_peer_id
from open1b.protocol.spotcheck import CHALLENGE_KIND, MAX_ANSWER_SIZE

from .files import FileRefused, read_bounded
from .metrics import NodeStats
from .p2p import P2P, NetworkError, Stream
from .worker import ReplayFailed, ReplayWorker

log = logging.getLogger("open1b.node.spot_answers")

SPOTCHECK_PROTOCOL = "/open1b/spotcheck/1.0.0"
MAX_CHALLENGE_REQUEST = 256  # {"run": 32 B, "step": u64, "challenge": 64 B} is about 130 bytes
MAX_ANSWER_FRAME = MAX_ANSWER_SIZE + 64  # the answer inside a one-key map
MAX_PENDING_ANSWERS = 4  # answers computing or waiting for the worker; more are refused ("busy")
MAX_PENDING_PER_PEER = 1
ANSWER_CACHE_BYTES = 64 << 20  # answers kept for repeated challenges (an answer is at most MAX_ANSWER_SIZE)
REPEAT_INTERVAL_S = 5.0  # the same challenge again sooner than this is a reject of the asker
ASK_RETRY_S = 1.0  # pause between rounds over the candidate peers, while the deadline allows
ERRORS = ("unknown_run", "bad_challenge", "busy", "failed")


class AnswerServer:
    """Answers challenges of the runs this node published (those whose directory it holds)."""

    def __init__(self, worker: ReplayWorker, manifests: dict[bytes, RunManifest],
                 run_dir: Callable[[bytes], Path | None], scratch: Path, *, timeout_s: float, stats: NodeStats,
                 penalise: Callable[[str], None] = lambda peer: None) -> None:
        self.worker, self.manifests, self.run_dir, self.scratch = worker, manifests, run_dir, scratch
        self.timeout_s, self.stats, self.penalise = timeout_s, stats, penalise
        self.pending = 0
        self.computed = 0  # answers the worker computed (the rest came from the cache)
        self._one = trio.Lock()  # one answer at a time: each costs up to one recomputation of a step
        self._pending_of: dict[str, int] = {}
        self._next_of: dict[str, float] = {}  # peer -> trio time before which no answer is computed for it
        self._cache: OrderedDict[tuple[bytes, int, bytes], tuple[bytes, float]] = OrderedDict()  # -> answer, served at
        self._cache_bytes = 0

    async def serve(self, stream: Stream) -> None:
        request = decode(await stream.receive(MAX_CHALLENGE_REQUEST), max_size=MAX_CHALLENGE_REQUEST)
        if (type(request) is not dict or set(request) != {"run", "step", "challenge"} or type(request["run"]) is not bytes
                or type(request["step"]) is not int or type(request["challenge"]) is not bytes
                or len(request["challenge"]) != SIGNATURE_SIZE):
            raise WrongTypeError("malformed spot-check challenge request")  # the handler wrapper resets
        await stream.send(encode(await self.answer(stream.peer_id, request["run"], request["step"],
                                                   request["challenge"])))
        await stream.close()

    async def answer(self, peer_id: str, run: bytes, step: int, challenge: bytes) -> dict:
        manifest, run_dir = self.manifests.get(run), self.run_dir(run)
        if manifest is None or run_dir is None or not 0 <= step < manifest.steps:
            return {"error": "unknown_run"}
        try:  # the challenge is the asking peer's own signature over (run, step) (docs/protocol.md §5.5)
            signing.verify(public_key_from_peer_id(peer_id), CHALLENGE_KIND, {"run": run, "step": step}, challenge)
        except (SignatureError, Open1bError):
            return {"error": "bad_challenge"}
        now, key = trio.current_time(), (run, step, challenge)
        if key in self._cache:  # the challenge signs the asker's key: only that peer asks for it
            data, served = self._cache[key]
            if now - served < REPEAT_INTERVAL_S:
                self.penalise(peer_id)
            self._cache[key] = (data, now)
            self._cache.move_to_end(key)
            self.stats.challenges_answered += 1
            return {"answer": data}
        if (self.pending >= MAX_PENDING_ANSWERS or self._pending_of.get(peer_id, 0) >= MAX_PENDING_PER_PEER
                or now < self._next_of.get(peer_id, now)):
            return {"error": "busy"}
        self.pending += 1
        self._pending_of[peer_id] = self._pending_of.get(peer_id, 0) + 1
        out = self.scratch / f"answer-{os.urandom(8).hex()}.cbor"
        try:
            async with self._one:
                started = trio.current_time()
                try:
                    self.scratch.mkdir(parents=True, exist_ok=True)
                    await self.worker.answer(run_dir, step, challenge, out, timeout_s=self.timeout_s)
                    data = await trio.to_thread.run_sync(read_bounded, out, MAX_ANSWER_SIZE)
                finally:
                    self.computed += 1
                    ended = trio.current_time()
                    self._next_of[peer_id] = ended + (ended - started)  # at most half the worker's time
        except (ReplayFailed, FileRefused, OSError) as exc:
            log.warning("answer to a challenge of step %d of %s failed: %s", step, run.hex()[:12], exc)
            return {"error": "failed"}
        finally:
            self.pending -= 1
            self._pending_of[peer_id] -= 1
            if not self._pending_of[peer_id]:
                del self._pending_of[peer_id]
            out.unlink(missing_ok=True)
        self._keep(key, data, trio.current_time())
        self.stats.challenges_answered += 1
        return {"answer": data}

    def _keep(self, key: tuple[bytes, int, bytes], data: bytes, now: float) -> None:
        if key in self._cache or len(data) > ANSWER_CACHE_BYTES:
            return
        self._cache[key] = (data, now)
        self._cache_bytes += len(data)
        while self._cache_bytes > ANSWER_CACHE_BYTES:
            _, (dropped, _) = self._cache.popitem(last=False)
            self._cache_bytes -= len(dropped)
        if len(self._next_of) > 4096:  # forget peers whose wait is over
            self._next_of = {p: t for p, t in self._next_of.items() if t > now}


async def ask(p2p: P2P, peer_id: str, run: bytes, step: int, challenge: bytes) -> bytes | None:
    """One peer's answer, or None if it has none (an error code, a malformed reply, a network failure)."""
    try:
        stream = await p2p.open_stream(peer_id, SPOTCHECK_PROTOCOL)
        try:
            await stream.send(encode({"run": run, "step": step, "challenge": challenge}))
            reply = decode(await stream.receive(MAX_ANSWER_FRAME), max_size=MAX_ANSWER_FRAME)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1):  # tell the peer, even when cancelled
                await stream.reset()
    except (NetworkError, Open1bError) as exc:
        log.info("challenge of step %d to %s: %s", step, peer_id, exc)
        return None
    if type(reply) is dict and set(reply) == {"answer"} and type(reply["answer"]) is bytes:
        return reply["answer"]
    if type(reply) is dict and set(reply) == {"error"} and reply["error"] in ERRORS:
        log.info("challenge of step %d to %s: %s", step, peer_id, reply["error"])
    else:
        log.info("challenge of step %d to %s: malformed reply", step, peer_id)
    return None


async def request_answer(p2p: P2P, candidates: Callable[[], Awaitable[list[str]]], run: bytes, step: int,
                         challenge: bytes, *, deadline_s: float, skip: set[str],
                         sleep: Callable[[float], Awaitable[None]]) -> tuple[str, bytes] | None:
    """(peer, answer): the first answer from ``candidates()`` (asked in turn, round after round,
    except those in ``skip``) within ``deadline_s``; None if none came. The caller checks it: anyone
    may answer, and only chunks that open the run's commitments count."""
    if deadline_s <= 0:
        return None
    with trio.move_on_after(deadline_s):
        while True:
            for peer in await candidates():
                if peer not in skip:
                    answer = await ask(p2p, peer, run, step, challenge)
                    if answer is not None:
                        return peer, answer
            await sleep(ASK_RETRY_S)
    return None
