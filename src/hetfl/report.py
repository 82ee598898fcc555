"""Tables for people: the end-of-run summary and the bench's mean ± std Markdown table."""

from __future__ import annotations

import statistics


def _exit_columns(evaluations: list[dict]) -> list[str]:
    """Exit column names present in any of these evaluations, shallowest first, then the ensemble."""
    n = max((int(k[4:]) for e in evaluations for k in e if k.startswith("exit")), default=0)
    return [f"exit{i}" for i in range(1, n + 1)] + ["ensemble"]


def format_table(header: list[str], rows: list[list[str]], markdown: bool = False) -> str:
    """A column-aligned text table (or a Markdown one)."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = lambda cells: ("| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |") if markdown \
        else "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    sep = ("|" + "|".join("-" * (w + 2) for w in widths) + "|") if markdown else "  ".join("-" * w for w in widths)
    return "\n".join([line(header), sep] + [line(r) for r in rows])


def run_table(summary: dict) -> str:
    """The end-of-run table: one row per evaluated model, accuracy (%) of each exit and the ensemble."""
    final = summary["final"]
    columns = _exit_columns(list(final.values()))
    rows = [[label] + [f"{100 * ev[c]:.2f}" if c in ev else "-" for c in columns] for label, ev in final.items()]
    table = format_table(["model"] + columns, rows)
    if summary.get("local_accuracy") is not None:
        table += f"\nlocal accuracy (each client's level model on its own test split): {100 * summary['local_accuracy']:.2f}%"
    return (f"{table}\n{summary['method']} on {summary['dataset']} (seed {summary['seed']}), "
            f"{summary['rounds']} rounds: {summary['bytes_down_per_round'] / 1e6:.2f} MB down and "
            f"{summary['bytes_up_per_round'] / 1e6:.2f} MB up per round, {summary['wall_seconds']:.1f} s; "
            f"run folder {summary['run_dir']}")


def mean_std(values: list[float], scale: float = 100.0, digits: int = 2) -> str:
    """'mean ± std' of values times ``scale`` (std over seeds; 0 for one seed)."""
    if not values:
        return "-"
    m = statistics.fmean(values) * scale
    s = statistics.stdev(values) * scale if len(values) > 1 else 0.0
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def rounds_to_target(curve: list, target: float) -> int | None:
    """The first evaluated round whose accuracy reaches ``target`` (None if none does, or no target)."""
    return next((t for t, a in curve if a >= target), None) if target else None


def headline_accuracy(evaluation: dict, inference: str) -> float | None:
    """A model's headline accuracy: the ensemble's or the last exit's, as the method infers."""
    if inference == "ensemble":
        return evaluation.get("ensemble")
    exits = [int(k[4:]) for k in evaluation if k.startswith("exit")]
    return evaluation[f"exit{max(exits)}"] if exits else None


def metric_values(runs: list[dict], metric: str) -> list[float]:
    """One value per seed of ``metric``; seeds where it is undefined (a target never reached) are left out.

    ``accuracy``: the headline accuracy of the global model; ``MODEL/KEY``: e.g. ``global/exit4``,
    ``level1/ensemble``, ``width0.25/accuracy``; ``local``: local accuracy; ``best_accuracy``,
    ``best_round``, ``rounds_to_target``, ``bytes_down_per_round``, ``wall_seconds``: summary fields.
    """
    values = []
    for s in runs:
        if metric == "accuracy":
            value = s["accuracy"]
        elif metric == "local":
            value = s.get("local_accuracy")
        elif "/" in metric:
            model, key = metric.split("/", 1)
            ev = s["final"].get(model, {})
            value = headline_accuracy(ev, s["headline"]) if key == "accuracy" else ev.get(key)
        else:
            value = s.get(metric)
        if value is not None:
            values.append(value)
    return values


