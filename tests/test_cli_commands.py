"""The CLI's working paths: run from TOML + flags, data describe, bench presets, plot."""

import json
import re

import pytest

from hetfl.cli import main

TINY = ["--dataset", "digits", "--num-clients", "20", "--model-width", "0.25", "--quiet"]


def test_run_from_toml_with_flag_override(tmp_path, capsys):
    cfg = tmp_path / "exp.toml"
    cfg.write_text('dataset = "digits"\nnum_clients = 20\nmodel_width = 0.25\nrounds = 5\nlr = 0.5\n')
    out = tmp_path / "runs"
    assert main(["run", "--config", str(cfg), "--rounds", "2", "--out", str(out), "--name", "r", "--quiet"]) == 0
    resolved = json.loads((out / "r" / "config.json").read_text())
    assert resolved["rounds"] == 2 and resolved["lr"] == 0.5 and resolved["num_clients"] == 20
    printed = capsys.readouterr().out
    assert "ensemble" in printed and "MB down" in printed  # the summary table


def test_data_describe_prints_histogram_and_writes_heatmap(tmp_path, capsys):
    png = tmp_path / "skew.png"
    code = main(["data", "describe", "--dataset", "digits", "--num-clients", "8", "--partition", "pathological",
                 "--classes-per-client", "2", "--png", str(png)])
    assert code == 0
    out = capsys.readouterr().out
    assert "heat map written" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_preset_table_mean_std_and_reuse(tmp_path, capsys):
    preset = tmp_path / "mini.toml"
    preset.write_text("""
title = "mini"
seeds = [0, 1]
[base]
dataset = "digits"
num_clients = 10
model_width = 0.25
rounds = 2
client_fraction = 0.5
[[runs]]
label = "AllLarge"
method = "alllarge"
[[runs]]
label = "Exclusive (a)"
method = "exclusivefl"
global_level = 1
[report]
models = true
[[claims]]
claim = "the full model beats the first block alone"
better = "AllLarge"
worse = ["Exclusive (a)"]
[[claims]]
claim = "the first block alone beats the full model (false)"
better = "Exclusive (a)"
worse = "AllLarge"
""")
    out, runs = tmp_path / "results", tmp_path / "runs"
    args = ["bench", str(preset), "--out", str(out), "--runs-dir", str(runs), "--quiet"]
    assert main(args) == 0
    table = (out / "table.md").read_text()
    assert "| AllLarge " in table and "| Exclusive (a) " in table and " ± " in table
    assert "Regenerate: `hetfl bench" in table
    assert "| AllLarge      | global " in table  # the table of every evaluated model
    claims = table.split("## Claims checked")[1]
    noise = r"( \(not significant: p=[\d.]+\))?"  # two seeds: Welch's t decides whether the gap is noise
    assert re.search(rf"\| the full model beats the first block alone +\| held{noise} +\|", claims)
    assert re.search(rf"\| the first block alone beats the full model \(false\) +\| did not hold{noise} +\|", claims)
    assert (out / "curves.png").exists()
    summaries = json.loads((out / "summaries.json").read_text())
    assert [s["seed"] for s in summaries["AllLarge"]] == [0, 1]
    (run,) = runs.glob("alllarge-*-s0")  # named by a hash of its config
    stamp = (run / "summary.json").stat().st_mtime_ns
    assert main(args) == 0  # finished runs are reused, not rerun
    assert (run / "summary.json").stat().st_mtime_ns == stamp


