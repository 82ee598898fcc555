"""Client-level differential privacy (``hetfl.privacy``): clipping by hand, the noise each coordinate keeps after the
division by its count (a width and a depth split), adaptive clipping's step by hand, the accountant against
dp-accounting's own, the refusals, and runs that spend what they say and resume to the same weights."""

import json
import math
import re

import pytest
import torch
from dp_accounting import GaussianDpEvent, NeighboringRelation, SampledWithoutReplacementDpEvent
from dp_accounting.rdp import RdpAccountant

from hetfl.aggregation import MaskedMean
from hetfl.cli import main
from hetfl.devices import Budget
from hetfl.methods import build_method
from hetfl.privacy.clipping import WITHIN_CLIP, clip_update
from hetfl.privacy.mechanism import CLIP_KEY, DPSettings
from hetfl.sim import Simulation
from hetfl.slicing import SubModel
from hetfl.updates import Update

t = torch.tensor


# ---- the client's clip ------------------------------------------------------------------------------------------
def test_clip_scales_the_whole_update_to_the_clip_norm_by_hand():
    sent = {"w": torch.zeros(2, 2), "b": t([1.0])}
    update = Update(0, SubModel(depth=1), {"w": t([[3.0, 0.0], [0.0, 0.0]]), "b": t([5.0])}, 7, {"train_loss": 1.0})
    clipped = clip_update(update, sent, clip=1.0)  # the update is (3, 4) over everything sent: norm 5
    assert clipped.state["w"].flatten().tolist() == pytest.approx([0.6, 0.0, 0.0, 0.0])
    assert clipped.state["b"].tolist() == pytest.approx([1.8])  # 1 + 4 / 5
    assert clipped.metrics == {"train_loss": 1.0, WITHIN_CLIP: 0.0}
    assert clipped.num_samples == 7 and clipped.client == 0
    kept = clip_update(update, sent, clip=5.0)  # within the norm: sent back bit for bit
    assert kept.state["w"] is update.state["w"] and kept.metrics[WITHIN_CLIP] == 1.0


# ---- the server's noise -----------------------------------------------------------------------------------------
def zero_updates(method, state, levels):
    """One update per level in ``levels`` that sends back exactly what the client got (an update of norm 0)."""
    updates = []
    for client, level in enumerate(levels):
        task, local = method.configure(state, client, Budget(level=level), 1)
        updates.append(Update(client, task.spec, local, 5, {"train_loss": 0.0}))
    return updates


@pytest.mark.parametrize("method", ["heterofl", "depthfl-fedavg"])
def test_noise_left_on_a_coordinate_is_sigma_c_over_the_clients_that_held_it(tiny_cfg, method):
    """Width (HeteroFL) and depth (DepthFL) splits, one client of each of 4 levels and another of the largest: the
    coordinates of each level's part are held by 5, 4, 3 or 2 clients and keep noise of std z C / count."""
    z, clip = 2.0, 0.5
    method = build_method(tiny_cfg(method=method, dp_noise_multiplier=z, dp_clip=clip), (1, 8, 8), 10)
    state = method.init_state(0)
    updates = zero_updates(method, state, levels=[1, 2, 3, 4, 4])
    counts = MaskedMean(state.params)
    for u in updates:
        counts.add(u.state, 1.0, u.spec)
    draws = {c: [] for c in range(2, 6)}
    for round_index in range(1, 41):
        new, record = method.privacy.aggregate(method, state, updates, round_index)
        for key, n in counts.weights.items():
            moved = new.params[key] - state.params[key]
            for c in draws:
                draws[c].append(moved[n == c])
        assert record["noise_std"] == z * clip
    for c, values in draws.items():
        values = torch.cat(values).double()
        assert len(values) > 2000, (c, len(values))  # every count occurs in both splits
        assert not any(((n > 0) & ((n < 2) | (n > 5))).any() for n in counts.weights.values())
        assert values.std().item() == pytest.approx(z * clip / c, rel=0.05), c
        assert abs(values.mean().item()) < 4 * z * clip / c / len(values) ** 0.5
    assert set(record["noise_per_coordinate"]) == set(method.eval_specs())


