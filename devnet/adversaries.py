"""Deliberately broken daemons, for devnet scenarios only (docs/reliability.md).

A devnet starts some of its daemons through its own entry point,
``python -m open1b.devnet.daemon_entry --behaviour NAME[=ARG] DAEMON_ARGS`` (:mod:`.daemon_entry`);
``open1b-node`` has no such flag and its config no such key. The entry point refuses unless its
environment holds ``OPEN1B_DEVNET=1``, which only the devnet's :class:`~open1b.devnet.Daemons`
helper sets: an operator cannot switch any of this on by accident. Each behaviour is an
:class:`Adversary`, which reaches the daemon only through the daemon's documented hook
(:class:`open1b.node.daemon.Harness`): it wraps the honest :class:`~open1b.node.auditor.Replayer`,
and runs a task of its own with the running :class:`~open1b.node.daemon.Daemon`'s components.
Behaviours:

* ``lie``     — signs ``match`` (the published hash) for every step of every run it knows, at
  once and without replaying; if it claims a step, it "replays" it the same way.
  ``lie=mismatch`` signs a ``mismatch`` with a made-up result instead: a false dispute.
* ``copy``    — replays nothing: re-signs the result (and every other field, such as a replay
  witness) of whatever another node attested, for each step it has not attested yet (run it
  with ``--no-audit``).
* ``spam=N``  — publishes N of each kind of forged or malformed statement (:data:`SPAM`) on the
  run's topics, in bursts until every peer has banned it (at most :data:`SPAM_BURSTS`), answers
  sync requests with the same bytes, and writes what it sent to ``<data dir>/injected.json``.
* ``sybil=N`` — mints N fresh keys and publishes, under each, a match for every step at once.
* ``slow=S``  — honest, but each replay takes S seconds longer (a window for ``kill -9``);
  ``slow=S,F``: F times as long as the honest replay took, if that is longer (a proportion that
  holds however loaded the machine is: the spot-check scenarios' replay-to-spot-check ratio).
* ``straggler=S`` — ``slow=S`` that says so: its replay-time estimate starts at S seconds (a
  declared speed), so its claims carry an ``expected_done`` S seconds out from the start
  (docs/protocol.md §10.1; the ``straggler`` scenario).
* ``device=CLASS`` — honest replays, signed as computed on device class CLASS (the CPU computes
  the same bits: one machine's devnet gets a second class; the ``device-classes`` scenario).
* ``refuse``  — honest, but never answers a spot-check challenge of the runs it publishes: it
  reads the request and says nothing until the verifier gives up (``refusing-trainer``).
* ``forger``  — answers challenges of the forged runs it publishes as their forger would,
  consistently with its forged commitments (:func:`..forged_run.forged_answer`), so that only the
  checks that need no answer can catch a forged micro-batch (``forged-microbatch``). The answer is
  computed in a thread of the daemon's process: a devnet's forger, not the honest worker path.
  In a dispute it stands by its published states: a step it forged one op of (its run's note says
  ``forged-op``) it traces on the forging backend (:class:`.forged_op.ForgingBackend`), as it
  computed it; the others honestly. ``forger=silent``: it answers a dispute with its trace, then
  says nothing (run it with ``--no-disputes``: it opens none); ``forger=oversized``: its first
  message after the trace is a frame over the bound.
* ``lie=mismatch`` also defends its false mismatches in disputes, with a trace of every step on
  the forging backend (the only way to another h_{k+1} from the same h_k).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from functools import partial
from pathlib import Path
from typing import Callable

import cbor2
import trio

from open1b.deterministic.device import cpu_device_class
from open1b.deterministic.dispute_replay import op_data, trace_step
from open1b.node.auditor import Replayer
from open1b.node.config import ConfigError
from open1b.node.daemon import Daemon
from open1b.node.dispute_tracer import StepTrace, Tracer
from open1b.node.files import write_atomic
from open1b.node.op_data import OpData
from open1b.node.p2p import NetworkError, Stream
from open1b.node.spot_answers import MAX_CHALLENGE_REQUEST, SPOTCHECK_PROTOCOL, AnswerServer
from open1b.node.sync import MAX_SYNC_REQUEST, SYNC_PROTOCOL
from open1b.node.topics import attestations_topic
from open1b.node.worker import WorkerResult
from open1b.protocol import (
    DEVICE_CLASS,
    MATCH,
    MAX_ATTESTATION_SIZE,
    MISMATCH,
    Attestation,
    Claim,
    Identity,
    Outcome,
    RunManifest,
    encode,
    sign,
)
from open1b.protocol.dispute.bisection import DISPUTE_PROTOCOL, MAX_MESSAGE
from open1b.protocol.hashing import blake2b256
from open1b.protocol.schema import Bytes, FieldType, UInt

from .forged_op import ForgingBackend
from .forged_run import forged_answer, forgery_of

log = logging.getLogger("open1b.devnet.adversaries")

ENV_SWITCH = "OPEN1B_DEVNET"
INJECTED_FILE = "injected.json"
MESH_WAIT_S = 15.0
RUN_WAIT_S = 120.0
SPAM_BURSTS, SPAM_PAUSE_S = 5, 3.0


def from_name(behaviour: str) -> Adversary:
    """The adversary a devnet asked for (``NAME[=ARG]``)."""
    if os.environ.get(ENV_SWITCH) != "1":
        raise ConfigError("--behaviour is a devnet-only test switch (it makes the node misbehave on purpose)")
    name, _, arg = behaviour.partition("=")
    if name not in BEHAVIOURS:
        raise ConfigError(f"unknown behaviour {name!r} (known: {', '.join(sorted(BEHAVIOURS))})")
    log.warning("THIS NODE MISBEHAVES ON PURPOSE: behaviour %s", behaviour)
    return BEHAVIOURS[name](arg)


class Adversary:
    """A :class:`~open1b.node.daemon.Harness`: by default it replays nothing and signs an echo of
    the published hash for any step it claims."""

    def __init__(self, arg: str) -> None:
        self.arg = arg
        self.honest: Replayer | None = None

    def replayer(self, honest: Replayer) -> Replayer:
        self.honest = honest
        return self

    async def replay(self, manifest: RunManifest, run_dir: Path, step: int) -> WorkerResult:
        """What the node signs instead of an honest replay; by default an echo of the published hash."""
        made_up = blake2b256(b"open1b/devnet/made-up-witness", manifest.run_id, step.to_bytes(8, "little"))
        return WorkerResult(manifest.state_hashes[step], manifest.state_hashes[step + 1], made_up, 1,
                            cpu_device_class())

    def device_class(self) -> str | None:
        return self.honest.device_class() if self.honest is not None else None

    async def ready(self) -> None:
        # a declared class is known at once, but the replays are the honest worker's: started alike
        if self.honest is not None:
            await self.honest.ready()

    def tracer(self, honest: Tracer) -> Tracer:
        """What its disputes are traced with: by default the honest worker."""
        return honest

    async def run(self, daemon: Daemon) -> None:
        """Misbehaviour of its own, started with the daemon's other tasks."""


