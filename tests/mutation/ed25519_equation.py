"""The plain Ed25519 verification equation of RFC 8032 §5.1.7, cofactorless and compared as
bytes (docs/protocol.md §5.4 rule 5), in pure Python.

The reference reading checks rules 1-4 itself and this equation last. libsodium cannot stand in
for it here: it applies rules 1-4 too, so a reading that dropped one of them would still pass.
The module is never mutated, and it caches its answers, so the mutants share them.
"""

from __future__ import annotations

import functools
import hashlib

P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493
D = -121665 * pow(121666, -1, P) % P
SQRT_M1 = pow(2, (P - 1) // 4, P)


def _x(y: int, sign: int) -> int | None:
    """The x of the curve point with this y and x parity (RFC 8032 §5.1.3), or None."""
    x2 = (y * y - 1) * pow(D * y * y + 1, -1, P) % P
    if x2 == 0:
        return None if sign else 0
    x = pow(x2, (P + 3) // 8, P)
    if (x * x - x2) % P:
        x = x * SQRT_M1 % P
    if (x * x - x2) % P:
        return None
    return P - x if x & 1 != sign else x


def _point(x: int, y: int) -> tuple[int, int, int, int]:  # extended coordinates (X, Y, Z, T)
    return x, y, 1, x * y % P


def _add(p, q):
    a = (p[1] - p[0]) * (q[1] - q[0]) % P
    b = (p[1] + p[0]) * (q[1] + q[0]) % P
    c = 2 * D * p[3] * q[3] % P
    d = 2 * p[2] * q[2] % P
    e, f, g, h = b - a, d - c, d + c, b + a
    return e * f % P, g * h % P, f * g % P, e * h % P


def _mul(n: int, p):
    out = (0, 1, 1, 0)
    while n:
        if n & 1:
            out = _add(out, p)
        p, n = _add(p, p), n >> 1
    return out


def _encode(p) -> bytes:
    zi = pow(p[2], -1, P)
    x, y = p[0] * zi % P, p[1] * zi % P
    return (y | (x & 1) << 255).to_bytes(32, "little")


_BY = 4 * pow(5, -1, P) % P
BASE = _point(_x(_BY, 0), _BY)


@functools.lru_cache(maxsize=None)
def holds(key: bytes, message: bytes, sig: bytes) -> bool:
    """encode([S]B - [k]A) == R, k = SHA-512(R ‖ A ‖ M) mod L; False if A is not a curve point."""
    y = int.from_bytes(key, "little") & ((1 << 255) - 1)
    x = _x(y % P, key[31] >> 7)
    if x is None:
        return False
    minus_a = _point(P - x if x else 0, y % P)
    k = int.from_bytes(hashlib.sha512(sig[:32] + key + message).digest(), "little") % L
    s = int.from_bytes(sig[32:], "little")
    return _encode(_add(_mul(s, BASE), _mul(k, minus_a))) == sig[:32]


@functools.lru_cache(maxsize=None)
def holds_cofactored(key: bytes, message: bytes, sig: bytes) -> bool:
    """ZIP-215's cofactored equation, [8]([S]B - [k]A - R) = identity with A and R decoded as points
    (y read mod p): the equation §5.4 does *not* use, for the mutant that reads it."""
    points = []
    for enc in (key, sig[:32]):
        y = int.from_bytes(enc, "little") & ((1 << 255) - 1)
        x = _x(y % P, enc[31] >> 7)
        if x is None:
            return False
        points.append(_point(P - x if x else 0, y % P))  # -A, -R
    k = int.from_bytes(hashlib.sha512(sig[:32] + key + message).digest(), "little") % L
    s = int.from_bytes(sig[32:], "little")
    d = _mul(8, _add(_add(_mul(s, BASE), _mul(k, points[0])), points[1]))
    return d[0] % P == 0 and (d[1] - d[2]) % P == 0
