"""DepthFL (Kim et al., ICLR 2023): depth-scaled local models, mutual self-distillation, FedDyn.

Algorithm 1 as hetfl runs it:

* Sec. 3.1 - a client of capability d_k trains W_g[:d_k]: the first d_k blocks and their d_k
  exit classifiers ("bottleneck layers")                                   -> ``plan``
* Eq. (1) - local objective: sum_i CE_i + 1/(d_k - 1) sum_i sum_{j!=i} KL(p_j || p_i), teachers
  detached, T = 1; the weight ramps up over the first ``kd_ramp`` = 30% of the rounds (the
  authors' code: a 300-round consistency ramp over 1000 rounds, scaled to the run)  -> ``recipe``
* Eq. (2), (3) - FedDyn penalty with grad L_k(theta_k) kept in global shape; only its [:d_k]
  slice is used and updated                                                -> ``client.client_update``
* server - h and theta per element, averaged over the clients that hold it
  (|P_t^{d_k >= d_i}| of Alg. 1), uniform weights                         -> ``FedDynServer``
* inference - the ensemble of all classifiers (Sec. 4)                     -> ``inference``

Under memory budgets where a client affords not even the first block and its exit (FeDepth's
budgets on PreResNet-20 with an exit after every block, its footnote 2), ``sit_out`` leaves such a
client out of training rather than stopping the run.

"DepthFL (FedAvg)" (Table 2, Table 3) is the same without FedDyn and without self-distillation.

The paper is silent on BatchNorm; hetfl's backbones normalise with batch statistics in training
(no running buffers, as ScaleFL's and HeteroFL's code do) and every method is evaluated with static
statistics of the training data (``evaluate.static_batchnorm``), never with test-batch statistics.
The paper's hyper-parameters (Table 13: SGD lr 0.1 x 0.998^t, no momentum, weight decay 1e-3, B = 64,
E = 5, alpha = 0.1) are the preset ``depthfl-paper``; the CPU benches use fewer local steps.
"""

from dataclasses import dataclass

from ..devices import Budget
from ..errors import HetflError
from ..options import opt
from ..slicing import SubModel
from ..recipes import ExitsCE
from .base import Method
from .options import MutualKD


@dataclass(frozen=True)
class Options(MutualKD):
    """Eq. (1)'s mutual KD, and what a client whose budget affords no depth does."""

    sit_out: bool = opt(False, "DepthFL: a client whose budget affords no depth sits out its rounds instead of "
                        "stopping the run (FeDepth's DepthFL under memory budgets, its footnote 2)", added_later=True)


class DepthFL(Method):
    name = "depthfl"
    summary = "depth-scaled sub-models with an exit per block, mutual self-distillation and FedDyn"
    scalings = ("depth",)
    Options = Options
    # Alg. 1 averages every block uniformly over the clients holding it (1/|P_t^{d_k >= d_i}|)
    defaults = {"server_opt": "feddyn", "kd_weight": 1.0, "kd_ramp": 0.3, "inference": "ensemble",
                "aggregation_weights": "uniform"}

    def plan(self, client, budget, round_index) -> SubModel | None:
        """The first d_k blocks and their exits, d_k the deepest cut the client's budget affords this round."""
        return self.fit(budget)

    def fit(self, budget: Budget) -> SubModel | None:
        """The deepest cut within ``budget``; with ``sit_out``, None (the client sits out) where none fits."""
        try:
            return super().fit(budget)
        except HetflError:
            if self.options.sit_out:
                return None
            raise

    def recipe(self, spec: SubModel, round_index: int) -> ExitsCE:
        """Eq. (1): the CEs of the client's exits + the mutual KD among them, at this round's weight."""
        return ExitsCE(kd_weight=self.options.kd_weight_at(round_index, self.cfg.rounds))


class DepthFLFedAvg(DepthFL):
    name = "depthfl-fedavg"
    summary = "DepthFL without FedDyn and without self-distillation (DepthFL Table 2's 'DepthFL (FedAvg)')"
    defaults = {**DepthFL.defaults, "server_opt": "fedavg", "kd_weight": 0.0, "kd_ramp": 0.0}
