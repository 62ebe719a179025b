"""Real py-libp2p hosts on loopback, in one trio process, for the adapter's tests (tests/node/test_p2p.py,
test_pubsub_frames.py): a connected pair, and a topic that one of them gossips to the other."""

from __future__ import annotations

from contextlib import AsyncExitStack

import trio

from open1b.node.p2p import P2P, open_p2p

from .conftest import ident

MESH_TIMEOUT_S = 20  # a bound on an event: it costs nothing when the mesh forms, and a loaded machine is slow


async def connected_pair(stack: AsyncExitStack, key: int, **options) -> tuple[P2P, P2P]:
    """Hosts ``a`` (``ident(key)``) and ``c`` (``ident(key + 1)``), ``c`` connected to ``a``; both
    close with ``stack``. ``options``: :func:`open_p2p`'s, for both."""
    a, c = [await stack.enter_async_context(open_p2p(ident(key + i), "127.0.0.1", 0, **options)) for i in range(2)]
    await c.connect(a.addrs[0])
    return a, c


async def gossip_from(c: P2P, to: P2P, topic: str, received: list[bytes]) -> None:
    """``to`` subscribes to ``topic``, keeping each message it delivers in ``received``; ``c``
    subscribes (handling nothing) and waits until ``to`` is in its mesh: what ``c`` publishes then
    reaches ``to``'s validator. Validators are the caller's to set."""

    async def handler(author, data):
        received.append(data)

    await to.subscribe(topic, handler)
    await c.subscribe(topic, lambda author, data: trio.sleep(0))
    await c.pubsub.wait_for_mesh(to.host.get_id(), topic, timeout=MESH_TIMEOUT_S)
