"""The client side: ``client_update`` trains received tensors as a ``Task`` says (DESIGN.md, "Data flow").

A free function of (local tensors, task, client data, the client's own state): it imports nothing
from the server side (methods, aggregation, engines), so every executor and a Flower ClientApp
call the same code. The work is the trainer's the task names (``trainers``).
"""

from __future__ import annotations

from .models.cache import ModelCache, family_of
from .privacy.clipping import privatized
from .slicing import State
from .task import Task
from .trainers import TRAINERS
from .trainers.schedule import ClientData
from .updates import Update


def client_update(local: State, task: Task, data: ClientData, client_state: State | None = None,
                  models: ModelCache | None = None) -> tuple[Update, State | None]:
    """Train the received tensors as ``task`` says; returns the update and the client's new own state.

    ``client_state`` is the client's persistent state in global shape (FedDyn's g_k, zero before
    its first round; ``task.state_shapes`` gives the global shapes); only the slice of the task's
    spec is read and updated, so a client whose sub-model changed between rounds keeps the rest
    untouched (DepthFL Sec. 3.2, Eq. (3)). ``models`` reuses module objects across calls (the
    simulator); without it the backbone is built from the task. With differential privacy the update is clipped
    before it leaves (``privacy.clipping``).
    """
    if task.trainer not in TRAINERS:
        raise ValueError(f"trainer '{task.trainer}' is unknown; one of {', '.join(TRAINERS)}")
    models = models or ModelCache(family_of(task.family), data.x.device, scaler=task.scaler)
    update, client_state = TRAINERS[task.trainer].update(local, task, data, client_state, models)
    return privatized(update, local, task), client_state
