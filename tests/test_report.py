"""Bench reports: metrics read from run summaries, Welch's t-test and the claim checks, on hand-made summaries."""

import json
import math

import pytest

from hetfl.bench.runner import config_key, load_preset, preset_configs, preset_names, run_bench, same_run
from hetfl.cli import DATASET_SHAPES
from hetfl.errors import HetflError
from hetfl.methods import build_method
from hetfl.report import (_comparisons, bench_table, check_claim, devices_note, metric_values, models_table, seed_cell,
                          t_pvalue, welch_test)


def summary(acc, exit1, best_round=10, headline="last", rounds_to_target=None, target=0.0):
    return {"accuracy": acc, "headline": headline, "best_round": best_round, "local_accuracy": None,
            "rounds_to_target": rounds_to_target, "target_accuracy": target,
            "final": {"global": {"exit1": exit1, "exit2": acc, "ensemble": (acc + exit1) / 2},
                      "level1": {"exit1": exit1, "ensemble": exit1}}}


def runs(*accuracies, exit1=0.5):
    return [summary(a, exit1) for a in accuracies]


def verdict(claim, results):
    return check_claim(claim, results)[1]


RESULTS = {"A": [summary(0.90, 0.70), summary(0.92, 0.72)],
           "B": [summary(0.80, 0.75), summary(0.82, 0.77)],
           "C": [summary(0.85, 0.60), summary(0.85, 0.62)]}


def test_metric_values_keep_every_seed():
    assert metric_values(RESULTS["A"], "accuracy") == [0.90, 0.92]
    assert metric_values(RESULTS["A"], "global/exit1") == [0.70, 0.72]
    assert metric_values(RESULTS["A"], "level1/accuracy") == [0.70, 0.72]  # its last exit
    assert metric_values(RESULTS["A"], "global/ensemble") == [pytest.approx(0.80), pytest.approx(0.82)]
    assert metric_values(RESULTS["A"], "local") == [None, None]  # undefined, not dropped
    assert metric_values(RESULTS["A"], "level2/accuracy") == [None, None]  # a model not evaluated


def test_cells_show_k_of_n_when_a_seed_has_no_value():
    partial = [summary(0.90, 0.70, rounds_to_target=10, target=0.8), summary(0.92, 0.72, target=0.8),
               summary(0.94, 0.74, rounds_to_target=14, target=0.8)]
    del partial[1]["final"]["global"]["exit1"]
    assert seed_cell(partial, "accuracy") == "92.00 ± 2.00"
    assert seed_cell(partial, "global/exit1") == "72.00 ± 2.83 (2/3)"
    assert seed_cell(partial, "rounds_to_target", scale=1.0, digits=1) == "12.0 ± 2.8 (2/3)"
    assert seed_cell(partial, "local") == "-"
    table = bench_table({"P": partial})
    assert "72.00 ± 2.83 (2/3)" in table and "12.0 ± 2.8 (2/3)" in table and "rounds to 80%" in table
    assert "72.00 ± 2.83 (2/3)" in models_table({"P": partial})  # every table that averages over seeds


def test_t_pvalue_against_closed_forms_and_tables():
    for t in (0.0, 0.3, 1.0, 2.5, 40.0):
        assert t_pvalue(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t), abs=1e-12)  # Cauchy
        assert t_pvalue(t, 2) == pytest.approx(1 - t / math.sqrt(t * t + 2), abs=1e-12)
        assert t_pvalue(t, 4) == pytest.approx(1 - t * (t * t + 6) / (t * t + 4) ** 1.5, abs=1e-12)
        assert t_pvalue(-t, 4) == t_pvalue(t, 4)
    # two-sided critical values of Student's t tables
    for t, df, p in [(12.7062, 1, 0.05), (2.7764, 4, 0.05), (2.2281, 10, 0.05), (3.1693, 10, 0.01),
                     (2.0423, 30, 0.05), (1.95996, 1e7, 0.05)]:
        assert t_pvalue(t, df) == pytest.approx(p, abs=2e-5)
    assert t_pvalue(1e-7, 1e6) == pytest.approx(1.0) and t_pvalue(1e-7, 1e6) < 1.0  # no rounding to 1


