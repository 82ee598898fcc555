"""Executors: the batched executor trains every method as the sequential one does, and the pure SGD step is
``torch.optim.SGD``'s arithmetic."""

import copy

import pytest
import torch
from torch import nn

from hetfl.errors import HetflError
from hetfl.executors.batched import BatchedExecutor, stack
from hetfl.sim import Simulation
from hetfl.task import TrainOptions
from hetfl.trainers.step import sgd_update
from tinybert import WORDS, tiny_bert, tiny_bert_dir  # noqa: F401  (fixtures)

# (method, options): every loss kind, a stateful client (FedDyn), FedProx, the Scaler, augmentation, clipping,
# ScaleFL's 2-D split and a transformer backbone
BATCHABLE = {
    "alllarge-fedprox-augment": dict(method="alllarge", prox_mu=0.01, crop_padding=1, flip=True, clip_grad=1.0),
    "depthfl": dict(method="depthfl"),
    "heterofl-scaler": dict(method="heterofl", scaler=True),
    "sheterofl": dict(method="sheterofl"),
    "scalefl": dict(method="scalefl", model_width=0.5),
    "inclusivefl-vit": dict(method="inclusivefl", model="vit", model_width=1.0, levels=3, md_beta=0.2),
    "splitmix": dict(method="splitmix", model="preresnet20", model_width=1.0, budget="width-memory", batch_size=8,
                     client_fraction=0.2),
}
# trained one client at a time inside the batched executor (the trainer is not batchable)
NOT_BATCHABLE = {"fedepth": dict(method="fedepth", model="preresnet20", batch_size=8)}


def run_both(tiny_cfg, name: str, **options) -> tuple[Simulation, Simulation]:
    """The same experiment run by the sequential and by the batched executor (a round of 10 clients by default: as
    rounds go on, max-pooling windows with near-ties, where the two executors round a convolution differently,
    route a gradient to another pixel, and the weights part by more than rounding while the accuracies agree)."""
    sims = []
    for executor in ("sequential", "batched"):
        sim = Simulation(tiny_cfg(**{"name": f"{name}-{executor}", "executor": executor, "rounds": 1,
                                     "client_fraction": 0.5, **options}))
        sim.run(progress=False)
        sims.append(sim)
    return sims[0], sims[1]


@pytest.mark.parametrize("case", list(BATCHABLE))
def test_batched_gives_the_sequential_weights_and_accuracies(tiny_cfg, case):
    sequential, batched = run_both(tiny_cfg, case, **BATCHABLE[case])
    assert isinstance(batched.executor, BatchedExecutor) and max(batched.executor.group_sizes) > 1  # it stacked
    for name, value in sequential.global_state.items():
        assert (value - batched.global_state[name]).abs().max() <= 1e-4, name
    for a, b in zip(sequential.history, batched.history):
        assert a["clients"] == b["clients"]
        for label, result in a["eval"].items():
            for key, accuracy in result.items():
                if key != "loss":
                    assert abs(accuracy - b["eval"][label][key]) <= 0.002, (label, key)
    assert batched.summary()["executor"] == "batched" and sequential.summary()["executor"] == "sequential"


@pytest.mark.parametrize("case", list(NOT_BATCHABLE))
def test_what_cannot_be_batched_runs_one_client_at_a_time_with_the_sequential_results(tiny_cfg, case, capsys):
    sequential, batched = run_both(tiny_cfg, case, **NOT_BATCHABLE[case])
    for name, value in sequential.global_state.items():
        assert torch.equal(value, batched.global_state[name]), name
    assert "batched executor: the 'blockwise' trainer is not batchable" in capsys.readouterr().err


def test_reefl_best_exit_teacher_is_chosen_per_client_in_a_stack(tiny_bert, tmp_path, monkeypatch):
    """ReeFL (LoRA on the tiny BERT): each stacked client picks its own teacher exit on the device, and the round
    ends where the sequential executor's does."""
    from hetfl.data import datasets
    from hetfl.methods import config_from

    g = torch.Generator().manual_seed(0)
    x = torch.randint(5, 5 + len(WORDS), (120, 8), generator=g)
    y = torch.randint(0, 3, (120,), generator=g)
    x[:, 0], x[:, 1:] = 2, 5 + y[:, None]
    monkeypatch.setitem(datasets._LOADED, ("r8:8", f"|{(tiny_bert / 'tokenizer.json').resolve()}"),
                        datasets.Dataset("r8", x, y, x[:60], y[:60], 3))
    weights = []
    for executor in ("sequential", "batched"):
        sim = Simulation(config_from(dict(method="reefl", dataset="r8", max_length=8, finetune="lora", adapter_rank=4,
                                          num_clients=6, client_fraction=1.0, levels=2, rounds=2, batch_size=8,
                                          lr=0.3, executor=executor, out=str(tmp_path / executor))))
        sim.run(progress=False)
        weights.append(sim.global_state)
    assert max(sim.executor.group_sizes) > 1
    for name, value in weights[0].items():
        assert (value - weights[1][name]).abs().max() <= 1e-4, name


