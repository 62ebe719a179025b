"""The DHT's record store, bounded: what a peer may make this node keep in memory.

py-libp2p's Kademlia server stores any record any peer PUTs, in any namespace (its default
validator accepts keys without one), up to 1 MiB each and 50,000 in all, for 24 hours: a single
fresh key putting 700 records of 500 kB grew a node by 216 MB. Here:

* only the namespaces the node registered a validator for are accepted, and a record's value
  must fit ``DhtLimits.max_value_bytes`` (a claim is at most 512 bytes);
* one peer may have at most ``per_peer_records`` records in the store (by the peer that sent the
  PUT, not the record's author: that is whom we can hold to account);
* the store holds at most ``max_records`` records and ``max_bytes`` bytes of keys and values.
  When full, the oldest record of the peer holding the most is dropped for the newcomer — many
  keys filling the store evict one another before they evict an honest peer's few claims; a peer
  that itself holds the most is refused.

A PUT refused for its namespace, size, validity or the sender's quota is a *reject* of the
sender (:meth:`~open1b.node.p2p.P2P.penalise`); one refused because the store is full of the
sender's own records is not. The sender of a PUT is known only inside libp2p's stream handler,
so :class:`BoundedKadDHT` records it in a context variable for the task that handles the stream.

This module and :mod:`.p2p` are the only ones that import libp2p.
"""

from __future__ import annotations

import logging
from collections import Counter
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable

import trio
from libp2p.identity.identify_push.identify_push import push_identify_to_peers
from libp2p.kad_dht import DHTMode, KadDHT
from libp2p.kad_dht.pb.kademlia_pb2 import Record
from libp2p.kad_dht.value_store import ValueStore
from libp2p.records.validator import NamespacedValidator

from open1b.protocol import Open1bError

log = logging.getLogger(__name__)

IDENTIFY_PUSH_TIMEOUT_S = 5.0  # telling our peers of a DHT mode change never holds up the caller longer

# The peer whose PUT_VALUE the current task is handling; None outside a DHT stream handler
# (our own puts, and records our own lookups bring back).
_sender: ContextVar[str | None] = ContextVar("dht_sender", default=None)


@dataclass(frozen=True)
class DhtLimits:
    max_value_bytes: int = 4096
    per_peer_records: int = 1024
    max_records: int = 16384
    max_bytes: int = 16 << 20


class RecordRefused(Open1bError):
    """A PUT this node will not store (the libp2p handler resets the stream)."""


class _OurNamespaces(NamespacedValidator):
    """Strict: a key outside the registered namespaces, or a value over the limit, is invalid."""

    def __init__(self, limits: DhtLimits, penalise: Callable[[str], None]) -> None:
        super().__init__({}, strict_validation=True)
        self._limits, self._penalise = limits, penalise

    def validate(self, key: str, value: bytes) -> None:
        try:
            if len(value) > self._limits.max_value_bytes:
                raise RecordRefused(f"a record of {len(value)} bytes, more than {self._limits.max_value_bytes}")
            if self.validator_by_key(key) is None:
                raise RecordRefused("a key outside the namespaces this node serves")
            super().validate(key, value)
        except (Open1bError, ValueError) as exc:  # our validators raise these for an invalid record
            sender = _sender.get()
            if sender is not None:
                log.debug("refused a DHT record from %s: %s", sender, exc)
                self._penalise(sender)
            raise


