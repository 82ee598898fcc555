"""Exit summaries of a frozen backbone stored once and read back (models.frozen_features): the same logits as the
blocks give, the blocks not run again, refused where something before an exit trains, and a real short run."""

import pytest
import torch

from hetfl.errors import HetflError
from hetfl.methods import config_from
from hetfl.models import model_family
from hetfl.models import frozen_features
from hetfl.models.frozen_features import FrozenFeatures, serving
from tinybert import WORDS, tiny_bert, tiny_bert_dir  # noqa: F401  (fixtures)

L = 8


def documents(n, seed=0):
    """``n`` documents of token ids, every other one padded after 4 tokens."""
    x = torch.randint(5, 5 + len(WORDS), (n, L), generator=torch.Generator().manual_seed(seed))
    x[:, 0] = 2
    x[::2, 4:] = 0
    return x


def block_calls(model):
    """A list that grows by one entry per block forward of ``model``."""
    calls = []
    for block in model.blocks:
        block.register_forward_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("width", [1.0, 0.5])
def test_stored_summaries_give_the_blocks_logits_and_the_blocks_do_not_run(tiny_bert, width):
    model = model_family("minilm", (L,), 3, width=width, finetune="frozen").build(seed=0).eval()
    x = documents(300)  # more than one fill chunk
    with torch.no_grad():
        expected = model(x[10:50])
        store = FrozenFeatures(x)
        calls = block_calls(model)
        with serving(store):
            first = model(x[10:50])
            assert store.fills == 1
            calls.clear()
            again = model(x[[7, 3, 299]])
        assert not calls and store.fills == 1  # read back: no block ran
    for got, want in zip(first, expected):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(again[0], model(x[[7, 3, 299]])[0], atol=1e-5, rtol=1e-5)


def test_a_backbone_that_trains_or_an_unknown_document_runs_the_blocks(tiny_bert):
    x = documents(20)
    store = FrozenFeatures(x[:10])
    lora = model_family("minilm", (L,), 3, finetune="lora").build(seed=0)
    frozen = model_family("minilm", (L,), 3, finetune="frozen").build(seed=0)
    with torch.no_grad(), serving(store):
        lora_calls, frozen_calls = block_calls(lora), block_calls(frozen)
        lora(x[:4])
        frozen(x[8:12])  # documents 10 and 11 were not registered
        assert store.fills == 0 and len(lora_calls) == len(frozen_calls) == 2
        frozen(x[:4], between=lambda b, h: h)  # a hook between blocks needs them run
        assert store.fills == 0 and len(frozen_calls) == 4


def test_ree_without_modulation_reads_them_and_with_modulation_runs_its_blocks(tiny_bert):
    x = documents(40)
    for modulate in (False, True):
        head = "ree" if modulate else "ree-unmodulated"
        model = model_family("minilm", (L,), 3, finetune="frozen", head=head).build(seed=0).eval()
        with torch.no_grad():
            expected = model(x[:12])
            store = FrozenFeatures(x)
            with serving(store):
                model(x[20:24])  # fills the store, unless modulating
                calls = block_calls(model)
                got = model(x[:12])
        assert store.fills == (0 if modulate else 1) and bool(calls) == modulate
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_the_option_is_refused_where_it_cannot_apply():
    with pytest.raises(HetflError, match="needs finetune = frozen"):
        config_from(dict(method="depthfl", dataset="r8", finetune="lora", cache_frozen_features=True)).validate()
    with pytest.raises(HetflError, match="modulation"):
        config_from(dict(method="reefl", dataset="r8", finetune="frozen", cache_frozen_features=True))
    config_from(dict(method="reefl", dataset="r8", finetune="frozen", modulation=False, cache_frozen_features=True))


def learnable_r8(monkeypatch, tiny_bert, n=120):
    """A small R8 stand-in on the tiny BERT's words, where every word names the class."""
    from hetfl.data import datasets

    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.randint(5, 5 + len(WORDS), (n, L), generator=g)
    x[:, 0], x[:, 1:4] = 2, 5 + y[:, None]  # three words name the class, the others are noise
    x[::3, 5:] = 0
    monkeypatch.setitem(datasets._LOADED, ("r8:8", f"|{(tiny_bert / 'tokenizer.json').resolve()}"),
                        datasets.Dataset("r8", x, y, x[:60], y[:60], 3))


@pytest.mark.parametrize("method, own", [("depthfl", {}), ("scalefl", {}), ("reefl", {"modulation": False})])
def test_a_federated_run_reading_stored_summaries_learns_as_one_running_the_blocks(tiny_bert, tmp_path, monkeypatch,
                                                                                    method, own):
    from hetfl.sim import Simulation

    learnable_r8(monkeypatch, tiny_bert)
    monkeypatch.setattr(frozen_features, "_last", None)  # not an earlier test's store of the same documents
    finals, fills = {}, []
    for n, cached in enumerate((False, True, True)):
        cfg = config_from(dict(method=method, dataset="r8", max_length=L, finetune="frozen", num_clients=6,
                               client_fraction=1.0, levels=2, rounds=12, batch_size=8,
                               cache_frozen_features=cached, out=str(tmp_path / f"runs{n}"), **own))
        sim = Simulation(cfg)
        assert (sim.frozen_features is not None) == cached
        before = sim.frozen_features.fills if cached else 0
        finals.setdefault(cached, []).append(sim.run(progress=False)["final"]["global"])
        if cached:
            fills.append(sim.frozen_features.fills - before)
    # the first run fills once per width (ScaleFL's two levels have two), the second reads what the first stored
    assert fills == ([2, 0] if method == "scalefl" else [1, 0])
    plain, (cached, again) = finals[False][0], finals[True]
    assert cached == again  # deterministic: the stored values do not depend on which batch first asked
    assert max(cached.values()) > 0.6  # chance is 1/3
    for name in plain:  # float rounding apart, the same training
        assert cached[name] == pytest.approx(plain[name], abs=0.02), name


def test_a_resumed_run_refills_the_same_summaries_and_ends_where_an_uninterrupted_one_does(tiny_bert, tmp_path,
                                                                                          monkeypatch):
    from hetfl.sim import Simulation

    learnable_r8(monkeypatch, tiny_bert)
    cfg = dict(method="depthfl", dataset="r8", max_length=L, finetune="frozen", num_clients=6, client_fraction=0.5,
               levels=2, rounds=6, batch_size=8, checkpoint_every=1, cache_frozen_features=True)
    whole = Simulation(config_from({**cfg, "out": str(tmp_path / "a")})).run(progress=False)
    cut = Simulation(config_from({**cfg, "out": str(tmp_path / "b")}))
    cut.run(progress=False, stop_after=3)
    monkeypatch.setattr(frozen_features, "_last", None)  # as a new process: the store is filled again
    resumed = Simulation.resume(cut.run_dir)
    assert resumed.frozen_features.fills == 0
    assert resumed.run(progress=False)["final"] == whole["final"]
    assert resumed.frozen_features.fills == 1
