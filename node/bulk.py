"""The bulk path for blobs (docs/run-format.md §6.6): a plain TCP connection beside libp2p, on
which both sides prove their libp2p peer IDs and every frame carries a tag.

Why not libp2p streams: Noise and Yamux in Python move 55–110 MB/s on loopback whatever the frame
size or the number of streams (they share one connection and one Python cipher loop); a session
here, its frames tagged by AES-GCM in OpenSSL (~10 GB/s), moved 1.2–1.4 GB/s, 0.4–0.6× a raw TCP copy
(``bench/transfer_bench.py``, docs/benchmarks.md).

* **Handshake.** Each side sends ``HELLO = MAGIC ‖ X25519 ephemeral key ‖ Ed25519 identity key``
  (client first); the server then signs the transcript hash ``th`` (both hellos) and the client
  countersigns it. The client checks that the server's key is the peer ID it meant to reach; the
  server learns the client's peer ID the same way and may refuse it (``allow``). Both derive one
  AES-256-GCM key per direction from the X25519 secret and ``th``, so a frame cannot be moved to
  another session or direction.
* **Frames.** ``u32le(len) ‖ body ‖ tag``, ``tag`` = AES-256-GCM with an empty plaintext over
  ``body`` as associated data (GMAC), nonce = the frame's counter in its direction. Bodies are not
  encrypted: a run's blobs are public; what matters is that bytes arriving are the bytes the
  authenticated peer sent, so that blame for a wrong chunk lands on that peer and not on an
  on-path forger. A length is checked against what the reader expects *before* it reads the body.
* **Requests** (client → server, 45 bytes): ``op ‖ digest ‖ u64le offset ‖ u32le length``;
  ``RANGE`` asks for bytes ``[offset, offset + length)`` of a blob, ``TABLE`` for a checkpoint's
  chunk table (:mod:`.chunk_table`). **Responses**: ``status ‖ u64le blob size ‖ payload``, in
  request order; a client may pipeline requests.
* **Dial-back.** A provider nobody can dial (behind NAT) is asked over libp2p
  (:data:`DIALBACK_PROTOCOL`, on a direct connection only) to open the TCP connection to the
  fetcher's own bulk listener instead; it first sends ``BACK_MAGIC ‖ token`` (the fetcher's
  one-time token), then the session runs as above with the fetcher as client. Without a direct
  connection either way there is no session: a checkpoint never crosses a relay.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Iterator

import nacl.bindings
import nacl.exceptions
import trio
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from open1b.protocol import Identity
from open1b.protocol.codec import decode, encode
from open1b.protocol.errors import DecodeError, SignatureError
from open1b.protocol.hashing import blake2b256
from open1b.protocol.identity import peer_id_from_public_key, verify_raw

from .blobs import BlobCache, BlobError
from .chunk_table import ChunkTableError
from .dialable import is_circuit
from .p2p import P2P, FrameTooLarge, NetworkError, Stream

log = logging.getLogger(__name__)

MAGIC = b"open1b/bulk/v1\x00\x00"
HELLO_SIZE = len(MAGIC) + 32 + 32
SIGNATURE_SIZE = 64
TAG_SIZE = 16
REQUEST = struct.Struct("<B32sQI")  # op, digest, offset, length
RESPONSE_HEAD = struct.Struct("<BQ")  # status, blob size
OP_RANGE, OP_TABLE = 1, 2
OK, NOT_FOUND, NOT_A_CHECKPOINT, BAD_REQUEST = 0, 1, 2, 3
MAX_RANGE = 4 << 20
"""The most bytes one RANGE response carries."""
MAX_TABLE = 32 * ((64 << 30) // (1 << 20) + 65536)
"""The largest chunk table: a 64 GiB blob in 1 MiB chunks, plus one short chunk per tensor."""
MAX_RESPONSE = RESPONSE_HEAD.size + max(MAX_RANGE, MAX_TABLE)
SOCKET_BUFFER = 4 << 20
"""Kernel socket buffers of a session: a few chunks, so each receive call moves more bytes."""
HANDSHAKE_TIMEOUT_S = 10.0
FIRST_BYTES_TIMEOUT_S = 2.0
"""A client sends its hello as soon as it connects; a connection silent this long is dropped."""
IDLE_TIMEOUT_S = 60.0
MAX_SESSIONS = 32
"""Authenticated sessions. Connections still in their handshake are bounded apart (any TCP client
can open one): at most MAX_HANDSHAKES_PER_IP from one address, MAX_HANDSHAKES in all, so that idle
sockets from one host neither hold session slots nor stop others' handshakes."""
MAX_HANDSHAKES_PER_IP = 4
MAX_HANDSHAKES = 64
ADDRESS_PROTOCOL = "/open1b/bulk-addr/1.0.0"
"""libp2p protocol on which a node tells a peer its bulk TCP port (answer: CBOR ``{"port": p}``)."""
DIALBACK_PROTOCOL = "/open1b/bulk-dialback/1.0.0"
"""libp2p protocol on which a fetcher asks a provider to dial its bulk listener (request: CBOR
``{"port": p, "token": 32 bytes}``; answer ``{"dialled": bool}``)."""
BACK_MAGIC = b"open1b/bulkbk/v1"
"""What a provider that dialled back sends first, before the fetcher's token (then the fetcher's hello)."""
TOKEN_SIZE = 32
MAX_DIALBACK_REQUEST = 64
MAX_AWAITED = 32
"""Dial-backs a fetcher awaits at once (one per provider of the fetches in flight)."""
MAX_DIALBACKS_PER_PEER = 2
"""Dial-back sessions (dialling or running) a provider holds at once for one fetcher."""
MAX_DIALBACKS_PER_HOST = 2
"""Dial-back sessions a provider holds at once to one address, whatever the keys asking (each key
is free, and a dial-back goes to the asker's address at the port it names)."""
DIALBACK_PAUSE_S = HANDSHAKE_TIMEOUT_S
"""After a dial-back that could not connect, that address is not dialled back for this long: a
fetcher's listener that did not answer will not answer a moment later, and the port an asker
names is its word (one key scanned its address's ports as fast as it asked)."""