def test_plot_run(tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(["run", *TINY, "--rounds", "2", "--out", str(out), "--name", "r"]) == 0
    assert main(["plot", str(out / "r")]) == 0
    assert (out / "r" / "curves.png").exists()


def test_unknown_bench_preset(capsys):
    assert main(["bench", "nope"]) == 2
    assert "bench preset 'nope' is unknown" in capsys.readouterr().err


def test_costs_takes_model_as_flag_and_prints_the_split_as_json(capsys):
    assert main(["costs", "--model", "cnn", "--method", "scalefl", "--no-latency", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)  # nothing but JSON on stdout
    assert [row["level"] for row in out["split"]] == [1, 2, 3, 4]
    assert all(row["within_epsilon"] for row in out["split"])
    assert [row["label"] for row in out["rows"]] == ["level 1", "level 2", "level 3", "level 4"]
    assert out["rows"][-1]["spec"]["width"] == 1.0


def test_costs_table_of_a_backbone(capsys):
    assert main(["costs", "cnn", "--model-width", "0.25", "--no-latency"]) == 0
    out = capsys.readouterr().out
    for label in ("depth 1", "depth 3", "width 0.5", "full"):
        assert label in out


MINI = """
title = "mini"
seeds = [0]
[base]
dataset = "digits"
num_clients = 10
model_width = 0.25
rounds = 1
client_fraction = 0.5
[[runs]]
label = "first"
method = "alllarge"
[[runs]]
label = "second"
method = "allsmall"
"""


def test_a_preset_extending_another_takes_its_setup_with_its_own_base_keys_and_words(tmp_path):
    """``extends``: the parent's runs, claims and seeds, its [base] with the child's keys replacing the parent's
    one by one, and only the child's title, description and diagnosis; a loop of two files is refused."""
    from hetfl.bench.runner import load_preset, preset_configs
    from hetfl.errors import HetflError

    claim = '[[claims]]\nclaim = "first beats second"\nbetter = "first"\nworse = "second"\n'
    short = MINI.replace('title = "mini"', 'title = "mini"\ndiagnosis = "at 1 round, nothing plateaus"') + claim
    (tmp_path / "short.toml").write_text(short)
    (tmp_path / "long.toml").write_text('extends = "short.toml"\ntitle = "mini at 3 rounds"\n[base]\nrounds = 3\n')
    _, parent = load_preset(str(tmp_path / "short.toml"))
    _, child = load_preset(str(tmp_path / "long.toml"))
    assert child == {"title": "mini at 3 rounds", "seeds": [0], "base": {**parent["base"], "rounds": 3},
                     "runs": parent["runs"], "claims": parent["claims"], "extends": str(tmp_path / "short.toml")}
    assert [(cfg.method, cfg.rounds, cfg.num_clients) for _, _, cfg in preset_configs(child, {}, None)] == [
        ("alllarge", 3, 10), ("allsmall", 3, 10)]
    _, shipped = load_preset("fedepth-table2")
    _, longer = load_preset("fedepth-table2-150")
    assert longer["base"] == {**shipped["base"], "rounds": 150} and longer["runs"] == shipped["runs"]
    assert longer["diagnosis"] != shipped["diagnosis"]
    (tmp_path / "short.toml").write_text('extends = "long.toml"\n' + short)
    with pytest.raises(HetflError, match="loops back: .*long.toml -> .*short.toml -> .*long.toml"):
        load_preset(str(tmp_path / "long.toml"))


def test_bench_processes_share_runs_through_locks(tmp_path, capsys):
    """A run another process holds is put off until the others are done, then reused, not trained again."""
    import threading
    import time

    from hetfl.bench.runner import load_preset, preset_configs, run_lock

    preset = tmp_path / "mini.toml"
    preset.write_text(MINI)
    runs = tmp_path / "runs"
    _, parsed = load_preset(str(preset))
    first = preset_configs(parsed, {}, None)[0][2].replace(out=str(runs))
    held, release = threading.Event(), threading.Event()

    def other_process():
        with run_lock(first, wait=True):
            held.set()
            release.wait(30)

    thread = threading.Thread(target=other_process)
    thread.start()
    held.wait(10)
    with run_lock(first, wait=False) as mine:
        assert mine is False
    threading.Timer(3.0, release.set).start()
    started = time.time()
    assert main(["bench", str(preset), "--out", str(tmp_path / "out"), "--runs-dir", str(runs), "--quiet"]) == 0
    thread.join()
    out = capsys.readouterr().out
    assert out.index("second, seed 0") < out.index("first, seed 0")  # the held run came last
    assert time.time() - started >= 2.5  # and was waited for


def test_a_finished_run_is_found_under_any_label(tmp_path, capsys):
    preset = tmp_path / "mini.toml"
    preset.write_text(MINI)
    runs = tmp_path / "runs"
    args = ["bench", str(preset), "--out", str(tmp_path / "out"), "--runs-dir", str(runs), "--quiet"]
    assert main(args) == 0
    (run,) = runs.glob("alllarge-*-s0")
    renamed = run.rename(runs / ("some-other-label-" + run.name.split("-", 1)[1]))
    stamp = (renamed / "summary.json").stat().st_mtime_ns
    assert main(args) == 0
    assert not list(runs.glob("alllarge-*-s0"))  # not trained again
    assert (renamed / "summary.json").stat().st_mtime_ns == stamp


@pytest.mark.parametrize("command", [["run"], ["costs"], ["bench"], ["data", "describe"], []])
def test_help_of_every_command(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: hetfl" in capsys.readouterr().out


def test_a_new_target_reuses_the_runs_and_reads_the_rounds_off_their_curves(tmp_path, capsys):
    preset = tmp_path / "mini.toml"
    runs = tmp_path / "runs"
    args = ["bench", str(preset), "--out", str(tmp_path / "out"), "--runs-dir", str(runs), "--quiet"]
    preset.write_text(MINI.replace("rounds = 1", "rounds = 2\ntarget_accuracy = 0.01"))
    assert main(args) == 0
    stamps = {p: p.stat().st_mtime_ns for p in runs.glob("*/summary.json")}
    preset.write_text(MINI.replace("rounds = 1", "rounds = 2\ntarget_accuracy = 0.99"))
    assert main(args) == 0
    assert {p: p.stat().st_mtime_ns for p in runs.glob("*/summary.json")} == stamps  # nothing trained again
    summaries = json.loads((tmp_path / "out" / "summaries.json").read_text())
    assert summaries["first"][0]["target_accuracy"] == 0.99 and summaries["first"][0]["rounds_to_target"] is None


def test_reuse_saved_takes_runs_from_the_committed_summaries_when_the_runs_folder_is_gone(tmp_path, capsys):
    """A new machine has no runs folder: --reuse-saved takes a run whose folder name (method, hash of its
    values, seed) the table's summaries.json holds, and trains only what it lacks (here a new seed)."""
    preset = tmp_path / "mini.toml"
    preset.write_text(MINI)
    out = tmp_path / "out"
    args = ["bench", str(preset), "--out", str(out), "--quiet", "--seeds", "0"]
    assert main([*args, "--runs-dir", str(tmp_path / "old-machine")]) == 0
    before = json.loads((out / "summaries.json").read_text())
    runs = tmp_path / "new-machine"
    assert main([*args, "--runs-dir", str(runs), "--reuse-saved"]) == 0
    assert not runs.exists()  # nothing trained
    assert json.loads((out / "summaries.json").read_text()) == before
    assert "its saved summary" in capsys.readouterr().out
    assert main(["bench", str(preset), "--out", str(out), "--quiet", "--seeds", "0,1", "--runs-dir", str(runs),
                 "--reuse-saved"]) == 0
    assert sorted(p.name.rsplit("-", 1)[1] for p in runs.glob("*-*-s*")) == ["s1", "s1"]  # seed 1 only
    after = json.loads((out / "summaries.json").read_text())
    assert [s["seed"] for s in after["first"]] == [0, 1] and after["first"][0] == before["first"][0]
    # a bench of one seed keeps the table's other seeds (same run folder names) instead of dropping them
    assert main([*args[:-1], "1", "--runs-dir", str(runs)]) == 0
    assert json.loads((out / "summaries.json").read_text()) == after
    assert "hetfl bench" in (table := (out / "table.md").read_text()) and "--seeds 1" not in table


def test_an_interrupted_bench_leaves_its_finished_runs_for_reuse_saved(tmp_path, monkeypatch):
    """Each finished run is added to the results folder's finished-runs.json at once: a bench stopped half-way
    (and its runs folder lost with the machine) resumes from it with --reuse-saved; the file goes once
    summaries.json is written."""
    import hetfl.bench.runner as runner

    preset = tmp_path / "mini.toml"
    preset.write_text(MINI)
    out = tmp_path / "out"
    real_run_one, calls = runner.run_one, []

    def stopped_at_the_second_run(cfg, progress):
        calls.append(cfg.name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_run_one(cfg, progress)

    monkeypatch.setattr(runner, "run_one", stopped_at_the_second_run)
    args = ["bench", str(preset), "--out", str(out), "--quiet"]
    assert main([*args, "--runs-dir", str(tmp_path / "old-machine")]) == 130  # Ctrl-C
    finished = json.loads((out / runner.FINISHED).read_text())
    assert list(finished) == calls[:1] and not (out / "summaries.json").exists()
    monkeypatch.setattr(runner, "run_one", real_run_one)
    runs = tmp_path / "new-machine"
    assert main([*args, "--runs-dir", str(runs), "--reuse-saved"]) == 0
    assert [p.name for p in runs.glob("*-*-s*")] == [calls[1]]  # only the unfinished run trained
    assert not (out / runner.FINISHED).exists()
    summaries = json.loads((out / "summaries.json").read_text())
    assert summaries["first"][0] == finished[calls[0]]


def test_a_bench_of_some_seeds_keeps_the_other_seeds_finished_runs(tmp_path):
    """A bench writing summaries.json drops from finished-runs.json only its own runs: a seed another
    process finished (not asked for here) stays there for the bench of every seed."""
    import hetfl.bench.runner as runner

    preset = tmp_path / "mini.toml"
    preset.write_text(MINI)
    out = tmp_path / "out"
    out.mkdir()
    other_seed = {"first-0123456789-s1": {"accuracy": 0.5}}
    (out / runner.FINISHED).write_text(json.dumps(other_seed))
    assert main(["bench", str(preset), "--out", str(out), "--quiet", "--seeds", "0",
                 "--runs-dir", str(tmp_path / "runs")]) == 0
    assert json.loads((out / runner.FINISHED).read_text()) == other_seed
