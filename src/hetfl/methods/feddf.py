"""FedDF (Lin et al., "Ensemble Distillation for Robust Model Fusion in Federated Learning", NeurIPS 2020), on
width prototypes as ScaleFL runs it (ScaleFL Sec. 4.3: "splitting along width dimension to form the local models at
each level").

The algorithm (FedDF Alg. 1, and Alg. 3 for prototypes of different architectures), and where hetfl does each:

1. One model per prototype P: here one per level, full depth at the level's width (``scaling = width``, the
   config's ``widths``), each its own tensors, as ``Decoupled`` keeps them (name group ``level{l}/``).
2. A round: the sampled clients train their level's model locally (plain SGD on CE, as FedAvg).
3. Per prototype, the weighted average of its clients' models, x_P = sum_k n_k x_k / n_P -> ``Method.aggregate``'s
   masked mean over each level's group.
4. Ensemble distillation into every prototype, for up to N steps (``distill_steps``): a batch d of the server's
   unlabeled data, the teacher the average of the logits of *all* the round's client models,
   (1 / |S_t|) sum_{k in S_t} f(x_k, d), of every prototype, and one Adam step on
   KL(softmax(teacher / T) || softmax(f(x_P, d) / T)) T^2 for x_P -> ``aggregate`` (``_distil``). The teachers are
   fixed during the distillation, so their logits on the whole server set are computed once per round
   (``_teacher_logits``), streamed as the updates arrive.
5. Early stopping: FedDF stops a prototype's distillation once its validation performance has not improved for a
   while (10^3 of at most 10^4 steps) and keeps the best model. The server here holds no labels, so the
   criterion is label-free: the same KL to the teacher on a held-out tenth of the server set (``distill_patience``
   steps without a new minimum, checked every ``distill_eval_every`` steps); the best student is kept. The test
   set is never seen.

Choices (the paper's where it gives one):

* The server set (``distill_dataset``, ``distill_size``): ``holdout`` (default), samples of the training set no
  client holds (fewer training samples for FedDF's clients than for the other rows of a table, the price of a
  server set drawn from the same distribution), or another dataset with inputs of the same shape (ScaleFL
  distils CIFAR-10 on CIFAR-100 and back, SST-2 on AgNews): ``data.server``.
* Adam, lr 1e-3 (FedDF Sec. 4), batch 128 (``distill_batch``), temperature T = 1 (``distill_temperature``).
* Distillation budget: at most 500 steps with patience 100, checked every 25 (``distill_steps``,
  ``distill_patience``, ``distill_eval_every``), not the paper's 10^4 / 10^3: the paper's steps at CIFAR scale
  cost more than a round of local training on this machine's CPUs; the options give the paper's values.
* BatchNorm: hetfl's models keep no running statistics (static BN, ``evaluate.static_batchnorm``). A teacher
  normalises with static statistics of the server set (the data the server has); a student trains on batch
  statistics, as clients do; the validation KL runs the student on batch statistics of 500-sample chunks.
* Teacher and student logits are the method's headline prediction (the last exit with ``train_exits = last``,
  FedDF's single-exit models).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..aggregation import ServerState
from ..data.server import HOLDOUT
from ..errors import HetflError
from ..evaluate import STATS_CHUNK, static_batchnorm
from ..models.base import federated_state
from ..options import Range, opt
from ..seeding import torch_generator
from ..slicing import extract
from ..updates import Update
from .decoupled import Decoupled
from .options import NoOptions

ROUND = "feddf/round"  # ServerState.extra: rounds distilled so far (seeds each round's batches; a checkpoint keeps it)


@dataclass(frozen=True)
class Options(NoOptions):
    """FedDF's server-side ensemble distillation."""

    distill_dataset: str = opt(HOLDOUT, "FedDF: the server's unlabeled distillation set: 'holdout' (distill_size "
                                        "training samples no client holds) or a dataset of the same input shape")
    distill_size: int = opt(0, "FedDF: samples in the server's distillation set, a tenth of which validate (0: a "
                               "tenth of the run's training set)", valid=Range(0))
    distill_steps: int = opt(500, "FedDF: at most this many Adam steps of distillation per level per round "
                                  "(the paper: 10^4)", valid=Range(1))
    distill_patience: int = opt(100, "FedDF: stop a level's distillation after this many steps without a lower "
                                     "validation KL (the paper: 10^3)", valid=Range(1))
    distill_eval_every: int = opt(25, "FedDF: steps between two checks of the validation KL", valid=Range(1))
    distill_batch: int = opt(128, "FedDF: server batch size of the distillation", valid=Range(1))
    distill_lr: float = opt(1e-3, "FedDF: Adam learning rate of the distillation", valid=Range(0, low_open=True))
    distill_temperature: float = opt(1.0, "FedDF: temperature T of the distillation's KL",
                                     valid=Range(0, low_open=True))

    def check(self, cfg) -> None:
        if self.distill_eval_every > self.distill_steps:
            raise HetflError(f"distill_eval_every {self.distill_eval_every} is beyond distill_steps "
                             f"{self.distill_steps}; the validation KL would never be checked")