_TRANSCRIPT_TAG = b"open1b/bulk/transcript/v1\x00"
_SERVER_SIG_TAG = b"open1b/bulk/server/v1\x00"
_CLIENT_SIG_TAG = b"open1b/bulk/client/v1\x00"
_KEY_TAGS = (b"open1b/bulk/key/c2s/v1\x00", b"open1b/bulk/key/s2c/v1\x00")


class BulkError(BlobError):
    """The bulk session failed (refused, timed out, a malformed or mis-tagged frame): nobody
    is blamed, since nothing shows that the peer, rather than the path, did it."""


class HandshakeError(BulkError):
    """The peer did not prove the identity we required, or sent a malformed hello."""


@dataclass(frozen=True)
class BulkPeer:
    """Where a provider's bulk listener is, and who must answer there."""

    peer_id: str
    host: str
    port: int

    async def open(self, identity: Identity, *, timeout_s: float = HANDSHAKE_TIMEOUT_S) -> Channel:
        """A session with the provider: we dial its listener."""
        return await open_channel(self, identity, timeout_s=timeout_s)


async def _read_into(sock, view: memoryview, peer: str) -> None:
    got = 0
    while got < len(view):
        try:
            n = await sock.recv_into(view[got:])
        except OSError as exc:
            raise BulkError(f"the bulk session with {peer} broke: {exc}") from exc
        if n == 0:
            raise BulkError(f"{peer} closed the bulk session")
        got += n


async def _read_exactly(sock, n: int, peer: str) -> bytes:
    buf = bytearray(n)
    await _read_into(sock, memoryview(buf), peer)
    return bytes(buf)