def test_feddyn_state_is_stacked_per_group_and_kept_per_client(tiny_cfg, tmp_path):
    """Round 2 of DepthFL (FedDyn) from the same state through both executors: the same updates and the same new
    g_k per client, whose slices the round-1 g_k already filled (every client took part in round 1)."""
    import shutil

    from hetfl.checkpoint import ClientStateStore
    from hetfl.executors import LocalClients
    from hetfl.executors.sequential import SequentialExecutor

    sim = Simulation(tiny_cfg(method="depthfl", client_fraction=1.0, rounds=2, name="feddyn"))
    sim.run(progress=False, stop_after=1)
    jobs = list(sim.jobs(2))
    stores = {}
    for name, make in (("sequential", SequentialExecutor), ("batched", BatchedExecutor)):
        shutil.copytree(sim.client_store.root, tmp_path / name)
        store = ClientStateStore(tmp_path / name)
        assert store.load(jobs[0].client) is not None
        executor = make(LocalClients(sim.x_train, sim.y_train, sim.parts, sim.method.models, lambda s=store: s))
        stores[name] = (store, [reply for _, reply in executor.execute(jobs, 2)])
    assert max(executor.group_sizes) > 1  # the batched executor stacked clients
    (store_a, replies_a), (store_b, replies_b) = stores["sequential"], stores["batched"]
    for job, a, b in zip(jobs, replies_a, replies_b):
        for name, value in a.update.state.items():
            assert (value - b.update.state[name]).abs().max() <= 1e-4, (job.client, name)
        a.keep(), b.keep()
        own_a, own_b = store_a.load(job.client), store_b.load(job.client)
        assert own_a.keys() == own_b.keys()
        for name, value in own_a.items():
            assert (value - own_b[name]).abs().max() <= 1e-5, (job.client, name)


def test_faults_wrap_the_batched_executor_as_the_sequential_one(tiny_cfg):
    sequential, batched = run_both(tiny_cfg, "faults", dropout_fraction=0.2, corrupt_fraction=0.2)
    for a, b in zip(sequential.history, batched.history):
        assert (a["missing"], a["rejected"], a["clients"]) == (b["missing"], b["rejected"], b["clients"])
        assert a["missing"] and a["rejected"]
    for name, value in sequential.global_state.items():
        assert (value - batched.global_state[name]).abs().max() <= 1e-4, name


def test_clients_of_different_sizes_train_together_in_buckets_per_batch_size(tiny_cfg):
    """A skewed partition: FedAvg's clients all hold one sub-model, so they form one group whatever their sample
    counts; each step stacks the clients with a batch of one size (the full batches together, the short last ones
    apart), and the weights are the sequential executor's."""
    options = dict(method="alllarge", partition="dirichlet-unequal", alpha=0.3, client_fraction=1.0)
    sequential, batched = run_both(tiny_cfg, "skewed", **options)
    sizes = [len(part) for part in batched.parts]
    assert len(set(sizes)) > 1 and batched.executor.group_sizes == [len(sizes)]
    assert max(batched.executor.bucket_sizes) > 1 and min(batched.executor.bucket_sizes) < len(sizes)
    for name, value in sequential.global_state.items():
        assert (value - batched.global_state[name]).abs().max() <= 1e-4, name


def test_auto_is_sequential_on_the_cpu_and_a_bad_executor_is_refused(tiny_cfg):
    sim = Simulation(tiny_cfg())
    assert sim.cfg.executor == "auto" and sim.executor.name == "sequential"
    with pytest.raises(HetflError, match="executor 'threads' is not allowed"):
        Simulation(tiny_cfg(executor="threads"))


def test_the_pure_step_is_torch_sgd_bit_for_bit():
    """Five steps of momentum SGD with weight decay on a real model, functional and in place."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    twin = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    params, momenta = [p.detach().clone() for p in twin.parameters()], None
    for _ in range(5):
        x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 3, (8,))
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        with torch.no_grad():
            for p, value in zip(twin.parameters(), params):
                p.copy_(value)
        grads = torch.autograd.grad(nn.functional.cross_entropy(twin(x), y), list(twin.parameters()))
        params, momenta = sgd_update(params, grads, momenta, TrainOptions(momentum=0.9, weight_decay=5e-4), 0.1)
    for p, q in zip(model.parameters(), params):
        assert torch.equal(p.detach(), q)


def test_the_pure_step_by_hand():
    """w = 1, g = 2, anchor 0.5, g_k = 0.25: FedProx + FedDyn pull, weight decay, momentum over two steps."""
    opts = TrainOptions(momentum=0.5, weight_decay=0.1, prox_mu=0.2, feddyn_alpha=0.2)
    w, g, a, h = torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([0.5]), torch.tensor([0.25])
    (w1,), (m1,) = sgd_update([w], [g], None, opts, 0.1, [a], [h])
    d = 2.0 + 0.4 * 0.5 - 0.25 + 0.1 * 1.0  # gradient + (mu + alpha)(w - anchor) - g_k + wd w = 2.05
    assert m1.item() == pytest.approx(d) and w1.item() == pytest.approx(1.0 - 0.1 * d)
    (w2,), (m2,) = sgd_update([w1], [g], [m1], opts, 0.1, [a], [h])
    d2 = 2.0 + 0.4 * (w1.item() - 0.5) - 0.25 + 0.1 * w1.item()
    assert m2.item() == pytest.approx(0.5 * d + d2) and w2.item() == pytest.approx(w1.item() - 0.1 * (0.5 * d + d2))


def test_stacked_weights_are_in_the_default_layout():
    """Channels-last weights stack into a plain contiguous tensor, the same values: vmap's convolutions then give
    plain activations, which CUDA's batch norm can copy inside vmap (it refuses a channels-last copy there)."""
    weights = [torch.randn(8, 3, 3, 3).to(memory_format=torch.channels_last) for _ in range(2)]
    stacked = stack([{"w": w} for w in weights])["w"]
    assert stacked.is_contiguous()
    assert all(torch.equal(stacked[i], w) for i, w in enumerate(weights))
