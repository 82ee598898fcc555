"""Tables for people: the end-of-run summary, the bench's mean ± std Markdown tables and its claim checks.

A cell that averages over seeds shows "(k/n)" when only k of the n seeds have a value. A claim is
decided on every seed, each of its comparisons by a two-sided Welch t-test (see ``check_claim``).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter

from .machine import device_seconds, device_type


def _exit_columns(evaluations: list[dict]) -> list[str]:
    """Exit column names present in any of these evaluations, shallowest first, then the ensemble and, with
    several exits, their mean accuracy."""
    n = max((depth for e in evaluations for depth in exit_accuracies(e)), default=0)
    return [f"exit{i}" for i in range(1, n + 1)] + ["ensemble"] + (["exits_mean"] if n > 1 else [])


def exit_accuracies(evaluation: dict) -> dict[int, float]:
    """A model's accuracy at each of its exits, by exit depth (1 = the shallowest)."""
    return {int(k[4:]): v for k, v in evaluation.items() if k.startswith("exit") and k[4:].isdigit()}


def exits_mean(evaluation: dict) -> float | None:
    """The mean accuracy over a model's exits (ReeFL Tables 1-2's headline metric), None without exits."""
    values = list(exit_accuracies(evaluation).values())
    return sum(values) / len(values) if values else None


def exits_mean_by_depth(final: dict[str, dict]) -> float | None:
    """The mean over exit depths of each exit's accuracy, an exit read from the global model where it has it and
    otherwise from the sub-model (level) that ends in it; None without exits.

    ReeFL Tables 1-2 average "all exits" of every baseline; InclusiveFL's exit k is the head of its depth-k
    sub-model (the global model has only the last), so its mean is over its sub-models. For a method whose global
    model holds every exit this is ``global/exits_mean``."""
    by_depth: dict[int, float] = {}
    for model in ["global", *sorted(m for m in final if m != "global")]:
        for depth, value in exit_accuracies(final[model]).items():
            by_depth.setdefault(depth, value)
    return sum(by_depth.values()) / len(by_depth) if by_depth else None


def evaluation_value(evaluation: dict, key: str) -> float | None:
    """``key`` of one model's evaluation ("exit2", "ensemble", "loss", or "exits_mean"), None if absent."""
    return exits_mean(evaluation) if key == "exits_mean" else evaluation.get(key)


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
    rows = [[label] + [f"{100 * v:.2f}" if (v := evaluation_value(ev, c)) is not None else "-" for c in columns]
            for label, ev in final.items()]
    table = format_table(["model"] + columns, rows)
    if summary.get("local_accuracy") is not None:
        table += f"\nlocal accuracy (each client's level model on its own test split): {100 * summary['local_accuracy']:.2f}%"
    if privacy := summary.get("privacy"):
        table += (f"\ndifferential privacy: epsilon {privacy['epsilon']:.3g} at delta {privacy['delta']:.3g} spent "
                  f"(noise multiplier {privacy['noise_multiplier']:.4g}, clipping {privacy['clipping']})")
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
    exits = list(exit_accuracies(evaluation))
    return evaluation[f"exit{max(exits)}"] if exits else None


def metric_value(summary: dict, metric: str) -> float | None:
    """``metric`` of one run, None where it is undefined (a target never reached, a model or exit not evaluated).

    ``accuracy``: the headline accuracy of the global model; ``MODEL/KEY``: e.g. ``global/exit4``,
    ``level1/ensemble``, ``global/exits_mean``, ``width0.25/accuracy``; ``local``: local accuracy; ``best_accuracy``,
    ``best_round``, ``rounds_to_target``, ``bytes_down_per_round``, ``wall_seconds``, ``max_memory_ratio`` (the
    largest measured step memory / budget of any client and round), ``within_budget`` (the share of client-rounds
    whose steps all stayed within budget): summary fields; ``late_gain``: the headline accuracy's gain over the
    last third of the rounds (``late_gain``); ``MODEL/drop``: the global model's headline accuracy minus MODEL's;
    ``exits_mean_by_depth``: the mean over exit depths, each from the global model or the sub-model ending in it;
    ``accuracy@N``: the headline accuracy at round N (``accuracy_at``).
    """
    if metric == "accuracy":
        return summary["accuracy"]
    if metric == "late_gain":
        return late_gain(summary.get("curve") or [], summary.get("rounds", 0))
    if (at := round_of(metric)) is not None:
        return accuracy_at(summary.get("curve") or [], at)
    if metric == "local":
        return summary.get("local_accuracy")
    if metric == "exits_mean_by_depth":
        return exits_mean_by_depth(summary["final"])
    if "/" in metric:
        model, key = metric.split("/", 1)
        if key == "drop":
            ours, top = metric_value(summary, f"{model}/accuracy"), metric_value(summary, "global/accuracy")
            return None if ours is None or top is None else top - ours
        ev = summary["final"].get(model, {})
        return headline_accuracy(ev, summary["headline"]) if key == "accuracy" else evaluation_value(ev, key)
    return summary.get(metric)


