"""The server strategy: init_state -> configure (plan + task) -> aggregate -> eval_specs (DESIGN.md, "Data flow").

A method is the server side of a round; the client side is ``client.client_update``, a free
function of the task a method emits. The base class implements the FedAvg family on levels: a
level-l client gets ``level_spec(l)``, cut from the global model as the config's ``scaling`` says
(a depth cut, a width ratio, or ScaleFL's 2-D split), trains every exit it holds (sum of CEs) or
only the last one, and the server folds the updates into an element-wise masked mean and applies
the configured server optimizer (FedAvg, FedAdam, FedDyn) to the explicit ``ServerState``.
Subclasses override ``plan`` (and, when needed, ``recipe``, the state layout and ``eval_specs``);
a method that only makes sense for some scalings lists them in ``scalings``. A method declares its
own options as an ``Options`` dataclass (``methods.options``) and the values it sets for generic
options unless the user gives them (``defaults``); it chooses its backbone (``make_family``:
the client builds the same registered family from the task) and its prediction (``predict``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import ClassVar

import torch

from ..aggregation import MaskedMean, ServerState, make_server_optimizer
from ..models.cache import ModelCache, build_model, describe_family
from ..updates import Update
from ..costs import measure, width_memory
from ..devices import Budget, describe_budget, fit_largest, fits, level_budgets, width_budgets
from ..errors import HetflError, warn
from ..losses import ensemble_logits
from ..models import ModelFamily, model_family
from ..models.base import federated_state
from ..options import check_choices, check_ranges, option_fields
from ..privacy.mechanism import PrivateAggregation, settings_of
from ..recipes import ExitsCE, Recipe
from ..slicing import SCALINGS, State, SubModel, extract
from ..splits import Split, split_search
from ..task import Task, TrainOptions
from .options import NoOptions


class Method:
    """Base of every method: FedAvg-family training of level sub-models on masks."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions  # the method's own options (a dataclass of ``opt`` fields)
    defaults: ClassVar[dict] = {}  # option values (generic or its own) this method sets unless the user gives them
    scalings: ClassVar[tuple[str, ...]] = SCALINGS  # how it may cut level sub-models
    # why the method cannot have differential privacy (its server reads more of an update than the noised masked
    # sums: ``privacy``), or None
    private_refusal: ClassVar[str | None] = None

    def __init__(self, cfg, family: ModelFamily, num_levels: int, device: torch.device | str = "cpu"):
        if cfg.scaling not in self.scalings:
            raise HetflError(f"method '{self.name}' cuts its sub-models by {' or '.join(self.scalings)}, not by "
                             f"scaling '{cfg.scaling}'; drop --scaling")
        self.cfg = cfg
        self.options = self.options_of(cfg)
        self.splits: list[Split] | None = None
        if cfg.scaling == "2d" and cfg.exits:
            raise HetflError("2d scaling places the exits after the levels' depth cuts (ScaleFL Alg. 1); drop --exits")
        if cfg.scaling == "2d":  # Eq. (1) per level, then an exit after every level's cut (ScaleFL Alg. 1)
            self.splits = split_search(family.with_exits(tuple(range(family.arch.num_blocks))),
                                       cfg.level_budget_ratios, cfg.level_split_epsilons, cfg.split_cost,
                                       cfg.split_nested)
            cuts = tuple(sorted({s.depth - 1 for s in self.splits}))
            # not an error: a bench gives every method of a table the same exit_every, and ScaleFL choosing its own
            # exits is how ReeFL's comparison runs it (ReeFL Sec. 4.1: "apart from ScaleFL which selects where to
            # place the exits")
            if cfg.exit_every and family.arch.exit_after != cuts:
                warn(f"2d scaling places the exits after the levels' depth cuts (ScaleFL Alg. 1), here after blocks "
                     f"{[c + 1 for c in cuts]}; --exit-every {cfg.exit_every} (after blocks "
                     f"{[e + 1 for e in family.arch.exit_after]}) is not used")
            family = family.with_exits(cuts)
        self.family = family
        self.num_levels = num_levels
        self.device = torch.device(device)
        self.level_budgets: list[Budget] | None = None  # physical budgets per level, or None: levels are indices
        self.cost = lambda spec: measure(self.family, spec, batch_size=cfg.batch_size)  # noqa: E731
        self._level_table: list[SubModel] | None = None
        self._fitted: dict[Budget, SubModel] = {}
        choices = len(self.candidates())
        if cfg.budget == "level" and num_levels > choices:  # physical budgets may share a sub-model
            raise HetflError(f"levels {num_levels} is beyond the depth of model '{family.name}' ({choices} sub-models "
                             f"for method '{self.name}' with {cfg.scaling} scaling); use at most {choices} levels")
        self.models = ModelCache(family, device, scaler=cfg.scaler)
        self.privacy = self._privacy(cfg)
        self.noise = None  # while a private aggregation runs: what perturbs each masked sum (``perturb``)
        self.family_spec = describe_family(family)  # what a task tells the client to build
        self.server = make_server_optimizer(
            cfg.server_opt, lr=cfg.server_lr, beta1=cfg.adam_beta1, beta2=cfg.adam_beta2,
            tau=cfg.adam_tau, feddyn_alpha=cfg.feddyn_alpha, num_clients=self.federation_size())
        self.train_options = TrainOptions(
            epochs=cfg.local_epochs, batch_size=cfg.batch_size, momentum=cfg.momentum,
            weight_decay=cfg.weight_decay, clip_grad=cfg.clip_grad, clip_value=cfg.clip_value,
            crop_padding=cfg.crop_padding, flip=cfg.flip, prox_mu=cfg.prox_mu,
            feddyn_alpha=cfg.feddyn_alpha if cfg.server_opt == "feddyn" else 0.0)

    def _privacy(self, cfg) -> PrivateAggregation | None:
        """DP-FedAvg's server side when ``cfg`` asks for differential privacy (``privacy``), else None."""
        if not cfg.private:
            return None
        if self.private_refusal:
            raise HetflError(f"method '{self.name}' cannot run with differential privacy: {self.private_refusal}; "
                             "drop the --dp-* options")
        return PrivateAggregation(settings_of(cfg), cfg.seed)

    @classmethod
    def options_of(cls, cfg):
        """The method's own options in ``cfg`` (its defaults where not given), checked against ``cfg``.

        An option added later that ``cfg`` does not hold is at its field's default, not the method's: a resolved
        config records such an option only when it differs from the field's default (``options.recorded``), so its
        absence means that default, in a config resolved now as in one recorded before the option existed.
        """
        own = option_fields(cls.Options)
        foreign = sorted(set(cfg.method_options) - set(own))
        if foreign:
            raise HetflError(f"option '{foreign[0]}' is not an option of method '{cls.name}'; drop it")
        defaults = {k: v for k, v in cls.defaults.items() if k in own and not own[k].metadata.get("added_later")}
        options = cls.Options(**{**defaults, **cfg.method_options})
        check_choices(options)
        check_ranges(options)
        options.check(cfg)
        return options

    @classmethod
    def make_family(cls, cfg, input_shape: tuple[int, ...], num_classes: int) -> ModelFamily:
        """The backbone this method trains for ``cfg`` (a registered family, so a client builds the same), with the
        exits ``cfg.exits`` asks for (default the backbone's), or an exit after every ``exit_every``-th block."""
        family = model_family(cfg.model, tuple(input_shape), num_classes, cfg.model_width, cfg.norm,
                              tuple(cfg.exits) or None, finetune=cfg.finetune, adapter_rank=cfg.adapter_rank)
        if not cfg.exit_every:
            return family
        blocks = family.arch.num_blocks
        return family.with_exits(tuple(range(blocks - 1, -1, -cfg.exit_every))[::-1])

    @property
    def inference(self) -> str:
        """The headline prediction: "last" exit or "ensemble" of exits (config ``inference``, a method default)."""
        return self.cfg.inference

    def predict(self, logits: list[torch.Tensor]) -> torch.Tensor:
        """The headline scores of a model from its exits' logits: the last exit's, or their ensemble."""
        return ensemble_logits(logits) if self.inference == "ensemble" else logits[-1]

    # ---- levels and budgets ------------------------------------------------------------------
    def candidates(self) -> list[SubModel]:
        """The sub-models this method can hand out, smallest first (config ``scaling``): a depth cut at
        every exit, the full depth at every level width, or every level's 2-D split."""
        if self.cfg.scaling == "width":
            return [self.spec(self.family.arch.num_blocks, width=w) for w in self.cfg.level_widths]
        if self.cfg.scaling == "2d":
            return [self.spec(s.depth, width=s.s_w) for s in self.splits]
        return [self.spec(b + 1) for b in self.family.arch.exit_after]

    def use_budgets(self, level_budgets: list[Budget], cost) -> None:
        """Fit sub-models to physical budgets (one per level) with ``cost(spec)`` instead of level indices."""
        self.level_budgets, self.cost = level_budgets, cost
        self._level_table, self._fitted = None, {}

    def fit_budgets(self, who=None) -> None:
        """Level l's budget = ratio_l x the full model's measured cost, or with ``width-memory`` the measured training
        memory of the full-depth backbone at width ratio_l (config ``budget``); every level must fit.

        ``who(level)`` names the devices of a level in the error (default "level l").
        """
        ratios = self.cfg.level_budget_ratios
        if self.cfg.budget == "width-memory":
            budgets = width_budgets(ratios, lambda r: width_memory(self.family, r, self.cfg.batch_size))
        else:
            budgets = level_budgets(self.cfg.budget, ratios, self.cost(self.candidates()[-1]))
        self.use_budgets(budgets, self.cost)
        for level in range(1, self.num_levels + 1):
            try:
                self.level_spec(level)
            except HetflError as e:
                raise HetflError(f"{who(level) if who else f'level {level}'}: {e}") from None

    def level_spec(self, level: int) -> SubModel:
        """The sub-model a level-``level`` device trains.

        With level indices: candidate ceil(level / L * candidates), the largest at level L (for the
        CNN's depth cuts: ceil(level / L * blocks) blocks). With physical budgets: the largest
        candidate whose measured cost fits the level's budget (DESIGN "Budgets are physical").
        """
        if self._level_table is None:
            candidates = self.candidates()
            if self.level_budgets is None:
                self._level_table = [candidates[math.ceil(l * len(candidates) / self.num_levels) - 1]
                                     for l in range(1, self.num_levels + 1)]
            else:
                self._level_table = [self.fit(b) for b in self.level_budgets]
        return self._level_table[level - 1]

    def fit(self, budget: Budget) -> SubModel:
        """The sub-model a device with ``budget`` trains this round: the largest candidate within its physical
        limits (training memory, MACs per sample) when it has any, else its level's (``level_spec``)."""
        if budget.memory_bytes is None and budget.macs_per_sample is None:
            return self.level_spec(budget.level)
        if budget not in self._fitted:
            self._fitted[budget] = fit_largest(self.candidates(), budget, self.cost)
        return self._fitted[budget]

    def level_for(self, budget: Budget) -> int:
        """The highest level whose sub-model fits ``budget``'s physical limits (its own level when it has none):
        what a device that states its budget in bytes or MACs counts as for methods that keep a model per level."""
        if budget.memory_bytes is None and budget.macs_per_sample is None:
            return budget.level
        fitting = [l for l in range(1, self.num_levels + 1) if fits(self.cost(self.level_spec(l)), budget)]
        if not fitting:
            raise HetflError(f"a budget of {describe_budget(budget)} is smaller than the smallest level's sub-model")
        return fitting[-1]

    def depth_for_level(self, level: int) -> int:
        """Blocks a level-``level`` device trains."""
        return self.level_spec(level).depth

    def spec(self, depth: int, **extras) -> SubModel:
        """A depth-``depth`` sub-model holding every exit, or only its last one with ``train_exits=last``."""
        exits = (self.family.exits_at_depth(depth),) if self.cfg.train_exits == "last" else None
        return SubModel(depth=depth, exits=exits, chunks=self.family.chunks, **extras)  # chunks: dense layers' inputs

    def full_spec(self) -> SubModel:
        """The whole global model."""
        return self.spec(self.family.arch.num_blocks)

    # ---- server side ----------------------------------------------------------------------
    @classmethod
    def server_data_wanted(cls, cfg) -> tuple[str, int] | None:
        """The unlabeled data the server keeps (``data.server``): (source, size), or None (most methods)."""
        return None

    def receive_server_data(self, x: torch.Tensor) -> None:
        """Take the server's unlabeled inputs (a method whose ``server_data_wanted`` names some)."""
        raise NotImplementedError(f"method '{self.name}' keeps no server data")

    def federation_size(self) -> int:
        """N of FedDyn's server update: the clients that can ever take part (all of them by default)."""
        return self.cfg.num_clients

    @property
    def stateful_clients(self) -> bool:
        """Whether clients keep persistent state between rounds (FedDyn's g_k)."""
        return self.cfg.server_opt == "feddyn"

    def init_state(self, seed: int) -> ServerState:
        """The initial server state: the full model with every exit, seeded; no optimizer state yet."""
        return ServerState(self.initial_params(SubModel(depth=self.family.arch.num_blocks), seed))

    def initial_params(self, spec: SubModel, seed: int) -> State:
        """Freshly initialised tensors of ``spec``'s model (seeded), under their global names."""
        model = build_model(self.family, spec, seed)
        return {spec.global_name(n): t.detach().to(self.device) for n, t in federated_state(model).items()}

    def plan(self, client: int, budget: Budget, round_index: int) -> SubModel | None:
        """The sub-model ``client`` trains this round, or None if it sits the round out."""
        raise NotImplementedError

    def aggregate_weight(self, update: Update) -> float:
        """Weight of an update in the masked mean: its sample count, or 1 (uniform; FedDyn)."""
        if self.cfg.server_opt == "feddyn" or self.cfg.aggregation_weights == "uniform":
            return 1.0
        return float(update.num_samples)

    def configure(self, state: ServerState, client: int, budget: Budget, round_index: int
                  ) -> tuple[Task, State] | None:
        """The task and local tensors of ``client`` this round, or None if it sits the round out."""
        spec = self.plan(client, budget, round_index)
        if spec is None:
            return None
        return self.task(state, spec, client, round_index), extract(state.params, self.models.shapes(spec), spec)

    def task(self, state: ServerState, spec: SubModel, client: int, round_index: int) -> Task:
        """The task of training ``spec`` at ``client`` this round: the recipe, with FedDyn the global shapes of the
        client's state tensors, and with differential privacy the norm the client clips its update to."""
        state_shapes = None
        if self.cfg.server_opt == "feddyn":
            keys = [spec.global_name(n) for n in self.models.shapes(spec)]
            state_shapes = {k: tuple(state.params[k].shape) for k in keys}
        return Task(spec=spec, family=self.family_spec, loss=self.recipe(spec, round_index),
                    train=self.train_options, lr=self.cfg.lr_at(round_index), round=round_index, client=client,
                    seed=self.cfg.seed, scaler=self.cfg.scaler, state_shapes=state_shapes,
                    dp_clip=self.privacy.clip_of(state) if self.privacy else 0.0)

    def recipe(self, spec: SubModel, round_index: int) -> Recipe:
        """The local loss of ``spec``'s model: the sum of CEs over the exits it holds (all of its depth, or
        only the last one with ``train_exits=last``)."""
        return ExitsCE()

    def aggregate(self, state: ServerState, updates: Iterable[Update]) -> ServerState:
        """Fold updates into a masked mean as they arrive, then take a server-optimizer step."""
        agg = MaskedMean(state.params)
        for update in updates:
            agg.add(update.state, self.aggregate_weight(update), update.spec,
                    None if self.privacy else self.held_rows(update))  # with DP every held row counts (``privacy``)
        return self.aggregate_mean(state, agg)

    def aggregate_mean(self, state: ServerState, agg: MaskedMean) -> ServerState:
        """The server-optimizer step on a masked mean (its sums noised first under differential privacy); ``state``
        itself when no update was folded in. Secure aggregation hands the server this mean alone
        (``MaskedMean.from_sums``), so only methods whose ``aggregate`` is this one can have it."""
        if agg.num_updates == 0:
            return state
        self.perturb(agg)
        return self.server.step(state, agg)

    @property
    def secure_refusal(self) -> str | None:
        """Why secure aggregation, which gives the server only the sums of a round's updates (``aggregate_mean``),
        cannot serve this method, or None."""
        if type(self).aggregate is not Method.aggregate:
            return "its server reads each update, not only their masked sums"
        if self.cfg.server_opt != "feddyn" and self.cfg.aggregation_weights != "uniform":
            return "it weights updates by their sample counts; add --aggregation-weights uniform"
        return None

    def perturb(self, agg: MaskedMean, levels: bool = True) -> None:
        """Returns None; adds differential privacy's noise to ``agg``'s sums, before they are divided by the counts,
        while a private aggregation runs (``privacy.mechanism.PrivateAggregation``; ``levels``: its sums are of the
        global names, so each evaluated model's noise after division is recorded)."""
        if self.noise is not None:
            self.noise(agg, levels)

    def held_rows(self, update: Update) -> dict[str, torch.Tensor] | None:
        """The rows of some of ``update``'s tensors that alone count in the masked mean (``MaskedMean.add``), or None:
        every element it holds counts (every method but those that mask labels)."""
        return None

    def server_log(self) -> dict | None:
        """What the last ``aggregate`` did beyond averaging, as plain values for the round's log (``RoundLog.server``;
        FedDF: each level's distillation); None for methods whose server only averages."""
        return None

    def eval_specs(self) -> dict[str, SubModel]:
        """Sub-models to evaluate, by label; "global" is the headline model."""
        return {"global": self.full_spec()}

    def budget_report(self) -> dict | None:
        """What each level's budget buys beyond its sub-model's costs (``hetfl costs --method``): {title: {"header":
        [...], "rows": [[...]]}} as plain values; None for methods whose levels are just their sub-models."""
        return None

    def level_eval_specs(self) -> dict[str, SubModel]:
        """The largest level's model as "global", and every smaller level's model as "level{l}"."""
        specs = {"global": self.level_spec(self.num_levels)}
        specs.update({f"level{l}": self.level_spec(l) for l in range(1, self.num_levels)})
        return specs
