"""The text path: the pretrained encoder in the multi-exit contract, fine-tuning modes, what travels, and the
token-id cache. All on a 2-layer BERT the tests save in MiniLM's format (no large download)."""

import hashlib
import json
import sys

import pytest
import torch

from hetfl.client import client_update
from hetfl.models.cache import ModelCache, describe_family
from hetfl.data import text
from hetfl.models import FINETUNE_MODES, model_family
from hetfl.models.base import federated_state
from hetfl.slicing import SubModel, state_bytes
from hetfl.recipes import ExitsCE
from hetfl.task import Task, TrainOptions
from hetfl.trainers.schedule import ClientData
from tinybert import WORDS, tiny_bert, tiny_bert_dir  # noqa: F401  (fixtures)

pytest.importorskip("peft")
L = 8


def token_batch():
    """Two documents of token ids, the second padded after 5 tokens."""
    x = torch.randint(5, 5 + len(WORDS), (2, L), generator=torch.Generator().manual_seed(0))
    x[:, 0] = 2
    x[1, 5:] = 0
    return x


@pytest.mark.parametrize("mode", FINETUNE_MODES)
def test_the_saved_model_loads_like_minilm_and_matches_transformers(tiny_bert, mode):
    from transformers import BertModel

    x = token_batch()
    reference = BertModel.from_pretrained(str(tiny_bert)).eval()
    with torch.no_grad():
        expected = reference(input_ids=x, attention_mask=(x != 0).long(), output_hidden_states=True).hidden_states
    model = model_family("minilm", (L,), 3, finetune=mode).build(seed=0).eval()
    seen = []
    with torch.no_grad():
        logits = model(x, between=lambda b, h: seen.append(h) or h)
    assert len(seen) == 2 and [tuple(z.shape) for z in logits] == [(2, 3), (2, 3)]
    for b, h in enumerate(seen):  # every mode starts as the pretrained function (added modules are the identity)
        torch.testing.assert_close(h[x != 0], expected[b + 1][x != 0], atol=1e-5, rtol=1e-5)


def test_the_encoder_is_read_without_transformers_bit_for_bit(tiny_bert):
    """load_pretrained reads config.json and model.safetensors with torch alone; the tensors are transformers'."""
    from transformers import BertModel

    from hetfl.models.minilm import load_pretrained

    load_pretrained.cache_clear()
    config, weights = load_pretrained(str(tiny_bert))
    reference = BertModel.from_pretrained(str(tiny_bert)).state_dict()
    assert config["num_hidden_layers"] == 2 and config["hidden_size"] == 32
    assert set(weights) >= {k for k in reference if not k.endswith("position_ids")}
    for name, tensor in reference.items():
        if name in weights:
            assert weights[name].dtype == tensor.dtype and torch.equal(weights[name], tensor), name


def test_the_real_minilm_reads_as_the_safetensors_library_reads_it():
    """all-MiniLM-L6-v2's own file (make test installs it), every tensor equal to safetensors' reading."""
    from safetensors.torch import load_file

    from hetfl.models.minilm import PACKAGE, pretrained_dir
    from hetfl.models.safetensors_file import read_safetensors

    pytest.importorskip(PACKAGE)
    path = pretrained_dir() / "model.safetensors"
    ours, theirs = read_safetensors(path), load_file(path)
    assert set(ours) == set(theirs) and len(ours) > 100
    assert all(ours[k].dtype == theirs[k].dtype and torch.equal(ours[k], theirs[k]) for k in theirs)


def test_a_damaged_weights_file_is_refused_in_one_line(tiny_bert, tmp_path):
    from hetfl.errors import HetflError
    from hetfl.models.safetensors_file import read_safetensors

    from hetfl.models.minilm import load_pretrained

    config = json.loads((tiny_bert / "config.json").read_text())
    folder = tmp_path / "no-width"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes((tiny_bert / "model.safetensors").read_bytes())
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "hidden_size"}))
    with pytest.raises(HetflError, match="lacks hidden_size: not a BERT encoder's config"):
        load_pretrained(str(folder))
    data = (tiny_bert / "model.safetensors").read_bytes()
    for broken in (data[:4], data[:-8], b"\xff" * 8 + data[8:]):
        (tmp_path / "w.safetensors").write_bytes(broken)
        with pytest.raises(HetflError, match="is not a readable safetensors file"):
            read_safetensors(tmp_path / "w.safetensors")


