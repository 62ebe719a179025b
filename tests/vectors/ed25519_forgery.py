"""Ed25519 signatures that a lax verifier accepts and docs/protocol.md §5.4 rejects.

Most satisfy the plain (cofactorless) verification equation [S]B = R + [k]A with
k = SHA-512(R ‖ A ‖ M) mod L, so only the strict byte rules tell them apart from a good signature:

* a small-order key A: pick r until k is a multiple of 8, then [k]A is the identity and
  (R, S) = ([r]B, r) verifies for any message;
* a small-order R: with the key's secret scalar a, S = k·a gives [S]B − [k]A = identity = R;
* S ≥ L: a good signature with L added to S (the equation only sees S mod L).

One satisfies only the *cofactored* equation [8][S]B = [8]R + [8][k]A (ZIP-215's): a mixed-order
key A = [a]B + T, T of order 8, signed as usual (R = [r]B, S = r + k·a). Then [S]B − [k]A = R − [k]T,
which is R only when 8 divides k: for the other 7 messages in 8 the plain equation fails and the
cofactored one holds, so a verifier that adds §5.4's byte rules to the cofactored equation
accepts what a strict one rejects (:func:`sign_as_mixed_order_key`).
"""

from __future__ import annotations

import hashlib

from nacl.bindings import crypto_core_ed25519_add, crypto_scalarmult_ed25519_base_noclamp

P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493
Y8 = 2707385501144840649318225287225658788936804267575313519463743609750303402022  # y of a point of order 8


def point(y: int, sign: int = 0) -> bytes:
    """The 32-byte encoding with ``y`` (which may be >= p: non-canonical) and the x sign bit."""
    return (y | sign << 255).to_bytes(32, "little")


IDENTITY = point(1)
SMALL_ORDER_KEYS = {  # name -> encoding of a point of small order
    "identity": IDENTITY, "order-2": point(P - 1), "order-4": point(0), "order-8": point(Y8),
    "identity-non-canonical": point(P + 1),
}


def _k(r_bytes: bytes, key: bytes, message: bytes) -> int:
    return int.from_bytes(hashlib.sha512(r_bytes + key + message).digest(), "little") % L


def sign_as_small_order_key(key: bytes, message: bytes) -> bytes:
    r = 1
    while _k(R := crypto_scalarmult_ed25519_base_noclamp(r.to_bytes(32, "little")), key, message) % 8:
        r += 1
    return R + r.to_bytes(32, "little")


def _secret_scalar(seed: bytes) -> int:
    h = bytearray(hashlib.sha512(seed).digest()[:32])
    h[0] &= 248
    h[31] = (h[31] & 127) | 64
    return int.from_bytes(h, "little")


def sign_with_small_order_r(seed: bytes, key: bytes, message: bytes, r_bytes: bytes = IDENTITY) -> bytes:
    return r_bytes + (_k(r_bytes, key, message) * _secret_scalar(seed) % L).to_bytes(32, "little")


def s_plus_l(signature: bytes) -> bytes:
    return signature[:32] + (int.from_bytes(signature[32:], "little") + L).to_bytes(32, "little")


NON_CANONICAL_Y = P + 3
"""The first y in p + 2 … p + 18 whose value mod p is the y of a curve point (3): a non-canonical
encoding of a point of large order, which no rule 3/4 list names."""


def mixed_order_key(seed: bytes) -> bytes:
    """[a]B + T for the seed's secret scalar a and T of order 8: not of small order (rule 3 passes)."""
    a = crypto_scalarmult_ed25519_base_noclamp((_secret_scalar(seed) % L).to_bytes(32, "little"))
    return crypto_core_ed25519_add(a, point(Y8))


def sign_as_mixed_order_key(seed: bytes, message_for, eight_divides_k: bool) -> tuple[bytes, bytes]:
    """(message, signature) by :func:`mixed_order_key` (seed): the first message ``message_for(i)``
    whose k is a multiple of 8 (``eight_divides_k``; the plain equation holds) or is not (only the
    cofactored one holds). R = [r]B with r derived from the seed and message, S = r + k·a mod L."""
    key, a = mixed_order_key(seed), _secret_scalar(seed) % L
    i = 0
    while True:
        message = message_for(i)
        r = int.from_bytes(hashlib.sha512(seed + message).digest(), "little") % L
        R = crypto_scalarmult_ed25519_base_noclamp(r.to_bytes(32, "little"))
        k = _k(R, key, message)
        if (k % 8 == 0) == eight_divides_k:
            return message, R + ((r + k * a) % L).to_bytes(32, "little")
        i += 1