class Slow(Adversary):
    async def replay(self, manifest, run_dir, step):
        assert self.honest is not None  # set by the daemon before it audits
        seconds, _, times = (self.arg or "3").partition(",")
        started = trio.current_time()
        result = await self.honest.replay(manifest, run_dir, step)
        took = trio.current_time() - started
        await trio.sleep(max(float(seconds), (float(times or 1) - 1) * took))
        return result


class Straggler(Slow):
    async def replay(self, manifest, run_dir, step):
        result = await super().replay(manifest, run_dir, step)  # it says how long it really took
        return dataclasses.replace(result, elapsed_ms=result.elapsed_ms + int(float(self.arg or 3) * 1000))

    async def run(self, daemon: Daemon) -> None:
        # Before the auditor's first claim: it waits for the network and a run, this does not.
        daemon.auditor.estimate.update(float(self.arg or 3))


class DeclaredDevice(Adversary):
    def __init__(self, arg: str) -> None:
        if not DEVICE_CLASS.fullmatch(arg):
            raise ConfigError(f"device={arg!r}: not a device class (docs/protocol.md §5.2)")
        super().__init__(arg)

    async def replay(self, manifest, run_dir, step):
        assert self.honest is not None  # set by the daemon before it audits
        return dataclasses.replace(await self.honest.replay(manifest, run_dir, step), device=self.arg)

    def device_class(self) -> str | None:
        return self.arg


