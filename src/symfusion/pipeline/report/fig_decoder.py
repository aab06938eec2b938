"""Figure D: held-out next-token loss along the linear path between two end decoders, unmatched and after each declared matching, with both barriers and each change's paired interval.

The decoder track's analogue of Figure 5 (report/barriers.py): one curve per matching its entry declares, the
legend giving each path's barrier (max - min of the loss along the path), its barrier above the straight line
between the end losses, and its change vs the unmatched path with the 95% interval of a paired bootstrap over the
test blocks (token-weighted). The CSV has every point of every path.
"""
from __future__ import annotations

from pathlib import Path

from symfusion.pipeline.report.barriers import peer_lines, BASELINE, SHAPES, barrier_rows, plot_paths, summary_cells
from symfusion.pipeline.report.registry import Experiment
from symfusion.pipeline.report.results import Built, csv_text, figure_files

__all__ = ["SHAPES", "build", "summary"]


def build(barrier_paths: list[str], experiment: Experiment) -> Built:
    by_pair, pairs, rows, summary = barrier_rows(barrier_paths, experiment)
    fig = plot_paths(experiment, by_pair, pairs, summary, "Figure D: loss along the linear path between two decoders",
                     "held-out next-token loss (nats per token)")
    return Built(rows, {**figure_files(fig), ".csv": csv_text(rows)})


def summary(csv_path: Path, experiment: Experiment) -> list[str]:
    """Each matching's barrier (both definitions) and its change vs unmatched with the interval, and the lowest."""
    cells, barriers, pairs = summary_cells(csv_path)
    if not barriers:
        return []
    lowest = min(barriers, key=barriers.get)
    over = f", means over {pairs} model pairs" if pairs > 1 else ""
    verdict = ("no matching lowers it" if lowest == BASELINE else f"lowest after {lowest}")
    return [f"Figure D (decoders): loss barriers (max - min along the path{over}) " + "; ".join(cells) +
            f"; {verdict}."] + peer_lines(csv_path, "decoder")
