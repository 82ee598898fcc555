"""Learning-curve plots (matplotlib, headless)."""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
import numpy as np  # noqa: E402

from .errors import HetflError  # noqa: E402
from .rundir import check_writable_folder, write_then_rename  # noqa: E402

MAX_CURVES_PER_PANEL = 8  # beyond this, one panel's colours repeat and its legend hides the curves


def panels(labels: list[str]) -> dict[str, list[str]]:
    """The labels by panel: more than ``MAX_CURVES_PER_PANEL`` curves are split by the last item in each
    label's closing parentheses ("FeDepth (Fair, α0.3)" -> "α0.3": one panel per data split), when
    every label has one and that makes 2-6 panels; otherwise one panel ("") holds them all."""
    if len(labels) <= MAX_CURVES_PER_PANEL:
        return {"": list(labels)}
    groups: dict[str, list[str]] = {}
    for label in labels:
        closing = re.search(r"\(([^()]*)\)\s*$", label)
        if closing is None:
            return {"": list(labels)}
        groups.setdefault(closing.group(1).split(",")[-1].strip(), []).append(label)
    return groups if 2 <= len(groups) <= 6 else {"": list(labels)}


def plot_curves(curves: dict[str, list[list[tuple[int, float]]]], path: str | Path, title: str = "") -> None:
    """Write a PNG of accuracy vs round: per label the mean over seeds, shaded by min..max; many labels are
    drawn in panels (``panels``) sharing the y axis."""
    groups = panels([label for label, runs in curves.items() if any(runs)])
    cols = min(len(groups), 3)
    rows = math.ceil(len(groups) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7 if cols == 1 else 5.5 * cols, 4.5 * rows), dpi=120,
                             sharey=True, squeeze=False)
    for ax, (panel, labels) in zip(axes.flat, groups.items()):
        for label in labels:
            runs = [r for r in curves[label] if r]
            length = min(len(r) for r in runs)
            rounds = [x for x, _ in runs[0][:length]]
            acc = np.array([[100 * y for _, y in r[:length]] for r in runs])
            ax.plot(rounds, acc.mean(0), label=label, marker="o" if length < 15 else None, ms=3)
            if len(runs) > 1:
                ax.fill_between(rounds, acc.min(0), acc.max(0), alpha=0.15)
        ax.set_xlabel("round")
        ax.set_title(panel, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("test accuracy (%)")
    for ax in axes.flat[len(groups):]:
        ax.set_visible(False)
    fig.suptitle(textwrap.fill(title, 60 * cols), fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def image_path(path: str | Path, flag: str) -> Path:
    """``path`` after checking that an image can be written there: a file name (not a folder) in an existing,
    writable folder, with an extension matplotlib writes (.png, .pdf, .svg, ...). Check it before the work that
    makes the image."""
    path = Path(path)
    formats = FigureCanvasAgg.get_supported_filetypes()
    fmt = path.suffix.lstrip(".").lower()
    if path.is_dir():
        raise HetflError(f"{flag} {path} is a folder; give an image file name such as {path / 'curves.png'}")
    if fmt not in formats:
        raise HetflError(f"{flag} {path}: cannot write images of format '{fmt or '(no extension)'}'; "
                         f"use one of: {', '.join(sorted(formats))}")
    parent = path.parent
    if not parent.is_dir():
        raise HetflError(f"{flag} {path}: folder {parent} does not exist")
    check_writable_folder(parent, f"{flag} {path}")
    return path


def save_figure(fig, path: str | Path) -> None:
    """Returns None; writes ``fig`` to ``path`` (its format from the extension) through a temporary file and a rename,
    so that a failed or killed write leaves no half image."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    try:
        write_then_rename(path, lambda tmp: fig.savefig(tmp, format=fmt))
    except OSError as e:
        raise HetflError(f"cannot write {path}: {e.strerror or e}") from None


def plot_levels(levels: dict[str, list[dict]], path: str | Path, title: str = "") -> None:
    """Write a PNG of each level's model (``bench.levels``): per level a bar per run (the mean accuracy over seeds,
    whiskers min..max), labelled with the width and depth ratios the model keeps (ScaleFL Figure 2); runs whose
    labels end in the same parenthesised setting ("(alpha 1)") share a panel."""
    groups: dict[str, list[str]] = {}
    for label in levels:
        closing = re.search(r"\(([^()]*)\)\s*$", label)
        groups.setdefault(closing.group(1) if closing else "", []).append(label)
    fig, axes = plt.subplots(1, len(groups), figsize=(6.5 * len(groups), 4.5), dpi=120, sharey=True, squeeze=False)
    for ax, (panel, labels) in zip(axes.flat, groups.items()):
        width = 0.8 / len(labels)
        for k, label in enumerate(labels):
            rows = [r for r in levels[label] if r["accuracies"]]
            x = np.array([r["level"] for r in rows]) - 0.4 + width * (k + 0.5)
            acc = [100 * np.array(r["accuracies"]) for r in rows]
            means = np.array([a.mean() for a in acc])
            spread = np.array([[m - a.min() for m, a in zip(means, acc)], [a.max() - m for m, a in zip(means, acc)]])
            name = re.sub(r"\s*\([^()]*\)\s*$", "", label) if panel else label
            ax.bar(x, means, width, yerr=spread, capsize=2, label=name)
            for xi, r in zip(x, rows):  # inside the bar's foot, clear of the whiskers
                ax.annotate(f"w{r['width']:.2f}\nd{r['depth']:.2f}", (xi, 0), xytext=(0, 3), textcoords="offset points",
                            ha="center", va="bottom", fontsize=6, color="white")
        ax.set_xticks(sorted({r["level"] for rows in levels.values() for r in rows}))
        ax.set_xlabel("level (its model: w = width ratio, d = depth ratio of the global model)")
        ax.set_title(panel, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # clear of the bars
    axes[0, 0].set_ylabel("accuracy of the level's model (%)")
    fig.suptitle(textwrap.fill(title, 70 * len(groups)), fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
