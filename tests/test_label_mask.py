"""Label masking (HeteroFL's masking trick; HeteroFL's and FedRolex's code): the masked CE and its step worked by hand,
classifier rows averaged over the clients holding their class by hand, what the client tells the server, the option's
defaults and its reading from configs recorded before it existed, and that nothing changes under IID."""

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hetfl.aggregation import ServerState
from hetfl.cli import main
from hetfl.devices import Budget
from hetfl.client import client_update
from hetfl.losses import client_classes, label_masked
from hetfl.methods import config_from, load_config
from hetfl.methods.fedrolex import FedRolex
from hetfl.methods.heterofl import HeteroFL
from hetfl.models import model_family
from hetfl.models.base import classifier_names
from hetfl.recipes import ExitsCE
from hetfl.slicing import SubModel, extract
from hetfl.task import FamilySpec, Task, TrainOptions
from hetfl.trainers.objectives import objective_for
from hetfl.trainers.schedule import ClientData
from hetfl.trainers.sgd import client_step
from hetfl.updates import Update, check_update


class Linear3(nn.Module):
    """A bare 2 -> 3 classifier whose forward returns its logits as the only exit."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 3)

    def forward(self, x):
        return [self.fc(x)]


def test_masked_logits_and_their_ce_by_hand():
    """Logits (2, 1, 0.5), the client holds classes 0 and 2: class 1's logit becomes 0, and stays in the normaliser."""
    z = torch.tensor([[2.0, 1.0, 0.5]], requires_grad=True)
    present = torch.tensor([True, False, True])
    (masked,) = label_masked([z], present)
    assert masked.tolist() == [[2.0, 0.0, 0.5]]
    loss = F.cross_entropy(masked, torch.tensor([0]))
    assert loss.item() == pytest.approx(-math.log(math.exp(2) / (math.exp(2) + 1 + math.exp(0.5))), rel=1e-6)
    (grad,) = torch.autograd.grad(loss, z)
    assert grad[0, 1] == 0  # no gradient reaches the absent class
    assert label_masked([z], None)[0] is z  # no mask: the logits themselves
    assert client_classes(torch.tensor([2, 0, 2]), 4).tolist() == [True, False, True, False]


def test_a_masked_step_leaves_the_absent_classes_row_and_moves_the_others_by_hand():
    """One SGD step (no momentum, no weight decay) of a 2 -> 3 classifier, weights 0 and biases 0, on x = (1, 2),
    y = 0, the client holding classes {0, 2}: masked logits (0, 0, 0), softmax over all three = 1/3 each, so
    dL/dz = (1/3 - 1, [masked], 1/3); row 0 moves by -lr (-2/3) x, row 2 by -lr (1/3) x, row 1 stays."""
    module = Linear3()
    params = {"fc.weight": torch.zeros(3, 2), "fc.bias": torch.zeros(3)}
    x, y, lr = torch.tensor([[1.0, 2.0]]), torch.tensor([0]), 0.3
    step = client_step(module, objective_for(ExitsCE(), None), TrainOptions(momentum=0.0, weight_decay=0.0), lr)
    new, _, _, loss = step(params, None, None, x, y, None, None, torch.tensor([True, False, True]))
    assert loss.item() == pytest.approx(math.log(3), rel=1e-6)
    assert torch.allclose(new["fc.weight"], torch.tensor([[0.2, 0.4], [0.0, 0.0], [-0.1, -0.2]]))
    assert torch.allclose(new["fc.bias"], torch.tensor([0.2, 0.0, -0.1]))
    unmasked, _, _, _ = step(params, None, None, x, y, None, None)  # without the mask row 1 moves too
    assert unmasked["fc.bias"][1] < 0


def make(method="heterofl", **cfg):
    """A width method on a tiny CNN (8x8 inputs, channels 4/8/16/32, 10 classes) and its initial global tensors."""
    family = model_family("cnn", (1, 8, 8), 10, width=1 / 16)
    cls = {"heterofl": HeteroFL, "fedrolex": FedRolex}[method]
    m = cls(config_from({"method": method, **cfg}), family, num_levels=4)
    return m, m.init_state(seed=0)


def constant_update(method, state, spec, value, classes, client=0, samples=10):
    """An update of ``spec`` whose every tensor holds ``value``, from a client holding ``classes``."""
    local = {n: torch.full_like(t, value) for n, t in extract(state.params, method.models.shapes(spec), spec).items()}
    return Update(client, spec, local, samples, {}, classes)