def distillation_kl(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(softmax(teacher / T) || softmax(student / T)) T^2, averaged over the batch (FedDF Alg. 1, line 11)."""
    t = temperature
    return F.kl_div(F.log_softmax(student / t, 1), F.log_softmax(teacher / t, 1), log_target=True,
                    reduction="batchmean") * t * t


class FedDF(Decoupled):
    name = "feddf"
    summary = ("a width model per level, averaged per level, then ensemble distillation of all the round's client "
               "models into each on unlabeled server data (FedDF)")
    defaults = {"scaling": "width", "train_exits": "last"}
    scalings = ("width",)
    Options = Options
    private_refusal = ("its distillation's teacher is every client's own model (their logits on the server data), "
                       "which noise on the averaged sums does not cover")

    @classmethod
    def server_data_wanted(cls, cfg) -> tuple[str, int]:
        options = cls.options_of(cfg)
        return options.distill_dataset, options.distill_size

    def receive_server_data(self, x: torch.Tensor) -> None:
        """Split the server set into distillation inputs and the tenth that validates (early stopping)."""
        n_val = max(1, len(x) // 10)
        self.x_server, self.x_val, self.x_distil = x, x[:n_val], x[n_val:]  # views: the teachers run on x once
        self.last_distillation: dict[int, dict] = {}  # per level: steps taken, validation KL before and after

    def aggregate(self, state: ServerState, updates: Iterable[Update]) -> ServerState:
        """Alg. 1/3: each level's models averaged (step 3), then the ensemble of all of them distilled into each."""
        teachers: list[torch.Tensor] = []  # the teachers' logits on the server set (``_teacher_logits``)

        def seen() -> Iterator[Update]:
            for update in updates:
                teachers.append(self._teacher_logits(state, update))
                yield update

        self.last_distillation = {}
        averaged = super().aggregate(state, seen())
        if not teachers:
            return averaged
        teacher = torch.stack(teachers).mean(0)  # AVGLOGITS over the round's clients, every prototype's
        round_index = int(state.extra.get(ROUND, torch.zeros(())).item()) + 1
        params = dict(averaged.params)
        for level in range(1, self.num_levels + 1):
            params.update(self._distil(params, level, teacher, round_index))
        extra = {**averaged.extra, ROUND: torch.tensor(round_index)}
        return ServerState(params, averaged.opt, extra)

    @torch.no_grad()
    def _teacher_logits(self, state: ServerState, update: Update) -> torch.Tensor:
        """One client model's headline logits on the server set (validation inputs, then distillation ones), with
        static BN statistics of the server set; a client that sent back part of its model has the rest as sent."""
        spec = update.spec
        local = {**extract(state.params, self.models.shapes(spec), spec), **update.state}
        model = self.models.loaded(spec, local)
        x = self.x_server
        with static_batchnorm(model, x):
            logits = torch.cat([self.predict(model(x[i:i + STATS_CHUNK])) for i in range(0, len(x), STATS_CHUNK)])
        return logits

    def _distil(self, params: dict, level: int, teacher: torch.Tensor, round_index: int) -> dict:
        """Level ``level``'s averaged model after distillation (steps 4-5): its tensors under their global names."""
        o, spec, started = self.options, self.level_spec(level), time.perf_counter()
        teach_val, teach_distil = teacher[:len(self.x_val)], teacher[len(self.x_val):]
        model = self.models.loaded(spec, extract(params, self.models.shapes(spec), spec)).train()
        trained = [p for p in model.parameters() if p.requires_grad]
        adam = torch.optim.Adam(trained, lr=o.distill_lr)
        generator = torch_generator(self.cfg.seed, "distill", round_index, level)

        @torch.no_grad()
        def validation_kl() -> float:
            total = 0.0
            for i in range(0, len(self.x_val), STATS_CHUNK):
                x = self.x_val[i:i + STATS_CHUNK]
                total += float(distillation_kl(self.predict(model(x)), teach_val[i:i + STATS_CHUNK],
                                               o.distill_temperature)) * len(x)
            return total / len(self.x_val)

        snapshot = lambda: {n: t.detach().clone() for n, t in federated_state(model).items()}  # noqa: E731
        best, best_kl, best_step = snapshot(), validation_kl(), 0
        first_kl, step = best_kl, 0
        while step < o.distill_steps and step - best_step < o.distill_patience:
            idx = torch.randint(len(self.x_distil), (o.distill_batch,), generator=generator).to(self.x_distil.device)
            loss = distillation_kl(self.predict(model(self.x_distil[idx])), teach_distil[idx], o.distill_temperature)
            adam.zero_grad(set_to_none=True)
            loss.backward()
            adam.step()
            step += 1
            if step % o.distill_eval_every == 0:
                kl = validation_kl()
                if kl < best_kl:
                    best, best_kl, best_step = snapshot(), kl, step
        self.last_distillation[level] = {"steps": step, "best_step": best_step, "val_kl_before": first_kl,
                                         "val_kl_after": best_kl, "seconds": time.perf_counter() - started}
        return {spec.global_name(n): t for n, t in best.items()}

    def server_log(self) -> dict | None:
        """Each level's distillation this round (steps taken, the best one, validation KL before and after, seconds):
        whether early stopping ends it and what it costs beside the clients' training."""
        if not self.last_distillation:
            return None
        return {"distillation": {str(level): d for level, d in self.last_distillation.items()}}

    def eval_specs(self):
        return self.level_eval_specs()
