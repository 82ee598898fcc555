"""Human-readable views of a partition: a text table of class counts per client, and a PNG heat map."""

from __future__ import annotations

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..plots import save_figure
from .partition import class_histogram

MAX_ROWS = 20  # clients listed in the table; the rest are summarised


def describe_partition(labels: torch.Tensor, parts: list[torch.Tensor], num_classes: int) -> str:
    """A text table of each client's size and per-class counts (first MAX_ROWS clients), then summary lines."""
    hist = class_histogram(labels, parts, num_classes)
    header = ["client", "samples"] + [f"c{c}" for c in range(num_classes)]
    rows = [[str(k), str(int(row.sum()))] + [str(int(v)) for v in row] for k, row in enumerate(hist[:MAX_ROWS])]
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    lines = [" ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in [header, *rows]]
    if len(hist) > MAX_ROWS:
        lines.append(f"... {len(hist) - MAX_ROWS} more clients")
    return "\n".join(lines + [_summary(hist)])


def _summary(hist: torch.Tensor) -> str:
    """One line: client count, total samples, min/median/max client size, mean classes present per client."""
    if len(hist) == 0:
        return "0 clients"
    sizes = hist.sum(1)
    present = (hist > 0).sum(1).double().mean()
    return (f"{len(hist)} clients, {int(sizes.sum())} samples; client size min {int(sizes.min())} / "
            f"median {int(sizes.median())} / max {int(sizes.max())}; classes per client: mean {present:.2f}")


def plot_heatmap(hist: torch.Tensor, path: str, title: str = "") -> None:
    """Returns None after writing a PNG heat map of ``hist`` (clients x classes sample counts) to ``path``."""
    fig = Figure(figsize=(min(2 + 0.3 * hist.shape[1], 16), min(1.5 + 0.15 * hist.shape[0], 12)))
    FigureCanvasAgg(fig)  # render with Agg, independent of pyplot's global backend
    ax = fig.add_subplot()
    image = ax.imshow(hist.cpu().numpy(), aspect="auto", interpolation="nearest", cmap="viridis")
    fig.colorbar(image, ax=ax, label="samples")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    save_figure(fig, path)