def test_classifier_rows_are_averaged_over_the_clients_holding_their_class_by_hand():
    """Uniform weights (HeteroFL). A (width 1/2, value 1) holds classes {0, 1}; B (width 1, value 4) holds {1, 2}.
    Classifier row 0: A's 1; row 1: (1 + 4) / 2; row 2: B's 4; rows 3-9: held by neither, so kept. Every other
    tensor is the plain masked mean: 2.5 where both hold it, 4 where only B does."""
    method, state = make()
    a, b = method.width_spec(0.5), method.width_spec(1.0)
    new = method.aggregate(state, [constant_update(method, state, a, 1.0, (0, 1)),
                                   constant_update(method, state, b, 4.0, (1, 2), client=1)]).params
    w, bias = method._classifiers
    assert (w, bias) == ("exits.3.2.weight", "exits.3.2.bias")
    old_w, old_b = state.params[w], state.params[bias]
    half = method.models.shapes(a)[w][1]  # A's input columns of the classifier: its half of the channels
    def near(t, value):  # FedAvg's server step (old + (mean - old)) rounds in the last bit
        return torch.allclose(t, torch.full_like(t, value) if isinstance(value, float) else value, atol=1e-6)

    assert near(new[w][0, :half], 1.0) and torch.equal(new[w][0, half:], old_w[0, half:])
    assert near(new[w][1, :half], 2.5) and near(new[w][1, half:], 4.0)
    assert near(new[w][2], 4.0)
    assert torch.equal(new[w][3:], old_w[3:]) and torch.equal(new[bias][3:], old_b[3:])
    assert near(new[bias][:3], torch.tensor([1.0, 2.5, 4.0]))
    conv = "blocks.0.0.weight"
    assert near(new[conv][:2], 2.5) and near(new[conv][2:], 4.0)
    # masking off: the classifier is the plain mean too
    off, off_state = make(label_mask=False)
    plain = off.aggregate(off_state, [constant_update(off, off_state, a, 1.0, None),
                                      constant_update(off, off_state, b, 4.0, None, client=1)]).params
    assert torch.allclose(plain[w][:, :half], torch.full((10, half), 2.5), atol=1e-6)
    assert torch.allclose(plain[bias], torch.full((10,), 2.5), atol=1e-6)


def test_fedrolex_masks_the_classifier_rows_of_a_rolled_window_too():
    """The class dimension is never rolled: a wrapped window's classifier rows are the classes themselves."""
    method, state = make("fedrolex")
    spec = method.plan(0, Budget(level=2), 15)
    assert spec.offset == 14
    new = method.aggregate(state, [constant_update(method, state, spec, 3.0, (4,))]).params
    bias = new["exits.3.2.bias"]
    assert abs(bias[4] - 3) < 1e-6 and torch.equal(torch.cat([bias[:4], bias[5:]]),
                                        torch.cat([state.params["exits.3.2.bias"][:4],
                                                   state.params["exits.3.2.bias"][5:]]))


def test_classifier_names_are_the_exits_linear_layers_with_a_row_per_class():
    model = model_family("resnet18", (3, 8, 8), 7, width=1 / 16).build()
    assert classifier_names(model, 7) == tuple(f"exits.{i}.{p}.{k}" for i, p in ((0, "fc"), (1, "fc"), (2, "fc"),
                                                                                 (3, "2")) for k in ("weight", "bias"))


def task(label_mask=True, classes=10):
    return Task(spec=SubModel(depth=4, width=0.5, exits=(4,)), family=FamilySpec("cnn", (1, 8, 8), classes),
                loss=ExitsCE(), train=TrainOptions(label_mask=label_mask, batch_size=4), lr=0.1, round=1, client=3,
                seed=0, scaler=True)


def test_the_client_names_the_classes_it_trained_on_and_the_server_checks_them():
    method, state = make()
    t = task()
    local = extract(state.params, method.models.shapes(t.spec), t.spec)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(20, 1, 8, 8, generator=g), torch.tensor([7, 2] * 10)
    data = ClientData(x, y, torch.arange(8))
    update, _ = client_update(local, t, data, models=method.models)
    assert update.classes == (2, 7)
    assert check_update(update, t, local) is None
    assert Task.from_json(t.to_json()) == t  # the task carries the mask
    for bad, why in (((), "not distinct"), ((2, 2), "not distinct"), ((10,), "not distinct"), (None, "not distinct")):
        update.classes = bad
        assert why in check_update(update, t, local)
    update.classes = (2, 7)
    assert "masks no labels" in check_update(update, task(label_mask=False), local)
    plain, _ = client_update(local, task(label_mask=False), data, models=method.models)
    assert plain.classes is None


def test_classes_travel_over_flowers_records():
    wire = pytest.importorskip("hetfl.flower.wire")
    update = Update(3, SubModel(depth=1), {"w": torch.ones(2)}, 5, {"train_loss": 0.5}, (1, 4))
    assert wire.read_reply(wire.reply_content(update)).classes == (1, 4)
    update.classes = None
    assert wire.read_reply(wire.reply_content(update)).classes is None


