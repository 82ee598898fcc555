"""Each level's local model of a bench's runs: its width and depth ratios and its accuracy (ScaleFL Figure 2).

ScaleFL's Figure 2 shows, for every level of MSDNet-24, the local model the level trains (how much
of the global model's width and depth it keeps) and that model's accuracy, ScaleFL beside HeteroFL.
A preset asks for it with ``[report] levels = true``: ``levels.png`` beside the table, and a table of
the same numbers under it. A level's model is found among the models a run evaluates (``eval_specs``)
as the one equal to ``level_spec(level)``; its accuracy is the run's final headline accuracy of that
model (its last exit, or its ensemble, as the method infers) on the global test set, over the seeds.
A method whose levels all train one model (FedAvg on the smallest budget) shows that model at every level.
"""

from __future__ import annotations

import statistics

from ..config import Config
from ..report import headline_accuracy


def level_models(cfg: Config) -> list[dict]:
    """Per level of ``cfg``'s method: {"level", "model" (its evaluation label, None when it evaluates none such),
    "width", "depth"} (the ratios of the global model's width and blocks it keeps)."""
    from ..data import load_dataset
    from ..methods import build_method

    data = load_dataset(cfg.dataset, cfg.data_dir or None, cfg.max_length)  # cached per process
    method = build_method(cfg, data.input_shape, data.num_classes)
    evaluated = method.eval_specs()
    blocks = method.family.arch.num_blocks
    out = []
    for level in range(1, method.num_levels + 1):
        spec = method.level_spec(level)
        label = next((name for name, s in evaluated.items() if s == spec), None)
        out.append({"level": level, "model": label, "width": spec.width, "depth": spec.depth / blocks})
    return out


def level_accuracies(resolved: dict[str, Config], results: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Per run label: ``level_models`` with "accuracies", the final headline accuracy of the level's model in each
    seed's summary (empty where the run evaluates no such model)."""
    out = {}
    for label, cfg in resolved.items():
        rows = level_models(cfg)
        for row in rows:
            row["accuracies"] = [headline_accuracy(s["final"][row["model"]], s["headline"]) for s in results[label]
                                 if row["model"] in s.get("final", {})]
        out[label] = rows
    return out


def levels_table(levels: dict[str, list[dict]]) -> str:
    """Markdown: one row per run and level, its width and depth ratios, the mean accuracy (and its spread)."""
    lines = ["| run | level | model | width | depth | accuracy (%) | seeds |", "|---|---|---|---|---|---|---|"]
    for label, rows in levels.items():
        for row in rows:
            acc = [100 * a for a in row["accuracies"]]
            shown = "-" if not acc else f"{statistics.mean(acc):.2f}" + (
                f" ± {statistics.stdev(acc):.2f}" if len(acc) > 1 else "")
            lines.append(f"| {label} | {row['level']} | {row['model'] or '-'} | {row['width']:.2f} | "
                         f"{row['depth']:.2f} | {shown} | {len(acc)} |")
    return "\n".join(lines)