def test_welch_test_by_hand():
    # equal sizes and variances: t = 0.02 / sqrt(2 * 1e-4 / 3) = sqrt(6), df = 4
    estimate, p = welch_test([(1, [0.90, 0.91, 0.92]), (-1, [0.88, 0.89, 0.90])])
    assert estimate == pytest.approx(0.02)
    t = math.sqrt(6)
    assert p == pytest.approx(1 - t * (t * t + 6) / (t * t + 4) ** 1.5)  # = 0.0705, the df = 4 closed form
    # unequal: s^2 = 4e-4 (n 3) and 8.667e-4 (n 4), Welch-Satterthwaite df 4.992; p as scipy.stats.ttest_ind gives it
    assert welch_test([(1, [0.90, 0.92, 0.94]), (-1, [0.80, 0.85, 0.86, 0.81])])[1] == pytest.approx(0.0048571157)
    # one sample against a threshold: t = 0.02 / (0.02 / sqrt(3)) = sqrt(3), df = 2
    estimate, p = welch_test([(1, [0.90, 0.92, 0.94])], offset=0.9)
    assert estimate == pytest.approx(0.02) and p == pytest.approx(1 - math.sqrt(3) / math.sqrt(5))
    assert welch_test([(1, [0.9]), (-1, [0.8, 0.82])])[1] is None  # one seed: no noise estimate
    assert welch_test([(1, [0.9, 0.9]), (-1, [0.8, 0.8])]) == (pytest.approx(0.1), 0.0)  # no spread: exact


def test_better_than_every_rival_each_by_welch():
    text, v, measured = check_claim({"claim": "A wins", "better": "A", "worse": ["B", "C"]}, RESULTS)
    # A - B: t = 0.1 / sqrt(2e-4 / 2 * 2) = 7.07, df 2 -> p = 0.0194; A - C: t = 0.06 / 0.01 = 6, df 1 -> p = 0.105
    assert v == "held (not significant: p=0.11)"
    assert "A 91.00 ± 1.41" in measured and "B 81.00 ± 1.41 (p=0.019)" in measured and "(p=0.11)" in measured
    assert verdict({"better": "A", "worse": "B"}, RESULTS) == "held"
    assert verdict({"better": "B", "worse": "A"}, RESULTS) == "did not hold"
    # A's last exit vs B's exit1 (another metric on the worse side): 91 > 76
    assert verdict({"better": "A", "worse": "B", "worse_metric": "global/exit1"}, RESULTS) == "held"
    # one worse_metric per rival: A's accuracy against B's exit1 and C's accuracy
    mixed = {"better": "A", "worse": ["B", "C"], "worse_metric": ["global/exit1", "accuracy"]}
    assert "B global/exit1 76.00 ± 1.41" in check_claim(mixed, RESULTS)[2]
    close = {"X": runs(0.90, 0.80), "Y": runs(0.84, 0.84)}
    p = 1 - 2 / math.pi * math.atan(0.2)  # t = 0.01 / sqrt(0.005 / 2) = 0.2, df 1
    assert verdict({"better": "X", "worse": "Y"}, close) == f"held (not significant: p={p:.2g})"
    assert verdict({"better": "Y", "worse": "X"}, close) == f"did not hold (not significant: p={p:.2g})"
    # P loses to Q by far (p 0.019) and beats R narrowly: one significant loss decides
    losing = {"P": runs(0.80, 0.82), "Q": runs(0.90, 0.92), "R": runs(0.805, 0.815)}
    assert verdict({"better": "P", "worse": ["Q", "R"]}, losing) == "did not hold"
    # several better labels against one worse: every pair is compared, p after each better label;
    # C - B: t = 0.04 / sqrt(2e-4 / 2) = 4, df 1 -> p = 0.156
    text, v, measured = check_claim({"better": ["A", "C"], "worse": "B"}, RESULTS)
    assert v == "held (not significant: p=0.16)" and "A 91.00 ± 1.41 (p=0.019)" in measured
    assert "C 85.00 ± 0.00 (p=0.16)" in measured and measured.endswith("B 81.00 ± 1.41")


def test_one_seed_says_there_is_no_noise_estimate():
    one = {"A": runs(0.90), "B": runs(0.80)}
    assert verdict({"better": "A", "worse": "B"}, one) == "held (one seed: no noise estimate)"
    assert verdict({"better": "B", "worse": "A"}, one) == "did not hold (one seed: no noise estimate)"
    assert verdict({"better": "A", "at_least": 0.95}, one) == "did not hold (one seed: no noise estimate)"


