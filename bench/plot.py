"""Plot bench/peers/run.py's results: jobs/s and PING p99 against N, per system.

    pip install -e '.[bench]'
    python bench/plot.py [bench/out/peers.json] [-o bench/results/peers.png]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
LABELS = {"ours-b100": "ours, batch 100", "ours-b1000": "ours, batch 1,000",
          "bullmq": "BullMQ stalled check", "rq": "RQ StartedJobRegistry.cleanup()"}
STYLES = {"ours-b100": "o-", "ours-b1000": "s-", "bullmq": "^-", "rq": "v-"}


def series(rows: list[dict], key: str) -> dict[str, tuple[list[int], list[float]]]:
    out: dict[str, tuple[list[int], list[float]]] = {}
    for row in sorted(rows, key=lambda r: r["n"]):
        if row.get("skipped"):
            continue
        xs, ys = out.setdefault(row["system"], ([], []))
        xs.append(row["n"])
        ys.append(row[key])
    return out


def plot(data: dict, output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["rows"]
    fig, (rate_ax, ping_ax, call_ax) = plt.subplots(1, 3, figsize=(15, 5))
    for ax, key, title, unit in ((rate_ax, "jobs_per_s", "recovery rate", "jobs/s"),
                                 (ping_ax, "ping_p99_ms", "PING p99, second client, during recovery", "ms"),
                                 (call_ax, "server_max_call_ms", "longest single call (server side)", "ms")):
        for system, (xs, ys) in series(rows, key).items():
            ax.plot(xs, ys, STYLES.get(system, "x-"), label=LABELS.get(system, system))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("N stalled jobs")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    skipped = [f"{LABELS.get(r['system'], r['system'])} at N={r['n']:,}" for r in rows if r.get("skipped")]
    rate_ax.legend(fontsize=8)
    machine = data.get("machine", {})
    load = machine.get("started_load") or [float("nan")]
    note = (f"redis {machine.get('redis', '?')}, {machine.get('cores', '?')} cores shared with other work "
            f"(load {load[0]:.1f} at start), whole benchmark at nice {machine.get('nice', 0)}")
    if skipped:
        note += "\nnot run (projected > 10 min): " + ", ".join(skipped)
    fig.suptitle("Stalled-job recovery on one Redis server: " + note, fontsize=9)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", nargs="?", type=Path, default=BENCH / "out" / "peers.json")
    parser.add_argument("-o", "--output", type=Path, default=BENCH / "results" / "peers.png")
    args = parser.parse_args(argv)
    plot(json.loads(args.data.read_text()), args.output)
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
