"""Client updates are checked before aggregation (issue 9, item 11): a bad one is dropped, counted and warned about."""

from __future__ import annotations

import dataclasses
import json

import torch

import hetfl.sim
from hetfl.sim import Simulation
from hetfl.updates import check_update


def test_check_update_reasons():
    shapes = {"w": torch.Size([2, 3]), "n": torch.Size([])}
    assert check_update({"w": torch.zeros(2, 3), "n": torch.tensor(4)}, shapes) is None
    assert check_update({"w": torch.zeros(2, 3)}, shapes) is None  # a client may send part of what it got
    assert "shape (3, 2), expected (2, 3)" in check_update({"w": torch.zeros(3, 2)}, shapes)
    assert "non-finite" in check_update({"w": torch.tensor([[0, 1, float("nan")]] * 2)}, shapes)
    assert "non-finite" in check_update({"w": torch.full((2, 3), float("-inf"))}, shapes)
    assert "'x' was not sent" in check_update({"x": torch.zeros(1)}, shapes)


def test_bad_updates_are_dropped_counted_and_warned_once(tiny_cfg, capsys, monkeypatch):
    cfg = tiny_cfg(rounds=2, client_fraction=1.0, name="bad")  # every client takes part in both rounds
    sim = Simulation(cfg)
    nan_client, shape_client = 3, 11
    honest = hetfl.sim.client_update

    def client_update(local, task, data, own=None, models=None):
        update, own = honest(local, task, data, own, models)
        state = dict(update.state)
        name = next(n for n, t in state.items() if t.is_floating_point() and t.dim() > 1)
        if task.client == nan_client:
            state[name] = torch.full_like(state[name], float("nan"))
        if task.client == shape_client:
            state[name] = state[name][:1]
        return dataclasses.replace(update, state=state), own

    monkeypatch.setattr(hetfl.sim, "client_update", client_update)
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