def _rounds_cell(runs: list[dict], key: str) -> str:
    """Mean ± std of a round count over the seeds that have one, and how many do."""
    values = [s[key] for s in runs if s.get(key) is not None]
    if not values:
        return "not reached"
    cell = mean_std(values, scale=1.0, digits=1)
    return cell if len(values) == len(runs) else f"{cell} ({len(values)}/{len(runs)})"


def bench_table(results: dict[str, list[dict]]) -> str:
    """Markdown table, one row per label: headline accuracy, every exit and the ensemble of the global
    model, local accuracy, rounds, traffic and time, mean ± std over seeds."""
    evaluations = [s["final"]["global"] for runs in results.values() for s in runs if "global" in s["final"]]
    columns = _exit_columns(evaluations)
    has_local = any(s.get("local_accuracy") is not None for runs in results.values() for s in runs)
    has_target = any(s.get("target_accuracy") for runs in results.values() for s in runs)
    rows = []
    for label, runs in results.items():
        cells = [mean_std(metric_values(runs, "accuracy"))]
        cells += [mean_std(metric_values(runs, f"global/{c}")) for c in columns]
        if has_local:
            cells.append(mean_std(metric_values(runs, "local")))
        cells.append(_rounds_cell(runs, "best_round"))
        if has_target:
            cells.append(_rounds_cell(runs, "rounds_to_target"))
        cells.append(mean_std(metric_values(runs, "bytes_down_per_round"), scale=1e-6))
        cells.append(mean_std(metric_values(runs, "wall_seconds"), scale=1.0, digits=1))
        rows.append([label, str(len(runs))] + cells)
    targets = sorted({s["target_accuracy"] for runs in results.values() for s in runs if s.get("target_accuracy")})
    header = (["method", "seeds", "accuracy (%)"] + [f"{c} (%)" for c in columns]
              + (["local (%)"] if has_local else []) + ["best round"]
              + ([f"rounds to {'/'.join(f'{100 * t:g}' for t in targets)}%"] if has_target else [])
              + ["MB down/round", "wall (s)"])
    return format_table(header, rows, markdown=True)


def models_table(results: dict[str, list[dict]], costs: dict[str, dict[str, dict]] | None = None) -> str:
    """Markdown table of every evaluated model of every label (levels, widths): headline accuracy,
    every exit, and with ``costs`` its parameters, MACs, CPU latency and accuracy drop from the global model."""
    evaluations = [ev for runs in results.values() for s in runs for ev in s["final"].values()]
    columns = _exit_columns(evaluations)
    rows = []
    for label, runs in results.items():
        models = list(runs[0]["final"])
        global_acc = metric_values(runs, "global/accuracy")
        for model in models:
            acc = metric_values(runs, f"{model}/accuracy")
            cells = [label, model, mean_std(acc)] + [mean_std(metric_values(runs, f"{model}/{c}")) for c in columns]
            if costs is not None:
                c = costs.get(label, {}).get(model)
                drop = statistics.fmean(global_acc) - statistics.fmean(acc) if acc and global_acc else None
                cells += ["-"] * 4 if c is None else [
                    f"{c['params']:,}", f"{c['macs'] / 1e6:,.2f}", f"{c['latency_ms']:.3f}",
                    "-" if drop is None else f"{100 * drop:.2f}"]
            rows.append(cells)
    header = (["method", "model", "accuracy (%)"] + [f"{c} (%)" for c in columns]
              + (["params", "MMACs/sample", "CPU latency (ms)", "drop vs global (pp)"] if costs is not None else []))
    return format_table(header, rows, markdown=True)