class Channel:
    """One authenticated bulk session over a TCP stream (after :func:`client_handshake` or
    :func:`server_handshake`): tagged frames, counters per direction, bounded reads."""

    def __init__(self, stream: trio.SocketStream, peer_id: str, send_key: bytes, receive_key: bytes) -> None:
        self.stream, self.peer_id = stream, peer_id
        self._sock = stream.socket
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            self._sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
        self._send_gcm, self._receive_gcm = AESGCM(send_key), AESGCM(receive_key)
        self._sent = self._received = 0
        self.dialled_back = False  # the provider opened the connection (:class:`DialBackPeer`)

    async def send(self, *parts: bytes | memoryview) -> None:
        """One frame whose body is the concatenation of ``parts``, written with a single copy."""
        size = sum(len(p) for p in parts)
        frame = bytearray(4 + size + TAG_SIZE)
        struct.pack_into("<I", frame, 0, size)
        at = 4
        for part in parts:
            frame[at:at + len(part)] = part
            at += len(part)
        view = memoryview(frame)
        view[at:] = self._send_gcm.encrypt(self._sent.to_bytes(12, "little"), b"", view[4:at])
        self._sent += 1
        try:
            await self.stream.send_all(view)
        except trio.BrokenResourceError as exc:
            raise BulkError(f"the bulk session with {self.peer_id} broke: {exc}") from exc

    async def receive(self, max_size: int, *, exact: int | None = None) -> bytearray:
        """The next frame's body, refused unless its announced length is ``exact`` (when given)
        and at most ``max_size``; its tag is checked before the body is returned."""
        (size,) = struct.unpack("<I", await _read_exactly(self._sock, 4, self.peer_id))
        if size > max_size or (exact is not None and size != exact):
            raise BulkError(f"{self.peer_id} announced a frame of {size} bytes "
                            f"({exact if exact is not None else f'at most {max_size}'} expected)")
        buf = bytearray(size + TAG_SIZE)
        view = memoryview(buf)
        await _read_into(self._sock, view, self.peer_id)
        try:
            self._receive_gcm.decrypt(self._received.to_bytes(12, "little"), bytes(view[size:]), view[:size])
        except InvalidTag:
            raise BulkError(f"frame {self._received} from {self.peer_id} has a wrong tag") from None
        self._received += 1
        del view
        del buf[size:]
        return buf

    async def aclose(self) -> None:
        await self.stream.aclose()


def _hello(ephemeral_public: bytes, identity: Identity) -> bytes:
    return MAGIC + ephemeral_public + identity.public_key


def _parse_hello(data: bytes) -> tuple[bytes, bytes]:
    if len(data) != HELLO_SIZE or data[:len(MAGIC)] != MAGIC:
        raise HandshakeError("not an open1b bulk hello")
    return data[len(MAGIC):len(MAGIC) + 32], data[len(MAGIC) + 32:]


def _verify(public_key: bytes, tag: bytes, th: bytes, signature: bytes) -> None:
    try:
        verify_raw(public_key, tag + th, bytes(signature))
    except SignatureError as exc:
        raise HandshakeError("the transcript signature does not verify") from exc


def _keys(ephemeral_secret: bytes, peer_ephemeral: bytes, th: bytes) -> tuple[bytes, bytes]:
    try:
        shared = nacl.bindings.crypto_scalarmult(ephemeral_secret, peer_ephemeral)
    except nacl.exceptions.RuntimeError as exc:  # libsodium refuses low-order points (all-zero secret)
        raise HandshakeError("the peer's ephemeral key is a low-order point") from exc
    c2s, s2c = (blake2b256(tag, shared, th) for tag in _KEY_TAGS)
    return c2s, s2c


def _ephemeral() -> tuple[bytes, bytes]:
    secret = os.urandom(32)
    return nacl.bindings.crypto_scalarmult_base(secret), secret


async def client_handshake(stream: trio.SocketStream, identity: Identity, expected_peer: str) -> Channel:
    """Open a session as client; refuses (``HandshakeError``) unless the server proves ``expected_peer``."""
    public, secret = _ephemeral()
    hello_c = _hello(public, identity)
    await stream.send_all(hello_c)
    answer = await _read_exactly(stream.socket, HELLO_SIZE + SIGNATURE_SIZE, expected_peer)
    hello_s, signature = answer[:HELLO_SIZE], answer[HELLO_SIZE:]
    eph_s, id_s = _parse_hello(hello_s)
    if peer_id_from_public_key(id_s) != expected_peer:
        raise HandshakeError(f"the bulk listener is {peer_id_from_public_key(id_s)}, not {expected_peer}")
    th = blake2b256(_TRANSCRIPT_TAG, hello_c, hello_s)
    _verify(id_s, _SERVER_SIG_TAG, th, signature)
    await stream.send_all(identity.sign_raw(_CLIENT_SIG_TAG + th))
    c2s, s2c = _keys(secret, eph_s, th)
    return Channel(stream, expected_peer, c2s, s2c)


