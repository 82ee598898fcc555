"""Client trainers behind one protocol: ``update(local, task, data, client_state, models) -> (Update, state)``.

``sgd`` (``trainers.sgd``) trains the whole sub-model with a pure step that the batched executor
can ``vmap``; ``blockwise`` (``trainers.blockwise``) is FeDepth's block-group training. A trainer
says whether its clients can be stacked (``batchable``).
"""

from __future__ import annotations

from typing import Protocol

from ..models.cache import ModelCache
from ..slicing import State
from ..task import Task
from ..updates import Update
from .blockwise import BlockwiseTrainer
from .schedule import ClientData
from .sgd import SGDTrainer


class Trainer(Protocol):
    """A client's local training for one kind of task."""

    name: str
    batchable: bool

    def update(self, local: State, task: Task, data: ClientData, client_state: State | None, models: ModelCache
               ) -> tuple[Update, State | None]:
        """The update of ``local`` trained as ``task`` says on ``data``, and the client's new own state."""


TRAINERS: dict[str, Trainer] = {t.name: t for t in (SGDTrainer(), BlockwiseTrainer())}
