"""The docs say what the tables say: the generated results index is current, and every relative link resolves;
the pilot records the tables' Horizon sections read (scripts/plateau.py)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import plateau  # noqa: E402
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


def test_run_hours_sum_wall_time_per_device_type():
    runs = [{"device": "cpu", "wall_seconds": 1800.0}, {"wall_seconds": 3600.0},  # no device: a CPU run
            {"device": "cuda:0", "wall_seconds": 720.0}, {"device": "cuda", "wall_seconds": 180.0},
            {"device": "cpu", "wall_seconds": None},
            {"device": "cpu", "wall_seconds": 1080.0, "segments": [  # begun on a GPU, finished here
                {"from_round": 1, "device": "cuda:0", "elapsed_before": 0.0},
                {"from_round": 11, "device": "cpu", "elapsed_before": 180.0}]}]
    assert results_index.run_hours(runs) == {"cpu": 1.75, "cuda": 0.3}
    assert results_index._hours(results_index.run_hours(runs)) == "cpu 1.8, cuda 0.3"
    assert results_index._hours({}) == "-"


def test_only_complete_tables_count_as_plateaued_and_interim_ones_show_the_runs_they_lack():
    from collections import Counter

    def row(preset, gaining, missing):
        return {"preset": preset, "title": preset, "runs": 6, "missing": missing, "seeds": [0, 1, 2],
                "rounds": [150], "hours": {"cpu": 1.0}, "gaining": gaining, "rows": 2,
                "claims": Counter({"held": 1}), "diagnosis": False, "recipes": {}}

    rows = [row("done", 0, 0), row("half", 0, 6), row("short", 1, 0)]
    totals = results_index.totals_block(rows)
    assert "3 tables with learning curves, 1 has plateaued (`done`)" in totals
    assert "1 of their 6 rows still gained" in totals and "1 table is interim" in totals
    index = results_index.index_block(rows).splitlines()
    assert [line.split(" | ")[1:4] for line in index[2:]] == [["6", "3 (0-2)", "150"], ["6 of 12", "3 (0-2)", "150"],
                                                              ["6", "3 (0-2)", "150"]]


def test_a_complete_longer_table_of_the_same_runs_supersedes_a_table_and_its_claims_leave_the_totals():
    from collections import Counter

    def row(preset, rounds, recipes, missing=0, held=1):
        return {"preset": preset, "title": preset, "runs": len(recipes), "missing": missing, "seeds": [0],
                "rounds": [rounds], "hours": {}, "gaining": 0, "rows": 1, "claims": Counter({"held": held}),
                "diagnosis": False, "recipes": recipes}

    a, b = {("A", 0): {"lr": 0.1}}, {("A", 0): {"lr": 0.1}, ("B", 0): {"lr": 0.1}}
    rows = [row("short", 30, a), row("long", 150, b, held=2), row("longest-but-interim", 300, b, missing=1),
            row("other-lr", 600, {("A", 0): {"lr": 0.2}}), row("mid", 100, a)]
    # the longest complete one that holds every run, recipe for recipe; an interim or retuned table supersedes nothing
    assert results_index.superseded_by(rows) == {"short": "long", "mid": "long"}
    totals = results_index.totals_block(rows)
    assert totals.startswith("4 claims checked in 3 tables (2 more, superseded by the same runs at a longer "
                             "horizon, left out: `mid`, `short`): 4 held")
    assert "(superseded by [long](long/table.md)" in results_index.index_block(rows).splitlines()[2]


def test_the_readme_is_a_product_page_with_the_set_up_first():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 250
    assert readme.index("make demo") < readme.index("## Quickstart") < readme.index("## Results")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
        if "://" not in target:
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"


def test_the_plateau_round_is_the_first_from_which_every_longer_horizon_gains_under_a_point():
    curve = [(10, 0.50), (20, 0.70), (30, 0.80), (40, 0.805), (50, 0.815), (60, 0.812)]
    # the last third of horizon 40 starts after round 26.7: 0.805 - 0.70 = 10.5 points; of 50, after 33.3:
    # 0.815 - 0.80 = 1.5; of 60, after 40: 0.812 - 0.805 = 0.7
    assert plateau.plateau_round(curve) == 60
    assert plateau.plateau_round(curve, threshold=0.02) == 50
    assert plateau.plateau_round([(10, 0.5), (20, 0.6), (30, 0.7)]) is None


def test_a_longer_table_becomes_a_pilot_record_that_the_bench_reads(tmp_path):
    from hetfl.bench.runner import pilots_of

    longer = tmp_path / "longer"
    longer.mkdir()
    curve = [[20, 0.5], [40, 0.6], [60, 0.605]]
    (longer / "summaries.json").write_text(json.dumps({"A": [
        {"seed": s, "rounds": 60, "curve": curve, "wall_seconds": 6.0, "run_dir": f"runs/a-s{s}"} for s in (0, 1)]}))
    out = tmp_path / "pilots" / "p.json"
    assert plateau.main(["--table", str(longer), "--for", "short", "--json", str(out), "--device", "a CPU"]) == 0
    [pilot] = pilots_of("short", out.parent)
    assert (pilot["device"], pilot["rounds"]) == ("a CPU", 60)
    assert [(r["seed"], r["run"], r["last_round"], r["plateau_round"]) for r in pilot["rows"]] == \
        [(0, "a-s0", 60, 60), (1, "a-s1", 60, 60)]


def test_a_results_folder_without_summaries_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "finished-runs.json").write_text("{}")  # an interim table's folder
    with pytest.raises(SystemExit) as stop:
        plateau.main(["--table", str(tmp_path)])
    assert stop.value.code == 2
    [*_, line] = capsys.readouterr().err.strip().splitlines()
    assert "has no summaries.json" in line


def test_the_index_counts_an_interim_table_s_finished_runs_beside_its_summaries(tmp_path):
    """A table whose summaries.json holds some rows and whose finished-runs.json holds runs finished since: the
    index counts both, as the interim table does."""
    from hetfl.bench.runner import FINISHED, _named_configs, load_preset

    configs = _named_configs(load_preset("demo")[1], {}, None, Path("runs") / "bench")
    (first, seed_a, cfg_a), (last, seed_b, cfg_b) = configs[0], configs[-1]
    assert first != last

    def summary(cfg, seed):
        return {"seed": seed, "rounds": 1, "accuracy": 0.5, "curve": [[1, 0.5]], "wall_seconds": 3600.0,
                "run_dir": f"runs/bench/{cfg.name}"}

    folder = tmp_path / "demo"
    folder.mkdir()
    (folder / "summaries.json").write_text(json.dumps({first: [summary(cfg_a, seed_a)]}))
    (folder / FINISHED).write_text(json.dumps({cfg_b.name: summary(cfg_b, seed_b)}))
    results, missing = results_index.results_of(folder)
    assert {label: len(runs) for label, runs in results.items()} == {first: 1, last: 1}
    assert missing == len(configs) - 2
