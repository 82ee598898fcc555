"""What the analysis scripts share: a finished run's simulation, and a model's test-set predictions as the run
evaluated them (the global model's sub-model, static BN statistics of the training data)."""

from __future__ import annotations

from pathlib import Path

import torch

from hetfl.methods import load_config
from hetfl.sim import Simulation, device_named
from hetfl.slicing import extract


def load_finished(run_dir: Path) -> Simulation:
    """The run's simulation (its data, partition and method, replayed from config.json) holding its final model.

    On the run's device where this machine has it, else on the CPU: a run that began on a GPU is read here too (the
    device computes a run's evaluations, it does not define them: ``hetfl.bench.runner.NAMED_ON_DEVICE``)."""
    cfg = load_config(str(run_dir / "config.json"), {})
    if device_named(cfg.device).type == "cuda" and not torch.cuda.is_available():
        cfg = cfg.replace(device="cpu")
    sim = Simulation(cfg)
    sim.state.params.update(torch.load(run_dir / "final_model.pt", map_location=sim.device, weights_only=True))
    return sim


def global_model(sim: Simulation, params: dict):
    """The module of the global model's sub-model (its "global" evaluation spec) holding ``params``."""
    spec = sim.method.eval_specs()["global"]
    return sim.eval_models.loaded(spec, extract(params, sim.eval_models.shapes(spec), spec))


def test_predictions(sim: Simulation, params: dict, exit_number: int = -1) -> torch.Tensor:
    """The class each test image gets from the 1-based exit ``exit_number`` (default: the last) of the global
    model's sub-model loaded with ``params``, with static BN as the run evaluated it."""
    model = global_model(sim, params)
    index = exit_number - 1 if exit_number > 0 else exit_number
    with sim._statistics(model), torch.no_grad():
        return torch.cat([model(sim.x_test[i:i + 1000])[index] for i in range(0, len(sim.x_test), 1000)]).argmax(1)