class Refuse(Adversary):
    def replayer(self, honest: Replayer) -> Replayer:
        return honest

    async def run(self, daemon: Daemon) -> None:
        async def silent(stream: Stream) -> None:
            await stream.receive(MAX_CHALLENGE_REQUEST)
            await stream.receive(1)  # returns (or raises) when the verifier closes or resets the stream

        daemon.p2p.set_stream_handler(SPOTCHECK_PROTOCOL, silent)  # in place of the honest answer server


class _ForgerAnswers:
    """What :class:`~..spot_answers.AnswerServer` computes answers with, in place of the worker."""

    async def answer(self, run_dir: Path, step: int, challenge: bytes, out: Path, *, timeout_s: float) -> int:
        with trio.fail_after(timeout_s):
            data = await trio.to_thread.run_sync(forged_answer, run_dir, step, challenge)
        out.write_bytes(data)
        return len(data)


class _ForgingTracer:
    """A forger's traces (node/dispute_tracer.py's ``Tracer``): the steps it forged one op of (the
    run's note, :data:`..forged_run.FORGERIES_FILE`, says ``forged-op``; ``always``: every step)
    traced on the forging backend, in a thread of the daemon's process; the others honestly."""

    def __init__(self, honest: Tracer, *, always: bool) -> None:
        self.honest, self.always, self.forged = honest, always, set()

    async def trace(self, manifest: RunManifest, run_dir: Path, step: int) -> StepTrace:
        if not (self.always or forgery_of(run_dir, step) == "forged-op"):
            return await self.honest.trace(manifest, run_dir, step)
        self.forged.add((manifest.run_id, step))
        t = await trio.to_thread.run_sync(partial(trace_step, run_dir, manifest, step, backend=ForgingBackend()))
        return StepTrace(t.trace.records, t.pre_state, t.post_state)

    async def op_data(self, manifest: RunManifest, run_dir: Path, step: int, pos: int) -> OpData:
        if (manifest.run_id, step) not in self.forged:
            return await self.honest.op_data(manifest, run_dir, step, pos)
        return OpData(*await trio.to_thread.run_sync(partial(op_data, run_dir, manifest, step, pos,
                                                             backend=ForgingBackend())))


class _BadDisputant:
    """The stream of a dispute this node answers, misbehaving once its trace is sent: ``silent``
    sends nothing more (and waits for the opener to give up and close), ``oversized`` sends a
    frame over the bound in place of its next message."""

    def __init__(self, stream: Stream, how: str) -> None:
        self.stream, self.how, self.peer_id, self.sent = stream, how, stream.peer_id, 0

    async def receive(self, max_size: int) -> bytes:
        return await self.stream.receive(max_size)

    async def send(self, frame: bytes) -> None:
        self.sent += 1
        if self.sent == 1:  # its trace
            await self.stream.send(frame)
        elif self.how == "oversized":
            await self.stream.send(b"\xa0" * (MAX_MESSAGE + 1))
        else:
            await self.stream.receive(1)  # returns (or raises) when the opener closes or resets the stream
            raise NetworkError("silent on purpose")

    async def close(self) -> None:
        await self.stream.close()


