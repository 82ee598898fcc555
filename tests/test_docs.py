"""The docs say what the tables say: the generated results index is current, and every relative link resolves."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import results_index  # noqa: E402

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "docs" / "results" / "README.md"]


def test_the_generated_results_index_and_claims_totals_are_current():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "results_index.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("text,kind", [("held", "held"), ("held (not significant: p=0.087)", "held, n.s."),
                                       ("did not hold", "did not hold"),
                                       ("did not hold (one seed: no noise estimate)", "did not hold, n.s."),
                                       ("undecided (2 of 3 seeds)", "undecided")])
def test_verdicts_are_counted_by_kind(text, kind):
    assert results_index.verdict_kind(text) == kind


def test_claims_are_read_from_a_tables_claims_section():
    table = ("# t\n\n## Claims checked\n\n| claim | verdict | measured |\n|---|---|---|\n| a | held | x |\n"
             "| b | did not hold (not significant: p=0.3) | y |\n\nText.\n\n## Diagnosis of the claims that fail\n| c | d |\n")
    assert results_index.claims(table) == {"held": 1, "did not hold, n.s.": 1}


def test_the_readme_is_a_product_page_with_the_set_up_first():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 250
    assert readme.index("make demo") < readme.index("## Quickstart") < readme.index("## Results")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
        if "://" not in target:
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"
