"""Escape probability against checks done, for a 10,000-node audit of an 80,957-step run (issue 18).

    .venv/bin/python bench/escape_plot.py            # simulates the spot checks; reads scale.json, spotcheck.json
    .venv/bin/python bench/escape_plot.py --replot   # redraws from results/escape.json

Both kinds of check come out of the simulator (:mod:`open1b.sim`: the node's real planner and
claim code, 10,000 auditors on the volunteer hardware mix, every step wanted by 2 distinct nodes):

* **replays**: bench/scale.py's flagship run (results/scale.json), a job taking each machine's
  replay time of one step;
* **spot checks**: the same scenario (nodes, steps, mix, seed) simulated here with each machine's
  time per job multiplied by the *measured* verifier cost of a spot check ÷ a replay
  (results/spotcheck.json, the ``small-32`` row: 8 ranks × 4 micro-batches, so S = 32 slots).

At each point of a simulated coverage curve the steps checked once and twice give every step's
count of checks, and :func:`open1b.protocol.escape_probability` gives the chance that a run with
one forged step, or 1% of its steps forged, escaped them: a replay catches any forgery, a spot
check catches forged data, a skipped update or a refusal with p = 1 and the worst-case forged
micro-batch with p = 1/S (docs/run-format.md §10.3). Not modelled: checkpoint downloads (the
measured ratio excludes checkpoint I/O on both sides) and a planner that mixes spot checks and
replays (each curve is one kind of check alone). Writes results/escape.json and
docs/img/escape.png.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from open1b.protocol import escape_probability
from open1b.protocol.escape import forged_steps_at
from open1b.sim import Scenario, simulate

RESULTS = Path(__file__).parent / "results"
FIGURE = Path(__file__).parent.parent / "docs" / "img" / "escape.png"
POINTS = 24


def spot_scenario(flagship: dict, ratio: float) -> Scenario:
    """The flagship scenario with every machine's time per job scaled to one spot check."""
    base = Scenario(nodes=flagship["nodes"], steps=flagship["steps"], redundancy=flagship["redundancy"],
                    seed=flagship["scenario"]["seed"], crypto="stand-in")  # stand-in: same outcome, faster
    mix = tuple((replace(hw, name=f"{hw.name} spot check", seconds=hw.seconds * ratio), share) for hw, share in base.mix)
    return base.replace(mix=mix)


def sample(curve: list, points: int) -> list:
    return [curve[round(i * (len(curve) - 1) / (points - 1))] for i in range(points)]


def escapes(curve: list, steps: int, p: float | None) -> list[dict]:
    """Escape probabilities along a simulated coverage curve [(hours, ≥1, ≥2)]; ``p`` None: replays."""
    rows = []
    for t, once, twice in sample(curve, POINTS):
        n1, n2 = round(once * steps), round(twice * steps)
        row = {"t": t, "checks": n1 + n2}
        for label, f in (("one", 1), ("one_percent", forged_steps_at(0.01, steps))):
            if p is None:
                row[label] = escape_probability([0] * steps, 0.0, f, replayed=range(n1))
            else:
                counts = [2] * n2 + [1] * (n1 - n2) + [0] * (steps - n1)
                row[label] = escape_probability(counts, p, f)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replot", action="store_true", help="redraw from results/escape.json")
    ap.add_argument("--ratio", type=float, help="a spot check ÷ replay measured elsewhere (default: spotcheck.json)")
    ap.add_argument("--slots", type=int, default=32, help="with --ratio: the measured shape's ranks × micro-batches")
    args = ap.parse_args()
    if args.replot:
        plot(json.loads((RESULTS / "escape.json").read_text()))
        return
    flagship = json.loads((RESULTS / "scale.json").read_text())
    if args.ratio is None:
        cost = next(r for r in json.loads((RESULTS / "spotcheck.json").read_text())["costs"]
                    if r["preset"] == "small-32")  # fmt: skip
        ratio, slots = cost["spot_over_step"], cost["topology"][0] * cost["topology"][1]
    else:
        ratio, slots = args.ratio, args.slots
    steps = flagship["steps"]
    sim = simulate(spot_scenario(flagship, ratio))
    out = {
        "nodes": flagship["nodes"], "steps": steps, "redundancy": flagship["redundancy"],
        "spot_over_replay": ratio, "slots": slots,
        "replay_time_to_full_h": flagship["time_to_full_h"], "spot_time_to_full_h": sim["time_to_full_h"],
        "spot_sim": {k: sim[k] for k in ("replays", "replay_ratio", "wall_s") if k in sim},
        "spot_curve": sim["curve"],  # the simulated coverage curve itself: a replot needs no new simulation
        "replays": escapes(flagship["curves"]["open1b"], steps, None),
        "spot_p1": escapes(sim["curve"], steps, 1.0),
        "spot_micro": escapes(sim["curve"], steps, 1 / slots),
    }
    (RESULTS / "escape.json").write_text(json.dumps(out, indent=1) + "\n")
    for name in ("replays", "spot_p1", "spot_micro"):
        end = out[name][-1]
        print(f"{name:10} {end['checks']:>7} checks by {end['t']:.2f} h: escape {end['one']:.3g} (f = 1),"
              f" {end['one_percent']:.3g} (f = 1%)")
    plot(out)


def plot(out: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharey=True)
    curves = (("replays", "k-o", "replays (any forgery)"),
              ("spot_p1", "b--s", "spot checks: forged data, skipped update, refusal (p = 1)"),
              ("spot_micro", "r:^", f"spot checks: one forged micro-batch (p = 1/{out['slots']})"))
    for row, (x, xlabel) in enumerate((("checks", "checks done"), ("t", "virtual hours (10,000 nodes)"))):
        for col, (f_name, title) in enumerate((("one", "one forged step"), ("one_percent", "1% of the steps forged"))):
            ax = axes[row][col]
            for name, style, label in curves:
                points = [(r[x], max(r[f_name], 1e-300)) for r in out[name] if r[x] > 0]
                ax.plot(*zip(*points), style, label=label, markersize=3)  # markers: the sampled points
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_ylim(1e-12, 2)
            ax.set_xlabel(xlabel)
            ax.set_title(f"{out['steps']:,} steps, {title}", fontsize=10)
        axes[row][0].set_ylabel("P(forged run escaped)")
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.suptitle(f"simulated: {out['nodes']:,} nodes, each step checked by 2 nodes; a spot check costs"
                 f" {out['spot_over_replay']:.1%} of a replay (measured); {POINTS} points of each curve", fontsize=11)
    fig.tight_layout()
    FIGURE.parent.mkdir(exist_ok=True)
    fig.savefig(FIGURE, dpi=100)


if __name__ == "__main__":
    main()
