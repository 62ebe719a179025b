"""Escape probability against work done, for a 10,000-node audit of an 80,957-step run (issue 18).

    .venv/bin/python bench/escape_plot.py      # reads results/scale.json and results/spotcheck.json

The replay curve is the simulator's flagship run (bench/scale.py flagship: the node's real
planner and claim code, 10,000 simulated auditors, redundancy 2): at each virtual hour, the steps
replayed so far catch any forgery. The spot-check curves spend the same node-hours on spot checks
instead, at the cost per check measured by bench/spotcheck_bench.py (``small-32``'s verifier cost
÷ a replay), spread evenly over the steps as the planner spreads them; each catches a forged step
with the per-check probability of docs/run-format.md §10.3. Every probability is
:func:`open1b.protocol.escape_probability`, for one forged step and for 1% of the steps forged.

Not simulated: spot checks inside the simulator's planner (the spot-check work is the replay
work converted at the measured ratio, so claims, latency and churn are the replays' own).
Writes results/escape.json and results/escape.png.
"""

from __future__ import annotations

import json
from pathlib import Path

from open1b.protocol import escape_probability
from open1b.protocol.escape import forged_steps_at

RESULTS = Path(__file__).parent / "results"
SLOTS = 64  # gpt-125m's ranks × micro_batches (8 × 8): a forged micro-batch is caught with 1/64 per check
POINTS = 14


def spread(checks: int, steps: int) -> list[int]:
    base, extra = divmod(checks, steps)
    return [base + 1] * extra + [base] * (steps - extra)


def main() -> None:
    flagship = json.loads((RESULTS / "scale.json").read_text())
    cost = next(r for r in json.loads((RESULTS / "spotcheck.json").read_text())["costs"] if r["preset"] == "small-32")
    ratio = cost["spot_over_step"]
    steps = flagship["steps"]
    curve = flagship["curves"]["open1b"]  # [hour, fraction with ≥ 1 replay, fraction with ≥ 2]
    picks = [curve[round(i * (len(curve) - 1) / (POINTS - 1))] for i in range(POINTS)]
    rows = []
    for hour, once, twice in picks:
        replayed = round(once * steps)
        replays = replayed + round(twice * steps)
        row = {"hour": hour, "replays": replays, "spot_checks": round(replays / ratio)}
        for f_name, f in (("one", 1), ("one_percent", forged_steps_at(0.01, steps))):
            row[f"replay_{f_name}"] = escape_probability([0] * steps, 0.0, f, replayed=range(replayed))
            counts = spread(row["spot_checks"], steps)
            row[f"spot_p1_{f_name}"] = escape_probability(counts, 1.0, f)
            row[f"spot_micro_{f_name}"] = escape_probability(counts, 1 / SLOTS, f)
        rows.append(row)
        print(row)
    out = {"steps": steps, "nodes": flagship["nodes"], "spot_over_replay": ratio, "slots": SLOTS, "rows": rows}
    (RESULTS / "escape.json").write_text(json.dumps(out, indent=1) + "\n")
    plot(out)


def plot(out: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    hours = [r["hour"] for r in out["rows"]]
    for ax, f_name, title in zip(axes, ("one", "one_percent"), ("one forged step", "1% of the steps forged")):
        ax.plot(hours, [max(r[f"replay_{f_name}"], 1e-300) for r in out["rows"]], "k-", label="replays (simulated)")
        ax.plot(hours, [max(r[f"spot_p1_{f_name}"], 1e-300) for r in out["rows"]], "b--",
                label="spot checks: forged data, skipped update (p = 1)")
        ax.plot(hours, [max(r[f"spot_micro_{f_name}"], 1e-300) for r in out["rows"]], "r:",
                label=f"spot checks: one forged micro-batch (p = 1/{out['slots']})")
        ax.set_yscale("log")
        ax.set_ylim(1e-12, 2)
        ax.set_xlabel("virtual hours (10,000 nodes)")
        ax.set_title(f"{out['steps']:,} steps, {title}")
    axes[0].set_ylabel("P(forged run escaped)")
    axes[0].legend(fontsize=7, loc="lower left")
    fig.suptitle(f"same node-hours: a spot check costs {out['spot_over_replay']:.1%} of a replay (measured)")
    fig.tight_layout()
    fig.savefig(RESULTS / "escape.png", dpi=110)


if __name__ == "__main__":
    main()
