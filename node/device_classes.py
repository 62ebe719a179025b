"""The device classes of one run's replays (docs/protocol.md §10.1; :class:`~.planner.DiversityView`):
which steps each class matched, how fast each turns a claim into an attestation, the class each
claim and each key named (:class:`DeviceClasses`), and the class wait that reads them
(:class:`ClassWait`).

:class:`~.deficits.DeficitIndex` tells it of every counted attestation and live claim; the class
wait asks the index for a step's attesters and its replays in flight (:class:`Replays`).
"""

from __future__ import annotations

from collections import Counter
from typing import Collection, Iterable, Protocol

from .pace import Pace
from .planner import CLASS_WAIT, PACE_WINDOW_S, TAIL_MARGIN


class Replays(Protocol):
    """A step's replays as the class wait reads them (:class:`~.deficits.DeficitIndex`)."""

    now: int

    def attesters(self, step: int) -> Collection[bytes]: ...

    def in_flight(self, step: int) -> Iterable[tuple[bytes, int]]:
        """(claimant, when its live claim was issued) for each live claimant that has not attested."""


class DeviceClasses:
    def __init__(self) -> None:
        self._matched_by: dict[str, Counter[int]] = {}  # device class -> steps it matched (counted matches)
        self._class_seen: dict[str, int] = {}  # device class -> when its latest counted match arrived
        self._class_of: dict[bytes, str] = {}  # key -> the device class its latest counted attestation named
        self._arrival: dict[tuple[int, bytes], int] = {}  # (step, counted attester) -> when it arrived
        # A key's turnaround: from its earliest claim on the step (ours included) to its
        # attestation, at least its replay time — fetching and loading included (the class wait);
        # per device class, a key's first counted attestation (cold: it carries the run's one-time
        # costs, fetching its shared files and starting a worker) apart from its later ones (warm)
        self._turnaround: dict[str, tuple[Pace, Pace]] = {}  # class -> (cold, warm)
        self._first_claim: dict[tuple[int, bytes], int] = {}  # (step, claimant) -> its earliest claim's issue
        self._claimed_as: dict[tuple[int, bytes], str] = {}  # (step, claimant) -> the device class its live claim named
        # device class -> the live claims in _claimed_as that name it: kept as claims come and go,
        # since the class wait asks which classes are live on every plan (thousands of claims in
        # the simulator's runs)
        self._naming: Counter[str] = Counter()

    # -- told ------------------------------------------------------------------------------------
    def claimed(self, step: int, claimant: bytes, issued_at: int) -> None:
        """Any claim, ours and expired ones too: where a turnaround starts."""
        first = self._first_claim.get((step, claimant))
        if first is None or issued_at < first:
            self._first_claim[(step, claimant)] = issued_at

    def claimed_as(self, step: int, claimant: bytes, device: str) -> None:
        """The device class a live claim names."""
        before = self._claimed_as.get((step, claimant))
        if before != device:
            self._unname(before)
            self._claimed_as[(step, claimant)] = device
            self._naming[device] += 1

    def lease_over(self, step: int, claimant: bytes) -> None:
        self._unname(self._claimed_as.pop((step, claimant), None))

    def _unname(self, device: str | None) -> None:
        if device is not None:
            self._naming[device] -= 1
            if not self._naming[device]:
                del self._naming[device]

    def attested(self, step: int, signer: bytes, match: bool, device: str | None, arrived: int,
                 elapsed_s: float | None, *, first: bool) -> None:
        """A counted attestation of ``step``; ``first``: its signer's first counted one of the step."""
        if first:
            self._arrival[(step, signer)] = arrived
            claimed = self._first_claim.pop((step, signer), None)
            took = elapsed_s if claimed is None else max(arrived - claimed, elapsed_s or 0)
            if device is not None:
                cold, warm = self._turnaround.setdefault(device, (Pace(), Pace()))
                (warm if signer in self._class_of else cold).arrived((step, signer), arrived, took)
        if device is not None:
            self._class_of[signer] = device
        if match and device is not None:
            self._matched_by.setdefault(device, Counter())[step] += 1
            self._class_seen[device] = max(self._class_seen.get(device, arrived), arrived)

    def unattested(self, step: int, signer: bytes, match: bool, device: str | None, *, last: bool) -> None:
        """A counted attestation stopped counting; ``last``: its signer has no other counted one of the step."""
        if last:
            del self._arrival[(step, signer)]
            for paces in self._turnaround.values():
                for pace in paces:
                    pace.left((step, signer))
        if match and device is not None:
            matched = self._matched_by[device]
            matched[step] -= 1
            if not matched[step]:
                del matched[step]

    # -- planner.DiversityView -------------------------------------------------------------------
    def matched_by(self, device: str) -> Collection[int]:
        return self._matched_by.get(device, set())

    def wait(self, replays: Replays, device: str) -> ClassWait:
        """The steps a node of class ``device`` leaves, for now, to another class (docs/protocol.md
        §10.1, the class wait): those whose matches and in-flight replays (live claims, of the
        class the claim names, else the one the claimant's latest attestation named, else
        ``device``'s) are all of class ``device``, while another class that is about as fast is
        live — it matched a step within PACE_WINDOW_S, or a live claim names it (r30); for
        CLASS_WAIT × that class's median turnaround (claim to attestation), this class's while
        it has none, after the step's latest attester arrived or its in-flight claim was issued.
        About as fast: its median warm turnaround at most TAIL_MARGIN times this class's, or
        either has no warm one yet — cold ones (a key's first replay of the run) say more of the
        run's start than of a class's speed, and one class may have only cold ones while the
        other has warm (a devnet under load: 40 s against 16 s, for the same CPU).
        :func:`~open1b.node.planner.pick` asks only about a step's last slot."""
        now = replays.now
        typical = {d: (cold.at(now)[1], warm.at(now)[1]) for d, (cold, warm) in self._turnaround.items()}
        own_cold, own = typical.get(device, (None, None))
        # The classes live besides this one: those that matched lately, and those replaying now —
        # a class whose first replays are still in flight when this one's first matches arrive
        # (a run's first round) is live before it has matched anything (r30).
        live = {d for d, seen in self._class_seen.items() if seen > now - PACE_WINDOW_S} | self._naming.keys()
        # the other classes worth waiting for: about as fast as this one (so the wait costs about
        # a replay of ours at most) — a slower class would take the step later
        others = []
        for d in live - {device}:
            cold, warm = typical.get(d, (None, None))
            took = warm or cold or own or own_cold  # unmeasured yet: as fast as this class
            if took and (own is None or warm is None or warm <= TAIL_MARGIN * own):
                others.append(took)
        return ClassWait(self, replays, device, CLASS_WAIT * min(others) if others else 0.0,
                         blind=not self._class_seen)


