"""The libp2p adapter against real py-libp2p hosts on loopback (three in one trio process)."""

import logging
from contextlib import AsyncExitStack

import pytest
import trio
from trio.testing import MockClock

from open1b.node.claim_records import ClaimRecords
from open1b.node.p2p import DHT_OP_TIMEOUT_S, P2P, NetworkError, open_p2p
from open1b.protocol import Claim, Outcome, claim_key, select_claim

from .conftest import ident
from .loopback_hosts import connected_pair, gossip_from

TOPIC = "/open1b/test"
NOW = 1_800_000_000


async def _three_nodes(stack: AsyncExitStack):
    nodes = [await stack.enter_async_context(open_p2p(ident(20 + i), "127.0.0.1", 0)) for i in range(3)]
    for node in nodes[1:]:
        await node.connect(nodes[0].addrs[0])
    for node in nodes:
        await node.discover(8)
    return nodes


def test_identity_gossip_validation_dht_arbitration_and_stream_isolation(tampered_run):
    _, manifest = tampered_run

    async def main():
        # the deadline scope encloses the stack: a scope opened inside it would misnest with the
        # nodes' own scopes when the stack closes them
        with trio.fail_after(60):
            async with AsyncExitStack() as stack:
                a, b, c = await _three_nodes(stack)
                assert a.peer_id == ident(20).peer_id  # one seed: libp2p peer ID = signer identity

                # -- gossip: accept is delivered, reject is counted against the author, ignore is not
                received = {n.peer_id: [] for n in (a, b)}
                for node in (a, b, c):
                    node.set_validator(TOPIC, lambda author, data: {b"ok": Outcome.ACCEPT, b"bad": Outcome.REJECT}
                                       .get(data[:3].rstrip(b"-"), Outcome.IGNORE))
                for node in (a, b):
                    async def handler(author, data, sink=received[node.peer_id]):
                        sink.append((author, data))
                    await node.subscribe(TOPIC, handler)
                await c.subscribe(TOPIC, lambda author, data: trio.sleep(0))
                await a.pubsub.wait_for_mesh(c.host.get_id(), TOPIC, timeout=10)
                await b.pubsub.wait_for_subscription(c.host.get_id(), TOPIC, timeout=10)
                c.set_validator(TOPIC, lambda author, data: Outcome.ACCEPT)  # c sends anything
                for payload in (b"bad-1", b"meh-1", b"ok-1"):
                    await c.publish(TOPIC, payload)
                while not all(received.values()):
                    await trio.sleep(0.02)
                await trio.sleep(0.3)
                for sink in received.values():
                    assert sink == [(c.peer_id, b"ok-1")]
                assert a.rejected == {c.peer_id: 1}

                # -- DHT: concurrent conflicting claims converge on the protocol's winner
                for node in (a, b, c):
                    node.register_record_validator("open1b", ClaimRecords())
                key = claim_key(manifest.run_id, 1, 0)
                claims = [Claim.create(ident(20 + i), run=manifest.run_id, step=1, slot=0, issued_at=NOW + i % 2,
                                       lease_expiry=NOW + 60) for i in range(3)]
                async with trio.open_nursery() as nursery:
                    for node, claim in zip((a, b, c), claims):
                        nursery.start_soon(node.put_record, key, claim.encoded)
                expected = claims[select_claim(claims)].encoded
                for node in (a, b, c):
                    assert await node.get_record(key, from_network=True) == expected
                assert not await c.put_record(key, claims[2].encoded) or claims[2].encoded == expected

                # -- a stream handler that raises must not take the host down
                async def crashing(stream):
                    await stream.receive(16)
                    raise RuntimeError("handler bug")

                async def echo(stream):
                    await stream.send(b"echo:" + await stream.receive(16))
                    await stream.close()

                a.set_stream_handler("/open1b/test/crash/1", crashing)
                a.set_stream_handler("/open1b/test/echo/1", echo)
                s = await b.open_stream(a.peer_id, "/open1b/test/crash/1")
                await s.send(b"x")
                s2 = await c.open_stream(a.peer_id, "/open1b/test/echo/1")
                await s2.send(b"hi")
                assert await s2.receive(64) == b"echo:hi"

    trio.run(main)


