"""A forged op, for the ``forged-op`` forgery and the dispute tests: a backend that computes every
op as the engine does, except one call of one op kind, whose first output gets one bit flipped.

The bit is a middle one of the mantissa (a relative change of about 2^-7), not the lowest: a
lowest-bit change of one activation can vanish in the optimizer's rounding, so that no parameter
of the published state differs and the forgery is invisible to every replay (seed 0: no parameter
differed at steps 1 and 4, 41 and 96 at steps 3 and 2; bit 16: 8,383–31,690 at each).

A trainer on it publishes a state that follows from the forged op; its op trace (the same
backend, traced) commits the forged output where the op returned it, as a trainer that forged
one op and then stood by its computation would."""

from __future__ import annotations

import numpy as np

from open1b.deterministic.backend import cpu_backend

FORGED_KIND, FORGED_CALL, FORGED_ELEMENT, FORGED_BIT = "gelu", 1, 5, 16
"""The default forgery: bit 16 of element 5 of the second ``gelu`` call's output (layer 1's forward
of the first micro-batch)."""


class ForgingBackend:
    """The serial CPU backend, except that call ``nth`` (from 0) of op ``kind`` returns its first
    output with bit ``bit`` of element ``element`` flipped. One instance per step: it counts
    calls, and the activation recompute calls a block's ops again (the forged call is the first
    forward's, so the recompute computes the true value and the trace keeps the forged one)."""

    def __init__(self, kind: str = FORGED_KIND, nth: int = FORGED_CALL, element: int = FORGED_ELEMENT,
                 bit: int = FORGED_BIT) -> None:
        self._inner, self.kind, self.nth, self.element, self.calls = cpu_backend(False), kind, nth, element, 0
        self.bit = bit
        # The ops as the trace lists them (run-format §11): a fused backend would compute the forged
        # op inside a product's epilogue, and the forgery would never happen.
        self.fused = False

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name != self.kind:
            return attr

        def forged(*args, **kwargs):
            out = attr(*args, **kwargs)
            if self.calls == self.nth:
                first = out[0] if isinstance(out, tuple) else out
                first.reshape(-1).view(np.uint32)[self.element] ^= np.uint32(1 << self.bit)
            self.calls += 1
            return out

        return forged