class Forger(Adversary):
    def replayer(self, honest: Replayer) -> Replayer:
        return honest

    def tracer(self, honest: Tracer) -> Tracer:
        return _ForgingTracer(honest, always=False)

    async def run(self, daemon: Daemon) -> None:
        server = AnswerServer(_ForgerAnswers(), daemon.ledger.manifests, daemon.store.run_dir,
                              daemon.config.data_dir / "spot", timeout_s=daemon.config.replay_timeout_s,
                              stats=daemon.stats)
        daemon.p2p.set_stream_handler(SPOTCHECK_PROTOCOL, server.serve)
        if self.arg in ("silent", "oversized"):
            daemon.p2p.set_stream_handler(DISPUTE_PROTOCOL,
                                          lambda stream: daemon.disputes.handle(_BadDisputant(stream, self.arg)))
        elif self.arg:
            raise ConfigError(f"forger={self.arg!r}: expected silent or oversized")


def _echo(daemon: Daemon, identity: Identity, manifest: RunManifest, step: int) -> Attestation:
    fields = dict(
        run=manifest.run_id, step=step, pre_state=manifest.state_hashes[step],
        post_state=manifest.state_hashes[step + 1], verdict=MATCH, engine=manifest.engine,
        engine_version=manifest.engine_version, hardware=daemon.auditor.hardware, device=cpu_device_class(),
        elapsed_ms=1, issued_at=daemon.clock.wall())
    # Fields a later protocol adds (a replay witness): someone who never replayed can only make one up.
    made_up = {name: _made_up(kind) for name, kind in Attestation.SCHEMA.items()
               if name not in fields and name != "signer"}
    return Attestation.create(identity, **fields, **made_up)


def _made_up(kind: FieldType):
    if isinstance(kind, Bytes):
        return blake2b256(b"open1b/devnet/made-up")[: kind.size or 32]
    return 0 if isinstance(kind, UInt) else ""


async def _publish(daemon: Daemon, att: Attestation) -> None:
    await daemon.ledger.outbox.publish(att)


async def _wait_for_mesh(daemon: Daemon) -> None:
    """Until the node knows a run (runs arrive by gossip or sync, after start-up) and every run's
    attestation topic has a peer (what we publish before that is lost)."""
    await daemon.bootstrapped.wait()
    with trio.move_on_after(RUN_WAIT_S):
        while not daemon.ledger.manifests:
            await trio.sleep(0.2)
    with trio.move_on_after(MESH_WAIT_S):
        while not all(daemon.p2p.topic_peers(attestations_topic(r)) for r in daemon.ledger.manifests):
            await trio.sleep(0.2)


class Lie(Adversary):
    """``lie``: a match for every step; ``lie=mismatch``: a mismatch (with a made-up result) for
    every step — a false dispute of each, defended with forged traces."""

    def tracer(self, honest: Tracer) -> Tracer:
        return _ForgingTracer(honest, always=True) if self.arg == "mismatch" else honest

    async def run(self, daemon):
        await _wait_for_mesh(daemon)
        for manifest in list(daemon.ledger.manifests.values()):
            for step in range(manifest.steps):
                att = _echo(daemon, daemon.identity, manifest, step)
                if self.arg == "mismatch":
                    made_up = blake2b256(b"open1b/devnet/made-up", manifest.run_id, step.to_bytes(8, "little"))
                    att = Attestation.create(daemon.identity, **{**_fields(att), "post_state": made_up,
                                                                  "verdict": MISMATCH})
                await _publish(daemon, att)
        log.warning("lie: signed a %s for every step without replaying", self.arg or MATCH)


def _fields(att: Attestation) -> dict:
    return {f.name: getattr(att, f.name) for f in dataclasses.fields(att) if f.name not in ("sig", "signer")}


