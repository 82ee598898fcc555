"""Methods on MSDNet-24 (ScaleFL Sec. 4.3, Table 3): Eq. (1)'s split search on its measured cost, ScaleFL and HeteroFL
learning digits, and the methods whose rules exclude it saying so in one line."""

import pytest

from hetfl.cli import main
from hetfl.models import model_family
from hetfl.splits import split_search

DIGITS = (1, 8, 8)
# shared by the split test and the ScaleFL run below: the same family, so the run reuses the measured costs
RUN = dict(model="msdnet24", dataset="digits", model_width=0.25, num_clients=8, client_fraction=0.5, rounds=3,
           batch_size=16, lr=0.05, static_bn_samples=500, eval_every=3, split_cost="params")


def test_eq1_split_search_on_msdnets_parameters():
    """Levels at 12.5/25/50/100% of the parameters (ScaleFL Sec. 4.2), tolerance 0.1: nested splits near the diagonal,
    each achieving the ratio its own sub-model's parameters give (depth d at width s_w with its exit, against the full
    network with its last exit: level 1's M before any early exit is placed)."""
    fam = model_family("msdnet24", DIGITS, 10, width=RUN["model_width"])
    splits = split_search(fam.with_exits(tuple(range(24))), [0.125, 0.25, 0.5, 1.0], [0.1] * 4, "params")
    assert all(s.within_epsilon for s in splits) and (splits[-1].depth, splits[-1].s_w) == (24, 1.0)
    assert [s.depth for s in splits] == sorted(s.depth for s in splits) and splits[0].depth < 24
    assert [s.s_w for s in splits] == sorted(s.s_w for s in splits)
    assert all(abs(s.s_d - s.s_w) <= 0.05 for s in splits)
    first = splits[0]

    def params(exits, depth=24, width=1.0):
        model = model_family("msdnet24", DIGITS, 10, width=RUN["model_width"], exit_after=exits).build(depth, width)
        return sum(p.numel() for p in model.parameters())

    assert first.ratio == pytest.approx(params((first.depth - 1, 23), first.depth, first.s_w) / params((23,)))


@pytest.mark.parametrize("method", ["heterofl", "scalefl"])
@pytest.mark.soak  # 30 s of training each on two idle cores: make soak, which CI runs after make test
def test_width_methods_learn_digits_on_msdnet(method, tmp_path):
    from hetfl.methods import config_from
    from hetfl.sim import Simulation

    sim = Simulation(config_from({**RUN, "method": method, "out": str(tmp_path)}))
    if method == "scalefl":  # 2-D splits: deeper levels are wider, the last is the whole network
        specs = [sim.method.level_spec(l) for l in (1, 2, 3, 4)]
        assert [(s.depth, s.width) for s in specs] == sorted((s.depth, s.width) for s in specs)
        assert (specs[0].depth < 24 and specs[0].width < 1) and (specs[-1].depth, specs[-1].width) == (24, 1.0)
    summary = sim.run(progress=False)
    assert summary["accuracy"] > 0.3, summary["final"]  # 10 classes: chance is 0.1


@pytest.mark.parametrize("method,fragment", [
    ("fedepth", "passes 3 scales between its blocks"),
    ("inclusivefl", "momentum distillation needs blocks of identical shapes"),
    ("reefl", "ReeFL needs a transformer backbone"),
])
def test_methods_whose_rules_exclude_msdnet_say_so_in_one_line(method, fragment, tmp_path, capsys):
    code = main(["run", "--method", method, "--model", "msdnet24", "--dataset", "digits", "--rounds", "1",
                 "--out", str(tmp_path), "--quiet"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("hetfl: error:") and fragment in lines[0], lines
