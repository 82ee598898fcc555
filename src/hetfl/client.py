"""The client side: ``client_update`` trains received tensors as a ``Task`` says (DESIGN.md, "Data flow").

A free function of (local tensors, task, client data, the client's own state): it imports nothing
from the server side (methods, aggregation, engines), so the simulator and a Flower ClientApp
call the same code. Here too: reusable sub-model objects, the local losses a task can name, and
the update a client sends back. ``trainer = blockwise`` (FeDepth) runs in ``blockwise``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from torch.func import functional_call

from .blockwise import train_blockwise, trained_prefixes
from .losses import RunningCE, best_exit_kd, exits_ce, mutual_kd, per_exit_ce, weighted_exits_with_last_teacher
from .models import ModelFamily, model_family
from .models.base import BaseEnsemble, NoNorm, federated_state
from .seeding import torch_generator
from .slicing import State, SubModel, corner
from .task import TRAINERS, FamilySpec, LossRecipe, Task
from .train import ClientData, LossFn, local_sgd


@dataclass
class Update:
    """What a client sends back: tensors in local shape, its spec, its sample count and metrics."""

    client: int
    spec: SubModel
    state: State
    num_samples: int
    metrics: dict = field(default_factory=dict)


def attach_scaler(model: nn.Module, rate: float) -> nn.Module:
    """``model`` with HeteroFL's Scaler: in training, the input of every normalisation layer of the
    stem and blocks is divided by ``rate``.

    Diao et al. (2021), Sec. 3.2 "Scaler": a width-r sub-model's activations are 1/r times smaller
    than the full model's, so training rescales them; inference (eval mode) is unscaled. HeteroFL's
    code puts the Scaler right before each normalisation layer (``NoNorm`` marks those places in a
    network built without BatchNorm), so a convolution that feeds a residual sum directly is not
    rescaled and training and inference run the same function up to the normalisation.
    """
    def scale(module, inputs):
        return (inputs[0] / rate,) if module.training else None

    for part in (model.stem, model.blocks):
        for layer in part.modules():
            if isinstance(layer, (nn.modules.batchnorm._BatchNorm, NoNorm)):
                layer.register_forward_pre_hook(scale)
    return model


def build_model(family: ModelFamily, spec: SubModel, seed: int | None = None) -> nn.Module:
    """The module of ``spec`` cut from ``family`` (seeded if asked): its depth and width holding only its exits,
    or SplitMix's bases (base i seeded with ``seed + i``)."""
    if spec.bases:
        base = SubModel(spec.depth, spec.width)
        return BaseEnsemble({i: build_model(family, base, None if seed is None else seed + i) for i in spec.bases})
    model = family.build(depth=spec.depth, width=spec.width, seed=seed)
    return model.keep_exits(spec.exits) if spec.exits is not None else model


class ModelCache:
    """One module object per sub-model architecture, reused across clients and rounds (no re-allocation).

    A module's state that travels is ``federated_state``: frozen pretrained tensors are built with
    the module from the pretrained files, never loaded or sent, and never change.
    """

    def __init__(self, family: ModelFamily, device: torch.device | str = "cpu", scaler: bool = False):
        self.family = family
        self.device = torch.device(device)
        self.scaler = scaler
        self._modules: dict[tuple, nn.Module] = {}
        self._shapes: dict[tuple, dict[str, torch.Size]] = {}

    def _key(self, spec: SubModel) -> tuple:
        return (spec.depth, spec.width, spec.exits, spec.bases)

    def module(self, spec: SubModel) -> nn.Module:
        """The module with ``spec``'s architecture (its weights are whatever was loaded last)."""
        key = self._key(spec)
        if key not in self._modules:
            model = build_model(self.family, spec)
            if self.scaler and spec.width < 1:
                attach_scaler(model, spec.width)
            self._modules[key] = model.to(self.device)
        return self._modules[key]

    def shapes(self, spec: SubModel) -> dict[str, torch.Size]:
        """Local tensor shapes of ``spec``, by name."""
        key = self._key(spec)
        if key not in self._shapes:
            self._shapes[key] = {n: t.shape for n, t in federated_state(self.module(spec)).items()}
        return self._shapes[key]

    def loaded(self, spec: SubModel, state: State) -> nn.Module:
        """The module of ``spec`` holding ``state`` (every tensor of its federated state, nothing else)."""
        module = self.module(spec)
        missing, unexpected = module.load_state_dict(state, strict=False)
        expected = set(module.state_dict()) - set(self.shapes(spec))  # the frozen tensors
        if unexpected or set(missing) != expected:
            wrong = sorted(set(unexpected) | (set(missing) - expected))
            raise ValueError(f"state does not match the federated tensors of {spec}: {wrong[:3]}")
        return module


def family_of(spec: FamilySpec) -> ModelFamily:
    """The model family a task names, rebuilt from the registry."""
    return model_family(spec.name, spec.input_shape, spec.num_classes, spec.width, spec.norm, spec.exit_after,
                        spec.finetune, spec.adapter_rank, spec.head)


def describe_family(family: ModelFamily) -> FamilySpec:
    """The serialisable description of ``family``."""
    return FamilySpec(family.name, family.input_shape, family.num_classes, family.base_width, family.norm,
                      family.arch.exit_after, family.finetune, family.adapter_rank, family.head)


