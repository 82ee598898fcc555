"""Every method is deterministic, and FedDyn's client state works under width slicing (DESIGN.md)."""

import pytest
import torch

from hetfl.client import client_update
from hetfl.methods import METHODS
from hetfl.slicing import corner
from hetfl.trainers.schedule import ClientData

# every method on its own defaults (its paper's backbone included); m-FeDepth with a budget that affords peers
OPTIONS = {"m-fedepth": {"budget_ratios": [1 / 6, 1 / 3, 1 / 2, 2.0]}}


# FedDF (44 s) is a soak: make test keeps its determinism in tests/test_feddf.py's distillation and resume tests
@pytest.mark.parametrize("method", [pytest.param(m, marks=pytest.mark.soak) if m == "feddf" else m for m in METHODS])
def test_same_config_gives_bit_identical_weights_for_every_method(tiny_cfg, method):
    from hetfl.sim import Simulation

    runs = []
    for name in ("a", "b"):
        sim = Simulation(tiny_cfg(method=method, rounds=2, name=name, **OPTIONS.get(method, {})))
        sim.run(progress=False)
        runs.append((sim.state.params, sim.history[-1]["eval"]))
    (a, eval_a), (b, eval_b) = runs
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert eval_a == eval_b


def test_feddyn_client_state_under_width_slicing(tiny_cfg):
    """A width-0.5 client reads and updates only the leading corner of its global-shaped g_k."""
    from hetfl.devices import Budget
    from hetfl.sim import Simulation

    sim = Simulation(tiny_cfg(method="heterofl", server_opt="feddyn", scaler=False))
    task, local = sim.method.configure(sim.state, 0, Budget(level=2), 1)
    assert task.spec.width == 0.5 and task.state_shapes is not None
    g = torch.Generator().manual_seed(0)
    own = {k: torch.randn(shape, generator=g) for k, shape in task.state_shapes.items()}
    update, new_own = client_update(local, task, ClientData(sim.x_train, sim.y_train, sim.parts[0]), own,
                                    models=sim.method.models)
    alpha = task.train.feddyn_alpha
    narrowed = 0
    for name, start in local.items():
        key = task.spec.global_name(name)
        if key not in own:  # buffers carry no FedDyn state
            continue
        inside = corner(start.shape)
        want = own[key][inside] - alpha * (update.state[name] - start)  # Acar et al., Alg. 1
        assert torch.allclose(new_own[key][inside], want, atol=1e-6), key
        outside = torch.ones_like(own[key], dtype=torch.bool)
        outside[inside] = False
        assert torch.equal(new_own[key][outside], own[key][outside]), key  # untouched beyond the client's slice
        narrowed += start.shape != own[key].shape
    assert narrowed > 0  # the client's tensors are narrower than the global ones
