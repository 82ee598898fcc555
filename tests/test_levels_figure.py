"""Each level's model of a bench (``[report] levels = true``, ScaleFL Figure 2): its width and depth ratios and
its accuracy, as a table under the bench's and as levels.png."""

from hetfl.bench.levels import level_models
from hetfl.cli import main
from hetfl.methods import config_from

PRESET = """
title = "levels"
seeds = [0, 1]
[base]
dataset = "digits"
num_clients = 10
client_fraction = 0.3
model_width = 0.25
levels = 4
[[runs]]
label = "HeteroFL (iid)"
method = "heterofl"
[[runs]]
label = "ScaleFL (iid)"
method = "scalefl"
[report]
levels = true
"""


def test_a_width_method_keeps_every_block_and_its_levels_widths():
    cfg = config_from({"method": "heterofl", "dataset": "digits", "levels": 4, "widths": [0.25, 0.5, 0.75, 1.0]})
    rows = level_models(cfg)
    assert [(r["level"], r["width"], r["depth"]) for r in rows] == [(1, 0.25, 1.0), (2, 0.5, 1.0), (3, 0.75, 1.0),
                                                                     (4, 1.0, 1.0)]
    assert [r["model"] for r in rows] == ["width0.25", "width0.5", "width0.75", "global"]


def test_scalefl_levels_cut_depth_and_width_and_the_smallest_keeps_the_least():
    rows = level_models(config_from({"method": "scalefl", "dataset": "digits", "levels": 4}))
    assert [r["model"] for r in rows] == ["level1", "level2", "level3", "global"]
    assert rows[-1]["width"] == rows[-1]["depth"] == 1.0
    assert rows[0]["depth"] < 1.0 and rows[0]["width"] < 1.0
    assert all(a["width"] * a["depth"] <= b["width"] * b["depth"] for a, b in zip(rows, rows[1:]))


def test_the_bench_writes_each_levels_model_as_a_table_and_a_figure(tmp_path, capsys):
    preset = tmp_path / "levels.toml"
    preset.write_text(PRESET)
    out = tmp_path / "out"
    assert main(["bench", str(preset), "--out", str(out), "--runs-dir", str(tmp_path / "runs"), "--rounds", "1",
                 "--quiet"]) == 0
    capsys.readouterr()
    table = (out / "table.md").read_text()
    section = table.split("## Each level's model")[1]
    rows = [line for line in section.splitlines() if line.startswith("| HeteroFL") or line.startswith("| ScaleFL")]
    assert len(rows) == 8 and all(line.rstrip().endswith("| 2 |") for line in rows)  # 2 runs x 4 levels, 2 seeds
    assert (out / "levels.png").stat().st_size > 10_000
