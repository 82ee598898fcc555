"""One evaluation protocol (DESIGN.md): no accuracy depends on how the test set is batched, and the
ensemble is the mean of the exits' logits."""

import pytest
import torch
from torch import nn

from hetfl.evaluate import evaluate


@pytest.mark.parametrize("method,options", [
    ("alllarge", {}),
    ("depthfl", {}),  # every exit and the ensemble
    ("scalefl", {"client_test_fraction": 0.2}),  # every level's model, and local accuracy
    ("heterofl", {}),  # every width
])
def test_accuracy_does_not_depend_on_the_evaluation_batch_size(tiny_cfg, method, options):
    from hetfl.sim import Simulation

    sim = Simulation(tiny_cfg(method=method, rounds=2, **options))
    sim.run(progress=False)
    results = {}
    for batch_size in (1, 7, 1000):
        sim.cfg = sim.cfg.replace(eval_batch_size=batch_size)
        results[batch_size] = sim.evaluate(2)
    (one, local_one), (big, local_big) = results[1], results[1000]
    assert one.keys() == big.keys()
    for label in one:
        for key in one[label]:
            if key == "loss":
                assert one[label][key] == pytest.approx(big[label][key], rel=1e-4)
            else:
                assert one[label][key] == big[label][key] == results[7][0][label][key], (label, key)
    assert local_one == local_big
    if options.get("client_test_fraction"):
        assert local_one is not None


class FixedExits(nn.Module):
    """Two exits whose logits are given per sample."""

    exit_numbers = (1, 2)

    def __init__(self, first, second):
        super().__init__()
        self.first, self.second = first, second

    def forward(self, x):
        idx = x[:, 0].long()
        return [self.first[idx], self.second[idx]]


def test_ensemble_accuracy_worked_by_hand():
    # sample 0: exit 1 says class 0 (3 vs 0), exit 2 says class 1 (0 vs 1): the mean (1.5, 0.5) says 0
    # sample 1: exit 1 says 1 (0 vs 1), exit 2 says 0 (1.2 vs 0): the mean (0.6, 0.5) says 0
    # sample 2: both say 1
    first = torch.tensor([[3.0, 0.0], [0.0, 1.0], [0.0, 2.0]])
    second = torch.tensor([[0.0, 1.0], [1.2, 0.0], [0.0, 1.0]])
    x = torch.arange(3.0).unsqueeze(1)
    y = torch.tensor([0, 1, 1])
    result = evaluate(FixedExits(first, second), x, y, batch_size=2)
    assert result["exit1"] == pytest.approx(3 / 3)
    assert result["exit2"] == pytest.approx(1 / 3)
    assert result["ensemble"] == pytest.approx(2 / 3)


def test_truncations_are_found_by_equal_tensors_and_a_subset_of_exits():
    from hetfl.evaluate import truncations

    w = torch.arange(6.0)
    states = {"global": {"a": w, "b": w + 1, "exit": w}, "prefix": {"a": w, "exit": w},
              "narrow": {"a": w[:3], "exit": w}, "other": {"a": w * 2, "exit": w}}
    numbers = {"global": (1, 2, 3), "prefix": (1, 3), "narrow": (1,), "other": (1,)}
    found = truncations(states, numbers, ["prefix", "narrow", "other"])
    assert found == {"prefix": ("global", [0, 2])}  # a width slice or other weights are models of their own


@pytest.mark.parametrize("method,options", [("splitmix", {}), ("scalefl", {"levels": 3, "widths": None})])
def test_a_model_scored_from_a_larger_ones_logits_scores_as_if_run_alone(tiny_cfg, method, options):
    """SplitMix's levels hold some of the global model's bases: their scores come from its logits, bit-identical
    to running each level's model alone with its own static BN statistics."""
    from hetfl.evaluate import truncations
    from hetfl.slicing import extract
    from hetfl.sim import Simulation

    sim = Simulation(tiny_cfg(method=method, rounds=2, **{k: v for k, v in options.items() if v is not None}))
    sim.run(progress=False)
    steps = []
    served, _ = sim.evaluate(on_model=steps.append)
    specs = sim.method.eval_specs()
    models = {label: sim.eval_models.module(spec) for label, spec in specs.items()}
    states = {spec: extract(sim.state.params, sim.eval_models.shapes(spec), spec) for spec in specs.values()}
    inside = truncations(states, {s: sim.eval_models.module(s).exit_numbers for s in states}, list(states))
    if method == "splitmix":
        assert inside and len(steps) == len(specs) - len(inside)  # each model run once
    for label, spec in specs.items():
        model = sim.eval_models.loaded(spec, states[spec])
        with sim._statistics(model):
            alone = evaluate(model, sim.x_test, sim.y_test, sim.cfg.eval_batch_size)
        assert served[label] == alone, label
    assert all(step.endswith(f"({len(steps)}/{len(steps)})") for step in steps[-1:])
    del models