class ClassWait:
    """Membership: a step the class wait holds back from ``device`` now. ``held`` tells whether
    any step asked about was held back (a node that found nothing only because of the wait will
    find it once the wait is over: the simulator does not park such a node)."""

    __slots__ = ("classes", "replays", "device", "wait_s", "blind", "held")

    def __init__(self, classes: DeviceClasses, replays: Replays, device: str, wait_s: float,
                 blind: bool = False) -> None:
        self.classes, self.replays, self.device, self.wait_s, self.blind = classes, replays, device, wait_s, blind
        self.held = False

    def __contains__(self, step: object) -> bool:
        if not (self.blind or self.wait_s):
            return False
        classes, replays = self.classes, self.replays
        attesters = replays.attesters(step)
        if self.blind and attesters:
            return False
        # Nothing matched yet (the run's first round, blind): the classes in flight are all a node
        # can know, and one that is its own waits until it attests or its lease ends. Else the
        # step's matches and replays in flight, for a while (wait_s).
        seen = {d for d, steps in classes._matched_by.items() if step in steps}
        since = max((classes._arrival[(step, s)] for s in attesters), default=None)
        for claimant, issued in replays.in_flight(step):  # the class its claim names, else the one an attestation told
            seen.add(classes._claimed_as.get((step, claimant)) or classes._class_of.get(claimant, self.device))
            since = issued if since is None else max(since, issued)
        if seen != {self.device} or (not self.blind and replays.now >= since + self.wait_s):
            return False
        self.held = True
        return True
