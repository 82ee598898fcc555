"""The committed tables' claims, re-checked with scipy's t distribution: every verdict and p-value as before.

``report.t_pvalue`` takes the t distribution from scipy; until then hetfl computed it itself through an incomplete
beta function. That implementation is kept below, only as the reference the new one is checked against: for every
results folder under docs/results, every claim is re-checked as ``hetfl bench PRESET --report-only`` does (the
same summaries, the preset's claims and targets), once with scipy and once with the reference, and

* every Welch p-value agrees to 1e-9 relative, every verdict and measured cell is the same text;
* every claim row is the one the committed table.md shows (verdict and measured cell, p as printed), except the
  cost claims, which compare latencies measured when the table was made and make no t-test.
"""

import math
import re
from pathlib import Path

import pytest

from hetfl import report
from hetfl.bench.runner import FINISHED, committed_results, load_preset

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
PRESET_OF = {"reefl-20ng-cpu": "reefl-20ng"}  # a folder of some of reefl-20ng's runs made on the CPU: no table.md
NO_RUNS = {"fedepth-memory", "pilots"}  # `hetfl costs` output; pilot curves (scripts/plateau.py): no claims
RTOL = 1e-9


# The reference: the t distribution hetfl computed itself before scipy (report.py, until this test was added).

def _old_beta_fraction(a: float, b: float, x: float) -> float:
    """Returns the continued fraction of the incomplete beta function, by the modified Lentz method."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        for term in (even, odd):
            d = 1.0 + term * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + term / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _old_incomplete_beta(a: float, b: float, x: float) -> float:
    """Returns the regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0 or x >= 1.0:
        return max(0.0, min(1.0, x))
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _old_incomplete_beta(b, a, 1.0 - x)
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    return math.exp(log_front) * _old_beta_fraction(a, b, x) / a


def old_t_pvalue(t: float, df: float) -> float:
    """Returns the two-sided p-value P(|T| >= |t|) of Student's t, as hetfl computed it before scipy."""
    a, x, y = df / 2.0, df / (df + t * t), t * t / (df + t * t)
    if x > (a + 1.0) / (a + 2.5):
        return 1.0 - _old_incomplete_beta(0.5, a, y)
    return _old_incomplete_beta(a, 0.5, x)


# The committed tables.

def committed_folders() -> list[Path]:
    """Returns every results folder under docs/results that holds runs (summaries.json or finished-runs.json)."""
    return sorted(p for p in RESULTS.iterdir() if p.is_dir() and p.name not in NO_RUNS)


def folder_results(folder: Path) -> tuple[dict, dict[str, list[dict]], frozenset[str]]:
    """Returns (preset, results by label, labels with seeds not run) of a results folder, read as
    ``hetfl bench PRESET --report-only --reuse-saved --out FOLDER`` reads it (runner.run_bench)."""
    _, preset = load_preset(PRESET_OF.get(folder.name, folder.name))
    results, missing = committed_results(folder, preset)
    return preset, results, frozenset(label for label, _ in missing)


def claim_rows(preset: dict, results: dict, pending: frozenset[str], t_pvalue, monkeypatch) -> tuple[list, list]:
    """Returns (claim rows, every Welch p-value made, in order) of the preset's t-tested claims, with ``t_pvalue``
    as the t distribution."""
    pvalues = []
    welch = report.welch_test

    def recorded(terms, offset=0.0):
        estimate, p = welch(terms, offset)
        pvalues.append(p)
        return estimate, p

    with monkeypatch.context() as m:
        m.setattr(report, "t_pvalue", t_pvalue)
        m.setattr(report, "welch_test", recorded)
        rows = [report.check_claim(c, results, None, pending) for c in preset.get("claims", []) if "cost_ratio" not in c]
    return rows, pvalues


def committed_row(table: str, row: list[str]) -> bool:
    """Returns whether the Markdown ``table`` has a claims row of exactly these cells (padding aside)."""
    cells = r" \| ".join(re.escape(c) + " *" for c in row)
    return re.search(rf"^\| {cells} \|$", table, re.MULTILINE) is not None


def test_every_committed_folder_is_covered():
    names = {p.name for p in committed_folders()}
    assert len(names) >= 20 and "reefl-20ng-cpu" in names
    for folder in committed_folders():
        assert (folder / "summaries.json").exists() or (folder / FINISHED).exists(), folder


@pytest.mark.parametrize("folder", committed_folders(), ids=lambda p: p.name)
def test_committed_claims_keep_their_verdicts_and_p_values(folder, monkeypatch):
    preset, results, pending = folder_results(folder)
    rows, pvalues = claim_rows(preset, results, pending, report.t_pvalue, monkeypatch)
    old_rows, old_pvalues = claim_rows(preset, results, pending, old_t_pvalue, monkeypatch)
    assert rows == old_rows  # verdicts and measured cells, p as printed
    assert len(pvalues) == len(old_pvalues)
    for p, old in zip(pvalues, old_pvalues):
        assert (p is None) == (old is None)
        if p is not None:
            assert p == pytest.approx(old, rel=RTOL, abs=1e-300)
    if (folder / "table.md").exists():
        table = (folder / "table.md").read_text(encoding="utf-8")
        missing = [row[:2] for row in rows if not committed_row(table, row)]
        assert not missing, f"{folder.name}/table.md does not show these claims so: {missing}"


@pytest.mark.parametrize("df", [1, 1.3, 2, 2.5, 4, 4.992, 7.7, 10, 30, 100, 1000])
def test_t_pvalue_agrees_with_the_reference_over_the_range_claims_use(df):
    # beyond df ~1e4 the reference loses digits (lgamma cancellation: 4e-8 off at 1e7) and scipy's stays exact
    for i in range(401):
        t = i / 10
        assert report.t_pvalue(t, df) == pytest.approx(old_t_pvalue(t, df), rel=RTOL, abs=1e-300)