async def server_handshake(stream: trio.SocketStream, identity: Identity, first: bytes = b"") -> Channel:
    """Answer a client's hello (``first``: its opening bytes, already read); returns a session with
    the client's proven peer ID."""
    hello_c = first + await _read_exactly(stream.socket, HELLO_SIZE - len(first), "the client")
    eph_c, id_c = _parse_hello(hello_c)
    public, secret = _ephemeral()
    hello_s = _hello(public, identity)
    th = blake2b256(_TRANSCRIPT_TAG, hello_c, hello_s)
    await stream.send_all(hello_s + identity.sign_raw(_SERVER_SIG_TAG + th))
    _verify(id_c, _CLIENT_SIG_TAG, th, await _read_exactly(stream.socket, SIGNATURE_SIZE, "the client"))
    c2s, s2c = _keys(secret, eph_c, th)
    return Channel(stream, peer_id_from_public_key(id_c), s2c, c2s)


async def open_channel(peer: BulkPeer, identity: Identity, *, timeout_s: float = HANDSHAKE_TIMEOUT_S) -> Channel:
    """Dial ``peer``'s bulk listener and complete the handshake within ``timeout_s``."""
    try:
        with trio.fail_after(timeout_s):
            stream = await trio.open_tcp_stream(peer.host, peer.port)
            try:
                return await client_handshake(stream, identity, peer.peer_id)
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
    except trio.TooSlowError:
        raise BulkError(f"bulk handshake with {peer.peer_id} timed out") from None
    except OSError as exc:
        raise BulkError(f"cannot reach {peer.peer_id}'s bulk listener: {exc}") from exc


