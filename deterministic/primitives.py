"""The arithmetic every kernel is written in, bound once per target.

Kernels never write ``a * b + c`` on floats; they write ``fadd(fmul(a, b), c)``. Each
primitive is one IEEE-754 single-precision operation, rounded to nearest-even once:

============  ==========================  ==================================  =====================
primitive     Python (numpy emulation)    CPU (numba, LLVM)                   CUDA (numba-cuda)
============  ==========================  ==================================  =====================
``fadd``      ``float32 + float32``       ``fadd float``                      ``add.rn.f32``
``fsub``      ``float32 - float32``       ``fsub float``                      ``add.rn.f32`` of -b
``fmul``      ``float32 * float32``       ``fmul float``                      ``mul.rn.f32``
``fdiv``      ``float32 / float32``       ``fdiv float``                      ``div.rn.f32``
``fsqrt``     ``np.sqrt(float32)``        ``llvm.sqrt.f32``                   ``sqrt.rn.f32``
``ffma``      exact, via float64 TwoSum   ``llvm.fma.f32`` (vfmadd; libm       ``fma.rn.f32``
                                          ``fmaf`` where the CPU has no FMA)
============  ==========================  ==================================  =====================

Why this makes kernels portable: without fast-math flags LLVM never contracts ``fmul`` and
``fadd`` into an fma on the CPU, and on the GPU an operation carrying ``.rn`` is exempt from
the contraction that NVVM and ptxas otherwise apply to every ``a*b + c`` (numba-cuda fuses by
default). Where the spec wants a fused multiply-add (the matmul's fold) it says so with
``ffma``, which rounds once on every target. ``.rn`` operations also keep subnormals (no
``.ftz``). Each typing rule accepts float32 arguments only, so a float64 or integer operand —
the promotion trap of ``x * 0.5`` — is a compile error instead of a silent float64 computation.
(numba's ``fastmath`` would still put contraction flags on these instructions: the engine never
compiles with it, and :mod:`.selfcheck` probes for it.)

:func:`as_int32` and :func:`as_float32` reinterpret bits (no arithmetic), for the software
transcendentals in :mod:`.mathf`.

The Python versions are the numpy emulation of a kernel (its plain Python run); like numpy they
warn on overflow or 0/0 unless the caller silences that with ``np.errstate``. The CUDA bindings
live in :mod:`.cuda` (imported only where a GPU build is wanted).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from .jit import CPU_OPTIONS

_F = np.float32


def fadd(a, b):
    """``a + b`` rounded once to float32."""
    return _F(_F(a) + _F(b))


def fsub(a, b):
    """``a - b`` rounded once to float32."""
    return _F(_F(a) - _F(b))


def fmul(a, b):
    """``a * b`` rounded once to float32 (never fused with a neighbouring add)."""
    return _F(_F(a) * _F(b))


def fdiv(a, b):
    """``a / b`` rounded once to float32 (IEEE: inf or nan on division by zero)."""
    return _F(_F(a) / _F(b))


def fsqrt(a):
    """Correctly rounded float32 square root (nan for a < 0)."""
    return _F(np.sqrt(_F(a)))


_F32_MAX = float(np.finfo(np.float32).max)
_F32_OVERFLOW = _F32_MAX + 2.0**103  # max + half an ulp: the float32 rounding boundary to inf


def ffma(a, b, c):
    """``a * b + c`` rounded once to float32 (scalars or arrays).

    Emulated exactly in float64: the product of two float32 values is exact there, TwoSum gives
    ``t + err == a*b + c`` exactly, and rounding ``t`` to float32 equals rounding the exact value
    except when ``t`` sits on a float32 midpoint, where the sign of ``err`` decides.
    """
    p = np.float64(a) * np.float64(b)
    c = np.float64(c)
    with np.errstate(invalid="ignore", over="ignore"):
        t = p + c
        bv = t - p
        err = (p - (t - bv)) + (c - bv)
        r = np.asarray(t).astype(np.float32)
        up = np.nextafter(r, np.float32(np.inf))
        down = np.nextafter(r, np.float32(-np.inf))
        other = np.where(r.astype(np.float64) > t, down, up)
        halfway = (r.astype(np.float64) + other.astype(np.float64)) / 2  # exact in float64
        mid = np.where(np.isinf(r), np.copysign(_F32_OVERFLOW, t), halfway)
        tie = (t == mid) & (err != 0) & np.isfinite(err)
        out = np.where(tie, np.where(err > 0, np.maximum(r, other), np.minimum(r, other)), r).astype(np.float32)
    return out[()] if out.ndim == 0 else out


def as_int32(x):
    """The bit pattern of float32 ``x`` as a signed 32-bit integer."""
    return np.int32(_F(x).view(np.int32))


def as_float32(i):
    """The float32 whose bit pattern is the low 32 bits of integer ``i``."""
    return np.int64(i).astype(np.int32).view(_F)




# ---- CPU: plain LLVM instructions, no fast-math flags -------------------------------------

_F32 = types.float32


def _cpu_binary(emit):
    @intrinsic
    def op(typingctx, a, b):
        if a != _F32 or b != _F32:
            return None
        return _F32(_F32, _F32), lambda context, builder, sig, args: emit(builder, *args)

    return op


def _emit_sqrt(builder, a):
    fnty = ir.FunctionType(ir.FloatType(), [ir.FloatType()])
    fn = builder.module.declare_intrinsic("llvm.sqrt", [ir.FloatType()], fnty)
    return builder.call(fn, [a])


@intrinsic
def _cpu_sqrt(typingctx, a):
    if a != _F32:
        return None
    return _F32(_F32), lambda context, builder, sig, args: _emit_sqrt(builder, args[0])


@intrinsic
def _cpu_fma(typingctx, a, b, c):
    if a != _F32 or b != _F32 or c != _F32:
        return None

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(ir.FloatType(), [ir.FloatType()] * 3)
        return builder.call(builder.module.declare_intrinsic("llvm.fma", [ir.FloatType()], fnty), args)

    return _F32(_F32, _F32, _F32), codegen


@intrinsic
def _cpu_as_int32(typingctx, x):
    if x != _F32:
        return None
    return types.int32(_F32), lambda context, builder, sig, args: builder.bitcast(args[0], ir.IntType(32))


def emit_int_to_f32_bits(builder, value, width):
    """LLVM: truncate or sign-extend an integer to 32 bits, then reinterpret it as a float."""
    if width > 32:
        value = builder.trunc(value, ir.IntType(32))
    elif width < 32:
        value = builder.sext(value, ir.IntType(32))
    return builder.bitcast(value, ir.FloatType())


@intrinsic
def _cpu_as_float32(typingctx, i):
    if not isinstance(i, types.Integer):
        return None
    return _F32(i), lambda context, builder, sig, args: emit_int_to_f32_bits(builder, args[0], sig.args[0].bitwidth)


_CPU_BINARY = {
    fadd: _cpu_binary(lambda b, x, y: b.fadd(x, y)),
    fsub: _cpu_binary(lambda b, x, y: b.fsub(x, y)),
    fmul: _cpu_binary(lambda b, x, y: b.fmul(x, y)),
    fdiv: _cpu_binary(lambda b, x, y: b.fdiv(x, y)),
}


def _bind_cpu_binary(fn, op):
    @overload(fn, target="cpu", jit_options=CPU_OPTIONS)
    def typer(a, b):
        return lambda a, b: op(a, b)


for _fn, _op in _CPU_BINARY.items():
    _bind_cpu_binary(_fn, _op)
overload(fsqrt, target="cpu", jit_options=CPU_OPTIONS)(lambda a: lambda a: _cpu_sqrt(a))
overload(ffma, target="cpu", jit_options=CPU_OPTIONS)(lambda a, b, c: lambda a, b, c: _cpu_fma(a, b, c))
overload(as_int32, target="cpu", jit_options=CPU_OPTIONS)(lambda x: lambda x: _cpu_as_int32(x))
overload(as_float32, target="cpu", jit_options=CPU_OPTIONS)(lambda i: lambda i: _cpu_as_float32(i))