def test_an_undefined_seed_makes_the_claim_undecided_unless_a_loss_is_significant():
    results = {"A": runs(0.90, 0.92, 0.94, exit1=0.7), "B": runs(0.80, 0.81, 0.82), "Q": runs(0.99, 0.995, 0.999)}
    results["A"][1]["final"]["global"].pop("exit1")
    # exit1 of A is undefined for seed 1: never dropped, whatever the other seeds say
    claim = {"better": "A", "worse": "B", "metric": "global/exit1", "worse_metric": "accuracy"}
    text, v, measured = check_claim(claim, results)
    assert v == "undecided (5 of 6 seeds)" and "A 70.00 ± 0.00 (2/3)" in measured
    assert verdict({"better": "A", "at_least": 0.5, "metric": "global/exit1"}, results) == "undecided (2 of 3 seeds)"
    # A loses to Q significantly: the claim fails whatever its undecided comparison (B on A's exit1) would say
    claim = {"better": "B", "worse": ["Q", "A"], "worse_metric": ["accuracy", "global/exit1"]}
    assert verdict(claim, results) == "did not hold"
    assert verdict({"better": "A", "worse": "Nobody"}, results) == "undecided (not run)"


def test_threshold_is_a_one_sample_test():
    three = {"A": runs(0.90, 0.92, 0.94), "B": runs(0.80, 0.81, 0.82)}
    p = 1 - math.sqrt(3) / math.sqrt(5)  # t = sqrt(3), df 2 (test_welch_test_by_hand)
    text, v, measured = check_claim({"better": "A", "at_least": 0.9}, three)
    assert v == f"held (not significant: p={p:.2g})" and measured == f"A 92.00 ± 2.00 against 90 (p={p:.2g})"
    assert verdict({"better": "A", "at_least": 0.85}, three) == "held"
    assert verdict({"better": "B", "at_least": 0.9}, three) == "did not hold"


def test_gain_is_a_difference_of_differences_with_its_noise():
    a, b, c, d = [0.90, 0.91, 0.92], [0.80, 0.81, 0.82], [0.85, 0.86, 0.87], [0.80, 0.81, 0.82]
    claim = {"gain": ["A", "B"], "exceeds_gain": ["C", "D"]}
    # (10 - 5) points, se^2 = 4 * 1e-4 / 3, df 8: t = 4.33, p = 0.0025 (scipy.stats.t.sf for reference)
    text, v, measured = check_claim(claim, {"A": runs(*a), "B": runs(*b), "C": runs(*c), "D": runs(*d)})
    assert v == "held" and measured == "gain +10.00 (A vs B) against +5.00 (C vs D) (p=0.0025)"
    # the same means with 3x the spread: t = 0.04 / sqrt(1.2e-3) = 1.155, df 8 -> p = 0.28
    noisy = {"A": runs(0.90, 0.93, 0.96), "B": runs(0.80, 0.83, 0.86), "C": runs(0.86, 0.89, 0.92),
             "D": runs(0.80, 0.83, 0.86)}
    assert verdict(claim, noisy) == "held (not significant: p=0.28)"
    assert verdict({"gain": ["C", "D"], "exceeds_gain": ["A", "B"]}, noisy) == "did not hold (not significant: p=0.28)"
    # a label on both sides cancels: A - B - (C - B) is the two-sample test of A against C
    shared = {"gain": ["A", "B"], "exceeds_gain": ["C", "B"]}
    results = {"A": runs(*a), "B": runs(0.5, 0.7, 0.9), "C": runs(0.88, 0.89, 0.90)}
    t = math.sqrt(6)  # as in test_welch_test_by_hand: df 4
    assert verdict(shared, results) == f"held (not significant: p={1 - t * (t * t + 6) / (t * t + 4) ** 1.5:.2g})"


def test_a_gain_may_be_compared_with_another_models_gain_of_the_same_runs():
    """(A - B) on the last exit against (A - B) on exit1: A's exit2 gains 10 points over B's, its exit1 5."""
    results = {"A": runs(0.90, 0.91, 0.92, exit1=0.70), "B": runs(0.80, 0.81, 0.82, exit1=0.65)}
    for s in results["B"]:  # a little spread on exit1, so the test has noise to weigh
        s["final"]["global"]["exit1"] += 0.01 * (s["accuracy"] - 0.81) / 0.01
    claim = {"gain": ["A", "B"], "exceeds_gain": ["A", "B"], "exceeds_metric": "global/exit1"}
    text, v, measured = check_claim(claim, results)
    assert measured.startswith("gain +10.00 (A vs B) against +5.00 (A vs B, global/exit1)")
    assert v.startswith("held")
    flipped = {**claim, "metric": "global/exit1", "exceeds_metric": "accuracy"}
    assert check_claim(flipped, results)[1].startswith("did not hold")