class _BoundedValueStore(ValueStore):
    def __init__(self, inner: ValueStore, limits: DhtLimits, penalise: Callable[[str], None]) -> None:
        self.__dict__.update(inner.__dict__)  # take over the host, peer ID and (empty) store
        self._limits, self._penalise = limits, penalise
        self._me = self.local_peer_id.to_base58()
        self._holder: dict[bytes, str] = {}  # key -> the peer whose PUT put it there

    def put(self, key: bytes, value: bytes, validity: float = 0.0) -> None:
        self._make_room(key, len(key) + len(value), self._me)
        super().put(key, value, validity)
        self._holder[key] = self._me

    def put_record(self, key: bytes, record: Record) -> None:
        sender = _sender.get() or self._me
        size = len(key) + len(record.value)
        if sender != self._me:
            self._holder = {k: self._holder.get(k, self._me) for k in self.store}  # forget expired keys
            held = sum(1 for k, p in self._holder.items() if p == sender and k != key)
            if held >= self._limits.per_peer_records:
                self._penalise(sender)
                raise RecordRefused(f"peer {sender} already has {held} records here")
        self._make_room(key, size, sender)
        super().put_record(key, record)
        self._holder[key] = sender

    def stored_bytes(self) -> int:
        return sum(len(k) + len(record.value) for k, (record, _) in self.store.items())

    def _make_room(self, key: bytes, size: int, sender: str) -> None:
        """Evict until ``size`` more bytes under ``key`` fit, or raise if only ``sender``'s own would go."""
        self._holder = {k: self._holder.get(k, self._me) for k in self.store}
        while True:
            others = [(k, (r, v)) for k, (r, v) in self.store.items() if k != key]
            count = len(others)
            total = sum(len(k) + len(r.value) for k, (r, _) in others)
            if count < self._limits.max_records and total + size <= self._limits.max_bytes:
                return
            counts = Counter(self._holder[k] for k, _ in others if self._holder[k] != self._me)
            if not counts or counts.most_common(1)[0][0] == sender:
                raise RecordRefused("the DHT record store is full")
            biggest = counts.most_common(1)[0][0]
            oldest = min((k for k, _ in others if self._holder[k] == biggest),
                         key=lambda k: self.store[k][0].timeReceived)
            del self.store[oldest]
            del self._holder[oldest]


class BoundedKadDHT(KadDHT):
    """A KadDHT with the bounds above, in server mode until :meth:`serve_as` says otherwise;
    validators are added with ``register_validator``."""

    def __init__(self, host, *, limits: DhtLimits, penalise: Callable[[str], None],
                 banned: Callable[[str], bool]) -> None:
        super().__init__(host, DHTMode.SERVER, validator=_OurNamespaces(limits, penalise), validator_changed=True,
                         strict_validation=True)
        self.value_store = _BoundedValueStore(self.value_store, limits, penalise)
        self._banned = banned

    async def _do_handle_stream(self, stream) -> None:
        sender = stream.muxed_conn.peer_id.to_base58()
        if self._banned(sender):  # a banned peer may dial us again; its DHT requests go unanswered
            await stream.reset()
            return
        token = _sender.set(sender)
        try:
            await super()._do_handle_stream(stream)
        finally:
            _sender.reset(token)

    @property
    def client(self) -> bool:
        """Whether this node runs the DHT in client mode: it asks, and answers no one."""
        return self.mode is DHTMode.CLIENT

    async def serve_as(self, *, client: bool) -> bool:
        """Switch to client mode (``client``) or back to server mode; True if the mode changed.

        A node some peers cannot dial must not sit in their routing tables: each lookup that
        reaches it waits on a dial that never connects (docs/node.md, behind NAT). In client mode
        the KAD protocol is no longer offered, so identify stops listing it and peers stop adding
        this node (py-libp2p adds only peers that list it), and a peer that still holds it drops it
        at its first refused request. py-libp2p's switch to client mode also empties our own routing
        table — the server peers we ask — so the ones it held are added back (each still checked
        to offer the KAD protocol)."""
        if client == self.client:
            return False
        known = self.routing_table.get_peer_ids() if client else []
        await self.switch_mode(DHTMode.CLIENT if client else DHTMode.SERVER)
        for peer in known:
            await self.add_peer(peer)
        log.info("DHT: %s mode (%s)", "client" if client else "server",
                 "some peers cannot dial us: we ask, and answer no DHT requests" if client else "peers can dial us")
        with trio.move_on_after(IDENTIFY_PUSH_TIMEOUT_S):  # our peers hear of the change at once
            try:
                await push_identify_to_peers(self.host)
            except Exception as exc:
                log.debug("identify push after the DHT mode change failed: %s", exc)
        return True