PLATEAU_GAIN = 0.01  # a run has plateaued when its last third of rounds gained less than this accuracy


def round_of(metric: str) -> int | None:
    """N of an ``accuracy@N`` metric, else None."""
    name, _, at = metric.partition("@")
    return int(at) if name == "accuracy" and at.isdigit() else None


def accuracy_at(curve: list, round_: int) -> float | None:
    """The accuracy at the last evaluation within the first ``round_`` rounds (None without one): a claim about a
    round count ("85% within 30 rounds") checked on a run of any length, as a run of that length measures it."""
    within = [a for t, a in curve if t <= round_]
    return within[-1] if within else None


def late_gain(curve: list, rounds: int) -> float | None:
    """The final accuracy minus the one at the last evaluation within the first two thirds of the rounds
    (None without such an evaluation): how much the run still gained at the end."""
    early = [a for t, a in curve if t <= 2 * rounds / 3]
    return curve[-1][1] - early[-1] if early and curve else None


def row_late_gains(results: dict[str, list[dict]]) -> dict[str, float]:
    """Each row's last-third gain, the mean over the seeds that have one (rows without a curve left out): the
    plateau criterion of a table: a row has plateaued when this is under ``PLATEAU_GAIN``."""
    gains = {label: [g for g in metric_values(runs, "late_gain") if g is not None] for label, runs in results.items()}
    return {label: statistics.fmean(g) for label, g in gains.items() if g}


def _seconds_per_round(runs: list[dict]) -> float | None:
    """Wall seconds per round of a row, mean over its seeds (None without a measured wall time)."""
    rates = [s["wall_seconds"] / s["rounds"] for s in runs if s.get("wall_seconds") and s.get("rounds")]
    return statistics.fmean(rates) if rates else None


def _cost_per_100_rounds(results: dict[str, list[dict]], labels: list[str], rows: str) -> str:
    """A sentence: the wall hours 100 more rounds of the rows ``labels`` (called ``rows``) cost at this table's
    measured pace, every seed, on the devices their runs computed on ('' without such rows or wall times)."""
    timed = [(label, rate) for label in labels if (rate := _seconds_per_round(results[label])) is not None]
    if not timed:
        return ""
    hours = sum(rate * 100 * len(results[label]) for label, rate in timed) / 3600
    devices = "/".join(sorted({s.get("device", "cpu") for label, _ in timed for s in results[label]}))
    untimed = f" ({len(labels) - len(timed)} without wall times left out)" if len(timed) < len(labels) else ""
    minutes = round(60 * hours)
    took = f"{hours:.1f} wall hours" if hours >= 1 else f"{minutes} wall minute{'' if minutes == 1 else 's'}"
    return (f" What a longer horizon costs, measured: every 100 more rounds of {rows}{untimed} take {took} at this "
            f"table's pace ({devices}, every seed; runs that shared the device each count their whole wall time).")


def _pilot_row(pilots: list[dict], label: str) -> tuple[dict, dict] | None:
    """The longest pilot that ran ``label`` and its reading over the seeds it ran: the seeds, the last round all
    reached, the latest plateau round (None where a seed had not plateaued by its last round) and the pilot's
    seconds per round (mean over its seeds; None if it kept no time)."""
    ran = [(p, [r for r in p["rows"] if r["label"] == label]) for p in pilots]
    ran = [(p, rows) for p, rows in ran if rows]
    if not ran:
        return None
    pilot, rows = max(ran, key=lambda pr: min(r["last_round"] for r in pr[1]))
    plateaus = [r["plateau_round"] for r in rows]
    paces = [r["train_seconds"] / r["last_round"] for r in rows if r.get("train_seconds") and r["last_round"]]
    return pilot, {"seeds": ", ".join(str(r["seed"]) for r in rows), "last_round": min(r["last_round"] for r in rows),
                   "plateau_round": None if None in plateaus else max(plateaus),
                   "pace": statistics.fmean(paces) if paces else None}


def _rounds_of(results: dict[str, list[dict]]) -> str:
    """The horizon of a table's runs: '150', or '100-150' where they differ."""
    horizons = sorted({s["rounds"] for runs in results.values() for s in runs if s.get("rounds")})
    return f"{horizons[0]}" if len(horizons) == 1 else f"{horizons[0]}-{horizons[-1]}"