def rounds_run(rounds, target=0.7):
    return {**summary(0.8, 0.5), "rounds_to_target": rounds, "target_accuracy": target}


def test_convergence_only_on_a_target_every_compared_run_reaches():
    claim = {"better": "F", "worse": "S", "metric": "rounds_to_target", "lower_is_better": True}
    reached = {"F": [rounds_run(r) for r in (10, 12, 14)], "S": [rounds_run(r) for r in (20, 22, 24)]}
    text, v, measured = check_claim(claim, reached)
    assert v == "held" and measured.startswith("rounds to 70%: F 12.00 ± 2.00; S 22.00 ± 2.00")
    # one seed of the slower run never gets there: that is not a win for the other, it is undecided
    missing = {**reached, "S": [rounds_run(r) for r in (20, None, 24)]}
    assert verdict(claim, missing) == "undecided (target reached by 5 of 6 runs)"
    other_target = {**reached, "S": [rounds_run(r, target=0.8) for r in (20, 22, 24)]}
    assert verdict(claim, other_target) == "undecided (different targets)"


def test_a_preset_cannot_decide_on_best_round(tmp_path):
    preset = tmp_path / "p.toml"
    text = '[[runs]]\nlabel = "A"\nmethod = "alllarge"\n[[runs]]\nlabel = "B"\nmethod = "allsmall"\n'
    preset.write_text(text + '[[claims]]\nbetter = "A"\nworse = "B"\nmetric = "best_round"\n')
    with pytest.raises(HetflError, match="rounds_to_target"):
        load_preset(str(preset))
    preset.write_text(text + '[[claims]]\nbetter = ["A"]\nworse = ["B"]\n')
    with pytest.raises(HetflError, match="both sides"):
        load_preset(str(preset))


def test_report_only_rewrites_the_table_from_saved_summaries(tmp_path):
    preset = tmp_path / "mini.toml"
    preset.write_text("""
title = "mini"
seeds = [0, 1]
diagnosis = "Slow is slow because it is small."
[base]
dataset = "digits"
target_accuracy = 0.5
[[runs]]
label = "Fast"
method = "alllarge"
[[runs]]
label = "Slow"
method = "allsmall"
[[claims]]
claim = "Fast reaches the target first"
better = "Fast"
worse = "Slow"
metric = "rounds_to_target"
lower_is_better = true
""")
    out = tmp_path / "out"
    out.mkdir()
    curve = lambda first: [[r, 0.6 if r >= first else 0.1] for r in range(1, 11)]  # noqa: E731
    saved = {label: [{**summary(0.8, 0.5), "seed": seed, "curve": curve(first + seed), "target_accuracy": 0.99,
                      "rounds_to_target": None} for seed in (0, 1)] for label, first in (("Fast", 2), ("Slow", 6))}
    (out / "summaries.json").write_text(json.dumps(saved))
    run_bench(str(preset), out=str(out), runs_dir=str(tmp_path / "runs"), report_only=True)
    table = (out / "table.md").read_text()
    # rounds re-read off the curves at the preset's target (0.5), not the saved one (0.99)
    assert "| Fast reaches the target first | held " in table and "rounds to 50%: Fast 2.50 ± 0.71" in table
    assert "## Diagnosis of the claims that fail\n\nSlow is slow because it is small." in table
    assert table.index("Slow is slow") > table.index("## Claims checked")
    assert not (tmp_path / "runs").exists()  # nothing trained