def make_loss(recipe: LossRecipe, models: ModelCache) -> LossFn:
    """The local loss ``loss(model, x, y)`` a recipe names (task.LOSS_KINDS)."""
    if recipe.kind == "last_teacher":  # ScaleFL Eq. (5)
        return lambda model, x, y: weighted_exits_with_last_teacher(model(x), y, recipe.beta, recipe.tau,
                                                                    recipe.normaliser)
    if recipe.kind == "slimmable":  # SHeteroFL: every smaller width on the leading slices of the same parameters
        def slimmable(model, x, y):
            total = exits_ce(model(x), y)
            params = dict(model.named_parameters())
            for sub in recipe.smaller:
                sliced = {n: params[n][corner(s)] for n, s in models.shapes(sub).items()}
                total = total + exits_ce(functional_call(models.module(sub), sliced, (x,)), y)
            return total

        return slimmable
    if recipe.kind == "best_exit":  # ReeFL Eq. (5)-(6): the teacher is the exit of lowest running CE here
        running = RunningCE(recipe.ema)

        def best_exit(model, x, y):
            logits = model(x)
            ce = per_exit_ce(logits, y)
            teacher = running.update(ce)
            if not recipe.kd_weight or len(logits) < 2:
                return ce.sum()
            return ce.sum() + recipe.kd_weight * best_exit_kd(logits, teacher, recipe.tau)

        return best_exit
    kd = recipe.kd_weight  # DepthFL Eq. (1): CE over the exits + kd x mutual KD among them

    def loss(model, x, y):
        logits = model(x)
        return exits_ce(logits, y) + kd * mutual_kd(logits) if kd else exits_ce(logits, y)

    return loss


def client_update(local: State, task: Task, data: ClientData, client_state: State | None = None,
                  models: ModelCache | None = None) -> tuple[Update, State | None]:
    """Train the received tensors as ``task`` says; returns the update and the client's new own state.

    ``client_state`` is the client's persistent state in global shape (FedDyn's g_k, zero before
    its first round; ``task.state_shapes`` gives the global shapes); only the slice of the task's
    spec is read and updated, so a client whose sub-model changed between rounds keeps the rest
    untouched (DepthFL Sec. 3.2, Eq. (3)). ``models`` reuses module objects across calls (the
    simulator); without it the backbone is built from the task.
    """
    if task.trainer not in TRAINERS:
        raise ValueError(f"trainer '{task.trainer}' is unknown; one of {', '.join(TRAINERS)}")
    spec, opts = task.spec, task.train
    device = data.x.device
    models = models or ModelCache(family_of(task.family), device, scaler=task.scaler)
    model = models.loaded(spec, local)
    if task.trainer == "blockwise":
        return _blockwise_update(model, local, task, data, client_state, models)
    names = [n for n, p in model.named_parameters() if p.requires_grad]  # the order local_sgd sees them in
    anchor = [local[n] for n in names] if opts.prox_mu or opts.feddyn_alpha else None
    linear = None
    if opts.feddyn_alpha:
        client_state = client_state if client_state is not None else {}
        linear = [_corner_of(client_state, spec.global_name(n), local[n]) for n in names]
    generator = torch_generator(task.seed, "train", task.round, task.client)
    loss = local_sgd(model, data, make_loss(task.loss, models), opts, task.lr, generator, anchor, linear)
    new_local = {n: t.detach().clone() for n, t in federated_state(model).items()}  # frozen tensors stay home
    if linear is not None:
        client_state = _feddyn_client_step(client_state, task, names, local, new_local, linear)
    return Update(task.client, spec, new_local, len(data), {"train_loss": loss}), client_state


def _blockwise_update(model: nn.Module, local: State, task: Task, data: ClientData, client_state: State | None,
                      models: ModelCache) -> tuple[Update, State | None]:
    """FeDepth's client update (``blockwise``); returns the update of the tensors it trained and its own state.

    m-FeDepth's other M - 1 models live in the client's own state between rounds, under ``peer{m}/``
    + the global name: a client keeps them across the rounds it takes part in, and starts one from
    the received global model the first time it has the memory for it (a peer started as a copy
    only departs from the uploaded model from the client's next round on: within a round the two
    see the same batches). A client that trains fewer models this round keeps its peers untouched.
    """
    plan = task.blockwise
    peers = []
    for m in range(1, plan.models):
        peer = build_model(models.family, task.spec).to(data.x.device)
        key = f"peer{m}/"
        peer.load_state_dict({n: (client_state or {}).get(key + n, t) for n, t in local.items()}, strict=True)
        peers.append(peer)
    generator = torch_generator(task.seed, "train", task.round, task.client)
    loss, peak = train_blockwise([model, *peers], plan, data, task.train, task.lr, generator)
    trained = trained_prefixes(model, plan)
    new_local = {n: t.detach().clone() for n, t in model.state_dict().items() if n.startswith(trained)}
    if peers:
        client_state = dict(client_state or {})
        client_state.update({f"peer{m}/{n}": t.detach().clone()
                             for m, peer in enumerate(peers, start=1) for n, t in peer.state_dict().items()})
    metrics = {"train_loss": loss, "memory_bytes": peak, "memory_budget": plan.budget_bytes}
    return Update(task.client, task.spec, new_local, len(data), metrics), client_state


def _feddyn_client_step(client_state: State, task: Task, names: list[str], start: State, end: State,
                        linear: list[torch.Tensor]) -> State:
    """g_k <- g_k - alpha (w_k - w_global) on this client's slice only (Acar et al., Alg. 1)."""
    alpha, spec = task.train.feddyn_alpha, task.spec
    new_state = dict(client_state)
    for name, g in zip(names, linear):
        key = spec.global_name(name)
        full = new_state.get(key)
        full = torch.zeros(task.state_shapes[key], device=g.device) if full is None else full.clone()
        full[corner(g.shape)] = g - alpha * (end[name] - start[name])
        new_state[key] = full
    return new_state


def _corner_of(state: State, key: str, like: torch.Tensor) -> torch.Tensor:
    """The leading corner of ``state[key]`` shaped like ``like``; zeros when the client has none yet."""
    if key not in state:
        return torch.zeros_like(like)
    return state[key][corner(like.shape)].to(like.device)