class Copy(Adversary):
    """Run it with ``--no-audit``: then it only copies (a step it claimed would get the base
    class's echo of the published hash, a plain lie)."""

    @staticmethod
    def _source(daemon: Daemon, run: bytes, step: int) -> Attestation | None:
        others = [a for a in daemon.store.attestations(run, step) if a.signer != daemon.identity.public_key]
        return min(others, key=lambda a: a.digest) if others else None

    async def run(self, daemon):
        await _wait_for_mesh(daemon)
        me = daemon.identity.public_key
        while True:
            for manifest in list(daemon.ledger.manifests.values()):
                mine = {a.step for a in daemon.store.attestations(manifest.run_id) if a.signer == me}
                for step in range(manifest.steps):
                    source = None if step in mine else self._source(daemon, manifest.run_id, step)
                    if source is not None:
                        await _publish(daemon, copy_attestation(daemon.identity, source, daemon.auditor.hardware,
                                                                daemon.clock.wall()))
            await trio.sleep(0.5)


def copy_attestation(identity: Identity, source: Attestation, hardware: str, now: int) -> Attestation:
    """``source``'s statement re-signed by ``identity``: every field copied (a replay witness
    included, whatever its name), except who signs, when, and on what hardware."""
    fields = {f.name: getattr(source, f.name) for f in dataclasses.fields(source)
              if f.name not in ("sig", "signer", "issued_at", "hardware")}
    return Attestation.create(identity, **fields, hardware=hardware, issued_at=now)


class Sybil(Adversary):
    async def run(self, daemon):
        await _wait_for_mesh(daemon)
        keys = [Identity(blake2b256(b"open1b/devnet/sybil", daemon.identity.seed, i.to_bytes(4, "little")))
                for i in range(int(self.arg or 20))]
        for manifest in list(daemon.ledger.manifests.values()):
            for identity in keys:
                for step in range(manifest.steps):
                    await _publish(daemon, _echo(daemon, identity, manifest, step))
        log.warning("sybil: %d fresh keys attested every step", len(keys))


# -- spam: forged and malformed statements ---------------------------------------------------
# name -> (what a receiver must answer, how to build one from (daemon, manifest, honest, i))
Forge = Callable[[Daemon, RunManifest, Attestation, int], bytes]


def _resign(identity: Identity, body: dict) -> bytes:
    """A correctly signed attestation whose body the constructors would refuse to build."""
    body = {k: v for k, v in body.items() if k != "sig"}
    return encode({**body, "sig": sign(identity, "attestation", body)})


def _own(daemon: Daemon, manifest: RunManifest, i: int, **changes) -> dict:
    body = cbor2.loads(_echo(daemon, daemon.identity, manifest, i % manifest.steps).encoded)
    body["elapsed_ms"] = 1000 + i  # every copy distinct
    body.update(changes)
    return body


def _flip_sig(daemon, manifest, honest, i):
    body = _own(daemon, manifest, i)
    data = bytearray(_resign(daemon.identity, body))
    data[-1] ^= 1  # the signature is the last map value: one bit of it
    return bytes(data)


def _wrong_key(daemon, manifest, honest, i):
    return _resign(daemon.identity, _own(daemon, manifest, i, signer=honest.signer))  # signed as someone else


def _truncated(daemon, manifest, honest, i):
    return _resign(daemon.identity, _own(daemon, manifest, i))[: -1 - i % 16]


def _oversized(daemon, manifest, honest, i):
    return _resign(daemon.identity, _own(daemon, manifest, i, hardware="x" * (1200 + i)))


def _non_canonical(daemon, manifest, honest, i):
    body = cbor2.loads(_resign(daemon.identity, _own(daemon, manifest, i)))
    return cbor2.dumps(dict(sorted(body.items(), reverse=True)))


def _garbage(daemon, manifest, honest, i):
    return blake2b256(b"garbage", bytes([i])) * (1 + i % 3)


def _wrong_kind(daemon, manifest, honest, i):
    now = daemon.clock.wall()
    return Claim.create(daemon.identity, run=manifest.run_id, step=i % manifest.steps, slot=0, issued_at=now,
                        lease_expiry=now + 60 + i).encoded


def _verdict_lie(daemon, manifest, honest, i):
    return _resign(daemon.identity, _own(daemon, manifest, i, post_state=blake2b256(b"not the result", bytes([i]))))


def _unknown_run(daemon, manifest, honest, i):
    return _resign(daemon.identity, _own(daemon, manifest, i, run=blake2b256(b"no such run", bytes([i]))))


