"""FjORD (Horvath et al., "FjORD: Fair and Accurate Federated Learning under heterogeneous targets with Ordered
Dropout", NeurIPS 2021): width-nested sub-models, each local step on one width drawn at random.

The algorithm, step by step, and where hetfl does each:

1. Ordered Dropout ("Ordered Dropout" section): the p-sub-network keeps the leading ceil(p K) units of every layer
   of K units (image channels and classes kept), so every narrower sub-network nests in every wider one ->
   hetfl's width slicing (``models.base.scaled`` rounds up as the paper does; ``slicing.extract``: the leading
   corner). The widths are discrete, a set P of ratios; FjORD samples them from D_P = uniform over P.
2. Client tiers: client i can afford widths up to p_max^i, the largest of P its device runs -> ``plan``
   (HeteroFL's ``fit``: the largest width within the client's physical budget, or its level's width).
3. The server sends client i its p_max^i sub-model -> ``Method.configure`` (``extract`` at width p_max).
4. Local training: at every local step (mini-batch) the client draws p uniformly from {p in P : p <= p_max^i}
   (``widths_up_to``) and takes the SGD step on the p-sub-network, the leading slices of its own p_max
   parameters, so the gradient lands on the shared leading units -> ``recipe`` (``recipes.OrderedDropout``;
   its loss ``trainers.objectives._ordered_dropout``). The draws are made up front from the client's generator
   (seed, "train", round, client), after its batches (``schedule.draw_variants``), so a run is bit-identical
   and the batched executor, which stacks the clients that drew the same width at a step, sees the same draws.
5. Self-distillation ("knowledge distillation", optional: ``fjord_kd``): every step also runs the client's
   widest sub-network p_max, trains it with its CE, and distils its detached softened outputs into the drawn
   width: CE(z_pmax, y) + (1 - alpha) CE(z_p, y) + alpha tau^2 KL(softmax(z_pmax / tau) || softmax(z_p / tau))
   (``losses.distilled_ce``). A step that draws p_max itself is its own teacher: CE + (1 - alpha) CE.
6. Aggregation: every element averaged over the clients that held it (the nested units of the widths each
   client covered) -> ``MaskedMean`` in ``Method.aggregate``, weighted by sample counts as the authors' code
   (Σ n_k w_k / Σ n_k over the clients whose p_max covers the element); elements no client held keep their value.
7. Evaluation: the full-width model ("global") and every narrower width ("width{p}"), as HeteroFL's
   ``eval_specs``; batch statistics by static BN per evaluated width (hetfl's rule; the authors keep a BN's
   statistics per width and share its affine parameters, which hetfl's sliced affine and per-width statistics
   match).

Sources: the paper (only its abstract could be read where this was written; its sections are named by title, not
number), and the authors' Flower baseline (``adap/flower``, ``baselines/fjord``: ``fjord/models.py``'s ``train``,
``od/samplers/fixed_od.py``, ``od/layers/*.py``, ``strategy.py``'s ``fjord_average``, ``conf/common.yaml``,
``main.py``), against which every step above was checked; none of its code is used. The KD loss's form, (1 - alpha)
CE + alpha KL at temperature tau, is the paper's; the terms the authors' code actually takes are in step 5.

Choices:

* Widths: the config's level widths (hetfl's l/L, 1/4 .. 1 at 4 levels, as HeteroFL), not the paper's 0.2, 0.4,
  ..., 1.0, so that a level-l device trains the same p_max under FjORD as under HeteroFL and SHeteroFL in one
  table; ``--levels 5 --widths 0.2,0.4,0.6,0.8,1.0`` gives the paper's tiers.
* Sampling: one p per step for the whole network (the authors' sampler draws one p per forward pass and gives it
  to every layer), uniform over the widths the client holds, its own included.
* The drawn width's loss without KD is its plain CE; with KD the authors' code takes CE(z_pmax, y) and the CE of z_p
  against softmax(z_pmax) (alpha = 1, tau = 1): ``fjord_kd_alpha`` and ``fjord_kd_tau`` default to those values.
  KD is off by default, as in the authors' baseline (its default train mode; KD is the ``fjord_kd`` variant).
* No Scaler: neither the paper nor the authors' code rescales the activations of a narrower width (HeteroFL's
  Scaler stays available with ``--scaler``).
* Weight decay and momentum act on every tensor the client holds at every step, also on the units beyond the
  drawn width (whose gradient is zero), as the authors' ``torch.optim.SGD`` over the whole model does.
* Label masking (``label_mask``, HeteroFL's masking trick) is available, as to every width method, and off by default:
  neither the paper nor the authors' baseline masks labels.
* Training setup: hetfl's common one by default (the generic SGD every row of a table shares). The authors' baseline
  runs SGD at lr 0.1 without momentum, weight decay 1e-4, batch 32 (``conf/common.yaml``): the preset
  ``width-peers-own``'s "FjORD (own)" row. Without momentum a narrow step moves the units beyond its width only by
  weight decay; with it, also by the momentum of earlier, wider steps (tests/test_fjord.py).
* Budgets are fitted on a p_max step, as HeteroFL's; with KD a step also runs p_max beside p (up to twice the
  forward work), which the fit does not count.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import HetflError
from ..options import Range, opt
from ..recipes import OrderedDropout
from ..slicing import SubModel
from .heterofl import HeteroFL
from .options import LabelMask


@dataclass(frozen=True)
class Options(LabelMask):
    """FjORD's self-distillation: on or off, its weight and its temperature; label masking (off: neither the paper nor
    the authors' baseline masks labels)."""

    fjord_kd: bool = opt(False, "FjORD: self-distillation: every step also trains the client's widest width p_max "
                                "(CE) and distils its softened outputs into the sampled width")
    fjord_kd_alpha: float = opt(1.0, "FjORD: weight alpha of the distillation in (1 - alpha) CE + alpha tau^2 KL of "
                                     "the sampled width (1 = the authors' code: soft targets only)", valid=Range(0, 1))
    fjord_kd_tau: float = opt(1.0, "FjORD: distillation temperature tau (the authors' code: 1)",
                              valid=Range(0, low_open=True))

    def check(self, cfg) -> None:
        if not self.fjord_kd and (self.fjord_kd_alpha != 1.0 or self.fjord_kd_tau != 1.0):
            raise HetflError("fjord_kd_alpha and fjord_kd_tau weigh the self-distillation; add --fjord-kd true")


class FjORD(HeteroFL):
    name = "fjord"
    summary = "width-nested sub-models; each local step trains one width drawn up to the client's (Ordered Dropout)"
    Options = Options
    defaults = {"scaling": "width", "train_exits": "last", "scaler": False, "aggregation_weights": "samples"}

    def widths_up_to(self, spec: SubModel) -> list[float]:
        """The widths a client holding ``spec`` (its p_max) draws from at every step: the level widths <= p_max."""
        return [w for w in self.cfg.level_widths if w <= spec.width]

    def recipe(self, spec: SubModel, round_index: int) -> OrderedDropout:
        """One width per step, uniform over ``widths_up_to(spec)``, on the leading slices of ``spec``'s tensors;
        with ``fjord_kd`` the self-distillation from p_max."""
        o = self.options
        return OrderedDropout(smaller=tuple(self.width_spec(w) for w in self.widths_up_to(spec) if w < spec.width),
                              kd=o.fjord_kd, alpha=o.fjord_kd_alpha, tau=o.fjord_kd_tau)