def test_report_only_with_reuse_saved_writes_an_interim_table_of_the_finished_runs(tmp_path):
    """A bench that has not ended has only finished-runs.json: --report-only --reuse-saved reports what it holds,
    says which runs are missing, and leaves a claim on a row not run undecided; without --reuse-saved it is a
    one-line error that names the flag."""
    preset = tmp_path / "mini.toml"
    preset.write_text("""
title = "mini"
seeds = [0, 1, 2]
[base]
dataset = "digits"
[[runs]]
label = "Big"
method = "alllarge"
[[runs]]
label = "Small"
method = "allsmall"
[[runs]]
label = "Never"
method = "exclusivefl"
[[claims]]
claim = "Big beats Small"
better = "Big"
worse = "Small"
[[claims]]
claim = "Small beats Big"
better = "Small"
worse = "Big"
[[claims]]
claim = "Big beats Never"
better = "Big"
worse = "Never"
""")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(HetflError, match="--reuse-saved"):
        run_bench(str(preset), out=str(out), runs_dir=str(tmp_path / "runs"), report_only=True)
    _, loaded = load_preset(str(preset))
    names = {(label, seed): f"{cfg.method}-{config_key(cfg)}-s{seed}"
             for label, seed, cfg in preset_configs(loaded, {}, None)}
    curve = [[1, 0.5], [2, 0.9]]
    finished = {names["Big", 0]: {**summary(0.90, 0.7), "seed": 0, "curve": curve},
                names["Big", 1]: {**summary(0.91, 0.7), "seed": 1, "curve": curve},
                names["Small", 0]: {**summary(0.60, 0.5), "seed": 0, "curve": curve},
                names["Small", 1]: {**summary(0.61, 0.5), "seed": 1, "curve": curve}}
    (out / "finished-runs.json").write_text(json.dumps(finished))
    run_bench(str(preset), out=str(out), runs_dir=str(tmp_path / "runs"), report_only=True, reuse_saved=True)
    table = (out / "table.md").read_text()
    assert ("**Interim table: 4 of 9 runs finished.** Not run yet: Big (seed 2); Small (seed 2); "
            "Never (seeds 0, 1, 2).") in table
    # seed 2 may yet count, whichever way the first two seeds point, significantly or not
    assert "| Small beats Big | undecided (seeds not all run yet) " in table
    assert "| Big beats Small | undecided (seeds not all run yet) " in table
    assert "| Big beats Never | undecided (not run) " in table
    assert "Regenerate: `hetfl bench" in table and "--reuse-saved`" in table
    assert (out / "curves.png").exists()
    assert not (out / "summaries.json").exists() and not (tmp_path / "runs").exists()  # nothing trained or moved


@pytest.mark.parametrize("name", preset_names())
def test_every_shipped_preset_validates_and_its_claims_name_evaluated_models(name):
    """Every run of every preset is a valid config that its method accepts (as `hetfl run` checks it), and
    every MODEL/KEY metric of a claim names a model that the run's method evaluates."""
    _, preset = load_preset(name)
    configs = preset_configs(preset, {}, None)
    assert configs and all(cfg.seed in preset["seeds"] for _, _, cfg in configs)
    models = {}
    for label, _, cfg in configs:
        if label not in models:
            models[label] = set(build_method(cfg, *DATASET_SHAPES[cfg.dataset]).eval_specs())
    for claim in preset.get("claims", []):
        for terms, _ in _comparisons(claim):
            for (label, metric), _ in terms:
                assert "/" not in metric or metric.split("/")[0] in models[label], (claim.get("claim"), label, metric)


def test_late_gain_is_what_the_last_third_of_the_rounds_added():
    from hetfl.report import late_gain, metric_value

    curve = [(5, 0.60), (10, 0.70), (20, 0.80), (25, 0.83), (30, 0.835)]
    assert late_gain(curve, 30) == pytest.approx(0.835 - 0.80)  # from round 20 = 2/3 of 30
    assert late_gain([(30, 0.9)], 30) is None  # no evaluation in the first two thirds
    assert metric_value({"curve": curve, "rounds": 30}, "late_gain") == pytest.approx(0.035)


def test_a_claim_about_round_30_is_checked_at_round_30_in_a_longer_run():
    from hetfl.report import accuracy_at, check_claim, metric_value

    curve = [(10, 0.70), (20, 0.80), (30, 0.83), (40, 0.86), (150, 0.91)]
    assert accuracy_at(curve, 30) == 0.83 and accuracy_at(curve, 35) == 0.83 and accuracy_at(curve, 5) is None
    assert metric_value({"curve": curve, "accuracy": 0.91}, "accuracy@30") == 0.83
    runs = [{"seed": s, "accuracy": 0.91, "curve": [(t, a + s / 1000) for t, a in curve]} for s in range(3)]
    claim = {"claim": "reaches 85% within 30 rounds", "better": "A", "at_least": 0.85}
    assert check_claim({**claim, "metric": "accuracy@30"}, {"A": runs})[1].startswith("did not hold")
    assert check_claim(claim, {"A": runs})[1].startswith("held")  # the final accuracy would have passed it
    assert check_claim({**claim, "metric": "accuracy@30"}, {"A": runs})[2].startswith("at round 30: A 83.10")


