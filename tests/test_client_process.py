"""The client side runs alone: a fresh process that imports only it trains from the server's JSON task
and tensors, and gets bit-identical results to the in-process simulator (DESIGN.md, "Data flow")."""

import json
import subprocess
import sys

import pytest
import torch

from hetfl.client import client_update
from hetfl.sim import Simulation
from hetfl.task import Task
from hetfl.trainers.schedule import ClientData

# the server side, and what a client on a device has no use for (the dataset registry, the experiment config)
SERVER_SIDE = ("hetfl.methods", "hetfl.aggregation", "hetfl.sim", "hetfl.splits", "hetfl.bench", "hetfl.data",
               "hetfl.config", "hetfl.devices", "hetfl.costs")

CLIENT = r"""
import json, sys
import torch
from hetfl.client import client_update
from hetfl.task import Task
from hetfl.trainers.schedule import ClientData

folder = sys.argv[1]
task = Task.from_json(open(f"{folder}/task.json").read())
inputs = torch.load(f"{folder}/inputs.pt", weights_only=True)
data = ClientData(inputs["x"], inputs["y"], torch.arange(len(inputs["y"])))
update, own = client_update(inputs["local"], task, data, inputs["own"])
torch.save({"state": update.state, "own": own, "num_samples": update.num_samples}, f"{folder}/outputs.pt")
print(json.dumps(sorted(m for m in sys.modules if m.startswith("hetfl"))))
"""


SURPLUS = [1 / 6, 1 / 3, 1 / 2, 2.0]


@pytest.mark.parametrize("method,options", [
    ("depthfl", {}),  # FedDyn client state in global shape + mutual KD
    ("sheterofl", {}),  # width slices, Scaler, the slimmable loss
    ("scalefl", {}),  # 2-D split, ScaleFL Eq. (5)
    ("fedepth", {"model": "preresnet20", "buffer_prefix": True}),  # block groups, skip connection, buffered prefix
    ("m-fedepth", {"model": "preresnet20", "budget_ratios": SURPLUS}),  # two models by mutual learning, a peer in state
    ("splitmix", {"model": "preresnet20", "budget": "width-memory", "budget_ratios": SURPLUS}),  # several bases
])
def test_client_update_in_a_fresh_process_is_bit_identical(tiny_cfg, tmp_path, method, options):
    sim = Simulation(tiny_cfg(method=method, **options))
    client = 3 if method != "m-fedepth" else next(c for c in range(20) if sim.scenario.budget(c, 2).level == 4)
    task, local = sim.method.configure(sim.state, client, sim.scenario.budget(client, 2), 2)
    idx = sim.parts[client]
    own = None
    g = torch.Generator().manual_seed(0)
    if task.state_shapes is not None:  # a client that already holds FedDyn state
        own = {k: 0.01 * torch.randn(s, generator=g) for k, s in task.state_shapes.items()}
    if method == "m-fedepth":  # a client that already holds its second model
        assert task.blockwise.models == 2
        own = {f"peer1/{k}": v + 0.01 * torch.randn(v.shape, generator=g) for k, v in local.items()}
    here, here_own = client_update(local, task, ClientData(sim.x_train, sim.y_train, idx), own,
                                   models=sim.method.models)

    (tmp_path / "task.json").write_text(task.to_json())
    torch.save({"local": local, "x": sim.x_train[idx], "y": sim.y_train[idx], "own": own}, tmp_path / "inputs.pt")
    done = subprocess.run([sys.executable, "-c", CLIENT, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert not [m for m in loaded if m.startswith(SERVER_SIDE)], loaded
    there = torch.load(tmp_path / "outputs.pt", weights_only=True)
    assert there["num_samples"] == here.num_samples
    assert there["state"].keys() == here.state.keys()
    for k in here.state:
        assert torch.equal(there["state"][k], here.state[k]), k
    if here_own is None:
        assert there["own"] is None
    else:
        assert there["own"].keys() == here_own.keys()
        for k in here_own:
            assert torch.equal(there["own"][k], here_own[k]), k


def test_task_round_trips_through_json(tiny_cfg):
    sim = Simulation(tiny_cfg(method="sheterofl"))
    task, _ = sim.method.configure(sim.state, 0, sim.scenario.budget(0, 1), 1)
    again = Task.from_json(task.to_json())
    assert again == task and again.loss.smaller == task.loss.smaller
    assert json.loads(task.to_json())["loss"]["kind"] == "slimmable"
