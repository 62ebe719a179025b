"""The CUDA kernels compiled to PTX (NVVM, no GPU needed): every float32 ``add/sub/mul/div/sqrt``
carries ``.rn`` (so nothing can be contracted into an fma behind the spec's back), ``fma`` appears
only where the spec fuses explicitly (the matmul's fold, ``fma.rn``), no flush-to-zero, no
float64, no approximate transcendentals. This is where "nothing is silently fused on one target"
is checked for CUDA."""

import re
import types

import numpy as np
import pytest
from numba import typeof

CC = (9, 0)  # H100/H200; the checks hold for any architecture NVVM targets
F32 = np.float32(1)


def a(*shape, dtype=np.float32):
    return typeof(np.zeros(shape, dtype))


def signatures():
    from open1b.deterministic import cuda as k

    f1, f2, f3, i1 = a(2), a(2, 2), a(2, 2, 2), a(2, dtype=np.int32)
    f32, i64, flag = typeof(F32), typeof(1), typeof(True)
    return {
        k.matmul_kernel: (f3, f3, f3, flag, flag, i64, i64, f3, f3),
        k.embed_kernel: (f2, f2, i1, f2),
        k.scatter_add_kernel: (f2, f2, i1, i1),
        k.rmsnorm_kernel: (f2, f1, f32, f32, f2, f1),
        k.rmsnorm_backward_kernel: (f2, f1, f1, f2, f2, f32, f2, f2),
        k.sum_rows_kernel: (f2, f1),
        k.chunk_sums_kernel: (f1, flag, f1),
        k.add_kernel: (f1, f1, f1),
        k.plus_zero_kernel: (f1, f1),
        k.gelu_kernel: (f1, f1),
        k.gelu_backward_kernel: (f1, f1, f1),
        k.split_heads_kernel: (f2, f3, i64, i64, i64),
        k.merge_heads_kernel: (f3, f2, i64, i64, i64),
        k.softmax_kernel: (f3, f32, f3),
        k.softmax_backward_kernel: (f3, f3, f32, f3),
        k.cross_entropy_kernel: (f2, i1, f32, f2, f1),
        k.adamw_kernel: (f1,) * 7 + (f32,) * 9,
        k.probe_kernel: (f1, f1),
        k.zero_kernel: (f1,),
        k.loss_kernel: (f1, f32, f1),
        k.clip_kernel: (f1, i1, f32, f32, f1, f1),
        k.adamw_clip_kernel: (f1,) * 7 + (f32,) * 8 + (f1,),
    }


@pytest.fixture(scope="module")
def ptx(request):
    """PTX of every kernel. numba-cuda asks the driver for the current device's compute
    capability when it compiles a *called* device function, even for compile_ptx with an
    explicit ``cc``; with no GPU here that query is answered with ``CC`` for this fixture only."""
    import numba.cuda.dispatcher as cuda_dispatcher
    from numba import cuda

    patch = pytest.MonkeyPatch()
    patch.setattr(cuda_dispatcher, "get_current_device", lambda: types.SimpleNamespace(compute_capability=CC))
    try:
        return {kernel.py_func.__name__: cuda.compile_ptx(kernel.py_func, sig, cc=CC)[0]
                for kernel, sig in signatures().items()}  # fmt: skip
    finally:
        patch.undo()


FLOAT_OP = re.compile(r"^\s*(add|sub|mul|div|sqrt|rcp|rsqrt)((?:\.\w+)*)\.f32\b", re.MULTILINE)


def test_every_kernel_compiles(ptx):
    assert len(ptx) == len(signatures()) and all(".entry" in text for text in ptx.values())


def test_fused_multiply_add_only_where_the_spec_says(ptx):
    fmas = {name: set(re.findall(r"\bfma\.\S+", text)) for name, text in ptx.items()}
    assert fmas.pop("matmul_kernel") == {"fma.rn.f32"}  # s = ffma(a, b, s)
    assert {name: ops for name, ops in fmas.items() if ops} == {}


def test_every_float32_operation_rounds_to_nearest(ptx):
    loose = {name: sorted({m.group(0).strip() for m in FLOAT_OP.finditer(text) if ".rn" not in m.group(2)})
             for name, text in ptx.items()}  # fmt: skip
    assert {name: ops for name, ops in loose.items() if ops} == {}
    assert all(FLOAT_OP.search(text) for name, text in ptx.items()
               if name not in ("split_heads_kernel", "merge_heads_kernel", "embed_kernel", "zero_kernel"))  # fmt: skip


def test_no_flush_to_zero_no_float64_no_approximations(ptx):
    for name, text in ptx.items():
        assert ".ftz" not in text, name
        assert ".f64" not in text, name
        assert ".approx" not in text, name


def test_matmul_keeps_accumulators_fragments_and_prefetch_in_registers(ptx):
    """The register-blocked matmul's only local memory is the per-output tree's upper stack
    (levels 2 and up, touched once per four chunks): the 4 x 4 accumulators, the two lowest tree
    levels, the A/B fragments and the double-buffer prefetch registers never spill."""
    import math

    from open1b.deterministic import cuda as k

    text = ptx["matmul_kernel"]
    depots = [int(n) for n in re.findall(r"\.local \.align \d+ \.b8\s+__local_depot\d+\[(\d+)\]", text)]
    assert depots == [4 * math.prod(k.UPPER_LEVELS)]
    loads, stores = len(re.findall(r"\bld\.local", text)), len(re.findall(r"\bst\.local", text))
    print(f"matmul_kernel PTX: {loads} ld.local, {stores} st.local (the upper tree levels and their zeroing)")
    # The inner loop (ffma over a staged chunk) has no local traffic: every local access sits
    # outside the blocks that hold an fma.
    for block in re.split(r"\n\$L__BB\d+_\d+:", text):
        if "fma.rn.f32" in block:
            assert "ld.local" not in block and "st.local" not in block
