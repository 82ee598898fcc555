"""Bad input: one line on stderr naming the field and what is allowed, exit code 2, no run folder."""

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from hetfl.cli import main

FMNIST = Path("/usr/share/datasets/fashion-mnist")


def run_cli(args, capsys):
    code = main(args)
    err = capsys.readouterr().err
    return code, err


def assert_clean_error(code, err, fragment, out_dir):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("hetfl: error:")
    assert fragment in lines[0], lines[0]
    assert not Path(out_dir).exists() or not any(Path(out_dir).iterdir())


TINY = ["--dataset", "digits", "--num-clients", "20", "--rounds", "1", "--model-width", "0.25", "--quiet"]


@pytest.mark.parametrize("flags,fragment", [
    (["--method", "fedbest"], "method 'fedbest' is unknown; choose one of: alllarge"),
    (["--dataset", "imagenet"], "dataset 'imagenet' is unknown"),
    (["--colour", "red"], "unrecognized arguments: --colour"),
    (["--alpha", "0", "--partition", "dirichlet"], "alpha must be > 0"),
    (["--alpha", "-1"], "alpha must be > 0"),
    (["--client-fraction", "0"], "client_fraction must be in (0, 1]"),
    (["--client-fraction", "1.5"], "client_fraction must be in (0, 1]"),
    (["--proportions", "1,-1,1,1"], "proportions must be >= 0"),
    (["--proportions", "0,0,0,0"], "proportions must not sum to zero"),
    (["--proportions", "1,1,1,100"], "give no client to level(s) [1, 2, 3]"),
    (["--proportions", "1,1"], "proportions has 2 entries but levels is 4"),
    (["--partition", "shards"], "partition 'shards' is not allowed; choose one of: iid"),
    (["--rounds", "ten"], "rounds must be of type int"),
    (["--global-level", "7", "--method", "exclusivefl"], "global_level must be in 1..4"),
    (["--global-level", "2"], "global_level is an option of exclusivefl; method 'alllarge' does not use it"),
    (["--method", "depthfl", "--kd-weight", "-1"], "kd_weight must be >= 0"),
    (["--method", "scalefl", "--kd-weight", "1"], "kd_weight is an option of exclusivefl, depthfl, depthfl-fedavg, "
                                                  "reefl, reefl-nokd; method 'scalefl' does not use it"),
    (["--method", "sheterofl", "--kd-weight", "1"], "method 'sheterofl' does not use it"),
    (["--method", "scalefl", "--scalefl-beta", "1"], "scalefl_beta must be in [0, 1)"),
    (["--method", "depthfl", "--levels", "5"], "levels 5 is beyond the depth of model 'cnn' (4 sub-models for method 'depthfl' with depth scaling)"),
    (["--scenario", "sometimes"], "scenario 'sometimes' is not allowed; choose one of: fixed, dynamic, maximum"),
    (["--method", "inclusivefl", "--model", "cnn", "--levels", "3"], "momentum distillation needs blocks of identical shapes"),
    (["--md-beta", "0.5"], "md_beta is an option of inclusivefl, inclusivefl-womd; method 'alllarge' does not"),
    (["--method", "inclusivefl", "--model", "vit", "--md-beta", "1.5"], "md_beta must be in [0, 1]"),
    (["--method", "heterofl", "--widths", "0.25,0.5,1.5,1"], "widths must be in (0, 1]"),
    (["--method", "heterofl", "--widths", "0,0.5,0.75,1"], "widths must be in (0, 1]"),
    (["--method", "heterofl", "--widths", "0.5,0.25,0.75,1"], "widths must increase"),
    (["--method", "depthfl", "--budget", "memory", "--budget-ratios", "0.01,0.5,0.75,1"],
     "client 5 (level 1): a budget of 0.02 MiB of training memory is smaller than the smallest sub-model (depth 1"),
    (["--budget", "macs", "--budget-ratios", "0.5,0.25,0.75,1"], "budget_ratios must increase"),
    (["--method", "scalefl", "--split-epsilon", "0"], "split_epsilon must be > 0"),
    (["--method", "scalefl", "--split-epsilon", "-0.1"], "split_epsilon must be > 0"),
    (["--method", "scalefl", "--budget-ratios", "0.25,0.5,0.75,0.9"], "the last budget ratio must be 1"),
    (["--method", "heterofl", "--scaling", "depth"], "method 'heterofl' cuts its sub-models by width"),
])
def test_bad_options(tmp_path, capsys, flags, fragment):
    out = tmp_path / "runs"
    code, err = run_cli(["run", *TINY, "--out", str(out), *flags], capsys)
    assert_clean_error(code, err, fragment, out)


def test_unknown_option_in_config_file(tmp_path, capsys):
    cfg = tmp_path / "exp.toml"
    cfg.write_text('dataset = "digits"\nnum_clinets = 10\n')
    out = tmp_path / "runs"
    code, err = run_cli(["run", "--config", str(cfg), "--out", str(out)], capsys)
    assert_clean_error(code, err, "option 'num_clinets' is unknown", out)


def test_missing_data_files(tmp_path, capsys):
    out = tmp_path / "runs"
    code, err = run_cli(["run", "--dataset", "mnist", "--data-dir", str(tmp_path / "nowhere"), "--out", str(out)], capsys)
    assert_clean_error(code, err, "--data-dir", out)


