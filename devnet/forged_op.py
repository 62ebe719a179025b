"""A forged op, for the ``forged-op`` forgery and the dispute tests: a backend that computes every
op as the engine does, except one call of one op kind, whose first output gets one bit flipped.

A trainer on it publishes a state that follows from the forged op; its op trace (the same
backend, traced) commits the forged output where the op returned it, as a trainer that forged
one op and then stood by its computation would."""

from __future__ import annotations

import numpy as np

from open1b.deterministic.backend import cpu_backend

FORGED_KIND, FORGED_CALL, FORGED_ELEMENT = "gelu", 1, 5
"""The default forgery: element 5 of the second ``gelu`` call's output (layer 1's forward of the
first micro-batch)."""


class ForgingBackend:
    """The serial CPU backend, except that call ``nth`` (from 0) of op ``kind`` returns its first
    output with the lowest bit of element ``element`` flipped. One instance per step: it counts
    calls, and the activation recompute calls a block's ops again (the forged call is the first
    forward's, so the recompute computes the true value and the trace keeps the forged one)."""

    def __init__(self, kind: str = FORGED_KIND, nth: int = FORGED_CALL, element: int = FORGED_ELEMENT) -> None:
        self._inner, self.kind, self.nth, self.element, self.calls = cpu_backend(False), kind, nth, element, 0
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
                first.reshape(-1).view(np.uint32)[self.element] ^= 1
            self.calls += 1
            return out

        return forged