def horizon_gains(results: dict[str, list[dict]], shorter: tuple[str, dict[str, list[dict]]] | None) -> str:
    """What a longer horizon added to each row, seed by seed: ``shorter`` is (name, results by label) of the same
    rows at fewer rounds (the preset this one ``extends``), and a row's horizon gain is its final accuracy here
    minus there, over the seeds both ran. A step size that decays to zero at the last round (cosine) puts the
    decay's gain into the last third of any horizon, so a last-third gain mixes what more rounds add with what
    the schedule's last steps add; the horizon gain is the first alone (under a point: no longer rising)."""
    if not shorter or not results:
        return ""
    name, before = shorter
    rows = []
    for label, runs in results.items():
        then = {s["seed"]: s for s in before.get(label, []) if s.get("accuracy") is not None}
        pairs = [(then[s["seed"]], s) for s in runs if s["seed"] in then and s.get("accuracy") is not None]
        if pairs:
            gain = mean_std([b["accuracy"] - a["accuracy"] for a, b in pairs])
            rows.append([label, ", ".join(str(now["seed"]) for _, now in pairs),
                         mean_std([a["accuracy"] for a, _ in pairs]), mean_std([b["accuracy"] for _, b in pairs]),
                         gain if gain.startswith("-") else f"+{gain}"])
    if not rows:
        return ""
    r0, r1 = _rounds_of(before), _rounds_of(results)
    return (f"Against `{name}`, the same rows at {r0} rounds (the preset this one extends), seed by seed: what "
            f"{r1} rounds added to each row's final accuracy. Where the step size decays to zero at the last round (a "
            "cosine schedule), the last third of any horizon holds the decay's gain and the last-third gain measures "
            "the schedule as well; a horizon gain under a point says a row no longer rises with more rounds.\n\n"
            + format_table(["row", "seeds", f"accuracy at {r0} rounds (%)", f"accuracy at {r1} rounds (%)",
                            "horizon gain (pp)"], rows, markdown=True))


def horizon_section(results: dict[str, list[dict]], pilots: list[dict] | None = None, interim: bool = False,
                    shorter: tuple[str, dict[str, list[dict]]] | None = None) -> str:
    """Which rows have not plateaued, and where a pilot says they would, at what cost measured here.

    ``pilots``: the pilot records (``scripts/plateau.py --json``) of this preset: each a dict with ``file``,
    ``device``, ``rounds`` and ``rows`` (``label``, ``seed``, ``last_round``, ``plateau_round``). The cost of a
    row at its pilot's plateau round is this table's own wall seconds per round (mean over seeds, on the
    device its runs computed on) times that round times the table's seeds; where the pilot did not plateau by
    its last round, the cost at that round is a lower bound ("> "). ``interim``: some runs are not finished, and
    the section speaks of the rows run so far. ``shorter``: see ``horizon_gains``."""
    gains = row_late_gains(results)
    if not gains:
        return ""
    at = _rounds_of(results)
    gaining = {label: g for label, g in gains.items() if g >= PLATEAU_GAIN}
    so_far = " run so far" if interim else ""
    against = horizon_gains(results, shorter)
    if not gaining:
        return "\n\n".join(p for p in (
            f"## Horizon\n\nAt {at} rounds every row{so_far} has plateaued: its last-third gain, mean over seeds, "
            f"is under {100 * PLATEAU_GAIN:g} point (largest: {100 * max(gains.values()):+.2f}).", against) if p)
    parts = [f"At {at} rounds {len(gaining)} of {len(gains)} rows{so_far} still gain {100 * PLATEAU_GAIN:g} point or "
             "more over their last third (mean over seeds), so the verdicts on them measure the horizon as well as the "
             "methods: " + ", ".join(f"{label} {100 * g:+.2f}" for label, g in gaining.items()) + "."]
    parts += [against] if against else []
    rows, total, lower_bound, used, unpiloted = [], 0.0, False, {}, []
    for label, g in gaining.items():
        runs = results[label]
        rate = _seconds_per_round(runs)
        here = "-" if rate is None else f"{rate:.1f} ({'/'.join(sorted({s.get('device', 'cpu') for s in runs}))})"
        found = _pilot_row(pilots or [], label)
        if found is None:
            rows.append([label, f"{100 * g:+.2f}", "none", "-", "-", "-", here, "-"])
            unpiloted.append(label)
            continue
        pilot, row = found
        used[pilot["file"]] = pilot
        horizon = row["plateau_round"] or row["last_round"]
        bound = "" if row["plateau_round"] else "> "
        hours = None if rate is None else rate * horizon * len(runs) / 3600
        if hours is not None:
            total += hours
            lower_bound |= bool(bound)
        rows.append([label, f"{100 * g:+.2f}", f"{pilot['file']} (seeds {row['seeds']})",
                     f"{row['last_round']} of {pilot['rounds']}",
                     str(row["plateau_round"]) if row["plateau_round"] else f"not by {row['last_round']}",
                     "-" if row["pace"] is None else f"{row['pace']:.1f}", here,
                     "-" if hours is None else f"{bound}{hours:.1f}"])
    others = f"the {len(unpiloted)} rows no pilot ran" if len(unpiloted) > 1 else "the row no pilot ran"
    cost = _cost_per_100_rounds(results, unpiloted, others if used else "these rows")
    if not used:
        parts.append("No pilot at a longer horizon has run these rows yet (`scripts/plateau.py`)." + cost)
        return "## Horizon\n\n" + "\n\n".join(parts)
    parts.append("Where a pilot at a longer horizon says they plateau: the first round from which every longer "
                 "horizon it reached gains under a point over its last third (`scripts/plateau.py`; it holds for the "
                 "learning-rate schedule the pilot ran). The pilots ran on "
                 + "; ".join(f"{p['device']} ({name})" for name, p in used.items()) + ". The cost of a row there is "
                 "this table's wall seconds per round (mean over seeds, on the device its runs computed on) times "
                 "the plateau round times this table's seeds; a row the pilot left short of a plateau costs more "
                 "(\"> \"). The pilot's own pace (its training seconds per round, on its device, which other "
                 "runs may have shared) is beside it: wall times compare on one device under one load only.")
    parts.append(format_table(["row", "last-third gain (pp)", "pilot", "pilot's rounds", "plateau round",
                               "s / round in the pilot", "s / round here", "wall hours at the plateau"], rows,
                              markdown=True))
    parts.append(f"Together: {'> ' if lower_bound else ''}{total:.1f} wall hours, for the rows a pilot ran." + cost)
    return "## Horizon\n\n" + "\n\n".join(parts)


