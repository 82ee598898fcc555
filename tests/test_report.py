"""Bench reports: metrics read from run summaries and the three forms of claim checks, by hand."""

import pytest

from hetfl.bench.runner import load_preset, preset_configs, preset_names
from hetfl.report import check_claim, metric_values


def summary(acc, exit1, best_round, headline="last"):
    return {"accuracy": acc, "headline": headline, "best_round": best_round, "local_accuracy": None,
            "final": {"global": {"exit1": exit1, "exit2": acc, "ensemble": (acc + exit1) / 2},
                      "level1": {"exit1": exit1, "ensemble": exit1}}}


RESULTS = {"A": [summary(0.90, 0.70, 10), summary(0.92, 0.72, 12)],
           "B": [summary(0.80, 0.75, 20), summary(0.82, 0.77, 22)],
           "C": [summary(0.85, 0.60, 8), summary(0.85, 0.62, 8)]}


def test_metric_values():
    assert metric_values(RESULTS["A"], "accuracy") == [0.90, 0.92]
    assert metric_values(RESULTS["A"], "global/exit1") == [0.70, 0.72]
    assert metric_values(RESULTS["A"], "level1/accuracy") == [0.70, 0.72]  # its last exit
    assert metric_values(RESULTS["A"], "global/ensemble") == [pytest.approx(0.80), pytest.approx(0.82)]
    assert metric_values(RESULTS["A"], "local") == []  # undefined everywhere


def test_better_than_every_one_with_noise_flag_and_rounds():
    text, verdict, measured = check_claim({"claim": "A wins", "better": "A", "worse": ["B", "C"]}, RESULTS)
    assert verdict == "held" and "A 91.00 ± 1.41" in measured and "B 81.00 ± 1.41" in measured
    assert check_claim({"better": "B", "worse": "A"}, RESULTS)[1] == "did not hold"
    # exit1: B 76 vs A 71, gap 5 > std 1.41 -> held, not noisy
    assert check_claim({"better": "B", "worse": "A", "metric": "global/exit1"}, RESULTS)[1] == "held"
    # C converges first: lower is better
    assert check_claim({"better": "C", "worse": "A", "metric": "best_round", "lower_is_better": True},
                       RESULTS)[1] == "held"
    # A's last exit vs B's exit1 (another metric on the worse side): 91 > 76
    assert check_claim({"better": "A", "worse": "B", "worse_metric": "global/exit1"}, RESULTS)[1] == "held"
    close = {"X": [summary(0.90, 0, 1), summary(0.80, 0, 1)], "Y": [summary(0.84, 0, 1), summary(0.84, 0, 1)]}
    assert check_claim({"better": "X", "worse": "Y"}, close)[1] == "held (within seed noise)"
    # P loses to Q by far and beats R narrowly: a clear loss, not noise
    mixed = {"P": [summary(0.80, 0, 1), summary(0.82, 0, 1)], "Q": [summary(0.90, 0, 1), summary(0.92, 0, 1)],
             "R": [summary(0.805, 0, 1), summary(0.815, 0, 1)]}
    assert check_claim({"better": "P", "worse": ["Q", "R"]}, mixed)[1] == "did not hold"
    assert check_claim({"better": "Y", "worse": "X"}, close)[1] == "did not hold (within seed noise)"


def test_threshold_and_gain_claims():
    assert check_claim({"better": "A", "at_least": 0.9}, RESULTS)[1] == "held"
    assert check_claim({"better": "B", "at_least": 0.9}, RESULTS)[1] == "did not hold"
    # A - B = +10 points; C - B = +4: A's gain exceeds C's
    assert check_claim({"gain": ["A", "B"], "exceeds_gain": ["C", "B"]}, RESULTS)[1] == "held"
    assert check_claim({"gain": ["C", "B"], "exceeds_gain": ["A", "B"]}, RESULTS)[1] == "did not hold"


@pytest.mark.parametrize("name", preset_names())
def test_every_shipped_preset_validates(name):
    """Every run of every preset is a valid config, and every claim names runs of its preset."""
    _, preset = load_preset(name)
    configs = preset_configs(preset, {}, None)
    assert configs and all(cfg.seed in preset["seeds"] for _, _, cfg in configs)