def test_cost_claims_and_accuracy_drop():
    from hetfl.report import check_cost_claim, metric_value

    costs = {"S": {"global": {"params": 1000, "latency_ms": 2.0}, "level2": {"params": 200, "latency_ms": 1.2}}}
    size = {"claim": "4x smaller", "better": "S", "cost_ratio": ["global", "level2"], "cost": "params", "at_least": 4}
    assert check_cost_claim(size, costs)[1] == "held" and "5.00x" in check_cost_claim(size, costs)[2]
    fast = {**size, "cost": "latency_ms", "at_least": 2}
    assert check_cost_claim(fast, costs)[1] == "did not hold"  # 1.67x
    assert check_cost_claim(size, None)[1].startswith("undecided")
    summary = {"headline": "last", "accuracy": 0.9,
               "final": {"global": {"exit1": 0.8, "exit2": 0.9}, "level2": {"exit1": 0.85}}}
    assert metric_value(summary, "level2/drop") == pytest.approx(0.05)


def test_a_latency_timed_on_a_busy_machine_decides_no_claim_and_the_table_says_how_busy_it_was():
    from hetfl.report import check_cost_claim, latency_note

    def costs(others):
        return {"S": {model: {"params": params, "latency_ms": ms, "others_busy_cores": others, "cores": 2}
                      for model, params, ms in (("global", 1000, 2.0), ("level2", 200, 1.2))}}

    fast = {"claim": "2x faster", "better": "S", "cost_ratio": ["global", "level2"], "cost": "latency_ms",
            "at_least": 2}
    size = {**fast, "cost": "params", "at_least": 4}
    assert check_cost_claim(fast, costs(0.04))[1] == "did not hold"
    busy = check_cost_claim(fast, costs(1.93))
    assert busy[1] == "undecided (latency timed while other processes kept 1.9 of 2 cores busy)"
    assert "1.67x" in busy[2]  # the measurement is still shown
    assert check_cost_claim(size, costs(1.93))[1] == "held"  # sizes do not depend on the load
    assert "at most 1.93 of 2 cores busy" in latency_note(costs(1.93))
    assert latency_note({"S": {"global": {"params": 1, "latency_ms": None}}}) == ""  # no latency timed
    assert "busy" not in latency_note({"S": {"global": {"params": 1, "latency_ms": 2.0}}})  # made before the load


def test_exits_mean_by_depth_reads_each_exit_from_the_global_model_or_the_sub_model_ending_in_it():
    from hetfl.report import metric_value

    inclusive = {"final": {"global": {"exit3": 0.96, "ensemble": 0.96},  # only its last exit
                           "level1": {"exit1": 0.90, "ensemble": 0.90}, "level2": {"exit2": 0.87, "ensemble": 0.87}}}
    assert metric_value(inclusive, "exits_mean_by_depth") == pytest.approx((0.90 + 0.87 + 0.96) / 3)
    assert metric_value(inclusive, "global/exits_mean") == pytest.approx(0.96)
    multi_exit = {"final": {"global": {"exit1": 0.80, "exit2": 0.90, "ensemble": 0.88}, "level1": {"exit1": 0.70}}}
    assert metric_value(multi_exit, "exits_mean_by_depth") == pytest.approx(0.85)  # the global model's own exits
    assert metric_value({"final": {"global": {"ensemble": 0.5}}}, "exits_mean_by_depth") is None


def test_a_runs_name_leaves_out_the_device_it_computes_on():
    """Runs on an H100 and on this CPU gave the same evaluations (docs/results/reefl-20ng-cpu): one name for
    both, and the name every run had before the device left it (a CPU run's, committed with reefl-20ng)."""
    _, preset = load_preset("reefl-20ng")
    (label, seed, cpu), = [c for c in preset_configs(preset, {}, [0]) if c[0] == "ExclusiveFL (frozen)"]
    (_, _, cuda), = [c for c in preset_configs(preset, {"device": "cuda"}, [0]) if c[0] == label]
    assert cuda.device == "cuda" and config_key(cpu) == config_key(cuda) == "d68591a82e"
    assert same_run(cpu, cuda) and not same_run(cpu, cpu.replace(lr=0.1))