def metric_values(runs: list[dict], metric: str) -> list[float | None]:
    """One value of ``metric`` per seed, None where it is undefined: no seed is ever left out."""
    return [metric_value(s, metric) for s in runs]


def _k_of_n(cell: str, k: int, n: int) -> str:
    """``cell`` with '(k/n)' appended when only k of the n seeds have a value."""
    return cell if k == n else f"{cell} ({k}/{n})"


def seed_cell(runs: list[dict], metric: str, scale: float = 100.0, digits: int = 2, missing: str = "-") -> str:
    """'mean ± std' of ``metric`` over the seeds that have it, '(k/n)' when only k of the n do, else ``missing``."""
    values = [v for v in metric_values(runs, metric) if v is not None]
    return _k_of_n(mean_std(values, scale, digits), len(values), len(runs)) if values else missing


def bench_table(results: dict[str, list[dict]]) -> str:
    """Markdown table, one row per label: headline accuracy, every exit and the ensemble of the global
    model, local accuracy, rounds, traffic and time, mean ± std over seeds."""
    evaluations = [s["final"]["global"] for runs in results.values() for s in runs if "global" in s["final"]]
    columns = _exit_columns(evaluations)
    has_local = any(s.get("local_accuracy") is not None for runs in results.values() for s in runs)
    has_target = any(s.get("target_accuracy") for runs in results.values() for s in runs)
    has_memory = any(s.get("max_memory_ratio") is not None for runs in results.values() for s in runs)
    rows = []
    for label, runs in results.items():
        cells = [seed_cell(runs, "accuracy")] + [seed_cell(runs, f"global/{c}") for c in columns]
        if has_local:
            cells.append(seed_cell(runs, "local"))
        cells += [seed_cell(runs, "best_accuracy"), seed_cell(runs, "late_gain")]
        cells.append(seed_cell(runs, "best_round", scale=1.0, digits=1))
        if has_target:
            cells.append(seed_cell(runs, "rounds_to_target", scale=1.0, digits=1, missing="not reached"))
        if has_memory:
            cells.append(seed_cell(runs, "max_memory_ratio", scale=1.0, digits=3))
            cells.append(seed_cell(runs, "within_budget"))
        cells.append(seed_cell(runs, "bytes_down_per_round", scale=1e-6))
        cells.append(seed_cell(runs, "wall_seconds", scale=1.0, digits=1))
        rows.append([label, str(len(runs))] + cells)
    targets = sorted({s["target_accuracy"] for runs in results.values() for s in runs if s.get("target_accuracy")})
    header = (["method", "seeds", "accuracy (%)"] + [f"{c} (%)" for c in columns]
              + (["local (%)"] if has_local else []) + ["best (%)", "last-third gain (pp)", "best round"]
              + ([f"rounds to {'/'.join(f'{100 * t:g}' for t in targets)}%"] if has_target else [])
              + (["max memory/budget", "client-rounds within budget (%)"] if has_memory else [])
              + ["MB down/round", "wall (s)"])
    return format_table(header, rows, markdown=True)


def _drop_cell(runs: list[dict], model: str) -> str:
    """Mean accuracy drop (points) from the global model to ``model`` over the seeds that have both."""
    pairs = zip(metric_values(runs, "global/accuracy"), metric_values(runs, f"{model}/accuracy"))
    drops = [g - a for g, a in pairs if g is not None and a is not None]
    return _k_of_n(f"{100 * statistics.fmean(drops):.2f}", len(drops), len(runs)) if drops else "-"


def models_table(results: dict[str, list[dict]], costs: dict[str, dict[str, dict]] | None = None) -> str:
    """Markdown table of every evaluated model of every label (levels, widths): headline accuracy,
    every exit, and with ``costs`` its parameters, MACs, CPU latency and accuracy drop from the global model."""
    evaluations = [ev for runs in results.values() for s in runs for ev in s["final"].values()]
    columns = _exit_columns(evaluations)
    rows = []
    for label, runs in results.items():
        for model in runs[0]["final"]:
            cells = [label, model, seed_cell(runs, f"{model}/accuracy")]
            cells += [seed_cell(runs, f"{model}/{c}") for c in columns]
            if costs is not None:
                c = costs.get(label, {}).get(model)
                cells += ["-"] * 4 if c is None else [
                    f"{c['params']:,}", f"{c['macs'] / 1e6:,.2f}", f"{c['latency_ms']:.3f}", _drop_cell(runs, model)]
            rows.append(cells)
    header = (["method", "model", "accuracy (%)"] + [f"{c} (%)" for c in columns]
              + (["params", "MMACs/sample", "CPU latency (ms)", "drop vs global (pp)"] if costs is not None else []))
    return format_table(header, rows, markdown=True)