def test_lora_is_peft_s_lora_bit_for_bit():
    """LoraLinear reproduces peft's LoRA (which the committed LoRA runs used): tensor names, initial values drawn
    from the same seeded generator, which tensors train, and the forward once B is no longer zero."""
    from peft import LoraConfig, inject_adapter_in_model

    from hetfl.models.finetune import apply_finetune
    from hetfl.models.minilm import EncoderBlock

    def blocks():
        torch.manual_seed(0)
        return torch.nn.ModuleList(EncoderBlock(32, 4, 64, 1e-12) for _ in range(2))

    ours, theirs = blocks(), blocks()
    torch.manual_seed(1)
    apply_finetune([ours], list(ours), "lora", 4)
    torch.manual_seed(1)
    theirs.requires_grad_(False)
    for block in theirs:
        inject_adapter_in_model(LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], lora_dropout=0.0),
                                block)
    mine, peft_state = ours.state_dict(), theirs.state_dict()
    assert list(mine) == list(peft_state) and any("lora_A.default" in n for n in mine)
    assert all(torch.equal(mine[n], peft_state[n]) for n in mine)
    assert trainable(ours) == trainable(theirs)
    with torch.no_grad():
        for n in [n for n in mine if "lora_B" in n]:
            noise = torch.randn(mine[n].shape, generator=torch.Generator().manual_seed(len(n)))
            mine[n].copy_(noise)
            peft_state[n].copy_(noise)
        h = torch.randn(2, L, 32, generator=torch.Generator().manual_seed(2))
        assert torch.equal(ours[0](h, None), theirs[0](h, None))


def test_the_text_backbone_needs_neither_transformers_nor_peft(tiny_bert, monkeypatch):
    """What a bare GPU image has (torch alone) builds and runs a LoRA MiniLM."""
    from hetfl.models.minilm import load_pretrained

    load_pretrained.cache_clear()
    for name in ("transformers", "peft", "safetensors"):
        monkeypatch.setitem(sys.modules, name, None)  # any import of them now raises ImportError
    model = model_family("minilm", (L,), 3, finetune="lora").build(seed=0)
    assert any("lora_A" in n for n in trainable(model))
    assert all(torch.isfinite(z).all() for z in model(token_batch()))


