"""ReeFL (Lee et al., ICML 2024): recurrent early exits for federated learning with heterogeneous clients.

Sec. 3 as hetfl runs it, per round:

* Sec. 3.1 - client i with budget r_i trains theta_g[:r_i]: the first blocks up to its deepest
  affordable exit E_{r_i}, with Ree (phi) and the shared classifier (psi), which every client
  holds                                                                        -> ``plan``
* Eq. (2)-(4) - after every block, Ree fuses [z_meta, z^1..z^l]; an exit classifies
  m_0^l + z^l with the shared classifier; the next block reads m_l^l instead of z^l
  (``modulation``; off: Table 4's ablation)                                    -> ``models.ree``
* Eq. (5)-(6) - local loss: sum_e CE_e + eta KL(p_teacher || p_e) over e != teacher, the
  teacher the exit of lowest running CE on this client (zeta = 0.2), detached, tau = 1; eta
  ramps up like DepthFL's over the first 30% of the rounds (Appendix A: 300 of 1000 rounds)
                                                                               -> ``recipe``
* aggregation - FedAvg, each parameter weighted by the samples of the clients that trained it
                                                                               -> ``Method.aggregate``
* inference - every exit (the paper's headline: the mean accuracy over exits) and the ensemble
  of the exits' logits (Appendix H)                                            -> ``inference``

The backbone and what of it trains are the config's (``--model minilm --finetune lora``); with a
frozen backbone only Ree, the shared classifier (and adapters) travel.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import HetflError
from ..models import ModelFamily
from ..options import Range, opt
from ..slicing import SubModel
from ..recipes import BestExit
from .base import Method
from .options import MutualKD


@dataclass(frozen=True)
class Options(MutualKD):
    """Best-exit KD (Eq. 5-6, its weight eta = kd_weight and its ramp) and modulation (Eq. 4)."""

    ree_ema: float = opt(0.2, "ReeFL: weight zeta of a new batch in each exit's running training CE, which picks "
                              "the teacher, in (0, 1] (Sec. 3.2)", valid=Range(0, 1, low_open=True))
    modulation: bool = opt(True, "ReeFL: the next block reads Ree's output in place of its class token (Eq. 4)")
    modulate_into: str = opt("summary", "ReeFL: what Ree's output replaces (Eq. 4): the summary token the exits read "
                                        "(on MiniLM the token mean: every real token shifted alike) or the [CLS] "
                                        "position alone", ("summary", "cls"), added_later=True)

    def check(self, cfg) -> None:
        super().check(cfg)
        if self.modulation and cfg.cache_frozen_features:
            raise HetflError("cache_frozen_features keeps what the frozen layers compute, which ReeFL's modulation "
                             "changes: use it with --modulation false, or drop it")


class ReeFL(Method):
    name = "reefl"
    summary = "depth sub-models of a transformer with one shared recurrent early exit (Ree), best-exit KD (ReeFL)"
    scalings = ("depth",)
    Options = Options
    # Appendix A: SGD without momentum or weight decay, lr 0.05 cosine-annealed to 1e-3, eta ramped over 30%, and
    # gradients clipped. The paper clips each value to [-1, 1]; hetfl clips the L2 norm at 1: on MiniLM (R8, frozen,
    # lr 0.05) ReeFL without clipping stays at the majority class (the shared classifier sums every exit's gradient)
    # and a transformer backbone (Sec. 4.1: DeiT on images; here the ViT, on text the pretrained MiniLM)
    defaults = {"model": "vit", "kd_weight": 1.0, "kd_ramp": 0.3, "inference": "ensemble", "momentum": 0.0, "weight_decay": 0.0,
                "lr": 0.05, "lr_schedule": "cosine", "lr_min": 1e-3, "clip_grad": 1.0}

    @classmethod
    def make_family(cls, cfg, input_shape, num_classes) -> ModelFamily:
        """The configured transformer with Ree and the shared classifier on its exit blocks."""
        family = super().make_family(cfg, input_shape, num_classes)
        options = cls.options_of(cfg)
        head = ("ree-cls" if options.modulate_into == "cls" else "ree") if options.modulation else "ree-unmodulated"
        return replace(family, head=head)

    def plan(self, client, budget, round_index) -> SubModel:
        """The blocks up to the deepest exit the client's budget affords, with Ree and the shared classifier."""
        return self.fit(budget)

    def recipe(self, spec: SubModel, round_index: int) -> BestExit:
        """Eq. (5)-(6): CE over the client's exits + eta x KD from its best exit, at this round's eta."""
        return BestExit(kd_weight=self.options.kd_weight_at(round_index, self.cfg.rounds), tau=1.0,
                        ema=self.options.ree_ema)


class ReeFLWithoutKD(ReeFL):
    name = "reefl-nokd"
    summary = "ReeFL without best-exit distillation (eta = 0; the paper's Table 3 ablation)"
    defaults = {**ReeFL.defaults, "kd_weight": 0.0, "kd_ramp": 0.0}