def test_adaptive_clipping_moves_the_clip_towards_the_quantile_by_hand(tiny_cfg):
    """Andrew et al. 2021, Alg. 1: 2 of 3 updates within C = 0.5, target quantile 0.5, eta 0.2 ->
    C' = 0.5 exp(-0.2 (2/3 - 0.5)); the next round's tasks clip to C'."""
    cfg = tiny_cfg(method="alllarge", num_clients=30, client_fraction=0.1, dp_noise_multiplier=1e-7, dp_clip=0.5,
                   dp_clip_quantile=0.5, dp_clip_lr=0.2, dp_clip_count_noise=1e-6)
    method = build_method(cfg, (1, 8, 8), 10)
    state = method.init_state(0)
    updates = []
    for client, size in enumerate([0.1, 0.2, 3.0]):  # update norms 0.1, 0.2 and 3: the last one beyond C
        task, local = method.configure(state, client, Budget(level=4), 1)
        assert task.dp_clip == 0.5
        name = next(iter(local))
        trained = {**local, name: local[name] + size / local[name].numel() ** 0.5}
        updates.append(clip_update(Update(client, task.spec, trained, 5), local, task.dp_clip))
    assert [u.metrics[WITHIN_CLIP] for u in updates] == [1.0, 1.0, 0.0]
    new, record = method.privacy.aggregate(method, state, updates, 1)
    assert record["within_clip"] == pytest.approx(2 / 3, abs=1e-5)
    assert float(new.extra[CLIP_KEY]) == pytest.approx(0.5 * math.exp(-0.2 * (2 / 3 - 0.5)), rel=1e-5)
    assert method.configure(new, 0, Budget(level=4), 2)[0].dp_clip == pytest.approx(float(new.extra[CLIP_KEY]))


# ---- the accountant ---------------------------------------------------------------------------------------------
def settings(z: float, rounds: int = 50, clients: int = 1000, per_round: int = 100, delta: float = 1e-5):
    return DPSettings(noise_multiplier=z, delta=delta, clip=1.0, quantile=0.0, clip_lr=0.2, count_noise=5.0,
                      clients=clients, per_round=per_round, rounds=rounds)


def test_epsilon_is_dp_accountings_own_for_the_same_sampling_noise_rounds_and_delta():
    """Noise z C on sums of updates clipped to C under replace-one adjacency: sensitivity 2C, multiplier z / 2."""
    library = RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
    library.compose(SampledWithoutReplacementDpEvent(1000, 100, GaussianDpEvent(1.5 / 2)), 50)
    assert settings(1.5).epsilon(50) == pytest.approx(library.get_epsilon(1e-5), rel=1e-9)


def test_epsilon_grows_with_rounds_and_shrinks_with_noise():
    by_rounds = [settings(2.0).epsilon(r) for r in (1, 10, 50, 200)]
    by_noise = [settings(z).epsilon(50) for z in (0.8, 1.5, 3.0, 6.0)]
    assert by_rounds == sorted(by_rounds) and len(set(by_rounds)) == 4
    assert by_noise == sorted(by_noise, reverse=True) and len(set(by_noise)) == 4