def check_claim(claim: dict, results: dict[str, list[dict]]) -> list[str]:
    """[claim, verdict, measured] for one preset claim, on the means over seeds. Three forms:

    * ``better`` beats ``worse`` (a label, or a list: every one of them) on ``metric``
      (``worse_metric`` for the other side when it differs; ``lower_is_better`` for round counts);
    * ``better`` reaches ``at_least`` on ``metric``;
    * the gain ``gain = [A, B]`` (A - B) exceeds the gain ``exceeds_gain = [C, D]``.
    """
    metric = claim.get("metric", "accuracy")
    lower = bool(claim.get("lower_is_better", False))
    scale = 1.0 if "round" in metric else 100.0

    def values(label, m=metric):
        return metric_values(results[label], m)

    def mean(label, m=metric):
        v = values(label, m)
        return statistics.fmean(v) if v else None

    def std(label, m=metric):
        v = values(label, m)
        return statistics.stdev(v) if len(v) > 1 else 0.0

    def shown(label, m=metric):
        return f"{label} {mean_std(values(label, m), scale=scale)}"

    text = claim.get("claim", "")
    if "gain" in claim:
        (a, b), (c, d) = claim["gain"], claim["exceeds_gain"]
        means = [mean(x) for x in (a, b, c, d)]
        measured = f"gain {scale * (means[0] - means[1]):+.2f} ({a} vs {b}); gain {scale * (means[2] - means[3]):+.2f} " \
                   f"({c} vs {d})" if None not in means else "a metric is missing"
        if None in means:
            return [text, "undecided", measured]
        return [text, "held" if means[0] - means[1] > means[2] - means[3] else "did not hold", measured]
    best = claim["better"]
    if "at_least" in claim:
        m = mean(best)
        verdict = "undecided" if m is None else ("held" if m >= claim["at_least"] else "did not hold")
        return [text, verdict, f"{shown(best)} (threshold {scale * claim['at_least']:g})"]
    worse = claim["worse"] if isinstance(claim["worse"], list) else [claim["worse"]]
    other = claim.get("worse_metric", metric)
    measured = "; ".join([shown(best)] + [shown(label, other) for label in worse])
    best_mean = mean(best)
    rivals = [(mean(label, other), std(label, other)) for label in worse]
    if best_mean is None or any(m is None for m, _ in rivals):
        return [text, "undecided (a metric is missing)", measured]
    beaten = [(best_mean < m) if lower else (best_mean > m) for m, _ in rivals]
    close = [abs(best_mean - m) <= max(std(best), s) for m, s in rivals]
    held = all(beaten)
    # held: is any win within noise? did not hold: is every loss within noise?
    noisy = any(close) if held else all(c for c, b in zip(close, beaten) if not b)
    return [text, ("held" if held else "did not hold") + (" (within seed noise)" if noisy else ""), measured]


def bench_report(preset: dict, results: dict[str, list[dict]], command: str, models: bool = False,
                 costs: dict | None = None) -> str:
    """The Markdown report of a bench: description, main table, models table, claims, how to regenerate."""
    seeds = sorted({s["seed"] for runs in results.values() for s in runs})
    parts = [f"# {preset.get('title', 'bench')}", preset.get("description", "").strip(),
             "## Global model", bench_table(results)]
    if models or costs is not None:
        parts += ["## Every evaluated model", models_table(results, costs)]
    if preset.get("claims"):
        rows = [check_claim(c, results) for c in preset["claims"]]
        parts += ["## Claims checked", format_table(["claim", "verdict", "measured (mean ± std over seeds)"],
                                                    rows, markdown=True),
                  "A claim holds when the mean over seeds is better; \"within seed noise\" when the gap is "
                  "not larger than the larger of the two standard deviations."]
    parts.append(f"Accuracy in % on the test set, mean ± std over seeds {seeds}. \"accuracy\" is the "
                 "method's own prediction (the last exit, or the ensemble = mean of the exits' logits); "
                 "\"best round\" is the round of the best accuracy; traffic is the mean over rounds of the "
                 "bytes sent to clients." + (" With one seed there is no estimate of seed noise: read gaps "
                                             "of a point or less as undecided." if len(seeds) == 1 else ""))
    parts.append(f"Regenerate: `{command}`")
    return "\n\n".join(p for p in parts if p) + "\n"
