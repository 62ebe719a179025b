"""What counts: the one policy object that says which statements this node counts, now.

Three things decide it, each set by the component that judges it and read by everyone else:

* the trust policy: the operator's list (``trust_policy``, ``trusted_peers``, own key) plus the
  keys that earned trust (:mod:`.earned_trust`), set by :class:`~.judge.Judge`;
* the keys coverage flags per run (docs/protocol.md §8.1), set by the judge;
* the witness reveals this node holds (docs/run-format.md §5): a match whose binding a held
  reveal refutes is not counted (docs/protocol.md §8.2).

Each setter returns what its change touches, as a :class:`Recount` (or None): the judge, which
makes the changes, tells it on to the planner's view (:mod:`.planner_view`), which recounts only
those statements. Readers only read here; this object calls no one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from open1b.protocol import MATCH, Attestation, TrustPolicy, WitnessReveal
from open1b.protocol.witness import witness_binding

from .store import Store


@dataclass(frozen=True)
class Recount:
    """Whether ``keys``' statements count changed (``run`` None: in every run, as when earned trust
    changes), or, with ``step``, whether the statements of that step of ``run`` count (a reveal)."""

    run: bytes | None
    keys: frozenset[bytes] = frozenset()
    step: int | None = None



class Counting:
    def __init__(self, me: bytes, listed: TrustPolicy, store: Store, *, plan_with_untrusted: bool = False) -> None:
        """``listed``: the operator's policy (:meth:`~.config.NodeConfig.trust`); ``store``: where
        the held reveals are read from, once per run."""
        self.me, self.listed, self.store = me, listed, store
        self.plan_with_untrusted = plan_with_untrusted
        self._policy = listed
        # Keys that earned trust, with the (run, step) pairs that earned them (earned_trust.Pair).
        self.earned: dict[bytes, tuple] = {}
        self.flagged: dict[bytes, frozenset[bytes]] = {}  # run -> keys coverage flags there
        self._public: dict[bytes, dict[int, bytes]] = {}  # run -> step -> W_step of a held, valid reveal

    @property
    def trust(self) -> TrustPolicy:
        """The policy coverage and the planner apply now: the listed roots and the earned keys."""
        return self._policy

    # -- reading ---------------------------------------------------------------------------------
    def counts(self, run: bytes, key: bytes) -> bool:
        """Whether ``key``'s statements of ``run`` count: trusted and not flagged there."""
        return self._policy.trusts(key) and key not in self.flagged.get(run, ())

    def plans_with(self, att: Attestation) -> bool:
        """Whether the planner counts ``att``: our own always (we never attest a step twice);
        others' when coverage has not flagged the key, no held witness reveal disproves it, and
        the trust policy counts the key — or, with ``plan_with_untrusted`` (off by default), it is a
        key the policy does not count: a step complete but for trust is not replayed again (it
        would be, by every node, forever); coverage still does not count it (docs/reliability.md)."""
        if att.signer == self.me:
            return True
        if att.signer in self.flagged.get(att.run, ()) or self.disproves(att):
            return False
        return self._policy.trusts(att.signer) or self.plan_with_untrusted

    def disproves(self, att: Attestation) -> bool:
        """Whether a held reveal proves ``att`` a match signed without knowing its step's witness
        (coverage does not count it: docs/protocol.md §8.2)."""
        witness = self._held(att.run).get(att.step)
        return (witness is not None and att.verdict == MATCH
                and att.witness != witness_binding(att.run, att.step, att.signer, witness))

    def _held(self, run: bytes) -> dict[int, bytes]:
        if run not in self._public:
            self._public[run] = {r.step: r.witness for r in self.store.reveals(run)}
        return self._public[run]

    # -- judged elsewhere, told here -----------------------------------------------------------
    def set_earned(self, earned: dict[bytes, tuple]) -> Recount | None:
        """The keys that earned trust now; the keys whose trust changed, if any."""
        changed = frozenset(earned.keys() ^ self.earned.keys())
        self.earned = earned
        self._policy = dataclasses.replace(self.listed, roots=self.listed.roots | earned.keys())
        return Recount(None, changed) if changed else None

    def set_flagged(self, run: bytes, keys: frozenset[bytes]) -> Recount | None:
        """The keys coverage flags in ``run`` now; those flagged or cleared, if any."""
        changed = frozenset(keys ^ self.flagged.get(run, frozenset()))
        self.flagged[run] = keys
        return Recount(run, changed) if changed else None

    def held_reveal(self, reveal: WitnessReveal) -> Recount:
        """A valid reveal was stored (ours or a peer's): the matches of its step that bind another
        witness stop counting. Always a recount of the step, even when the store had the reveal
        already (the first read of a run's reveals finds the one just stored): nobody has counted
        with it yet."""
        self._held(reveal.run)[reveal.step] = reveal.witness
        return Recount(reveal.run, step=reveal.step)
