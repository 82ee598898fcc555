"""What the server tells one client for one round: a ``Task`` (DESIGN.md, "Data flow").

A task is the sub-model spec plus a recipe: which backbone to build, the loss and its weights at
this round, the optimizer settings and learning rate at this round, the trainer kind (``sgd``, or
``blockwise``: FeDepth's block groups, planned by the server and carried in ``Blockwise``) and the
seeds. It is plain data that round-trips through JSON, so the client side (``client.client_update``)
needs nothing from the server side: no method object, no split search, no server optimizer.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from .recipes import Recipe, recipe_from_dict, recipe_to_dict
from .slicing import SubModel

BLOCKWISE_HEADS = ("skip", "aux")  # how a block group reaches a classifier: skip connection to the head, or its own


@dataclass(frozen=True)
class FamilySpec:
    """The backbone to build: a registered model family bound to a dataset's shapes, with its exits."""

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    width: float = 1.0
    norm: str = "bn"
    exit_after: tuple[int, ...] = ()
    finetune: str = "full"  # what of a pretrained backbone trains (models.finetune)
    adapter_rank: int = 32
    head: str = "exits"  # or ReeFL's Ree + shared classifier (models.ree)


@dataclass(frozen=True)
class TrainOptions:
    """Local optimisation settings shared by every client."""

    epochs: int = 1
    batch_size: int = 32
    momentum: float = 0.9
    weight_decay: float = 5e-4
    clip_grad: float = 0.0  # max global L2 norm of the gradient; 0 = no clipping
    clip_value: float = 0.0  # max |element| of the gradient (after the L2 clip, if both); 0 = no clipping
    crop_padding: int = 0
    flip: bool = False
    prox_mu: float = 0.0
    feddyn_alpha: float = 0.0
    label_mask: bool = False  # mask the logits of the classes the client holds no sample of (losses.label_masked)


@dataclass(frozen=True)
class Blockwise:
    """FeDepth's plan for one client (``trainer = blockwise``; see ``blockwise``), made by the server from the
    client's measured memory budget."""

    groups: tuple[tuple[int, int], ...]  # (first, last) 0-based blocks of each group, in training order; a block
    # in no group is never trained (partial training); the stem trains with block 0
    head: str = "skip"  # BLOCKWISE_HEADS
    models: int = 1  # M models trained together by deep mutual learning (m-FeDepth); the first is uploaded
    budget_bytes: int = 0  # the client's training-memory budget, against which every step is measured
    group_bytes: tuple[int, ...] = ()  # each group's measured step memory at the batch size, as planned
    buffer: bool = False  # keep the frozen prefix's output of every sample when the budget affords it

    def __post_init__(self):
        if self.head not in BLOCKWISE_HEADS:
            raise ValueError(f"blockwise head '{self.head}' is unknown; one of {', '.join(BLOCKWISE_HEADS)}")

    @classmethod
    def from_dict(cls, d: dict) -> Blockwise:
        """The plan serialised by ``asdict``."""
        return cls(groups=tuple((int(a), int(b)) for a, b in d["groups"]), head=d["head"], models=d["models"],
                   budget_bytes=d["budget_bytes"], group_bytes=tuple(d["group_bytes"]), buffer=d["buffer"])


@dataclass(frozen=True)
class Task:
    """One client's work for one round; ``to_json``/``from_json`` carry it between processes."""

    spec: SubModel
    family: FamilySpec
    loss: Recipe
    train: TrainOptions
    lr: float
    round: int
    client: int
    seed: int
    trainer: str = "sgd"  # trainers.TRAINERS: "sgd" (the whole sub-model) or "blockwise" (FeDepth's block groups)
    scaler: bool = False  # HeteroFL's Scaler on sub-models narrower than the global model
    blockwise: Blockwise | None = None  # trainer "blockwise": the block groups and how to train them
    # global shapes of the client's persistent state tensors (FedDyn's g_k), by global name; None: no state
    state_shapes: dict[str, tuple[int, ...]] | None = field(default=None, compare=False)
    dp_clip: float = 0.0  # differential privacy: the L2 norm the update is clipped to (privacy.clipping); 0: none

    def to_json(self) -> str:
        """The task as a JSON string."""
        return json.dumps({**asdict(self), "loss": recipe_to_dict(self.loss)})

    @classmethod
    def from_json(cls, text: str) -> Task:
        """The task serialised by ``to_json``."""
        d = json.loads(text)
        family = dict(d["family"])
        family["input_shape"], family["exit_after"] = tuple(family["input_shape"]), tuple(family["exit_after"])
        shapes, blockwise = d.get("state_shapes"), d.get("blockwise")
        return cls(spec=SubModel.from_dict(d["spec"]), family=FamilySpec(**family), loss=recipe_from_dict(d["loss"]),
                   train=TrainOptions(**d["train"]), lr=d["lr"], round=d["round"], client=d["client"],
                   seed=d["seed"], trainer=d["trainer"], scaler=d["scaler"],
                   blockwise=None if blockwise is None else Blockwise.from_dict(blockwise),
                   state_shapes=None if shapes is None else {k: tuple(v) for k, v in shapes.items()},
                   dp_clip=d.get("dp_clip", 0.0))
