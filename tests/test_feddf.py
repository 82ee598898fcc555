"""FedDF: the distillation loss by hand, the server set no client holds, distillation lowering the ensemble-to-model
KL, determinism and a short run well above chance."""

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from weights import assert_identical

from hetfl.data import load_dataset
from hetfl.data.server import server_data
from hetfl.errors import HetflError
from hetfl.methods import config_from
from hetfl.methods.feddf import distillation_kl
from hetfl.sim import Simulation

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import feddf_distillation  # noqa: E402

SMALL = dict(method="feddf", dataset="digits", num_clients=10, client_fraction=0.5, distill_steps=40,
             distill_eval_every=10, distill_patience=20)


def test_distillation_kl_by_hand():
    """KL(softmax(t / T) || softmax(s / T)) T^2: teacher (0, ln 3) -> (1/4, 3/4), student (0, 0) -> (1/2, 1/2)."""
    teacher, student = torch.tensor([[0.0, math.log(3.0)]]), torch.zeros(1, 2)
    expected = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    assert distillation_kl(student, teacher, 1.0).item() == pytest.approx(expected, rel=1e-6)
    p = torch.softmax(teacher / 2, 1)  # at T = 2 the student's softmax stays uniform; the KL is scaled by T^2
    assert distillation_kl(student, teacher, 2.0).item() == pytest.approx(
        4 * float((p * (p / 0.5).log()).sum()), rel=1e-6)
    assert distillation_kl(teacher, teacher, 1.0).item() == pytest.approx(0.0, abs=1e-7)


def test_the_holdout_is_a_part_of_the_training_set_no_client_holds():
    sim = Simulation(config_from({**SMALL, "distill_size": 200}))
    held_by_clients = torch.cat(sim.parts)
    assert len(held_by_clients) + 200 == len(sim.x_train)  # every other training sample is a client's
    assert len(set(held_by_clients.tolist())) == len(held_by_clients)
    server = torch.cat([sim.method.x_distil, sim.method.x_val])
    assert len(sim.method.x_val) == 20 and len(server) == 200
    free = sorted(set(range(len(sim.x_train))) - set(held_by_clients.tolist()))
    assert torch.equal(server.sort(0).values, sim.x_train[free].sort(0).values)


def test_server_set_errors_say_what_is_allowed():
    digits = load_dataset("digits")
    with pytest.raises(HetflError, match="more than half"):
        server_data("holdout", len(digits.y_train), digits, seed=0)
    with pytest.raises(HetflError, match="the run's own dataset"):
        server_data("digits", 100, digits, seed=0)
    with pytest.raises(HetflError, match="same shape"):
        server_data("fmnist", 100, digits, seed=0)


def test_distillation_lowers_the_ensemble_to_model_kl_and_a_run_is_deterministic():
    def run():
        sim = Simulation(config_from({**SMALL, "rounds": 3}))
        log = sim.run_round(1)
        first = dict(sim.method.last_distillation)
        assert log.server == {"distillation": {str(level): d for level, d in first.items()}}  # in metrics.jsonl
        assert sorted(first) == list(range(1, sim.method.num_levels + 1)) and all(d["seconds"] > 0
                                                                                     for d in first.values())
        for r in (2, 3):
            sim.run_round(r)
        return sim, first

    (a, first), (b, _) = run(), run()
    # round 1: the level averages are far from the ensemble of the clients, and every level's model moves towards it
    for level, d in first.items():
        assert d["val_kl_after"] < 0.8 * d["val_kl_before"], (level, d)
    for level, d in a.method.last_distillation.items():  # later: never worse (the best student is kept)
        assert d["val_kl_after"] <= d["val_kl_before"], (level, d)
        assert d["steps"] <= 40 and d["steps"] - d["best_step"] <= 20
    assert all(torch.equal(a.state.params[k], b.state.params[k]) for k in a.state.params)
    accuracy = a.evaluate(3)[0]["global"]["exit4"]
    assert accuracy > 0.6  # chance: 0.1


def test_the_distillation_summary_reads_the_rounds_that_logged_it(tmp_path):
    """scripts/feddf_distillation.py: medians per level over the rounds with a ``server`` field, older rounds
    skipped, and the share of each round spent distilling."""
    def level(steps, before, after, seconds):
        return {"steps": steps, "best_step": steps - 25, "val_kl_before": before, "val_kl_after": after,
                "seconds": seconds}

    lines = [{"round": 1, "seconds": 50.0},  # older code: no server field
             {"round": 2, "seconds": 100.0, "server": {"distillation": {"1": level(50, 0.04, 0.01, 20.0),
                                                                        "2": level(100, 0.02, 0.01, 40.0)}}},
             {"round": 3, "seconds": 200.0, "server": {"distillation": {"1": level(150, 0.02, 0.005, 40.0),
                                                                        "2": level(200, 0.06, 0.02, 60.0)}}}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert feddf_distillation.summary(tmp_path) == [
        [tmp_path.name, "1", "2", "100", "75", "0.0300", "0.0075", "30.0"],
        [tmp_path.name, "2", "2", "150", "125", "0.0400", "0.0150", "50.0"],
        [tmp_path.name, "all", "2", "-", "-", "-", "-", "55% of a round"]]  # median of 60% and 50%


def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(tmp_path):
    """The server's distillation (its batches, its early stopping) draws nothing a checkpoint loses: a run stopped
    after round 2 and resumed ends bit-identical to one that never stopped."""
    cfg = config_from({**SMALL, "rounds": 3, "checkpoint_every": 1, "out": str(tmp_path)})
    whole = Simulation(cfg.replace(name="whole")).run(progress=False)
    cut = Simulation(cfg.replace(name="cut"))
    cut.run(progress=False, stop_after=2)
    resumed = Simulation.resume(cut.run_dir)
    assert resumed.start_round == 2
    summary = resumed.run(progress=False)
    load = lambda s: torch.load(f"{s['run_dir']}/final_model.pt", weights_only=True)  # noqa: E731
    assert_identical(load(whole), load(summary))