# ---- refusals ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flags, says", [
    (["--dp-noise-multiplier", "-1"], "dp_noise_multiplier must be >= 0"),
    (["--dp-noise-multiplier", "nan"], "dp_noise_multiplier must be a finite number"),
    (["--dp-target-epsilon", "inf"], "dp_target_epsilon must be a finite number"),
    (["--dp-noise-multiplier", "1", "--dp-delta", "1"], "dp_delta must be in [0, 1)"),
    (["--dp-noise-multiplier", "1", "--dp-clip", "0"], "dp_clip must be > 0"),
    (["--dp-noise-multiplier", "1", "--dp-target-epsilon", "8"], "not both"),
    (["--dp-clip", "2"], "dp_clip is an option of differential privacy, which is off"),
    (["--dp-noise-multiplier", "1", "--aggregation-weights", "samples"], "uniform weights"),
    (["--dp-noise-multiplier", "3", "--dp-clip-quantile", "0.5"], "adaptive clipping needs dp_noise_multiplier below"),
    (["--dp-target-epsilon", "0.05", "--dp-clip-quantile", "0.5"], "no noise multiplier up to"),
    (["--method", "feddf", "--dp-noise-multiplier", "1"], "method 'feddf' cannot run with differential privacy"),
    ([], "give --dp-noise-multiplier or --dp-target-epsilon"),
])
def test_bad_privacy_options_are_refused_with_one_line(capsys, flags, says):
    assert main(["dp", *([] if "--method" in flags else ["--method", "heterofl"]), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err


def test_a_method_that_cannot_have_privacy_is_refused_before_a_run_folder_exists(tmp_path, capsys):
    assert main(["run", "--method", "feddf", "--dataset", "digits", "--dp-noise-multiplier", "1",
                 "--out", str(tmp_path)]) == 2
    assert "cannot run with differential privacy" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


# ---- runs -------------------------------------------------------------------------------------------------------
def test_a_run_calibrated_to_a_target_spends_at_most_it_and_says_so_every_round(tmp_path, capsys):
    """`hetfl run --method heterofl --dp-target-epsilon 8 --dp-delta 1e-5`, on digits for 3 rounds."""
    assert main(["run", "--method", "heterofl", "--dataset", "digits", "--model-width", "0.25", "--rounds", "3",
                 "--dp-target-epsilon", "8", "--dp-delta", "1e-5", "--out", str(tmp_path), "--name", "r",
                 "--quiet"]) == 0
    said = re.search(r"differential privacy: epsilon ([0-9.]+) at delta 1e-05 spent", capsys.readouterr().out)
    assert said and 7.99 <= float(said.group(1)) <= 8
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())["privacy"]
    assert 7.99 <= summary["epsilon"] <= 8 and summary["delta"] == 1e-5 and summary["target_epsilon"] == 8
    rounds = [json.loads(line)["privacy"] for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    spent = [r["epsilon"] for r in rounds]
    assert spent == sorted(spent) and spent[-1] == summary["epsilon"] and spent[0] > 0
    assert json.loads((tmp_path / "r" / "config.json").read_text())["aggregation_weights"] == "uniform"


def test_a_private_run_learns_and_resumes_to_the_uninterrupted_weights(tiny_cfg):
    """Adaptive clipping's C is server state: a run stopped after round 2 and resumed ends where an uninterrupted
    one does; and the noised model still beats chance (10 classes) by a clear margin."""
    options = dict(method="alllarge", rounds=4, num_clients=20, client_fraction=0.5, dp_noise_multiplier=0.3,
                   dp_clip=1.0, dp_clip_quantile=0.5, dp_clip_count_noise=1.0, lr=0.1)
    whole = Simulation(tiny_cfg(**options, name="whole"))
    summary = whole.run(progress=False)
    assert summary["accuracy"] > 0.4, summary["accuracy"]
    clips = [r["privacy"]["clip"] for r in whole.history]
    assert clips[0] == 1.0 and len(set(clips)) == 4  # the clip moved every round
    cut = Simulation(tiny_cfg(**options, name="cut"))
    cut.run(progress=False, stop_after=2)
    Simulation.resume(cut.run_dir).run(progress=False)
    final = lambda sim: torch.load(sim.run_dir / "final_model.pt")  # noqa: E731
    a, b = final(whole), final(cut)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_every_executor_clips_the_updates_it_trains(tiny_cfg):
    """The batched executor clips as the sequential one (client.client_update) does: one round of HeteroFL with
    next to no noise and a clip of 0.05 moves the model by at most 0.05 sqrt(5) (the masked mean of 5 updates of
    norm <= 0.05), where the same round without DP moves it by far more; both executors agree to rounding."""
    start = None
    moved = {}
    for name, dp in (("sequential", True), ("batched", True), ("plain", False)):
        options = dict(dp_noise_multiplier=1e-6, dp_clip=0.05) if dp else {}
        sim = Simulation(tiny_cfg(method="heterofl", rounds=1, executor="batched" if name == "batched" else
                                  "sequential", name=name, **options))
        start = start or {k: v.clone() for k, v in sim.state.params.items()}
        sim.run(progress=False)
        moved[name] = sim.state.params
    norm = lambda w: sum((w[k] - start[k]).square().sum() for k in w).sqrt().item()  # noqa: E731
    assert norm(moved["sequential"]) <= 0.05 * 5 ** 0.5 + 1e-4 < 0.5 * norm(moved["plain"])
    assert all(torch.allclose(moved["sequential"][k], moved["batched"][k], atol=1e-5) for k in start)
