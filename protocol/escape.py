"""The probability that a forged run escaped the checks done so far (docs/protocol.md §8.7).

A run of S steps has f forged steps, fixed when it was published. The checks come later, from
randomness the trainer could not know (§5.5), so which steps were checked is independent of
which were forged: averaged over the forger's choice, the steps it forged are a uniform f-subset.
Step k was spot checked n_k times, each check catching a forged step with probability at least
p (§10.3 of docs/run-format.md), independently (each check has its own challenge); a step that
replay decided (verified or refuted) or a spot check failed is *caught*: a forgery there did not
go unnoticed. The forgery escapes step k with x_k = (1 - p)^{n_k} (0 when caught), and the run
escapes with

    P(escape) = E_F [ prod_{k in F} x_k ] = e_f(x_1, ..., x_S) / C(S, f)

(e_f the elementary symmetric polynomial). Steps with equal x_k form groups; adding a group of m
steps to M is a hypergeometric convolution, whose weights C(M, j-i) C(m, i) / C(M+m, j) lie in
[0, 1], so :func:`escape_probability` never forms a binomial that overflows (80,957 steps are
routine) and needs no numerical library: the protocol package stays pure.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Iterable, Sequence


def escape_probability(checks: Sequence[int], detection: float, forged: int,
                       replayed: Iterable[int] = ()) -> float:
    """P(a run with ``forged`` forged steps escaped): ``checks[k]`` spot checks of step k, each
    catching a forged step with probability ``detection``; the steps in ``replayed`` are caught
    (replay decided them, or a spot check failed them): no forgery escapes there."""
    steps = len(checks)
    if not 0 < forged <= steps:
        raise ValueError(f"forged must be in [1, {steps}]")
    if not 0.0 <= detection <= 1.0:
        raise ValueError("detection is a probability")
    done = set(replayed)
    groups = Counter(0.0 if k in done else (1.0 - detection) ** n for k, n in enumerate(checks))
    mean = [1.0]  # mean[j]: E over j-subsets of the steps so far of the product of their x
    size = 0
    for x, m in sorted(groups.items()):
        top = min(size + m, forged)
        mean = [sum(mean[j - i] * _hypergeometric(size, m, j, i) * x ** i
                    for i in range(max(0, j - size), min(m, j) + 1) if j - i < len(mean))
                for j in range(top + 1)]  # fmt: skip
        size += m
    return min(1.0, mean[forged])


def _hypergeometric(a: int, b: int, n: int, i: int) -> float:
    """C(a, n - i) C(b, i) / C(a + b, n): the chance that i of n draws from a + b fall among b."""
    return math.exp(_log_comb(a, n - i) + _log_comb(b, i) - _log_comb(a + b, n))


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def forged_steps_at(fraction: float, steps: int) -> int:
    """The f of "at least ``fraction`` of the steps are forged": ceil, and at least one."""
    return max(1, min(steps, math.ceil(fraction * steps - 1e-9)))