def privacy_table(results: dict[str, list[dict]]) -> str:
    """Markdown table of every evaluated model of every label under differential privacy: the epsilon its run spent
    (at its delta; "inf": no DP), its accuracy and the noise std that each of its coordinates kept after the division
    by the clients that held it (mean over its coordinates and the rounds, in the clip norm's units times C), mean ±
    std over seeds; empty when no run is private."""
    if not any(s.get("privacy") for runs in results.values() for s in runs):
        return ""
    rows = []
    for label, runs in results.items():
        private = [s["privacy"] for s in runs if s.get("privacy")]
        spent = (f"{statistics.fmean(p['epsilon'] for p in private):.3g} at delta {private[0]['delta']:.2g}"
                 if private else "inf")
        for model in runs[0]["final"]:
            noise = [p.get("noise_per_coordinate", {}).get(model) for p in private]
            noise_cell = mean_std([v for v in noise if v is not None], 1.0, 4) if private else "0"
            rows.append([label, model, spent, seed_cell(runs, f"{model}/accuracy"), noise_cell])
    return format_table(["run", "model", "epsilon spent", "accuracy (%)", "noise std per coordinate after division"],
                        rows, markdown=True)


# Seed noise: Welch's t-test. The statistic and its degrees of freedom are computed here (a claim tests a linear
# combination of several runs' means, which no scipy test takes); the t distribution is scipy's.

ALPHA = 0.05  # two-sided significance threshold of every comparison a claim makes
# other processes' busy cores above which a latency was timed on a contended machine: no latency claim is decided
BUSY_CORES = 0.5


def t_pvalue(t: float, df: float) -> float:
    """Returns the two-sided p-value P(|T| >= |t|) of Student's t with ``df`` (possibly fractional) degrees of
    freedom."""
    from scipy import stats  # here, not at the top: sim.py imports this module, and only claims need scipy

    return float(2.0 * stats.t.sf(abs(t), df))  # the upper tail doubled: accurate however small p is


def welch_test(terms: list[tuple[float, list[float]]], offset: float = 0.0) -> tuple[float, float | None]:
    """(estimate, two-sided p) of sum(c * mean(values)) - offset over independent samples (c, values).

    Welch's t: standard error sqrt(sum(c^2 s^2 / n)), Welch-Satterthwaite degrees of freedom. One sample
    and an offset is the one-sample test against a threshold; +1/-1 the two-sample test; +1/-1/-1/+1 the
    difference of two differences. p is None when a sample has one value (no noise estimate).
    """
    estimate = sum(c * statistics.fmean(v) for c, v in terms) - offset
    if any(len(v) < 2 for _, v in terms):
        return estimate, None
    parts = [(c * c * statistics.variance(v) / len(v), len(v)) for c, v in terms]
    se2 = sum(part for part, _ in parts)
    if se2 == 0:  # identical seeds on every side: the difference is exact
        return estimate, 0.0 if estimate else 1.0
    df = se2 ** 2 / sum(part ** 2 / (n - 1) for part, n in parts)
    return estimate, t_pvalue(estimate / math.sqrt(se2), df)


# Claims.

def as_list(value) -> list:
    """``value`` if it is a list, else a list of it."""
    return value if isinstance(value, list) else [value]


def _comparisons(claim: dict) -> list[tuple[list[tuple[tuple[str, str], float]], float]]:
    """Every comparison the claim makes as (terms, offset), terms [((label, metric), coefficient)]: the claim
    says sum(c * mean) - offset > 0. Better minus worse for every pair; the mean minus ``at_least``; A - B - C + D."""
    metric = claim.get("metric", "accuracy")
    if "gain" in claim:
        (a, b), (c, d) = claim["gain"], claim["exceeds_gain"]
        other = claim.get("exceeds_metric", metric)  # the second gain may be another model's of the same runs
        return [([((a, metric), 1.0), ((b, metric), -1.0), ((c, other), -1.0), ((d, other), 1.0)], 0.0)]
    if "at_least" in claim:
        return [([((claim["better"], metric), 1.0)], claim["at_least"])]
    worse = as_list(claim["worse"])
    others = as_list(claim.get("worse_metric", metric))
    others = others * len(worse) if len(others) == 1 else others
    return [([((b, metric), 1.0), ((w, m), -1.0)], 0.0)
            for b in as_list(claim["better"]) for w, m in zip(worse, others)]


def claim_labels(claim: dict) -> set[str]:
    """The rows whose runs the claim compares (none for a ``cost_ratio`` claim, which compares models)."""
    if "cost_ratio" in claim:
        return set()
    return {label for terms, _ in _comparisons(claim) for (label, _), _ in terms}


