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

from .slicing import SubModel
from .train import TrainOptions

TRAINERS = ("sgd", "blockwise")  # local SGD on the whole sub-model; FeDepth's block groups one after another
BLOCKWISE_HEADS = ("skip", "aux")  # how a block group reaches a classifier: skip connection to the head, or its own
# exits_ce: sum of CE over the held exits (+ kd_weight x DepthFL Eq. (1)'s mutual KD);
# last_teacher: ScaleFL Eq. (5); slimmable: CE of the own width + every width in ``smaller`` (SHeteroFL);
# best_exit: ReeFL Eq. (5)-(6), CE over the exits + kd_weight x KD from the exit of lowest running CE
LOSS_KINDS = ("exits_ce", "last_teacher", "slimmable", "best_exit")


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
class LossRecipe:
    """The local loss: its kind (``LOSS_KINDS``) and its weights at this round."""

    kind: str = "exits_ce"
    kd_weight: float = 0.0  # exits_ce: weight of the mutual KD among exits (DepthFL Eq. (1)); best_exit: eta
    beta: float = 0.0  # last_teacher: KD weight beta (ScaleFL Eq. (5))
    tau: float = 1.0  # last_teacher, best_exit: temperature tau
    normaliser: str = "sum"  # last_teacher: divide by sum_i i ("sum") or by n ("last")
    ema: float = 0.2  # best_exit: weight zeta of a new batch in the running CE per exit (ReeFL Sec. 3.2)
    smaller: tuple[SubModel, ...] = ()  # slimmable: the smaller-width sub-models trained on shared slices

    def __post_init__(self):
        if self.kind not in LOSS_KINDS:
            raise ValueError(f"loss kind '{self.kind}' is unknown; one of {', '.join(LOSS_KINDS)}")


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
    loss: LossRecipe
    train: TrainOptions
    lr: float
    round: int
    client: int
    seed: int
    trainer: str = "sgd"
    scaler: bool = False  # HeteroFL's Scaler on sub-models narrower than the global model
    blockwise: Blockwise | None = None  # trainer "blockwise": the block groups and how to train them
    # global shapes of the client's persistent state tensors (FedDyn's g_k), by global name; None: no state
    state_shapes: dict[str, tuple[int, ...]] | None = field(default=None, compare=False)

    def to_json(self) -> str:
        """The task as a JSON string."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Task:
        """The task serialised by ``to_json``."""
        d = json.loads(text)
        loss = dict(d["loss"])
        loss["smaller"] = tuple(SubModel.from_dict(s) for s in loss["smaller"])
        family = dict(d["family"])
        family["input_shape"], family["exit_after"] = tuple(family["input_shape"]), tuple(family["exit_after"])
        shapes, blockwise = d.get("state_shapes"), d.get("blockwise")
        return cls(spec=SubModel.from_dict(d["spec"]), family=FamilySpec(**family), loss=LossRecipe(**loss),
                   train=TrainOptions(**d["train"]), lr=d["lr"], round=d["round"], client=d["client"],
                   seed=d["seed"], trainer=d["trainer"], scaler=d["scaler"],
                   blockwise=None if blockwise is None else Blockwise.from_dict(blockwise),
                   state_shapes=None if shapes is None else {k: tuple(v) for k, v in shapes.items()})