def test_defaults_follow_each_methods_code_and_a_config_recorded_before_the_option_reads_as_off(tmp_path):
    assert config_from({"method": "heterofl"}).method_options == {"label_mask": True}
    assert config_from({"method": "sheterofl"}).method_options == {"label_mask": True}
    assert config_from({"method": "fedrolex"}).method_options == {"label_mask": True}
    assert "label_mask" not in config_from({"method": "fjord"}).method_options  # off: FjORD's baseline has none
    assert config_from({"method": "fjord", "label_mask": True}).method_options["label_mask"] is True
    off = config_from({"method": "heterofl", "label_mask": False})
    assert "label_mask" not in off.to_dict()  # off is not recorded: runs made before the option keep their names
    assert HeteroFL.options_of(off).label_mask is False  # and the method reads the resolved config as off
    old = tmp_path / "config.json"  # a run folder's config, written before label masking existed
    old.write_text(json.dumps({k: v for k, v in config_from({"method": "heterofl"}).to_dict().items()
                               if k != "label_mask"}))
    assert HeteroFL.options_of(load_config(old)).label_mask is False
    on = tmp_path / "on.json"
    on.write_text(json.dumps(config_from({"method": "fedrolex"}).to_dict()))
    assert FedRolex.options_of(load_config(on)).label_mask is True
    toml = tmp_path / "run.toml"  # a user's TOML without the key: the method's default
    toml.write_text('method = "heterofl"\n')
    assert HeteroFL.options_of(load_config(toml)).label_mask is True


@pytest.mark.parametrize("flags,fragment", [
    (["--method", "heterofl", "--label-mask", "maybe"], "label_mask must be of type bool, got 'maybe'"),
    (["--method", "alllarge", "--label-mask", "true"], "label_mask is an option of heterofl"),
])
def test_bad_label_mask_values_give_one_error_line(tmp_path, capsys, flags, fragment):
    out = tmp_path / "runs"
    code = main(["run", "--dataset", "digits", "--num-clients", "20", "--rounds", "1", "--model-width", "0.25",
                 "--quiet", "--out", str(out), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("hetfl: error:") and fragment in err[0], err
    assert not out.exists() or not any(out.iterdir())


def final_weights(cfg):
    from hetfl.sim import Simulation

    sim = Simulation(cfg)
    summary = sim.run(progress=False)
    return sim, torch.load(Path(summary["run_dir"], "final_model.pt"), weights_only=True)


def test_masking_changes_nothing_when_every_client_holds_every_class(tiny_cfg):
    """IID digits over 8 clients (about 200 samples each): every client holds all 10 classes, so the masked run's
    weights are the unmasked run's, bit for bit."""
    runs = []
    for mask in (True, False):
        sim, weights = final_weights(tiny_cfg(method="fedrolex", num_clients=8, client_fraction=0.5, rounds=2,
                                              label_mask=mask, name=f"mask-{mask}"))
        assert sim.method.options.label_mask is mask
        runs.append(weights)
    assert all(len(torch.unique(sim.y_train[p])) == 10 for p in sim.parts)
    assert runs[0].keys() == runs[1].keys() and all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])


def test_masking_changes_a_run_where_clients_lack_classes_and_batched_matches_sequential(tiny_cfg):
    """Two classes per client: the masked run differs from the unmasked one, and the batched executor, which stacks
    the clients' class vectors, gives the sequential executor's weights. The images get the same faint noise in
    every run: digits' flat backgrounds tie in max-pooling windows, where a stacked kernel may route the gradient
    to another of the equal values (executors.batched)."""
    from hetfl.executors.batched import BatchedExecutor
    from hetfl.sim import Simulation

    states = {}
    for executor, mask in (("sequential", True), ("batched", True), ("sequential", False)):
        sim = Simulation(tiny_cfg(method="heterofl", partition="pathological", classes_per_client=2,
                                  client_fraction=0.5, executor=executor, label_mask=mask, name=f"{executor}-{mask}"))
        sim.create_run_dir()
        sim.executor.prepare()
        x = sim.executor.clients.x  # the process's cached dataset: a noisy copy, never the tensor itself
        sim.executor.clients.x = x + 1e-3 * torch.randn(x.shape, generator=torch.Generator().manual_seed(0))
        sim.run_round(1)
        states[executor, mask] = sim.state.params
        if executor == "batched":
            assert isinstance(sim.executor, BatchedExecutor) and max(sim.executor.group_sizes) > 1
    masked, batched, plain = states["sequential", True], states["batched", True], states["sequential", False]
    assert all((masked[k] - batched[k]).abs().max() <= 1e-4 for k in masked)
    assert any(not torch.allclose(masked[k], plain[k]) for k in masked)