def trainable(model):
    return {n for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("mode", ["frozen", "lora", "pa", "sa", "ssf"])
def test_only_trainable_tensors_travel_and_the_backbone_stays_bit_identical(tiny_bert, mode):
    family = model_family("minilm", (L,), 3, finetune=mode)
    models = ModelCache(family)
    spec = SubModel(depth=2)
    global_model = family.build(seed=0)
    local = federated_state(global_model)
    assert set(local) == trainable(global_model)  # exits and the mode's own modules, nothing frozen
    frozen_before = {n: t.clone() for n, t in global_model.state_dict().items() if n not in local}
    g = torch.Generator().manual_seed(1)
    x = torch.randint(5, 5 + len(WORDS), (12, L), generator=g)
    data = ClientData(x, torch.randint(0, 3, (12,), generator=g), torch.arange(12))
    task = Task(spec=spec, family=describe_family(family), loss=ExitsCE(), lr=0.5, round=1, client=0, seed=0,
                train=TrainOptions(batch_size=4, momentum=0.9, weight_decay=1e-2))
    update, _ = client_update(local, task, data, models=models)
    assert set(update.state) == set(local)  # only trainable tensors are sent back
    assert any(not torch.equal(update.state[n], local[n]) for n in local)  # and they did train
    module = models.module(spec)
    for name, before in frozen_before.items():  # momentum and weight decay never touch a frozen tensor
        assert torch.equal(module.state_dict()[name], before), name


def test_bytes_per_round_show_what_travels(tiny_bert):
    sizes = {mode: state_bytes(federated_state(model_family("minilm", (L,), 3, finetune=mode).build(seed=0)))
             for mode in FINETUNE_MODES}
    exits = 2 * (2 * 32 + 32 * 3 + 3) * 4  # two exits: LayerNorm(32) + Linear(32, 3), float32
    assert sizes["frozen"] == exits
    # SSF: a scale and a shift per output of every Linear and LayerNorm: per layer seven 32-wide and one 64-wide,
    # and the embeddings' LayerNorm
    assert sizes["ssf"] == exits + 4 * 2 * (2 * (7 * 32 + 64) + 32)
    assert sizes["frozen"] < sizes["ssf"] < sizes["lora"] < sizes["full"]
    assert sizes["pa"] == sizes["sa"] < sizes["full"]


def write_tab(path, rows):
    path.write_text("Category\tText\nd\tstring\nclass\t\n\n" + "".join(f"{c}\t{t}\n" for c, t in rows))


def test_token_ids_are_cached_and_reused(tiny_bert, tmp_path, monkeypatch):
    monkeypatch.setenv("HETFL_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "data"
    data.mkdir()
    write_tab(data / "reuters-r8-train.tab", [("earn", "stock profit said"), ("crude", "oil price"),
                                              ("earn", "bank rate and the market")])
    write_tab(data / "reuters-r8-test.tab", [("crude", "oil ships"), ("earn", "profit")])
    sums = {n: hashlib.sha256((data / n).read_bytes()).hexdigest() for n in text.FILES["r8"]}
    monkeypatch.setattr(text, "SHA256", sums)  # the test's own files stand in for the checksummed ones
    tokenizer = tiny_bert / "tokenizer.json"
    calls = []
    real = text.tokenize
    monkeypatch.setattr(text, "tokenize", lambda *a: calls.append(a) or real(*a))
    x_train, y_train, x_test, y_test, classes = text.load_text("r8", str(data), tokenizer, 6)
    assert len(calls) == 2 and classes == ["crude", "earn"] and y_train.tolist() == [1, 0, 1]
    ids = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    assert x_train[1].tolist() == [ids["[CLS]"], ids["oil"], ids["price"], ids["[SEP]"], 0, 0]
    assert x_train[2].tolist() == [2, ids["bank"], ids["rate"], ids["and"], ids["the"], 3]  # truncated to 6
    assert x_test[0].tolist()[:4] == [2, ids["oil"], ids["ship"], ids["##s"]]
    monkeypatch.setattr(text, "tokenize", lambda *a: pytest.fail("tokenized again instead of reading the cache"))
    again = text.load_text("r8", str(data), tokenizer, 6)
    assert all(torch.equal(a, b) for a, b in zip(again[:4], (x_train, y_train, x_test, y_test)))
    monkeypatch.setattr(text, "tokenize", lambda *a: calls.append(a) or real(*a))
    assert text.load_text("r8", str(data), tokenizer, 7)[0].shape == (3, 7)  # another length: another cache entry
    assert len(calls) == 4


def test_a_corrupt_data_file_is_refused(tmp_path, monkeypatch):
    write_tab(tmp_path / "reuters-r8-train.tab", [("earn", "stock")])
    with pytest.raises(text.HetflError, match="unexpected sha256"):
        text.read_tab(tmp_path / "reuters-r8-train.tab")


def test_finetune_modes_need_a_pretrained_backbone():
    with pytest.raises(text.HetflError, match="needs a pretrained backbone"):
        model_family("vit", (1, 28, 28), 10, finetune="lora")


def test_a_backbone_refuses_inputs_of_the_other_kind():
    with pytest.raises(text.HetflError, match="reads images"):
        model_family("vit", (64,), 8)
    with pytest.raises(text.HetflError, match="reads token ids"):
        model_family("minilm", (1, 28, 28), 10)
    with pytest.raises(text.HetflError, match="token summary"):
        model_family("cnn", (1, 8, 8), 10, head="ree").build()
