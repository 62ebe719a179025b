"""The bench's disputes (bench/dispute_bench.py, docs/protocol.md §18.5): both parties played here,
each with its own key and its own trace of the step (replayed from the run's checkpoint; a
forger's on its forging backend), bisecting over the real dispute stream between two libp2p hosts
on loopback — the protocol's cost alone, without daemons. A devnet's disputes are the daemons'
own (node/dispute_agent.py)."""

from __future__ import annotations

import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Callable

import trio

from open1b.deterministic.dispute_replay import op_data, trace_step
from open1b.node.disputes import DisputeResult, DisputeServer, Party, bisect
from open1b.node.op_data import OpData
from open1b.node.p2p import open_p2p
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
        return OpData(*op_data(run_dir, manifest, step, pos, backend=backend() if backend else None))

    return Party(commitment, traced.tree, traced.trace.records, data)


def dispute(opener: tuple[Identity, Party], answerer: tuple[Identity, Party]) -> tuple[DisputeResult, float]:
    """Bisect between two hosts on loopback, ``opener`` opening: its result and the wall seconds."""

    async def main():
        with trio.fail_after(300):
            async with AsyncExitStack() as stack:
                a, b = [await stack.enter_async_context(open_p2p(ident, "127.0.0.1", 0))
                        for ident in (opener[0], answerer[0])]
                await a.connect(b.addrs[0])
                async def find(trace, session):
                    return answerer[1]

                DisputeServer(find, penalise=lambda peer: None,
                              on_result=lambda peer, result: None).serve(b)
                started = time.perf_counter()
                result = await bisect(await a.open_stream(b.peer_id, DISPUTE_PROTOCOL), opener[1])
                return result, time.perf_counter() - started

    return trio.run(main)