def _merged(terms: list, values: dict) -> list[tuple[float, list[float]]]:
    """(coefficient, values) per distinct sample: a sample named twice gets the sum (its mean cancels out)."""
    coefficients: dict = {}
    for key, c in terms:
        coefficients[key] = coefficients.get(key, 0.0) + c
    return [(c, values[key]) for key, c in coefficients.items() if c]


def _p(p: float) -> str:
    """A p-value as shown: two significant digits."""
    return "p<0.001" if p < 0.001 else f"p={p:.2g}"


def _fails_significantly(outcome: tuple[bool, float | None]) -> bool:
    """Whether a comparison's (claimed way, p) goes against the claim with p < ALPHA."""
    ok, p = outcome
    return not ok and p is not None and p < ALPHA


def _verdict(outcomes: list[tuple[bool, float | None] | None], undecided: str) -> str:
    """The claim's verdict from its comparisons' (claimed way, p), None for one that could not be made."""
    tested = [o for o in outcomes if o is not None]
    if any(map(_fails_significantly, tested)):
        return "did not hold"  # a significant failure decides, whatever the comparisons not made
    if len(tested) < len(outcomes):
        return f"undecided ({undecided})"
    held = all(ok for ok, _ in tested)
    deciding = [p for ok, p in tested if ok == held]  # every comparison when it held; the failed ones if not
    word = "held" if held else "did not hold"
    if None in deciding:
        return f"{word} (one seed: no noise estimate)"
    p = max(deciding) if held else min(deciding)
    return word if p < ALPHA else f"{word} (not significant: {_p(p)})"


def check_cost_claim(claim: dict, costs: dict | None) -> list[str]:
    """[claim, verdict, measured] for ``cost_ratio = [A, B]``: model A's ``cost`` (params, macs, latency_ms)
    over model B's, of the run ``better``, reaches ``at_least`` (measured once: no seeds, no test)."""
    (a, b), label, kind = claim["cost_ratio"], claim["better"], claim.get("cost", "params")
    rows = (costs or {}).get(label, {})
    if a not in rows or b not in rows:
        return [claim.get("claim", ""), "undecided (no cost table: set costs = true under [report])", "-"]
    ratio = rows[a][kind] / rows[b][kind]
    measured = f"{label}: {kind} of {a} / {b} = {rows[a][kind]:,.4g} / {rows[b][kind]:,.4g} = {ratio:.2f}x " \
               f"against {claim['at_least']:g}x"
    if kind == "latency_ms" and (busy := _busy_note(rows[a]) or _busy_note(rows[b])):
        return [claim.get("claim", ""), f"undecided (latency timed while {busy})", measured]
    return [claim.get("claim", ""), "held" if ratio >= claim["at_least"] else "did not hold", measured]


def _busy_note(row: dict) -> str:
    """What made a cost row's latency unfit to decide a claim ("other processes kept 1.9 of 2 cores busy"), or ""
    when other processes kept under ``BUSY_CORES`` busy while it was timed (or nobody measured it)."""
    others = row.get("others_busy_cores")
    return "" if others is None or others < BUSY_CORES else \
        f"other processes kept {others:.1f} of {row['cores']} cores busy"


def latency_note(costs: dict[str, dict[str, dict]] | None) -> str:
    """Under the models table: how its CPU latencies were timed and how busy the machine was meanwhile."""
    rows = [row for models in (costs or {}).values() for row in models.values() if row.get("latency_ms") is not None]
    if not rows:
        return ""
    note = ("CPU latency: median of single-sample forward passes in eval mode on one thread (`hetfl.costs."
            "latencies_ms`), timed when this table was written")
    busiest = [row for row in rows if row.get("others_busy_cores") is not None]
    if busiest:
        worst = max(busiest, key=lambda row: row["others_busy_cores"])
        note += (f", while other processes kept at most {worst['others_busy_cores']:.2f} of {worst['cores']} cores "
                 f"busy (a latency claim is decided only below {BUSY_CORES:g})")
    return note + "."


