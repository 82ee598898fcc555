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