def test_the_report_says_which_devices_its_runs_computed_on():
    def on(device):
        return {**summary(0.9, 0.5), "seed": 0, **({"device": device} if device else {})}

    assert devices_note({"A": [on(None), on("cpu")]}) == ""  # a summary without the field is a CPU run's
    note = devices_note({"A": [on("cuda"), on("cuda:0")], "B": [on(None)]})
    assert note.startswith("Runs computed on cpu (1), cuda (2): ")
    resumed = {**on("cpu"), "wall_seconds": 60.0, "segments": [  # begun on a GPU, finished here
        {"from_round": 1, "device": "cuda:0", "elapsed_before": 0.0}, {"from_round": 11, "device": "cpu",
                                                                        "elapsed_before": 20.0}]}
    note = devices_note({"A": [on("cuda"), resumed], "B": [on(None)]})
    assert note.startswith("Runs computed on cpu (1), cpu+cuda (1), cuda (1): ")
    h100 = {"from_round": 1, "gpu": "NVIDIA H100 80GB HBM3", "cpu": "Intel(R) Xeon(R) Processor"}  # no device: older
    resumed["segments"][0].update(gpu="NVIDIA H100 80GB HBM3")
    resumed["segments"][1].update(cpu="AMD EPYC 7B13", cpu_capability="AVX2")
    note = devices_note({"A": [{**on("cuda"), "segments": [h100]}, resumed], "B": [on(None)]})
    assert note.startswith("Runs computed on cpu (1), cpu+cuda (1), cuda (1) "
                           "(cpu: AMD EPYC 7B13, AVX2; cuda: NVIDIA H100 80GB HBM3): ")


def curved(points, rounds=30, wall=None, device=None):
    """A run summary with a learning curve (round, accuracy), its rounds, wall seconds and device."""
    return {"curve": points, "rounds": rounds, "wall_seconds": wall, **({"device": device} if device else {})}


def test_the_horizon_section_names_the_rows_still_gaining_by_their_mean_over_seeds():
    from hetfl.report import horizon_section, row_late_gains

    results = {"flat": [curved([(10, 0.5), (20, 0.8), (30, 0.805)]), curved([(10, 0.5), (20, 0.8), (30, 0.81)])],
               # one seed gains 3 points, the other 0: mean 1.5, still gaining
               "rising": [curved([(10, 0.5), (20, 0.7), (30, 0.73)]), curved([(10, 0.5), (20, 0.7), (30, 0.70)])]}
    gains = row_late_gains(results)
    assert gains == {"flat": pytest.approx(0.0075), "rising": pytest.approx(0.015)}
    section = horizon_section(results)
    assert "1 of 2 rows still gain" in section and "rising +1.50" in section and "flat" not in section
    assert "No pilot" in section
    plateaued = horizon_section({"flat": results["flat"]})
    assert "every row has plateaued" in plateaued and "(largest: +0.75)" in plateaued
    assert "every row run so far has plateaued" in horizon_section({"flat": results["flat"]}, interim=True)
    assert horizon_section({"no curve": [curved([(30, 0.9)])]}) == ""  # no evaluation in the first two thirds


def test_the_horizon_section_costs_each_row_at_its_pilot_plateau_round_from_this_table_wall_times():
    from hetfl.report import horizon_section

    results = {"slow": [curved([(10, 0.5), (20, 0.7), (30, 0.75)], wall=3600.0, device="cpu")] * 3,  # 120 s a round
               "cut": [curved([(10, 0.5), (20, 0.7), (30, 0.75)], wall=360.0)] * 3,  # 12 s a round
               "unpiloted": [curved([(10, 0.5), (20, 0.7), (30, 0.75)], wall=30.0)]}
    pilot = {"file": "pilots/p.json", "device": "an accelerator", "rounds": 150,
             "rows": [{"label": "slow", "seed": 0, "last_round": 150, "plateau_round": 90, "train_seconds": 300.0},
                      {"label": "slow", "seed": 1, "last_round": 150, "plateau_round": 120,  # the later one counts
                       "train_seconds": 600.0},
                      {"label": "cut", "seed": 0, "last_round": 60, "plateau_round": None}]}
    section = horizon_section(results, [pilot])
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in section.splitlines() if line.startswith("| ") and not line.startswith("| row")}
    assert rows["slow"] == ["+5.00", "pilots/p.json (seeds 0, 1)", "150 of 150", "120", "3.0", "120.0 (cpu)", "12.0"]
    assert rows["cut"] == ["+5.00", "pilots/p.json (seeds 0)", "60 of 150", "not by 60", "-", "12.0 (cpu)", "> 0.6"]
    assert rows["unpiloted"][1:] == ["none", "-", "-", "-", "1.0 (cpu)", "-"]
    assert "Together: > 12.6 wall hours" in section and "an accelerator (pilots/p.json)" in section
    # the row no pilot ran, 1 s a round, one seed: 100 rounds take 100 s
    assert "every 100 more rounds of the row no pilot ran take 2 wall minutes" in section
    alone = horizon_section({"slow": results["slow"]})  # 120 s a round x 100 x 3 seeds = 10 hours
    assert "No pilot at a longer horizon" in alone and "every 100 more rounds of these rows take 10.0 wall hours" \
        " at this table's pace (cpu, every seed;" in alone