class TokenBucket:
    """An upload rate limit: ``rate`` bytes per second with bursts of ``burst`` bytes, on trio's
    clock (so a test's virtual clock drives it). Shared by every session of one server."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._tokens, self._at = float(burst), None
        self._lock = trio.Lock()

    async def take(self, n: int) -> None:
        async with self._lock:  # first come, first served
            while True:
                now = trio.current_time()
                if self._at is not None:
                    self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
                self._at = now
                if self._tokens >= min(n, self.burst):
                    self._tokens -= n  # may go negative: a large request repays its debt later
                    return
                await trio.sleep((min(n, self.burst) - self._tokens) / self.rate)


# -- server --------------------------------------------------------------------------------
class _Session:
    """One client's session on the server: answers its requests in order. A blob is looked up
    (and marked as recently used) once per session and kept open, so a chunk costs one ``pread``;
    an open file stays readable even if the cache evicts the blob meanwhile."""

    def __init__(self, cache: BlobCache, channel: Channel, bucket: TokenBucket | None) -> None:
        self.cache, self.channel, self.bucket = cache, channel, bucket
        self._open: dict[bytes, tuple[int, int]] = {}  # digest -> (fd, size)

    async def _file(self, digest: bytes) -> tuple[int, int] | None:
        if digest not in self._open:
            path = await self.cache.open_verified(digest)
            if path is None:
                return None
            fd = os.open(path, os.O_RDONLY)
            self._open[digest] = fd, os.fstat(fd).st_size
        return self._open[digest]

    async def answer(self, request: bytes) -> None:
        op, digest, offset, length = REQUEST.unpack(request)
        send = self.channel.send
        if op not in (OP_RANGE, OP_TABLE) or (op == OP_RANGE and not 0 < length <= MAX_RANGE):
            await send(RESPONSE_HEAD.pack(BAD_REQUEST, 0))
            return
        opened = await self._file(digest)
        if opened is None:
            await send(RESPONSE_HEAD.pack(NOT_FOUND, 0))
            return
        fd, size = opened
        if op == OP_TABLE:
            try:
                table = await self.cache.chunk_table(digest)
            except ChunkTableError:
                await send(RESPONSE_HEAD.pack(NOT_A_CHECKPOINT, size))
                return
            await send(RESPONSE_HEAD.pack(OK, size), table)
            return
        start = min(offset, size)
        data = await trio.to_thread.run_sync(os.pread, fd, min(length, size - start), start)
        if self.bucket is not None:
            await self.bucket.take(len(data))
        await send(RESPONSE_HEAD.pack(OK, size), data)
        self.cache.served_bytes += len(data)

    def close(self) -> None:
        for fd, _ in self._open.values():
            os.close(fd)
        self._open.clear()


class _HandshakeGate:
    """Counts the connections that have not completed a handshake, by remote address."""

    def __init__(self, per_ip: int, total: int) -> None:
        self.per_ip, self.total = per_ip, total
        self._by_ip: dict[str, int] = {}

    @contextmanager
    def enter(self, stream: trio.SocketStream) -> Iterator[bool]:
        """True while the connection holds a handshake slot; False if its address or all are taken."""
        try:
            ip = stream.socket.getpeername()[0]
        except OSError:  # already gone
            yield False
            return
        if self._by_ip.get(ip, 0) >= self.per_ip or sum(self._by_ip.values()) >= self.total:
            yield False
            return
        self._by_ip[ip] = self._by_ip.get(ip, 0) + 1
        try:
            yield True
        finally:
            self._by_ip[ip] -= 1
            if not self._by_ip[ip]:
                del self._by_ip[ip]


async def _opening(stream: trio.SocketStream) -> bytes | None:
    """A connection's first 16 bytes (a hello's MAGIC, or BACK_MAGIC from a provider dialling
    back); None if nothing came within FIRST_BYTES_TIMEOUT_S."""
    first = b""
    with trio.move_on_after(FIRST_BYTES_TIMEOUT_S):
        first = await stream.socket.recv(1, socket.MSG_PEEK)
    if not first:
        return None
    return await _read_exactly(stream.socket, len(MAGIC), "the client")


class BulkServer:
    """A node's bulk listener and its dial-backs. It serves the blobs in ``cache`` to fetchers
    that dial it; as a provider nobody can dial, it dials a fetcher's listener when asked
    (:meth:`dial_back`, the libp2p handler of :data:`DIALBACK_PROTOCOL`); as a fetcher, it hands
    the connection of a provider that dialled back to the fetch awaiting it (:meth:`awaiting`).
    ``allow(peer_id)`` refuses peers after the handshake (e.g. banned ones); ``rate_bytes_per_s``
    caps the upload of all sessions together, dialled back or not."""

    def __init__(self, cache: BlobCache, identity: Identity, *, allow: Callable[[str], bool] = lambda peer: True,
                 rate_bytes_per_s: float | None = None, max_sessions: int = MAX_SESSIONS,
                 penalise: Callable[[str], None] = lambda peer: None) -> None:
        self.cache, self.identity, self.allow, self.penalise = cache, identity, allow, penalise
        self._bucket = TokenBucket(rate_bytes_per_s, burst=MAX_RANGE) if rate_bytes_per_s else None
        self._limiter = trio.CapacityLimiter(max_sessions)
        self._gate = _HandshakeGate(MAX_HANDSHAKES_PER_IP, MAX_HANDSHAKES)
        self._awaited: dict[bytes, trio.MemorySendChannel[trio.SocketStream]] = {}  # token -> its fetch
        self._dialling: dict[str, int] = {}  # fetcher's peer ID, and its address -> dial-back sessions held for it
        self._paused: dict[str, float] = {}  # address -> when it may be dialled back again (a dial there failed)
        self._nursery: trio.Nursery | None = None
        self.port = 0  # once serving
        self.dialled_back = 0  # sessions served over a connection this node dialled (as a provider)
        self.dialbacks_refused = 0

    async def serve(self, host: str, port: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Listen on ``host:port`` (0: any free port) until cancelled; reports the bound port."""
        listeners = await trio.open_tcp_listeners(port, host=host)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(trio.serve_listeners, self._arrived, listeners)
            self.port = listeners[0].socket.getsockname()[1]
            task_status.started(self.port)

    async def _arrived(self, stream: trio.SocketStream) -> None:
        """A connection to our listener: a fetcher's session, or a provider dialling back."""
        channel = None
        try:
            with self._gate.enter(stream) as entered:
                with trio.move_on_after(HANDSHAKE_TIMEOUT_S):
                    opening = await _opening(stream) if entered else None
                    if opening == BACK_MAGIC:
                        token = await _read_exactly(stream.socket, TOKEN_SIZE, "a provider dialling back")
                        self._hand_over(token, stream)
                        return
                    if opening == MAGIC:
                        channel = await server_handshake(stream, self.identity, opening)
            if channel is not None and self.allow(channel.peer_id):
                await self._answer(channel)
        except (BulkError, OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            return  # a client that goes away or misbehaves only ends its own session
        finally:
            await trio.aclose_forcefully(stream)

    async def _answer(self, channel: Channel) -> None:
        """Answer the requests of an authenticated session until it goes idle (a slot of
        ``max_sessions`` held meanwhile; none free: the session is closed at once)."""
        try:
            self._limiter.acquire_nowait()
        except trio.WouldBlock:
            return
        session = _Session(self.cache, channel, self._bucket)
        try:
            while True:
                with trio.move_on_after(IDLE_TIMEOUT_S) as idle:
                    request = await channel.receive(REQUEST.size, exact=REQUEST.size)
                if idle.cancelled_caught:
                    return
                await session.answer(bytes(request))
        finally:
            session.close()
            self._limiter.release()

    # -- as a fetcher: a provider dials us back ----------------------------------------------
    def _hand_over(self, token: bytes, stream: trio.SocketStream) -> None:
        """Give the fetch awaiting ``token`` its connection (as a duplicate of the socket: the
        listener closes its own when the handler returns); a token is good for one connection."""
        send = self._awaited.pop(token, None)
        if send is None:
            return
        mine = trio.SocketStream(stream.socket.dup())
        try:
            send.send_nowait(mine)
        except (trio.WouldBlock, trio.BrokenResourceError):
            mine.socket.close()

    @asynccontextmanager
    async def awaiting(self, token: bytes) -> AsyncIterator[trio.MemoryReceiveChannel[trio.SocketStream]]:
        """Where the connection of a provider that dials back with ``token`` arrives, until the
        block ends (a connection that arrives later is closed)."""
        if not self.port:
            raise BulkError("no bulk listener to be dialled back at")
        if len(self._awaited) >= MAX_AWAITED:
            raise BulkError(f"{MAX_AWAITED} dial-backs awaited already")
        send, receive = trio.open_memory_channel[trio.SocketStream](1)
        self._awaited[token] = send
        try:
            yield receive
        finally:
            self._awaited.pop(token, None)
            send.close()
            while True:  # one that arrived and was not taken (nothing awaited here: the block may be cancelled)
                try:
                    receive.receive_nowait().socket.close()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break

    # -- as a provider: dial a fetcher back ---------------------------------------------------
    async def dial_back(self, stream: Stream) -> None:
        """The libp2p handler of :data:`DIALBACK_PROTOCOL`: dial the asker's bulk listener at the
        address its connection comes from (never another: the service cannot be aimed at a third
        party), on a direct connection only, at most MAX_DIALBACKS_PER_PEER sessions per peer and
        MAX_DIALBACKS_PER_HOST per address, none for DIALBACK_PAUSE_S after a dial there failed;
        then serve the session, in which the asker must prove to be the peer that asked. A
        malformed request is refused and its sender penalised."""
        peer, host = stream.peer_id, stream.remote_host
        try:
            request = decode(await stream.receive(MAX_DIALBACK_REQUEST), max_size=MAX_DIALBACK_REQUEST)
        except (FrameTooLarge, DecodeError):
            request = None
        port = request.get("port") if type(request) is dict else None
        token = request.get("token") if type(request) is dict else None
        # [REJECT] a request that is not {"port": 1..65535, "token": TOKEN_SIZE bytes}
        if type(port) is not int or not 0 < port < 65536 or type(token) is not bytes or len(token) != TOKEN_SIZE:
            self.penalise(peer)
            self.dialbacks_refused += 1
            await stream.reset()
            return
        if stream.relayed:  # the address it comes from is the relay's, and no checkpoint crosses one
            log.info("refused a bulk dial-back asked by %s over a relayed connection", peer)
        now = trio.current_time()
        if (stream.relayed or host is None or not self.allow(peer) or self._nursery is None
                or self._dialling.get(peer, 0) >= MAX_DIALBACKS_PER_PEER
                or self._dialling.get(host, 0) >= MAX_DIALBACKS_PER_HOST or self._paused.get(host, now) > now):
            self.dialbacks_refused += 1
            await stream.reset()
            return
        for held in (peer, host):
            self._dialling[held] = self._dialling.get(held, 0) + 1
        tcp, started = None, False
        try:
            tcp = await _dial(host, port, token)
            if tcp is not None:
                self._nursery.start_soon(self._serve_dialled, tcp, peer, host)  # it owns the connection and the counts now
                started = True
            else:
                self._paused = {h: t for h, t in self._paused.items() if t > now}  # only the addresses paused now
                self._paused[host] = trio.current_time() + DIALBACK_PAUSE_S
        finally:
            if not started:
                self._release(peer, host)
                if tcp is not None:
                    await trio.aclose_forcefully(tcp)
        await stream.send(encode({"dialled": started}))
        await stream.close()

    async def _serve_dialled(self, tcp: trio.SocketStream, peer: str, host: str) -> None:
        channel = None
        try:
            with trio.move_on_after(HANDSHAKE_TIMEOUT_S):
                channel = await server_handshake(tcp, self.identity)
            if channel is not None and channel.peer_id == peer:  # the asker, no one else
                self.dialled_back += 1
                await self._answer(channel)
        except (BulkError, OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            self._release(peer, host)
            await trio.aclose_forcefully(tcp)

    def _release(self, peer: str, host: str) -> None:
        for held in (peer, host):
            self._dialling[held] -= 1
            if not self._dialling[held]:
                del self._dialling[held]


async def _dial(host: str, port: int, token: bytes) -> trio.SocketStream | None:
    """A connection to a fetcher's bulk listener, introduced by ``BACK_MAGIC ‖ token``; None if
    it could not be made within HANDSHAKE_TIMEOUT_S."""
    with trio.move_on_after(HANDSHAKE_TIMEOUT_S):
        try:
            tcp = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            log.info("bulk dial-back to %s:%d failed: %s", host, port, exc)
            return None
        try:
            await tcp.send_all(BACK_MAGIC + token)
        except (OSError, trio.BrokenResourceError):
            await trio.aclose_forcefully(tcp)
            return None
        return tcp
    log.info("bulk dial-back to %s:%d: no connection in %.0f s", host, port, HANDSHAKE_TIMEOUT_S)
    return None


async def serve_bulk(cache: BlobCache, identity: Identity, host: str, port: int, *,
                     allow: Callable[[str], bool] = lambda peer: True, rate_bytes_per_s: float | None = None,
                     max_sessions: int = MAX_SESSIONS, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve the blobs in ``cache`` on ``host:port`` (0: any free port) until cancelled: a
    :class:`BulkServer` that nobody asks to dial back (tests, benchmarks)."""
    server = BulkServer(cache, identity, allow=allow, rate_bytes_per_s=rate_bytes_per_s, max_sessions=max_sessions)
    await server.serve(host, port, task_status=task_status)


# -- client --------------------------------------------------------------------------------
async def request(channel: Channel, op: int, digest: bytes, offset: int = 0, length: int = 0) -> None:
    await channel.send(REQUEST.pack(op, digest, offset, length))


async def response(channel: Channel, payload: int) -> tuple[int, int, bytearray]:
    """The next response: (status, blob size, payload); an OK payload must be exactly ``payload``
    bytes (the caller knows what it asked for), any other status carries none."""
    head = RESPONSE_HEAD.size
    body = await channel.receive(head + max(payload, 0))
    status, size = RESPONSE_HEAD.unpack_from(body)
    if (status == OK and len(body) != head + payload) or (status != OK and len(body) != head):
        raise BulkError(f"{channel.peer_id} sent a response of {len(body)} bytes for status {status}")
    del body[:head]
    return status, size, body


def address_handler(port: int) -> Callable[[Stream], object]:
    """The libp2p handler of :data:`ADDRESS_PROTOCOL`: tells a peer our bulk port."""

    async def answer(stream: Stream) -> None:
        await stream.send(encode({"port": port}))
        await stream.close()

    return answer


@dataclass(frozen=True)
class DialBackPeer:
    """A provider nobody can dial (behind NAT) with which we hold a direct libp2p connection: it
    is asked to dial our bulk listener (``server``) instead."""

    peer_id: str
    p2p: P2P = field(compare=False, repr=False)
    server: BulkServer = field(compare=False, repr=False)

    async def open(self, identity: Identity, *, timeout_s: float = HANDSHAKE_TIMEOUT_S) -> Channel:
        """Ask the provider over libp2p, await its connection with our one-time token, and open the
        session on it as client (the provider proves its peer ID as when we dial it)."""
        token = os.urandom(TOKEN_SIZE)
        try:
            with trio.fail_after(timeout_s):
                async with self.server.awaiting(token) as arrivals:
                    stream = await self.p2p.open_stream(self.peer_id, DIALBACK_PROTOCOL)
                    try:
                        if stream.relayed:  # (the provider refuses it too)
                            raise BulkError(f"{self.peer_id} is reachable only through a relay")
                        await stream.send(encode({"port": self.server.port, "token": token}))
                        answer = decode(await stream.receive(MAX_DIALBACK_REQUEST), max_size=MAX_DIALBACK_REQUEST)
                    finally:
                        await stream.reset()
                    if type(answer) is not dict or answer.get("dialled") is not True:
                        raise BulkError(f"{self.peer_id} could not dial our bulk listener back")
                    tcp = await arrivals.receive()
                    try:
                        channel = await client_handshake(tcp, identity, self.peer_id)
                    except BaseException:
                        await trio.aclose_forcefully(tcp)
                        raise
        except trio.TooSlowError:
            raise BulkError(f"bulk dial-back from {self.peer_id}: no session in {timeout_s:.0f} s") from None
        except (NetworkError, DecodeError) as exc:
            raise BulkError(f"bulk dial-back from {self.peer_id}: {exc}") from exc
        channel.dialled_back = True
        return channel


async def find_bulk_peer(p2p: P2P, peer_id: str, server: BulkServer | None = None, *,
                         timeout_s: float = HANDSHAKE_TIMEOUT_S) -> BulkPeer | DialBackPeer | None:
    """How to open a bulk session with ``peer_id``: its listener, at the host its libp2p address
    names and the port it tells us over libp2p; or, with no address of it we can dial (behind
    NAT) but a direct connection with it, a dial-back to our ``server`` — unless we are behind
    NAT too, where its dial could not reach us either. None when it has no bulk listener or
    answers nonsense, or (logged) when we reach it only through a relay (a checkpoint never
    crosses one, and a ``/p2p-circuit`` address names the relay's host) or neither side can dial."""
    hosts = [a.split("/")[2] for a in p2p.peer_addrs(peer_id) if a.startswith("/ip4/") and not is_circuit(a)]
    if not hosts:
        kind = p2p.relays.kind(peer_id)
        if kind == "relayed":
            log.info("no bulk session with %s: we reach it only through a relay, and checkpoints never cross one",
                     peer_id)
        elif kind == "direct" and p2p.reachability == "private":  # (a hole punch joined two homes)
            log.info("no bulk session with %s: neither of us can dial the other's bulk port (both behind NAT); "
                     "blobs from it come over our direct libp2p connection", peer_id)
        elif kind == "direct" and server is not None:
            return DialBackPeer(peer_id, p2p, server)
        return None
    try:
        with trio.fail_after(timeout_s):
            stream = await p2p.open_stream(peer_id, ADDRESS_PROTOCOL)
            answer = decode(await stream.receive(64), max_size=64)
    except (NetworkError, trio.TooSlowError, DecodeError):  # (p2p.Stream turns libp2p's zoo into NetworkError)
        return None
    port = answer.get("port") if type(answer) is dict else None
    if type(port) is not int or not 0 < port < 65536:
        return None
    return BulkPeer(peer_id, hosts[0], port)


BulkProvider = BulkPeer | DialBackPeer
"""A provider a bulk session can be opened with (``await provider.open(identity)``)."""
