"""Figure 5: loss along the linear path between the end models for each declared matching, with both barrier definitions and each barrier change's paired interval.

One curve per matching the entry's inputs declare (in that order; the entry's `labels:` or each matching's
label). The CSV has every point of every path, both barriers (the paper's range first), and each
matching's barrier change vs unmatched with the paired bootstrap interval over the test examples; with
several model pairs the changes are means over pairs (report/barriers.py).
"""
from __future__ import annotations

from pathlib import Path

from symfusion.pipeline.report.barriers import peer_lines, SHAPES, barrier_rows, plot_paths, summary_cells
from symfusion.pipeline.report.registry import Experiment
from symfusion.pipeline.report.results import Built, csv_text, figure_files

__all__ = ["SHAPES", "build", "summary"]


def build(barrier_paths: list[str], experiment: Experiment) -> Built:
    """Loss along theta(alpha) = alpha*A + (1-alpha)*B for B unmatched / partly / fully matched; both barrier
    definitions, and each matching's barrier change vs unmatched with its paired bootstrap interval."""
    by_pair, pairs, rows, summary = barrier_rows(barrier_paths, experiment)
    fig = plot_paths(experiment, by_pair, pairs, summary, "Figure 5: loss along the linear path between the end models",
                     "test loss (cross-entropy)")
    return Built(rows, {**figure_files(fig), ".csv": csv_text(rows)})


def summary(csv_path: Path, experiment: Experiment) -> list[str]:
    """Mean barriers per matching over the pairs, each change with its interval, and the lowest."""
    cells, barriers, pairs = summary_cells(csv_path)
    if not barriers:
        return []
    lowest = min(barriers, key=barriers.get)
    over = f", means over {pairs} model pairs" if pairs > 1 else ""
    return [f"Figure 5: loss barriers (the paper's: max - min along the path{over}) " + "; ".join(cells) +
            f"; lowest: {lowest} ({'as' if lowest == 'rotation' else 'unlike'} the paper, where full "
            "matching gives the lowest barrier)."] + peer_lines(csv_path, "vision")