def test_the_horizon_gain_pairs_each_seed_with_the_same_seed_of_the_shorter_table():
    from hetfl.report import horizon_section

    def run(seed, accuracy, rounds):
        return {**curved([(rounds // 3, 0.3), (2 * rounds // 3, 0.5), (rounds, accuracy)], rounds=rounds),
                "seed": seed, "accuracy": accuracy}

    shorter = ("short", {"A": [run(0, 0.70, 100), run(1, 0.74, 100), run(2, 0.90, 100)],
                         "B": [run(0, 0.80, 100)], "gone": [run(0, 0.5, 100)]})
    longer = {"A": [run(0, 0.73, 150), run(1, 0.75, 150)],  # seed 2 not run here: left out of both columns
              "B": [run(0, 0.79, 150)], "new": [run(0, 0.6, 150)]}
    section = horizon_section(longer, shorter=shorter, interim=True)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in section.splitlines() if line.startswith("| ") and not line.startswith("| row")}
    # gains 3 and 1 points: mean 2, sample std sqrt(2)
    assert rows["A"] == ["0, 1", "72.00 ± 2.83", "74.00 ± 1.41", "+2.00 ± 1.41"]
    assert rows["B"] == ["0", "80.00 ± 0.00", "79.00 ± 0.00", "-1.00 ± 0.00"]
    assert "new" not in rows and "gone" not in rows
    assert "Against `short`, the same rows at 100 rounds" in section and "what 150 rounds added" in section
    flat = {"B": [run(0, 0.79, 150)]}
    flat["B"][0]["curve"] = [(50, 0.788), (100, 0.789), (150, 0.79)]
    assert "every row has plateaued" in horizon_section(flat, shorter=shorter) and \
        "| B   | 0     |" in horizon_section(flat, shorter=shorter)
    assert horizon_section(flat) == horizon_section(flat, shorter=("short", {}))  # nothing to pair: no table


def test_a_preset_that_extends_a_shorter_one_reads_its_table_beside_it(tmp_path):
    from hetfl.bench.runner import load_preset, shorter_table

    results = tmp_path / "results"
    (results / "fedepth-table2").mkdir(parents=True)
    summary = {"seed": 0, "accuracy": 0.7, "curve": [[50, 0.6], [100, 0.7]], "rounds": 100}
    _, longer = load_preset("fedepth-table2-150")
    label = longer["runs"][0]["label"]
    (results / "fedepth-table2" / "summaries.json").write_text(json.dumps({label: [summary]}))
    name, before = shorter_table(longer, results)
    assert name == "fedepth-table2" and list(before) == [label] and before[label][0]["accuracy"] == 0.7
    assert shorter_table(longer, tmp_path / "elsewhere") is None  # no table beside it
    _, wider = load_preset("depthfl-width-150")  # another optimizer as well: not the same rows, only longer
    (results / "depthfl-width").mkdir()
    (results / "depthfl-width" / "summaries.json").write_text("{}")
    assert shorter_table(wider, results) is None
    assert shorter_table(load_preset("fedepth-table2")[1], results) is None  # extends nothing


def test_a_bench_table_reads_the_pilots_beside_its_results_folder(tmp_path):
    from hetfl.bench.runner import pilots_of

    pilots = tmp_path / "pilots"
    pilots.mkdir()
    row = {"label": "A", "seed": 0, "last_round": 90, "plateau_round": 60}
    (pilots / "long.json").write_text(json.dumps({"rounds": 90, "device": "gpu", "presets": {"p": [row]}}))
    (pilots / "other.json").write_text(json.dumps({"rounds": 90, "presets": {"q": [row]}}))
    assert pilots_of("p", pilots) == [{"file": "pilots/long.json", "device": "gpu", "rounds": 90, "rows": [row]}]
    assert pilots_of("p", tmp_path / "absent") == []
    (pilots / "broken.json").write_text("{")
    with pytest.raises(HetflError, match="broken.json is not JSON"):
        pilots_of("p", pilots)
