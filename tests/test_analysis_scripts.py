"""scripts/finished_run.py, what the analysis scripts share: a finished run's test predictions are the run's own
evaluation, also for a run whose config names a GPU this machine lacks."""

import json
import sys
from pathlib import Path

import pytest
import torch

from hetfl.sim import Simulation

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import finished_run  # noqa: E402  (its test_predictions is no test)


@pytest.fixture
def finished(tiny_cfg):
    sim = Simulation(tiny_cfg(method="depthfl", rounds=2))
    summary = sim.run(progress=False)
    return sim.run_dir, summary


def accuracy(run_dir: Path, exit_number: int) -> float:
    sim = finished_run.load_finished(run_dir)
    return (finished_run.test_predictions(sim, sim.state.params, exit_number) == sim.y_test).double().mean().item()


def test_the_predictions_are_the_runs_own_evaluation(finished):
    run_dir, summary = finished
    final = summary["final"]["global"]
    for number in (1, 4):
        assert accuracy(run_dir, number) == pytest.approx(final[f"exit{number}"], abs=1e-12)


@pytest.mark.skipif(torch.cuda.is_available(), reason="reads a GPU run on a machine without one")
def test_a_run_begun_on_a_gpu_is_read_on_the_cpu(finished):
    run_dir, summary = finished
    config = run_dir / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "device": "cuda:0"}))
    assert accuracy(run_dir, 4) == pytest.approx(summary["final"]["global"]["exit4"], abs=1e-12)
