"""ReeFL (Sec. 3.2, Eq. 2-6): Ree's shapes and history, modulation, best-exit teacher and KL, and a short
federated run; on the tiny BERT the tests save (tinybert.py)."""

import math

import pytest
import torch
import torch.nn.functional as F

from hetfl.models.cache import describe_family
from hetfl.trainers.objectives import objective_for
from hetfl.losses import best_exit_kd, running_ce
from hetfl.methods import config_from
from hetfl.models import model_family
from hetfl.models.base import federated_state
from hetfl.models.minilm import MeanExit
from hetfl.recipes import BestExit
from tinybert import WORDS, tiny_bert, tiny_bert_dir  # noqa: F401  (fixtures)

L = 8


def tokens(n=3, seed=0):
    x = torch.randint(5, 5 + len(WORDS), (n, L), generator=torch.Generator().manual_seed(seed))
    x[:, 0] = 2
    x[-1, 6:] = 0
    return x


def ree_model(head="ree", depth=None, finetune="frozen"):
    return model_family("minilm", (L,), 3, finetune=finetune, head=head).build(depth=depth, seed=0).eval()


def record(model):
    """Hooks capturing every block's input and output, and Ree's input and output, at each call."""
    seen = {"block_in": [], "block_out": [], "ree_in": [], "ree_out": []}
    for block in model.blocks:
        block.register_forward_pre_hook(lambda m, a: seen["block_in"].append(a[0].clone()))
        block.register_forward_hook(lambda m, a, out: seen["block_out"].append(out.clone()))
    model.ree.register_forward_pre_hook(lambda m, a: seen["ree_in"].append(a[0].clone()))
    model.ree.register_forward_hook(lambda m, a, out: seen["ree_out"].append(out.clone()))
    return seen


def summary(h, x):
    """The token mean of the real tokens, by hand: MiniLM's summary token."""
    real = (x != 0).float().unsqueeze(-1)
    return (h * real).sum(1) / real.sum(1)


def test_minilm_exits_read_the_mean_of_the_real_tokens():
    h = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])  # the third token is padding
    mask = torch.tensor([[True, True, False]])
    assert torch.equal(MeanExit.pool(h, mask), torch.tensor([[2.0, 3.0]]))
    moved = MeanExit.replace(h, torch.tensor([[0.0, 0.0]]), mask)
    assert torch.equal(moved, torch.tensor([[[-1.0, -1.0], [1.0, 1.0], [100.0, 100.0]]]))  # same shift, pad kept


def test_ree_shapes_and_the_growing_history_of_raw_summary_tokens(tiny_bert):
    model = ree_model()
    seen = record(model)
    x = tokens()
    with torch.no_grad():
        logits = model(x)
    assert [tuple(z.shape) for z in logits] == [(3, 3), (3, 3)]  # one shared classifier, an exit per block
    assert tuple(model.ree.pos.shape) == (1, 3, 32)  # meta + one position per block
    assert [tuple(t.shape) for t in seen["ree_in"]] == [(3, 1, 32), (3, 2, 32)]  # history grows by one per block
    assert [tuple(t.shape) for t in seen["ree_out"]] == [(3, 2, 32), (3, 3, 32)]  # m^l = [m_0 .. m_l]
    # the history holds z^1..z^l as the blocks output them (before modulation), unchanged once stored
    for l, history in enumerate(seen["ree_in"]):
        for j in range(l + 1):
            torch.testing.assert_close(history[:, j], summary(seen["block_out"][j], x), rtol=0, atol=1e-6)
    # Eq. (3): the exits classify m_0^l + z^l with the shared head
    with torch.no_grad():
        for l, z in enumerate(logits):
            expected = model.head(seen["ree_out"][l][:, 0] + summary(seen["block_out"][l], x))
            torch.testing.assert_close(z, expected)


def test_a_depth_cut_holds_the_leading_corner_of_the_global_tensors(tiny_bert):
    full, cut = federated_state(ree_model()), federated_state(ree_model(depth=1))
    assert set(cut) <= set(full) and {"ree.meta", "ree.pos", "head.fc.weight"} <= set(cut)
    assert tuple(cut["ree.pos"].shape) == (1, 2, 32) and tuple(full["ree.pos"].shape) == (1, 3, 32)
    assert all(cut[k].shape == full[k].shape for k in cut if k != "ree.pos")  # Ree and the head: whole, everywhere


def test_modulation_replaces_the_summary_token_the_next_block_reads(tiny_bert):
    model = ree_model()
    seen = record(model)
    x = tokens()
    with torch.no_grad():
        model(x)
    nxt, out = seen["block_in"][1], seen["block_out"][0]
    m = seen["ree_out"][0][:, -1]
    torch.testing.assert_close(summary(nxt, x), m, rtol=0, atol=1e-5)  # Eq. (4): m_l^l in place of z^l
    real = x != 0
    shift = nxt - out  # one shift per document on its real tokens; padding as block 1 output it
    torch.testing.assert_close(shift[real], (m - summary(out, x))[:, None].expand_as(out)[real], rtol=0, atol=1e-5)
    assert torch.equal(nxt[~real], out[~real])
    assert not torch.allclose(summary(nxt, x), summary(out, x))
    plain = ree_model(head="ree-unmodulated")
    seen = record(plain)
    with torch.no_grad():
        plain(tokens())
    assert torch.equal(seen["block_in"][1], seen["block_out"][0])  # the ablation: no replacement