@pytest.mark.skipif(not FMNIST.exists(), reason="needs the Debian package dataset-fashion-mnist")
def test_checksum_mismatch(tmp_path, capsys):
    data = tmp_path / "fmnist"
    data.mkdir()
    for f in FMNIST.glob("*.gz"):
        os.symlink(f, data / f.name)
    labels = data / "t10k-labels-idx1-ubyte.gz"
    raw = bytearray(gzip.decompress(labels.read_bytes()))
    raw[-1] = (raw[-1] + 1) % 10  # one label changed: still a valid IDX file
    labels.unlink()
    (data / "t10k-labels-idx1-ubyte").write_bytes(bytes(raw))
    out = tmp_path / "runs"
    code, err = run_cli(["run", "--dataset", "fmnist", "--data-dir", str(data), "--out", str(out)], capsys)
    assert_clean_error(code, err, "checksum", out)


def finished_run(tmp_path, capsys):
    out = tmp_path / "runs"
    code, _ = run_cli(["run", *TINY, "--out", str(out), "--name", "r", "--checkpoint-every", "1"], capsys)
    assert code == 0
    return out / "r"


def test_corrupt_checkpoint(tmp_path, capsys):
    run = finished_run(tmp_path, capsys)
    state = run / "checkpoint" / "state.pt"
    state.write_bytes(state.read_bytes()[:100])
    before = sorted(p.name for p in run.rglob("*"))
    code, err = run_cli(["run", "--resume", str(run)], capsys)
    assert code == 2 and "corrupt" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in run.rglob("*")) == before  # nothing touched


def test_foreign_checkpoint(tmp_path, capsys):
    run = finished_run(tmp_path, capsys)
    other_out = tmp_path / "other"
    assert run_cli(["run", *TINY, "--seed", "5", "--out", str(other_out), "--name", "o"], capsys)[0] == 0
    shutil.rmtree(run / "checkpoint")
    shutil.copytree(other_out / "o" / "checkpoint", run / "checkpoint")
    code, err = run_cli(["run", "--resume", str(run)], capsys)
    assert code == 2 and "belongs to another experiment" in err


def test_a_checkpoint_from_before_an_option_existed_still_resumes(tmp_path, capsys):
    """Options added later (dropout_fraction, ...) are recorded only when set, so older checkpoints lack them;
    a checkpoint that recorded one at its default (split_nested, written before it was marked) matches too."""
    run = finished_run(tmp_path, capsys)
    state = run / "checkpoint" / "state.pt"
    payload = torch.load(state, weights_only=True)
    for option in ("dropout_fraction", "corrupt_fraction", "round_timeout", "split_nested"):
        assert option not in payload["config"]
    payload["config"]["split_nested"] = True
    torch.save(payload, state)
    (run / "summary.json").unlink()  # so the resume reads the checkpoint
    assert run_cli(["run", "--resume", str(run)], capsys)[0] == 0
    payload["config"]["lr"] = 1.0  # but an option that differs still makes it another experiment's
    torch.save(payload, state)
    (run / "summary.json").unlink()
    code, err = run_cli(["run", "--resume", str(run)], capsys)
    assert code == 2 and "belongs to another experiment" in err


def test_a_run_begun_on_an_accelerator_goes_on_on_the_cpu(tiny_cfg, capsys):
    """The device is no part of the experiment: a run whose folder names cuda (made so by hand here, as a run a GPU
    cut short comes back) resumes with --device cpu, and each stretch of rounds names its hardware."""
    from hetfl.sim import Simulation

    whole = Simulation(tiny_cfg(name="whole")).run(progress=False)
    cut = Simulation(tiny_cfg(name="cut"))
    cut.run(progress=False, stop_after=2)
    run, state = cut.run_dir, cut.run_dir / "checkpoint" / "state.pt"
    payload = torch.load(state, weights_only=True)
    payload["config"]["device"] = "cuda"
    torch.save(payload, state)
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "device": "cuda"}))
    if not torch.cuda.is_available():  # its own device, absent here: a clean error that says what to do
        code, err = run_cli(["run", "--resume", str(run)], capsys)
        assert code == 2 and "CUDA is not available" in err and "--device cpu" in err
    code, err = run_cli(["run", "--resume", str(run), "--lr", "0.5"], capsys)
    assert code == 2 and "no other options but --device" in err
    assert run_cli(["run", "--resume", str(run), "--device", "cpu"], capsys)[0] == 0
    summary = json.loads((run / "summary.json").read_text())
    assert [json.loads(line)["round"] for line in open(run / "metrics.jsonl")] == [1, 2, 3]
    assert [s["from_round"] for s in summary["segments"]] == [1, 3]
    whole = torch.load(Path(whole["run_dir"]) / "final_model.pt", weights_only=True)
    resumed = torch.load(run / "final_model.pt", weights_only=True)
    assert whole.keys() == resumed.keys() and all(torch.equal(whole[k], resumed[k]) for k in whole)  # a CPU's


def test_not_a_checkpoint(tmp_path, capsys):
    run = finished_run(tmp_path, capsys)
    torch.save({"weights": torch.zeros(2)}, run / "checkpoint" / "state.pt")
    code, err = run_cli(["run", "--resume", str(run)], capsys)
    assert code == 2 and "is not a hetfl checkpoint" in err


def test_resume_of_a_folder_that_is_no_run(tmp_path, capsys):
    code, err = run_cli(["run", "--resume", str(tmp_path)], capsys)
    assert code == 2 and "not a hetfl run folder" in err


def test_methods_lists_every_method(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    for name in ("alllarge", "allsmall", "exclusivefl", "decoupled"):
        assert name in out