def check_claim(claim: dict, results: dict[str, list[dict]], costs: dict | None = None,
                pending: frozenset[str] = frozenset()) -> list[str]:
    """[claim, verdict, measured] for one preset claim; every comparison a two-sided Welch t-test over every seed.

    Three forms: ``better`` beats ``worse`` on ``metric`` (one side may be a list: each of it is compared;
    ``worse_metric``, one or one per worse label, for the other side; ``lower_is_better`` for round
    counts); ``better`` reaches ``at_least`` on ``metric`` (one-sample test); the gain ``gain = [A, B]``
    (A - B) exceeds the gain ``exceeds_gain = [C, D]`` (the difference of differences and its combined
    standard error; ``exceeds_metric``: the second gain's metric, default ``metric``).

    Verdicts: "did not hold" when a comparison goes against the claim with p < ALPHA. Else, a comparison
    with a label not run, or a seed where a compared value is undefined, makes the claim "undecided
    (not run)" or "undecided (k of n seeds)" ("target reached by k of n runs" for rounds to a target,
    which every compared run must share). Else "held" when every comparison goes the claimed way at
    p < ALPHA; "held (not significant: p)" when they all go that way but not all significantly (the
    largest p); "did not hold (not significant: p)" when some go the other way, none significantly (the
    smallest p); with one seed on a side there is no noise estimate, and the verdict says so.
    A fourth form, ``cost_ratio``, compares measured costs (``check_cost_claim``). ``pending``: the labels with
    seeds not run yet (an interim table); a comparison of one is "undecided (seeds not all run yet)", even when it
    already fails significantly: every seed counts, and a spread over the first seeds can understate the noise
    (fedepth-table2-150's FeDepth (Fair, β2) ended 66.68 and 67.06 on two seeds and 74.48 on the third).
    """
    if "cost_ratio" in claim:
        return check_cost_claim(claim, costs)
    comparisons = _comparisons(claim)
    width = max(len(terms) for terms, _ in comparisons)  # every comparison's first sample (better) first
    samples = list(dict.fromkeys(terms[i][0] for i in range(width) for terms, _ in comparisons if i < len(terms)))
    values = {key: metric_values(results[key[0]], key[1]) for key in samples if key[0] in results}
    rounds = any(m == "rounds_to_target" for _, m in samples)
    if rounds and len({s.get("target_accuracy") for label, _ in samples for s in results.get(label, [])}) > 1:
        return [claim.get("claim", ""), "undecided (different targets)", _measured(claim, results, samples, [])]
    sign = -1.0 if claim.get("lower_is_better") else 1.0
    outcomes = []
    for terms, offset in comparisons:
        if any(key not in values or None in values[key] for key, _ in terms):
            outcomes.append(None)
            continue
        estimate, p = welch_test(_merged(terms, values), offset)
        outcomes.append((sign * estimate >= 0 if "at_least" in claim else sign * estimate > 0, p))
    # an interim table: a comparison of a row whose seeds are not all run decides nothing yet
    deciding = [None if pending & {label for (label, _), _ in terms} else o
                for (terms, _), o in zip(comparisons, outcomes)]
    n, k = sum(map(len, values.values())), sum(x is not None for v in values.values() for x in v)
    undecided = ("not run" if len(values) < len(samples)
                 else "seeds not all run yet" if deciding != outcomes
                 else f"target reached by {k} of {n} runs" if rounds else f"{k} of {n} seeds")
    return [claim.get("claim", ""), _verdict(deciding, undecided), _measured(claim, results, samples, outcomes)]


def _measured(claim: dict, results: dict[str, list[dict]], samples: list, outcomes: list) -> str:
    """The measured column: every compared sample (mean ± std), each comparison's p after the sample it tests
    (the rival; the better label when there are several), or the threshold, or the two gains."""
    metric = claim.get("metric", "accuracy")
    scale = 1.0 if "round" in metric else 100.0

    def cell(label, m):
        if label not in results:
            return f"{label} not run"
        return f"{label}{'' if m == metric else f' {m}'} {seed_cell(results[label], m, scale, missing='undefined')}"

    notes = [f" ({_p(o[1])})" if o is not None and o[1] is not None else "" for o in outcomes] or [""]
    prefix = ""
    if metric == "rounds_to_target":
        targets = sorted({s.get("target_accuracy") or 0 for label, _ in samples for s in results.get(label, [])})
        prefix = f"rounds to {'/'.join(f'{100 * t:g}%' for t in targets) or 'the target'}: "
    elif (at := round_of(metric)) is not None:
        prefix = f"at round {at}: "
    if "at_least" in claim:
        return f"{prefix}{cell(claim['better'], metric)} against {scale * claim['at_least']:g}{notes[0]}"
    if "gain" in claim and outcomes and outcomes[0] is not None:
        mean = {key: scale * statistics.fmean(metric_values(results[key[0]], key[1])) for key in samples}
        (a, b), (c, d) = claim["gain"], claim["exceeds_gain"]
        other = claim.get("exceeds_metric", metric)
        named = lambda x, y, m: f"{x} vs {y}" + ("" if m == metric else f", {m}")  # noqa: E731
        return (f"gain {mean[a, metric] - mean[b, metric]:+.2f} ({named(a, b, metric)}) against "
                f"{mean[c, other] - mean[d, other]:+.2f} ({named(c, d, other)}){notes[0]}")
    several = len(as_list(claim.get("better"))) > 1
    tested = {terms[0 if several else 1][0]: note for (terms, _), note in zip(_comparisons(claim), notes)}
    return prefix + "; ".join(cell(*key) + tested.get(key, "") for key in samples)


def interim_note(missing: list[tuple[str, int]] | None, finished: int) -> str:
    """A line saying which of a preset's runs an interim table lacks ("" when it lacks none)."""
    if not missing:
        return ""
    seeds: dict[str, list[int]] = {}
    for label, seed in missing:
        seeds.setdefault(label, []).append(seed)
    lacking = "; ".join(f"{label} (seed{'s' if len(s) > 1 else ''} {', '.join(map(str, s))})"
                        for label, s in seeds.items())
    return (f"**Interim table: {finished} of {finished + len(missing)} runs finished.** Not run yet: {lacking}. "
            "A row averages the seeds it has (the \"seeds\" column); a claim's comparison with a row whose seeds "
            "are not all run decides nothing until they are.")


