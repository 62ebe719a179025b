"""Real py-libp2p hosts on loopback, in one trio process, for the tests of what runs between hosts
(tests/node/test_p2p.py, test_pubsub_frames.py, test_bulk.py, test_reachability.py): a connected
pair, a topic that one of them gossips to the other, many fresh keys asking one provider at once,
and a plain TCP listener that behaves as told."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Awaitable, Callable, TypeVar

import trio

from open1b.node.p2p import P2P, open_p2p
from open1b.protocol import Identity

from .conftest import ident

T = TypeVar("T")
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


async def connected_to(stack: AsyncExitStack, provider: P2P, keys: list[Identity]) -> list[P2P]:
    """A host of each of ``keys`` (fresh keys, one address: a flood's askers), each connected to
    ``provider``; they close with ``stack``."""
    hosts = [await stack.enter_async_context(open_p2p(k, "127.0.0.1", 0)) for k in keys]
    for host in hosts:
        await host.connect(provider.addrs[0])
    return hosts


async def at_once(ask: Callable[[P2P], Awaitable[T]], askers: list[P2P]) -> list[T]:
    """``ask(asker)`` for every one of ``askers`` at the same time: the answers, as they came."""
    answers: list[T] = []

    async def one(asker: P2P) -> None:
        answers.append(await ask(asker))

    async with trio.open_nursery() as asking:
        for asker in askers:
            asking.start_soon(one, asker)
    return answers


async def tcp_listener(nursery: trio.Nursery, behaviour: Callable[[trio.SocketStream], Awaitable[None]]) -> int:
    """A TCP listener on loopback that runs ``behaviour(stream)`` for each connection; its port."""
    listeners = await nursery.start(trio.serve_tcp, behaviour, 0)
    return listeners[0].socket.getsockname()[1]
