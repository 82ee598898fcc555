"""The generic experiment configuration: one dataclass, validated once, from a TOML file and/or flags.

Every field is a CLI flag (``--num-clients 100``) and a TOML key (``num_clients = 100``); flags
override the file. A method's own options (DepthFL's KD weight, InclusiveFL's beta, ...) are
declared by the method (``methods.*.Options``) and ride along in ``method_options``; they are
flags and keys like the generic ones, and ``methods.config_from`` resolves a file or flags against
the method they name. This module knows nothing of the methods. Validation names the bad field and
what is allowed, and runs before anything is created on disk.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from .aggregation import SERVER_OPTIMIZERS
from .data.partition import SCHEMES
from .data.text import is_text
from .devices import BUDGET_UNITS, SCENARIOS
from .errors import HetflError, read_text_file
from .evaluate import INFERENCES
from .models import FINETUNE_MODES, MODEL_NAMES, NORMS
from .options import Range, check_choices, check_ranges, coerce, opt, option_fields, recorded
from .rundir import check_location
from .slicing import SCALINGS, TRAIN_EXITS

LR_SCHEDULES = ("constant", "step", "cosine", "exponential")
# how the simulator trains a round's clients (executors): auto = batched on CUDA, sequential elsewhere
EXECUTORS = ("auto", "sequential", "batched")


@dataclass
class Config:
    """Everything that defines one experiment."""

    # what to run
    method: str = opt("alllarge", "method to run (see `hetfl methods`)")
    seed: int = opt(0, "seed of every random choice (data split, levels, sampling, init, batches)",
                    valid=Range(0, 2 ** 32 - 1))
    # data
    dataset: str = opt("fmnist", "fmnist, digits, mnist, emnist, cifar10, cifar100, 20ng, r8, text:DIR (text), "
                       "npz:PATH or idx:DIR")
    data_dir: str = opt("", "folder holding the dataset files (default: the usual places, see docs/data.md)")
    num_clients: int = opt(100, "number of clients", valid=Range(1, 10 ** 6))
    partition: str = opt("iid", "how samples are split over clients",
                         SCHEMES)
    alpha: float = opt(0.5, "Dirichlet concentration (smaller = more skewed)", valid=Range(0, low_open=True))
    classes_per_client: int = opt(2, "classes per client for the pathological partition", valid=Range(1))
    min_client_size: int = opt(10, "minimum samples per client for dirichlet-unequal", valid=Range(0))
    client_test_fraction: float = opt(0.0, "fraction of each client's samples held out as its local test set",
                                      valid=Range(0, 1, high_open=True))
    crop_padding: int = opt(0, "random-crop padding in pixels (0 = no crop)", valid=Range(0))
    flip: bool = opt(False, "random horizontal flips")
    max_length: int = opt(128, "text datasets: tokens per document after the pretrained tokenizer (truncated, padded)",
                          added_later=True, valid=Range(2, 512))
    # model
    model: str = opt("cnn", "backbone family", MODEL_NAMES)
    finetune: str = opt("full", "what of a pretrained backbone (minilm) trains: all of it, nothing (frozen), LoRA, "
                        "parallel or serial adapters, or SSF scale-and-shift; exits always train", FINETUNE_MODES,
                        added_later=True)
    adapter_rank: int = opt(32, "rank of LoRA (alpha = 2 x rank) and of the adapters' bottleneck", added_later=True,
                            valid=Range(1, 4096))
    cache_frozen_features: bool = opt(False, "with --finetune frozen: compute each document's exit summaries once "
                                      "and read them back instead of running the frozen layers (a large speed-up; "
                                      "equal up to float rounding)", added_later=True)
    exit_every: int = opt(0, "an exit after every k-th block, the last block included (0 = the model's default)",
                          added_later=True, valid=Range(0))
    model_width: float = opt(1.0, "width multiplier of the global model (1 = 64/128/256/512 channels)",
                             valid=Range(0, low_open=True))
    norm: str = opt("bn", "normalisation layers: bn (batch statistics) or none", NORMS)
    exits: list[int] = opt([], "0-based blocks an exit classifier reads, the last block included (default: the "
                           "backbone's: every block of the CNN and the ViT, every stage of the ResNets)",
                           added_later=True)
    # devices
    scenario: str = opt("fixed", "how device levels are drawn each round", SCENARIOS)
    scaling: str = opt("depth", "how a level's sub-model is cut from the global model: depth (its first blocks), "
                       "width (the leading channels of every layer) or 2d (ScaleFL's Eq. (1) split at the level's "
                       "budget ratio)", SCALINGS)
    budget: str = opt("level", "what a level means: an index, or a budget of training memory or MACs per sample "
                      "= budget_ratios[l] x the full model's, or (width-memory) the measured training memory of the "
                      "full-depth model at width budget_ratios[l] (FeDepth's budgets)", BUDGET_UNITS)
    budget_ratios: list[float] = opt([], "budget of each level as a fraction of the full model's cost (width-memory: "
                                     "a width ratio, may exceed 1), increasing (default l/levels; 2d scaling: "
                                     "2^(l - levels), ScaleFL's 12.5/25/50/100%)", valid=Range(0, low_open=True))
    levels: int = opt(4, "number of device levels", valid=Range(1, 64))
    proportions: list[float] = opt([], "share of clients per level, smallest level first (default equal), e.g. 1,2,7",
                                   valid=Range(0))
    widths: list[float] = opt([], "width-scaling methods: width ratio per level, smallest first (default l/levels)",
                              valid=Range(0, 1, low_open=True))
    scaler: bool = opt(False, "HeteroFL's Scaler: divide activations by the width ratio in training")
    static_bn_samples: int = opt(10000, "BatchNorm models are evaluated with static statistics (HeteroFL's sBN) of "
                                 "a seeded subset of this many training samples (0 = all of them)", valid=Range(0))
    # federated rounds
    rounds: int = opt(30, "communication rounds", valid=Range(1))
    client_fraction: float = opt(0.1, "fraction of clients sampled per round", valid=Range(0, 1, low_open=True))
    local_epochs: int = opt(1, "local epochs per round", valid=Range(1, 10 ** 4))
    batch_size: int = opt(32, "local batch size", valid=Range(1))
    lr: float = opt(0.05, "client learning rate", valid=Range(0, low_open=True))
    lr_schedule: str = opt("constant", "learning-rate schedule over rounds", LR_SCHEDULES)
    lr_steps: list[int] = opt([], "step schedule: rounds at which lr is multiplied by lr_gamma", valid=Range(1))
    lr_gamma: float = opt(0.1, "step: factor per step; exponential: factor per round", valid=Range(0, low_open=True))
    lr_min: float = opt(0.0, "cosine: final learning rate", valid=Range(0))
    momentum: float = opt(0.9, "client SGD momentum", valid=Range(0, 1, high_open=True))
    weight_decay: float = opt(5e-4, "client weight decay", valid=Range(0))
    clip_grad: float = opt(0.0, "max gradient L2 norm (0 = no clipping)", valid=Range(0))
    clip_value: float = opt(0.0, "clip every gradient element to [-v, v] (0 = no clipping; ReeFL's Appendix A "
                                 "clips at 1)", added_later=True, valid=Range(0))
    train_exits: str = opt("all", "exits that get a loss: every exit of the sub-model, or the last", TRAIN_EXITS)
    inference: str = opt("last", "headline prediction: the last exit, or the ensemble (mean of the exits' logits)",
                         INFERENCES)
    prox_mu: float = opt(0.0, "FedProx proximal weight mu (0 = off)", valid=Range(0))
    split_epsilon: list[float] = opt([0.1], "2d scaling: cost tolerance epsilon_l of the split search, Eq. (1); "
                                     "one value for every level or one per level", valid=Range(0, low_open=True))
    split_nested: bool = opt(True, "2d scaling: keep the level splits nested (each at least as deep and as wide as "
                             "the one before); false: Eq. (1)'s unconstrained argmin per level", added_later=True)
    split_cost: str = opt("macs", "2d scaling: the cost the split search matches: MACs per sample, or params "
                          "(ScaleFL's Table 1 ratios; too lopsided on the CNN, whose last block holds 3/4 of them)",
                          ("macs", "params"))
    # server
    server_opt: str = opt("fedavg", "server optimizer", SERVER_OPTIMIZERS)
    server_lr: float = opt(0.0, "server learning rate; 0 = the optimizer's usual one: FedAvg 1 (plain averaging), "
                           "FedAdam eta = 1e-2 (Reddi et al. 2021)", valid=Range(0))
    adam_beta1: float = opt(0.9, "FedAdam beta1", valid=Range(0, 1, high_open=True))
    adam_beta2: float = opt(0.99, "FedAdam beta2", valid=Range(0, 1, high_open=True))
    adam_tau: float = opt(1e-3, "FedAdam adaptivity tau", valid=Range(0, low_open=True))
    feddyn_alpha: float = opt(0.1, "FedDyn alpha", valid=Range(0, low_open=True))
    aggregation_weights: str = opt("samples", "weights of the masked mean", ("samples", "uniform"))
    # client-level differential privacy (DP-FedAvg; hetfl.privacy, docs/privacy.md)
    dp_noise_multiplier: float = opt(0.0, "differential privacy: std of the Gaussian noise on every coordinate of the "
                                     "masked sums, in units of the clip norm (0 = no DP unless dp_target_epsilon)",
                                     added_later=True, valid=Range(0))
    dp_target_epsilon: float = opt(0.0, "differential privacy: the epsilon the run may spend over its rounds; the "
                                   "noise multiplier is calibrated to it (0 = not given)", added_later=True,
                                   valid=Range(0))
    dp_delta: float = opt(0.0, "differential privacy: delta (0 = num_clients^-1.1, below 1 / num_clients)",
                          added_later=True, valid=Range(0, 1, high_open=True))
    dp_clip: float = opt(1.0, "differential privacy: the L2 norm each client clips its update to (with "
                         "dp_clip_quantile: the first round's)", added_later=True, valid=Range(0, low_open=True))
    dp_clip_quantile: float = opt(0.0, "differential privacy: adaptive clipping's target quantile of the update norms "
                                  "(Andrew et al. 2021; 0.5 = the median; 0 = fixed clipping at dp_clip)",
                                  added_later=True, valid=Range(0, 1, high_open=True))
    dp_clip_lr: float = opt(0.2, "differential privacy: adaptive clipping's geometric step eta", added_later=True,
                            valid=Range(0, low_open=True))
    dp_clip_count_noise: float = opt(0.0, "differential privacy: adaptive clipping's noise std on the count of "
                                     "updates within the clip (0 = clients per round / 20)", added_later=True,
                                     valid=Range(0))
    # faults (simulator) and deadlines (Flower)
    dropout_fraction: float = opt(0.0, "simulator: fraction of the sampled clients that drop out each round (seeded; "
                                  "they send nothing and are recorded as missing)", added_later=True, valid=Range(0, 1))
    corrupt_fraction: float = opt(0.0, "simulator: fraction of the sampled clients that send a corrupted update each "
                                  "round (NaN or inf values, a wrong shape or dtype, an unassigned sub-model or a "
                                  "sample count of 0; seeded), which the server rejects", added_later=True,
                                  valid=Range(0, 1))
    round_timeout: float = opt(600.0, "Flower: seconds the server waits for a round's replies (and, at the start, for "
                               "the nodes to say who they are); a client that has not replied by then is missing",
                               added_later=True, valid=Range(0, 7 * 24 * 3600, low_open=True))
    # evaluation and bookkeeping
    eval_every: int = opt(1, "evaluate every N rounds (and always after the last)", valid=Range(1))
    eval_batch_size: int = opt(1000, "evaluation batch size", valid=Range(1))
    target_accuracy: float = opt(0.0, "report the first round whose headline accuracy reaches this (0 = none)",
                                 valid=Range(0, 1))
    checkpoint_every: int = opt(5, "checkpoint every N rounds (and always after the first and the last)",
                                valid=Range(1))
    checkpoint_seconds: float = opt(300.0, "also checkpoint after a round once this many seconds passed since the "
                                    "last checkpoint, so a kill loses at most that much work (0 = by rounds only)",
                                    valid=Range(0))
    device: str = opt("cpu", "torch device: cpu, cuda, cuda:1, ...")
    executor: str = opt("auto", "how the simulator trains a round's clients: one after another (sequential), or "
                        "those that share a sub-model and a step schedule stacked under torch.func.vmap (batched; "
                        "for accelerators); auto: batched on CUDA, sequential elsewhere", EXECUTORS, added_later=True)
    out: str = opt("runs", "folder where run folders are created")
    name: str = opt("", "run folder name (default: method-dataset-seed-timestamp)")
    # the method's own options, by name (declared and validated by the method: ``methods.config_from``)
    method_options: dict[str, Any] = field(default_factory=dict, metadata={"help": None})

    # ---- construction --------------------------------------------------------------------
    @classmethod
    def field_names(cls) -> list[str]:
        """Names of the generic options, in declaration order."""
        return [name for name, f in option_fields(cls).items() if f.metadata.get("help")]

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config", options: type | None = None) -> Config:
        """A config of ``values``: generic options, and the fields of the method's ``options`` dataclass
        (converted to their types; the method checks their values). Unknown keys and wrong types are errors."""
        fields = {name: option_fields(cls)[name] for name in cls.field_names()}
        own = option_fields(options) if options is not None else {}
        kwargs, method_options = {}, {}
        for key, value in values.items():
            if key in fields:
                kwargs[key] = coerce(key, value, fields[key].type, source)
            elif key in own:
                method_options[key] = coerce(key, value, own[key].type, source)
            else:
                raise HetflError(f"{source}: option '{key}' is unknown; see `hetfl run --help` for the options")
        return cls(**kwargs, method_options=method_options)

    @staticmethod
    def read(path: str | Path) -> dict[str, Any]:
        """The option values of a TOML file (or of the JSON a run folder holds)."""
        path = Path(path)
        kind = "JSON" if path.suffix == ".json" else "TOML"
        text = read_text_file(path, f"config file {path}")
        try:
            values = json.loads(text) if kind == "JSON" else tomllib.loads(text)
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
            raise HetflError(f"config file {path} is not valid {kind}: {e}") from None
        if not isinstance(values, dict):
            raise HetflError(f"config file {path} must hold a {kind} object of options, got {type(values).__name__}")
        return values

    def to_dict(self) -> dict[str, Any]:
        """Every option as plain values, the method's own ones beside the generic ones (one flat mapping); an
        option added later only when it is set (``options.recorded``)."""
        values = dataclasses.asdict(self)
        own = values.pop("method_options")
        return {**recorded(values, Config), **own}

    def replace(self, **changes) -> Config:
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)

    # ---- validation ----------------------------------------------------------------------
    def check_values(self) -> Config:
        """Self, after checking each option on its own (its choices, its type's and its range's limits)."""
        check_choices(self)
        check_ranges(self)
        return self

    def run_folder_name(self, when: datetime | None = None) -> str:
        """The run folder's name: ``name``, else METHOD-DATASET-sSEED-TIMESTAMP (``when``; None: a stand-in of the
        same length, for checks made before the run starts)."""
        if self.name:
            return self.name
        stamp = (when or datetime(2000, 1, 1)).strftime("%Y%m%d-%H%M%S-%f")
        return f"{self.method}-{self.dataset.replace(':', '_').replace('/', '_')}-s{self.seed}-{stamp}"

    def validate(self) -> Config:
        """Self, after checking every field and how they combine for a run; raises HetflError naming the first bad
        one."""
        self.check_values()
        if self.cache_frozen_features and self.finetune != "frozen":
            raise HetflError(f"cache_frozen_features needs finetune = frozen (layers that train change the summaries "
                             f"it would keep), got finetune = {self.finetune}; drop it")
        check_location(self.out, self.run_folder_name())  # before anything is loaded or created
        if is_text(self.dataset) and (self.crop_padding or self.flip):  # known from the name: before any file is read
            raise HetflError(f"crop_padding and flip augment images; {self.dataset} is text: drop them")
        self._check_privacy()
        if self.proportions and len(self.proportions) != self.levels:
            raise HetflError(f"proportions has {len(self.proportions)} entries but levels is {self.levels}; "
                             "give one share per level")
        if len(self.split_epsilon) not in (1, self.levels):
            raise HetflError(f"split_epsilon must be > 0, one value or one per level ({self.levels}), "
                             f"got {self.split_epsilon}")
        if self.budget_ratios:
            if len(self.budget_ratios) != self.levels:
                raise HetflError(f"budget_ratios has {len(self.budget_ratios)} entries but levels is {self.levels}; "
                                 "give one ratio per level")
            if any(b <= a for a, b in zip(self.budget_ratios, self.budget_ratios[1:])):
                raise HetflError(f"budget_ratios must increase from the smallest level to the largest, "
                                 f"got {self.budget_ratios}")
            if self.scaling == "2d" and self.budget_ratios[-1] != 1:
                raise HetflError(f"with 2d scaling the largest level is the full model: the last budget ratio must "
                                 f"be 1, got {self.budget_ratios}")
        if self.widths:
            if len(self.widths) != self.levels:
                raise HetflError(f"widths has {len(self.widths)} entries but levels is {self.levels}; "
                                 "give one width per level")
            if any(b <= a for a, b in zip(self.widths, self.widths[1:])):
                raise HetflError(f"widths must increase from the smallest level to the largest, got {self.widths}")
        return self

    def _check_privacy(self) -> None:
        """Returns None; HetflError where the differential-privacy options contradict each other or are given
        without differential privacy."""
        if self.dp_noise_multiplier and self.dp_target_epsilon:
            raise HetflError(f"give dp_noise_multiplier ({self.dp_noise_multiplier:g}) or dp_target_epsilon "
                             f"({self.dp_target_epsilon:g}), not both: the target calibrates the multiplier")
        if not (self.dp_noise_multiplier or self.dp_target_epsilon):
            fields = option_fields(Config)
            given = [name for name in fields if name.startswith("dp_") and getattr(self, name) != fields[name].default]
            if given:
                raise HetflError(f"{given[0]} is an option of differential privacy, which is off; give "
                                 "dp_noise_multiplier or dp_target_epsilon, or drop it")
        elif self.aggregation_weights != "uniform":
            raise HetflError("differential privacy averages with uniform weights (sample-count weights would make a "
                             "client's share of the sums depend on its private sample count); drop "
                             "aggregation_weights = samples")

    @property
    def private(self) -> bool:
        """Whether the run is differentially private (a noise multiplier or a target epsilon is given)."""
        return self.dp_noise_multiplier > 0 or self.dp_target_epsilon > 0

    @property
    def level_proportions(self) -> list[float]:
        """Share of clients per level (equal when not given)."""
        return list(self.proportions) or [1.0] * self.levels

    @property
    def level_budget_ratios(self) -> list[float]:
        """Budget of each level as a fraction of the full model's cost (default l / levels; 2d: 2^(l - levels))."""
        if self.budget_ratios:
            return list(self.budget_ratios)
        if self.scaling == "2d":  # ScaleFL Sec. 4: 12.5%, 25%, 50%, 100% for four levels
            return [0.5 ** (self.levels - l) for l in range(1, self.levels + 1)]
        return [l / self.levels for l in range(1, self.levels + 1)]

    @property
    def level_split_epsilons(self) -> list[float]:
        """epsilon_l of every level (ScaleFL Eq. (1))."""
        return list(self.split_epsilon) * self.levels if len(self.split_epsilon) == 1 else list(self.split_epsilon)

    @property
    def level_widths(self) -> list[float]:
        """Width ratio per level (l / levels when not given)."""
        return list(self.widths) or [(l + 1) / self.levels for l in range(self.levels)]

    @property
    def clients_per_round(self) -> int:
        """Clients sampled each round: round(fraction * clients), at least 1 (FedAvg's m = max(C K, 1))."""
        return max(1, round(self.client_fraction * self.num_clients))

    def lr_at(self, round_index: int) -> float:
        """The client learning rate at a 1-based round."""
        t = round_index - 1
        if self.lr_schedule == "step":
            return self.lr * self.lr_gamma ** sum(1 for s in self.lr_steps if round_index > s)
        if self.lr_schedule == "cosine":
            span = max(self.rounds - 1, 1)
            return self.lr_min + 0.5 * (self.lr - self.lr_min) * (1 + math.cos(math.pi * t / span))
        if self.lr_schedule == "exponential":
            return self.lr * self.lr_gamma ** t
        return self.lr

