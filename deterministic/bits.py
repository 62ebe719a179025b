"""Reinterpret float32 bits as int32 and back, in compiled code *and* in plain Python.

The software transcendentals in :mod:`.mathf` need the IEEE bit pattern (exponent
extraction, building 2**k). Each helper is an ordinary Python function (used when a
kernel's ``.py_func`` runs as a numpy emulation) with a numba overload that compiles to a
single LLVM ``bitcast`` — no arithmetic, so nothing that could round differently.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload


def float32_to_int32(x):
    """The bit pattern of float32 ``x`` as a signed 32-bit integer."""
    return int(np.float32(x).view(np.int32))


def int32_to_float32(i):
    """The float32 whose bit pattern is the low 32 bits of integer ``i``."""
    return np.int32(np.int64(i).astype(np.int32)).view(np.float32)


@intrinsic
def _bitcast_f32_i32(typingctx, x):
    if not isinstance(x, types.Float) or x.bitwidth != 32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(types.float32), codegen


@intrinsic
def _bitcast_i32_f32(typingctx, i):
    if not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        (value,) = args
        width = signature.args[0].bitwidth
        if width > 32:
            value = builder.trunc(value, ir.IntType(32))
        elif width < 32:
            value = builder.sext(value, ir.IntType(32))
        return builder.bitcast(value, ir.FloatType())

    return types.float32(i), codegen


@overload(float32_to_int32, jit_options={"cache": True})
def _float32_to_int32_overload(x):
    if isinstance(x, types.Float) and x.bitwidth == 32:
        return lambda x: _bitcast_f32_i32(x)
    return None


@overload(int32_to_float32, jit_options={"cache": True})
def _int32_to_float32_overload(i):
    if isinstance(i, types.Integer):
        return lambda i: _bitcast_i32_f32(i)
    return None
