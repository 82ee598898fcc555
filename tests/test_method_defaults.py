"""Every registered method runs on its own defaults: a newcomer's `hetfl run --method M` never stops at once."""

import json

import pytest

from hetfl.cli import main
from hetfl.methods import METHODS, config_from


# FedDF's round distils on 5,000 server samples by default (56 s here): a soak, so make test stays under 15 minutes
@pytest.mark.parametrize("method", [pytest.param(m, marks=pytest.mark.soak) if m == "feddf" else m
                                    for m in sorted(METHODS)])
def test_every_method_runs_one_round_on_its_defaults(method, tmp_path, capsys):
    """Only the data size is chosen (digits, 6 clients, one round); everything else is the method's default."""
    code = main(["run", "--method", method, "--dataset", "digits", "--num-clients", "6", "--rounds", "1", "--quiet",
                 "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    (summary,) = tmp_path.glob("*/summary.json")
    final = json.loads(summary.read_text())["final"]
    accuracies = [v for served in final.values() for k, v in served.items() if k != "loss" and v is not None]
    assert accuracies and all(0.0 <= v <= 1.0 for v in accuracies)


@pytest.mark.parametrize("method,model", [("fedepth", "preresnet20"), ("m-fedepth", "preresnet20"),
                                          ("inclusivefl", "vit"), ("inclusivefl-womd", "vit"), ("reefl", "vit"),
                                          ("reefl-nokd", "vit")])
def test_a_method_defaults_to_its_papers_backbone_where_the_default_cnn_does_not_fit(method, model):
    assert config_from({"method": method}).model == model
    assert config_from({"method": method, "dataset": "r8"}).model == "minilm"  # text: the pretrained encoder
    assert config_from({"method": method, "model": "cnn", "md_beta": 0.0} if "inclusivefl" in method
                       else {"method": method, "model": "cnn"}).model == "cnn"  # a given model is kept


@pytest.fixture
def inputs_on_other_devices():
    """The (module, input device, parameter device) of every module call whose input is not where the module's own
    parameters are, while the fixture lasts."""
    import torch
    from torch.nn.modules.module import register_module_forward_pre_hook

    seen = []

    def check(module, args):
        devices = {p.device for p in module.parameters(recurse=False)}
        seen.extend((type(module).__name__, a.device, devices) for a in args
                    if isinstance(a, torch.Tensor) and devices and a.device not in devices)

    hook = register_module_forward_pre_hook(check)
    yield seen
    hook.remove()


@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_method_built_for_another_device_feeds_its_modules_nothing_from_the_cpu(method, inputs_on_other_devices):
    """Built on torch's meta device (shapes only: a stand-in for cuda on a machine without one), a method's set-up
    passes no CPU tensor to its models: FeDepth's check of its block boundary once ran a CPU batch through a CUDA
    stem and every FeDepth run failed on a GPU at its start. (Its budgets are measured on the CPU by design.)"""
    from hetfl.methods import method_class

    cfg, cls = config_from({"method": method, "dataset": "fmnist"}), method_class(method)
    cls(cfg, cls.make_family(cfg, (1, 28, 28), 10), cfg.levels, "meta")
    assert inputs_on_other_devices == []
