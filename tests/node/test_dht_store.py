"""A hostile peer PUTting records straight into our DHT server (real hosts on loopback): junk is
refused and counted against it, the store stays within its bounds, claims still work."""

import os
from contextlib import AsyncExitStack

import trio
from libp2p.peer.id import ID

from open1b.node.claim_records import ClaimRecords
from open1b.node.dht_store import DhtLimits
from open1b.node.p2p import open_p2p
from open1b.protocol import Claim, claim_key
from open1b.protocol.claims import CLAIM_NAMESPACE

from .conftest import ident

NOW = 1_800_000_000


class _AcceptAll:
    """Any value; the newest wins (libp2p passes [held, incoming])."""

    def validate(self, key: str, value: bytes) -> None:
        pass

    def select(self, key: str, values: list[bytes]) -> int:
        return len(values) - 1


async def _put_at(sender, target, key: str, value: bytes) -> bool:
    """A raw PUT_VALUE from ``sender`` to ``target``, skipping the sender's own validation (a
    hostile peer runs whatever code it likes)."""
    return await sender.dht.value_store._store_at_peer(ID.from_base58(target.peer_id), key.encode(), value)


def test_junk_and_oversized_records_are_refused_and_the_sender_penalised():
    async def main():
        with trio.fail_after(120):
            async with AsyncExitStack() as stack:
                node, honest, attacker = [await stack.enter_async_context(
                    open_p2p(ident(40 + i), "127.0.0.1", 0, max_rejects_per_peer=1000)) for i in range(3)]
                for peer in (honest, attacker):
                    await peer.connect(node.addrs[0])
                for p in (node, honest):
                    p.register_record_validator(CLAIM_NAMESPACE, ClaimRecords())
                claim = Claim.create(ident(41), run=bytes(32), step=1, slot=0, issued_at=NOW, lease_expiry=NOW + 60)
                junk = [
                    *[(f"/junk/{os.urandom(8).hex()}", os.urandom(500_000)) for _ in range(20)],  # the probe's attack
                    (f"/{CLAIM_NAMESPACE}/c/{'0' * 32}", os.urandom(500_000)),  # our namespace, oversized
                    (f"/{CLAIM_NAMESPACE}/c/{'0' * 32}", b"not a claim"),  # our namespace, invalid
                    (claim_key(bytes(32), 2, 0), claim.encoded),  # a valid claim under another key
                    ("no-namespace", b"x"),
                ]
                for key, value in junk:
                    assert not await _put_at(attacker, node, key, value)
                assert node.dht.value_store.size() == 0
                assert node.rejected == {attacker.peer_id: len(junk)}

                # a valid claim is still stored, and read back from the network
                key = claim_key(bytes(32), 1, 0)
                assert await _put_at(honest, node, key, claim.encoded)
                assert node.dht.value_store.get(key.encode()).value == claim.encoded
                assert await honest.put_record(key, claim.encoded)
                assert await node.get_record(key, from_network=True) == claim.encoded
                assert honest.peer_id not in node.rejected

                # past the reject limit the attacker is banned: even its valid claims go unstored
                node.max_rejects_per_peer = len(junk) + 1
                assert not await _put_at(attacker, node, *junk[0])
                assert attacker.peer_id in node.banned
                other = Claim.create(ident(42), run=bytes(32), step=3, slot=0, issued_at=NOW, lease_expiry=NOW + 60)
                assert not await _put_at(attacker, node, claim_key(bytes(32), 3, 0), other.encoded)
                assert node.dht.value_store.size() == 1

    trio.run(main)


def test_the_record_store_is_bounded_per_peer_and_in_all():
    limits = DhtLimits(max_value_bytes=1000, per_peer_records=4, max_records=6, max_bytes=6 * 1010)

    async def main():
        with trio.fail_after(120):
            async with AsyncExitStack() as stack:
                node = await stack.enter_async_context(
                    open_p2p(ident(50), "127.0.0.1", 0, dht_limits=limits, max_rejects_per_peer=1000))
                peers = [await stack.enter_async_context(open_p2p(ident(51 + i), "127.0.0.1", 0)) for i in range(4)]
                attacker, honest = peers[0], peers[1:]
                for peer in peers:
                    await peer.connect(node.addrs[0])
                node.register_record_validator("t", _AcceptAll())
                store = node.dht.value_store

                stored = [await _put_at(attacker, node, f"/t/a{i}", bytes(900)) for i in range(10)]
                assert stored == [True] * 4 + [False] * 6  # its quota; each refusal a reject
                assert node.rejected == {attacker.peer_id: 6}
                assert await _put_at(attacker, node, "/t/a0", bytes(900))  # replacing its own record is fine

                # honest peers' records evict the biggest holder's oldest, never each other's
                for i, peer in enumerate(honest):
                    assert await _put_at(peer, node, f"/t/h{i}", bytes(900))
                assert store.size() == 6 and store.stored_bytes() <= limits.max_bytes
                assert {f"/t/h{i}".encode() for i in range(3)} <= set(store.store)
                assert sum(k.startswith(b"/t/a") for k in store.store) == 3
                # the attacker can no longer push anything in: the store is full of its own
                assert await _put_at(attacker, node, "/t/a0", bytes(900))
                assert not await _put_at(attacker, node, "/t/a9", bytes(900))
                assert node.rejected == {attacker.peer_id: 6}  # a full store is not the sender's fault
                assert store.size() == 6 and store.stored_bytes() <= limits.max_bytes
                assert all(p.peer_id not in node.rejected for p in honest)

    trio.run(main)