CLAIM_RULE = (
    f"Every comparison a claim makes is a two-sided Welch t-test over the seeds (unequal variances, "
    f"Welch-Satterthwaite degrees of freedom), significant at p < {ALPHA:g}: better against each rival (two "
    "samples), a threshold (one sample), a gain against a gain (the difference of the differences, with the "
    "combined standard error of the four means). \"held\": every comparison goes the claimed way and is "
    "significant; \"held (not significant: p)\": they all go that way, the largest p shown. \"did not hold\": "
    "one goes the other way significantly (whatever the others); \"did not hold (not significant: p)\": some "
    "go the other way, none significantly (the smallest p shown). With one seed there is no noise estimate and "
    "the verdict says so. A seed where a compared value is undefined is never dropped: short of a significant "
    "failure the claim is \"undecided (k of n seeds)\", or \"undecided (not run)\" for a run missing from "
    "the results. Convergence is compared as rounds to the target accuracy of the table, which every seed of "
    "every compared run must reach (else \"undecided (target reached by k of n runs)\"), never on the best round.")


def bench_report(preset: dict, results: dict[str, list[dict]], command: str, models: bool = False,
                 costs: dict | None = None, missing: list[tuple[str, int]] | None = None,
                 pilots: list[dict] | None = None, shorter: tuple[str, dict[str, list[dict]]] | None = None) -> str:
    """The Markdown report of a bench: description, main table, models table, claims, diagnosis, horizon (with
    ``pilots`` and ``shorter``, see ``horizon_section``), how to regenerate; ``missing``, the (label, seed)s not run yet, makes it
    an interim table that says which."""
    seeds = sorted({s["seed"] for runs in results.values() for s in runs})
    parts = [f"# {preset.get('title', 'bench')}", preset.get("description", "").strip(),
             interim_note(missing, sum(map(len, results.values()))), "## Global model", bench_table(results)]
    if models or costs is not None:
        parts += ["## Every evaluated model", models_table(results, costs), latency_note(costs)]
    if table := privacy_table(results):
        parts += ["## Differential privacy: each model's accuracy and the noise it kept", table]
    if preset.get("claims"):
        pending = frozenset(label for label, _ in missing or [])
        rows = [check_claim(c, results, costs, pending) for c in preset["claims"]]
        parts += ["## Claims checked", format_table(["claim", "verdict", "measured (mean ± std over seeds)"],
                                                    rows, markdown=True), CLAIM_RULE]
    if preset.get("diagnosis"):
        parts += ["## Diagnosis of the claims that fail", preset["diagnosis"].strip()]
    parts.append(horizon_section(results, pilots, interim=bool(missing), shorter=shorter))
    parts.append(f"Accuracy in % on the test set, mean ± std over seeds {seeds}; a cell marked (k/n) averages "
                 "the k of n seeds where the value is defined. \"accuracy\" is the method's own prediction (the "
                 "last exit, or the ensemble = mean of the exits' logits); \"best round\" is the round of the best "
                 "accuracy (capped by the horizon, so no claim is decided on it); \"best\" the best accuracy of any "
                 "evaluation, \"accuracy\" the final one; \"last-third gain\" what the final accuracy gained over "
                 f"the last third of the rounds: a run has plateaued when it is below {100 * PLATEAU_GAIN:g} point; "
                 "traffic is the mean over rounds of the bytes sent to clients.")
    parts.append(devices_note(results))
    parts.append(f"Regenerate: `{command}`")
    return "\n\n".join(p for p in parts if p) + "\n"


def devices_note(results: dict[str, list[dict]]) -> str:
    """Which device types the runs computed on ("cpu+cuda": a run resumed on another device,
    ``machine.device_split``) and, where their segments say, the hardware, unless all on the CPU; empty then."""
    runs = [s for summaries in results.values() for s in summaries]
    counts = Counter("+".join(sorted(device_seconds(s))) for s in runs)
    if set(counts) <= {"cpu"}:
        return ""
    hardware: dict[str, set[str]] = {}
    for segment in (segment for s in runs for segment in s.get("segments") or []):
        gpu = segment.get("gpu")  # a segment before they named their device: a GPU's has its name
        device = device_type(segment.get("device", "cuda" if gpu else "cpu"))
        cpu = segment.get("cpu") and f"{segment['cpu']}, {segment.get('cpu_capability')}"
        name = gpu if device == "cuda" else cpu
        if name:
            hardware.setdefault(device, set()).add(name)
    which = "; ".join(f"{device}: {', '.join(sorted(names))}" for device, names in sorted(hardware.items()))
    return ("Runs computed on " + ", ".join(f"{device} ({n})" for device, n in sorted(counts.items()))
            + (f" ({which})" if which else "")
            + ": the device is no part of a run's name or values (`bench/runner.py`, `NAMED_ON_DEVICE`), so a "
            "table can gather runs made on several; wall times compare on one device only.")