def test_teacher_is_the_exit_of_lowest_running_ce_worked_by_hand():
    value = running_ce(None, torch.tensor([1.0, 0.5]), 0.2)
    assert int(value.argmin()) == 1  # estimate [0.2, 0.1]
    value = running_ce(value, torch.tensor([0.0, 2.0]), 0.2)
    assert int(value.argmin()) == 0  # 0.8 [0.2, 0.1] + 0.2 [0, 2] = [0.16, 0.48]
    torch.testing.assert_close(value, torch.tensor([0.16, 0.48]))
    # 0.8 [0.16, 0.48] + 0.2 [0.8, 0] = [0.288, 0.384]: this batch alone would pick exit 1, the estimate keeps 0
    value = running_ce(value, torch.tensor([0.8, 0.0]), 0.2)
    assert int(value.argmin()) == 0
    torch.testing.assert_close(value, torch.tensor([0.288, 0.384]))


def test_best_exit_kl_goes_from_the_detached_teacher_to_the_students_by_hand():
    teacher = torch.tensor([[0.0, math.log(3.0)]], requires_grad=True)  # p = [1/4, 3/4]
    student = torch.tensor([[0.0, 0.0]], requires_grad=True)  # q = [1/2, 1/2]
    other = torch.tensor([[math.log(3.0), 0.0]], requires_grad=True)  # r = [3/4, 1/4]
    kl = best_exit_kd([student, teacher, other], teacher=1)
    by_hand = (0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)) \
        + (0.25 * math.log(0.25 / 0.75) + 0.75 * math.log(0.75 / 0.25))  # KL(p || q) + KL(p || r)
    assert kl.item() == pytest.approx(by_hand, abs=1e-6)
    kl.backward()
    assert teacher.grad is None or not teacher.grad.any()  # the teacher is detached
    # d KL(p || softmax(s)) / ds = softmax(s) - p
    torch.testing.assert_close(student.grad, torch.tensor([[0.5 - 0.25, 0.5 - 0.75]]))
    tau = 2.0
    scaled = best_exit_kd([student, teacher], teacher=1, tau=tau)
    p, q = F.softmax(teacher.detach() / tau, 1), F.softmax(student.detach() / tau, 1)
    assert scaled.item() == pytest.approx(tau**2 * (p * (p / q).log()).sum().item(), abs=1e-6)


def test_the_loss_picks_the_teacher_by_running_ce_and_adds_eta_kl(tiny_bert):
    model = ree_model(finetune="frozen").train()
    x, y = tokens(4), torch.tensor([0, 1, 2, 0])
    objective = objective_for(BestExit(kd_weight=0.5, ema=0.2), None)
    with torch.no_grad():
        logits = model(x)
        ce = torch.stack([F.cross_entropy(z, y) for z in logits])
        teacher = int(ce.argmin())
        expected = ce.sum() + 0.5 * best_exit_kd(logits, teacher)
        loss, carry = objective(model, {}, x, y, None)
        assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
        assert int(carry.argmin()) == teacher


def test_reefl_runs_federated_on_text_and_sends_only_ree_head_and_adapters(tiny_bert, tmp_path, monkeypatch):
    from hetfl.data import datasets
    from hetfl.sim import Simulation

    g = torch.Generator().manual_seed(0)
    n = 120
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.randint(5, 5 + len(WORDS), (n, L), generator=g)
    x[:, 0], x[:, 1:] = 2, 5 + y[:, None]  # every word names the class: learnable in a few steps
    monkeypatch.setitem(datasets._LOADED, ("r8:8", f"|{(tiny_bert / 'tokenizer.json').resolve()}"),
                        datasets.Dataset("r8", x, y, x[:60], y[:60], 3))
    cfg = config_from(dict(method="reefl", dataset="r8", max_length=L, finetune="lora", adapter_rank=4,
                           num_clients=6, client_fraction=1.0, levels=2, rounds=8, batch_size=8, lr=0.3,
                           out=str(tmp_path / "runs")))
    assert cfg.model == "minilm"  # a text dataset's default backbone
    sim = Simulation(cfg)
    assert sim.method.family.head == "ree" and describe_family(sim.method.family).finetune == "lora"
    summary = sim.run(progress=False)
    final = summary["final"]["global"]
    assert set(final) >= {"exit1", "exit2", "ensemble"}
    assert final["exit2"] > 0.6 and final["ensemble"] > 0.6  # chance is 1/3
    sent = sim.method.models.shapes(sim.method.plan(0, sim.scenario.budget(0, 1), 1))
    assert all(k.startswith(("ree.", "head.")) or "lora_" in k for k in sent)


def test_modulation_into_the_class_token_alone(tiny_bert):
    """The other reading of Eq. (4) on a mean-pooled encoder: Ree's output in the [CLS] position, the rest as output."""
    model = ree_model(head="ree-cls")
    seen = record(model)
    with torch.no_grad():
        model(tokens())
    nxt, out = seen["block_in"][1], seen["block_out"][0]
    assert torch.equal(nxt[:, 0], seen["ree_out"][0][:, -1])
    assert torch.equal(nxt[:, 1:], out[:, 1:])
    from hetfl.methods.reefl import ReeFL

    cfg = config_from({"method": "reefl", "dataset": "r8", "modulate_into": "cls"}, "test")
    assert ReeFL.make_family(cfg, (L,), 3).head == "ree-cls"
    assert "modulate_into" not in config_from({"method": "reefl", "dataset": "r8"}, "test").to_dict()  # added later