def test_a_validator_of_ours_that_raises_ignores_the_message_and_blames_no_one(caplog):
    """A raise in our own validator is our bug: the message is dropped (IGNORE), the sender is
    never penalised — under REJECT, a bug would ban every honest peer after a few messages — and
    the traceback is logged once."""
    received = []

    def buggy(author, data):
        if data.startswith(b"bug"):
            raise TypeError("a bug of ours")
        return Outcome.ACCEPT

    async def main():
        with trio.fail_after(60):
            async with AsyncExitStack() as stack:
                a, c = await connected_pair(stack, 30, max_rejects_per_peer=2)
                a.set_validator(TOPIC, buggy)
                c.set_validator(TOPIC, lambda author, data: Outcome.ACCEPT)
                await gossip_from(c, a, TOPIC, received)
                for i in range(5):  # past max_rejects_per_peer, had they counted against c
                    await c.publish(TOPIC, b"bug-%d" % i)
                await c.publish(TOPIC, b"fine")
                while a.validator_errors < 5 or not received:
                    await trio.sleep(0.02)
                assert a.rejected == {} and a.banned == set() and c.peer_id in a.connected_peers()

    with caplog.at_level(logging.ERROR, logger="open1b.node.p2p"):
        trio.run(main)
    assert received == [b"fine"]
    bugs = [r for r in caplog.records if r.getMessage().startswith("BUG: our gossip validator")]
    assert len(bugs) == 1 and bugs[0].exc_info[0] is TypeError


class _StuckDHT:
    """A DHT whose every walk hangs, as py-libp2p's did on a peer a partition made unreachable."""

    class value_store:  # noqa: N801 - the attribute py-libp2p's DHT has
        get = remove = put = staticmethod(lambda *args: None)

    async def _hang(self, *args):
        await trio.sleep_forever()

    get_value = put_value = provide = find_providers = _hang


def test_a_dht_operation_stuck_on_an_unreachable_peer_ends_at_its_bound():
    p2p = P2P(ident(7))
    p2p.dht = _StuckDHT()

    async def main() -> float:
        started = trio.current_time()
        with trio.fail_after(10 * DHT_OP_TIMEOUT_S):  # unbounded, the test fails instead of hanging
            return await walks(started)

    async def walks(started: float) -> float:
        assert await p2p.get_record("/open1b/c/k", from_network=True) is None  # cannot tell: as if unclaimed
        with pytest.raises(NetworkError):  # the claim was not taken: the auditor tries another step
            await p2p.put_record("/open1b/c/k", b"v")
        assert await p2p.provide("k") is False
        assert await p2p.find_providers("k") == []
        return trio.current_time() - started

    assert trio.run(main, clock=MockClock(autojump_threshold=0)) == 4 * DHT_OP_TIMEOUT_S



def test_a_stream_to_a_peer_the_peerstore_never_heard_of_is_a_network_error():
    # the dispute agent opens streams to a run's publisher by its key alone; the relay lookup of
    # such a peer raised libp2p's PeerStoreError, which took the daemon down with it
    async def main():
        with trio.fail_after(30):
            async with open_p2p(ident(97), "127.0.0.1", 0) as node:
                with pytest.raises(NetworkError, match="No known addresses"):
                    await node.open_stream(ident(98).peer_id, "/open1b/test/1.0.0")

    trio.run(main)


def test_an_async_validator_is_awaited_with_the_forwarder_and_judged_as_a_plain_one():
    """The fraud proofs' validator awaits the referee's thread: libp2p runs it in the message's
    own task; its REJECT counts against the forwarding peer, its raise against no one."""
    seen, received = [], []

    async def validator(forwarder, author, data):
        seen.append((forwarder, author, data))
        await trio.sleep(0)  # it awaits
        if data == b"bug":
            raise TypeError("a bug of ours")
        return {b"ok": Outcome.ACCEPT, b"bad": Outcome.REJECT}.get(data, Outcome.IGNORE)

    async def main():
        with trio.fail_after(60):
            async with AsyncExitStack() as stack:
                a, c = await connected_pair(stack, 32)
                a.set_validator(TOPIC, validator)
                c.set_validator(TOPIC, lambda author, data: Outcome.ACCEPT)  # c sends anything
                await gossip_from(c, a, TOPIC, received)
                for payload in (b"bug", b"meh", b"bad", b"ok"):
                    await c.publish(TOPIC, payload)
                while not (received and a.rejected and a.validator_errors and len(seen) == 4):
                    await trio.sleep(0.02)
                assert received == [b"ok"] and a.rejected == {c.peer_id: 1} and a.validator_errors == 1
                assert sorted(seen) == sorted((c.peer_id, c.peer_id, p) for p in (b"bug", b"meh", b"bad", b"ok"))

    trio.run(main)
