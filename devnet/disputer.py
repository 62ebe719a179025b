"""The harness's disputes on a devnet (docs/protocol.md §18.5, §18.7): the daemons do not open or
answer disputes yet (§18.8), so a scenario plays both parties here, each with its own key and
its own trace of the step (replayed from the run's checkpoint; a forger's on its forging backend),
bisects over the real dispute stream between two libp2p hosts on loopback, and gossips the proof
into the devnet from a third host, as any node holding a proof would. What the devnet then does
with it (validate with the referee, store, refute or flag in coverage) is the daemons' own code."""

from __future__ import annotations

import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Callable

import trio

from open1b.deterministic.dispute_replay import op_data, trace_step
from open1b.node.disputes import DisputeResult, DisputeServer, Party, bisect
from open1b.node.p2p import open_p2p
from open1b.node.topics import fraud_proofs_topic
from open1b.protocol import Identity, RunManifest
from open1b.protocol.dispute.bisection import DISPUTE_PROTOCOL
from open1b.protocol.dispute.trace import TraceCommitment

Backend = Callable[[], object] | None
"""A party's backend factory (a fresh forger per replay), or None for the engine's default."""


def party(run_dir: Path, manifest: RunManifest, step: int, identity: Identity, backend: Backend) -> Party:
    """``identity``'s side of a dispute over ``step``: its traced replay, signed."""
    traced = trace_step(run_dir, manifest, step, backend=backend() if backend else None)
    commitment = TraceCommitment.create(identity, run=manifest.run_id, step=step, pre_state=traced.pre_state,
                                        post_state=traced.post_state, ops=traced.trace.ops, root=traced.tree.root)

    async def data(pos: int):
        return op_data(run_dir, manifest, step, pos, backend=backend() if backend else None)

    return Party(commitment, traced.tree, traced.trace.records, data)


def dispute(opener: tuple[Identity, Party], answerer: tuple[Identity, Party]) -> tuple[DisputeResult, float]:
    """Bisect between two hosts on loopback, ``opener`` opening: its result and the wall seconds."""

    async def main():
        with trio.fail_after(300):
            async with AsyncExitStack() as stack:
                a, b = [await stack.enter_async_context(open_p2p(ident, "127.0.0.1", 0))
                        for ident in (opener[0], answerer[0])]
                await a.connect(b.addrs[0])
                DisputeServer(lambda trace: answerer[1], penalise=lambda peer: None,
                              on_result=lambda peer, result: None).serve(b)
                started = time.perf_counter()
                result = await bisect(await a.open_stream(b.peer_id, DISPUTE_PROTOCOL), opener[1])
                return result, time.perf_counter() - started

    return trio.run(main)


async def _ignore(author: str, data: bytes) -> None:
    """The reporter reads nothing: it subscribes only to join the topic's mesh."""


def gossip_proof(proof: bytes, run: bytes, bootstrap: str, stored: Callable[[], bool], *, timeout_s: float = 60.0
                 ) -> float:
    """Publish ``proof`` on the run's fraud-proof topic from a fresh host joined to ``bootstrap``,
    again every 2 s until ``stored()`` (a node's API lists it) or ``timeout_s``; returns the
    seconds until it was stored. TimeoutError if it never was."""
    topic = fraud_proofs_topic(run)

    async def main():
        with trio.fail_after(timeout_s):
            async with open_p2p(Identity(b"\x5a" * 32), "127.0.0.1", 0) as host:
                await host.connect(bootstrap)
                await host.subscribe(topic, _ignore)
                started = time.perf_counter()
                while True:
                    if host.topic_peers(topic):
                        await host.publish(topic, proof)
                    await trio.sleep(2.0)  # gossip has no delivery receipt: the node's API is the receipt
                    if await trio.to_thread.run_sync(stored):
                        return time.perf_counter() - started

    return trio.run(main)