def _future(daemon, manifest, honest, i):
    return _resign(daemon.identity, _own(daemon, manifest, i, issued_at=daemon.clock.wall() + 3600 + i))


def _replayed(daemon, manifest, honest, i):
    return honest.encoded  # an old, valid statement sent again


SPAM: dict[str, tuple[str, Forge]] = {
    "bad_signature": ("reject/bad_signature", _flip_sig),
    "wrong_key": ("reject/bad_signature", _wrong_key),
    "truncated": ("reject/malformed", _truncated),
    "oversized": ("reject/oversize", _oversized),
    "non_canonical": ("reject/non_canonical", _non_canonical),
    "garbage": ("reject/*", _garbage),  # random bytes: whichever decoding rule they break first
    "wrong_kind": ("reject/kind", _wrong_kind),
    "verdict_lie": ("reject/verdict", _verdict_lie),
    "unknown_run": ("ignore/unknown_run", _unknown_run),
    "future": ("ignore/future", _future),
    "replayed": ("duplicate", _replayed),
}


class Spam(Adversary):
    async def run(self, daemon):
        await _wait_for_mesh(daemon)
        count = int(self.arg or 3)
        injected: dict[str, dict] = {}
        frames: list[bytes] = []
        # Bursts, as a real spammer keeps going: gossip reaches only our mesh peers, and the mesh
        # moves on to the peers that have not banned us yet.
        for burst in range(SPAM_BURSTS):
            if burst and not daemon.p2p.connected_peers():
                break  # everyone has banned us
            for manifest in list(daemon.ledger.manifests.values()):
                honest = await self._an_honest_attestation(daemon, manifest)
                topic = attestations_topic(manifest.run_id)
                # Our own validator would drop what we publish: accept everything on our side.
                daemon.p2p.set_validator(topic, lambda author, data: Outcome.ACCEPT)
                # Round-robin over the kinds: receivers ban us after max_rejects_per_peer rejections
                # and drop the rest unread, so every kind must come early at least once.
                for i in range(count):
                    for name, (expect, forge) in SPAM.items():
                        data = forge(daemon, manifest, honest, i)
                        await daemon.p2p.publish(topic, data)
                        await trio.sleep(0.02)
                        entry = injected.setdefault(name, {"expect": expect, "count": 0, "digests": []})
                        entry["count"] += 1
                        entry["digests"].append(blake2b256(data).hex())
                        if burst == 0 and len(data) <= MAX_ATTESTATION_SIZE:
                            frames.append(data)
            if burst == 0:
                daemon.p2p.set_stream_handler(SYNC_PROTOCOL, lambda stream: _serve_garbage(stream, frames))
            write_atomic(daemon.config.data_dir / INJECTED_FILE, json.dumps(
                {"peer_id": daemon.identity.peer_id, "bursts": burst + 1, "per_kind": count,
                 "injected": injected}).encode())
            log.warning("spam: burst %d: %d forged or malformed statements so far", burst + 1,
                        sum(v["count"] for v in injected.values()))
            await trio.sleep(SPAM_PAUSE_S)

    @staticmethod
    async def _an_honest_attestation(daemon: Daemon, manifest: RunManifest) -> Attestation:
        while True:
            found = [a for a in daemon.store.attestations(manifest.run_id) if a.signer != daemon.identity.public_key]
            if found:
                return min(found, key=lambda a: a.digest)
            await trio.sleep(0.2)


async def _serve_garbage(stream, frames: list[bytes]) -> None:
    await stream.receive(MAX_SYNC_REQUEST)
    for frame in frames:
        await stream.send(frame)
    await stream.send(b"")
    await stream.close()


BEHAVIOURS: dict[str, type[Adversary]] = {"lie": Lie, "copy": Copy, "spam": Spam, "sybil": Sybil, "slow": Slow,
                                         "refuse": Refuse, "forger": Forger, "straggler": Straggler,
                                         "device": DeclaredDevice}
