"""Client updates are checked before aggregation (on Flower too: tests/test_flower.py, guarantee 5): a bad one is
dropped, counted, recorded with its reason and warned about; the simulator injects such faults on purpose."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import hetfl.client
from hetfl.client import Update
from hetfl.faults import CORRUPTIONS, corrupt
from hetfl.sim import Simulation
from hetfl.slicing import SubModel
from hetfl.recipes import ExitsCE
from hetfl.task import FamilySpec, Task, TrainOptions
from hetfl.updates import check_update


def test_check_update_reasons():
    spec = SubModel(depth=2)
    task = Task(spec=spec, family=FamilySpec("cnn", (1, 8, 8), 10), loss=ExitsCE(), train=TrainOptions(), lr=0.1,
                round=1, client=7, seed=0)
    sent = {"w": torch.zeros(2, 3), "n": torch.tensor(4)}

    def reason(state=None, **changes):
        update = Update(client=7, spec=spec, state=dict(sent) if state is None else state, num_samples=5)
        return check_update(dataclasses.replace(update, **changes), task, sent)

    assert reason() is None
    assert reason({"w": torch.zeros(2, 3)}) is None  # a client may send part of what it got
    assert "shape (3, 2), expected (2, 3)" in reason({"w": torch.zeros(3, 2)})
    assert "dtype torch.float64, expected torch.float32" in reason({"w": torch.zeros(2, 3, dtype=torch.float64)})
    assert "non-finite" in reason({"w": torch.tensor([[0, 1, float("nan")]] * 2)})
    assert "non-finite" in reason({"w": torch.full((2, 3), float("-inf"))})
    assert "'x' was not sent" in reason({"x": torch.zeros(1)})
    assert "was not assigned" in reason(spec=SubModel(depth=3))
    assert "client 8's" in reason(client=8)
    for bad in (0, -3, 2.5, True):
        assert "sample count" in reason(num_samples=bad)


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_every_injected_corruption_is_rejected(kind):
    spec = SubModel(depth=2)
    task = Task(spec=spec, family=FamilySpec("cnn", (1, 8, 8), 10), loss=ExitsCE(), train=TrainOptions(), lr=0.1,
                round=1, client=7, seed=0)
    sent = {"w": torch.zeros(2, 3), "b": torch.zeros(3)}
    update = Update(client=7, spec=spec, state=dict(sent), num_samples=5)
    assert check_update(update, task, sent) is None
    assert check_update(corrupt(update, kind), task, sent) is not None


def test_simulated_faults_drop_and_corrupt_seeded_fractions(tiny_cfg):
    cfg = tiny_cfg(rounds=2, client_fraction=0.5, dropout_fraction=0.5, corrupt_fraction=0.4, name="faults")
    sim = Simulation(cfg)
    sim.run(progress=False)
    records = [json.loads(line) for line in (sim.run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in records:  # 10 sampled: 5 drop out, 2 of the other 5 corrupt their update
        assert len(r["missing"]) == 5 and len(r["rejected"]) == 2 == r["dropped"] and r["clients"] == 3
        assert not set(map(int, r["rejected"])) & set(r["missing"])
        assert set(r["missing"]) <= set(sim.sample_clients(r["round"]))
    assert records[0]["missing"] != records[1]["missing"]  # drawn again every round
    again = Simulation(cfg.replace(name="faults-again"))
    again.run(progress=False)
    for k, v in again.global_state.items():  # seeded: the same faults, the same weights
        assert torch.equal(v, sim.global_state[k]), k


def test_bad_updates_are_dropped_counted_and_warned_once(tiny_cfg, capsys, monkeypatch):
    cfg = tiny_cfg(rounds=2, client_fraction=1.0, name="bad")  # every client takes part in both rounds
    sim = Simulation(cfg)
    nan_client, shape_client = 3, 11
    honest = hetfl.client.client_update

    def client_update(local, task, data, own=None, models=None):
        update, own = honest(local, task, data, own, models)
        state = dict(update.state)
        name = next(n for n, t in state.items() if t.is_floating_point() and t.dim() > 1)
        if task.client == nan_client:
            state[name] = torch.full_like(state[name], float("nan"))
        if task.client == shape_client:
            state[name] = state[name][:1]
        return dataclasses.replace(update, state=state), own

    monkeypatch.setattr(hetfl.client, "client_update", client_update)
    sim.run(progress=False)
    assert all(torch.isfinite(t).all() for t in sim.global_state.values() if t.is_floating_point())
    records = [json.loads(line) for line in (sim.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["dropped"] for r in records] == [2, 2]
    assert [r["clients"] for r in records] == [18, 18]
    err = capsys.readouterr().err
    assert err.count(f"dropped the update of client {nan_client}: ") == 1  # once per client, not per round
    assert err.count(f"dropped the update of client {shape_client}: ") == 1
    assert "non-finite" in err and "has shape" in err

    # the same as if the two clients had sat the rounds out
    clean = Simulation(cfg.replace(name="clean"))
    plan = clean.method.plan
    clean.method.plan = lambda client, *a: None if client in (nan_client, shape_client) else plan(client, *a)
    clean.run(progress=False)
    for k, v in clean.global_state.items():
        assert torch.equal(v, sim.global_state[k]), k


def test_fedavg_completes_with_half_the_sampled_clients_dropping_out_every_round(tiny_cfg):
    base = dict(method="alllarge", rounds=6, client_fraction=0.5)
    full = Simulation(tiny_cfg(name="full", **base)).run(progress=False)
    sim = Simulation(tiny_cfg(name="half", dropout_fraction=0.5, **base))
    half = sim.run(progress=False)
    assert all(len(r["missing"]) == 5 and r["clients"] == 5 for r in sim.history)  # 5 of the 10 sampled, each round
    print(f"digits, FedAvg, 6 rounds: accuracy {full['accuracy']:.3f} without dropout, {half['accuracy']:.3f} with "
          "half the sampled clients dropping out")
    assert half["accuracy"] > 0.5 and full["accuracy"] > 0.5  # 10 classes: chance is 0.1
