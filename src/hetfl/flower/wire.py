"""What travels between hetfl's ServerApp and ClientApp, in Flower's records (both sides import this).

Down, per node, a ``train`` message: the client's local tensors only (an ``ArrayRecord`` of the
sub-model the server cut for it, never the global model), its ``Task`` as JSON, the partition it
trains on and which of its own states to start from. Up: its update's tensors, its sample count
and loss, the client and sub-model it says it trained, when its task masks labels the classes it holds, and with
differential privacy's adaptive clipping whether its update was within the clip. ``read_reply`` turns whatever a node
sent into an ``Update`` or says why it cannot; ``updates.check_update`` then checks its content.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from ..privacy.clipping import WITHIN_CLIP
from ..updates import Update
from ..slicing import State, SubModel
from ..task import Task

TRAIN, QUERY = "train", "query"  # Flower message types: a round's job; "who are you" (the node config)
WITHIN = "dp-within-clip"  # differential privacy's adaptive clipping: the update's norm was within the clip


@dataclass(frozen=True)
class Work:
    """A node's job in a round: the task, the local tensors, the data and which own state to start from."""

    task: Task
    local: State
    data: dict  # the run's dataset and partition options: a node with a partition-id trains on that partition
    run: str  # the run's key: a node keeps its clients' own states per run
    state_round: int  # the round whose own state (FedDyn's g_k) the client starts from; 0: none yet
    keep_round: int  # the node may forget the client's own states of rounds before this one


def work_content(work: Work) -> RecordDict:
    """The records of a ``train`` message carrying ``work``."""
    return RecordDict({
        "arrays": ArrayRecord(dict(work.local)),
        "config": ConfigRecord({"task": work.task.to_json(), "data": json.dumps(work.data), "run": work.run,
                                "state-round": work.state_round, "keep-round": work.keep_round}),
    })


def read_work(content: RecordDict) -> Work:
    """The ``Work`` a ``train`` message carries."""
    config = content["config"]
    return Work(task=Task.from_json(str(config["task"])), local=dict(content["arrays"].to_torch_state_dict()),
                data=json.loads(str(config["data"])), run=str(config["run"]),
                state_round=int(config["state-round"]), keep_round=int(config["keep-round"]))


def reply_content(update: Update) -> RecordDict:
    """The records of the reply carrying ``update``."""
    return RecordDict({
        "arrays": ArrayRecord(dict(update.state)),
        "metrics": MetricRecord({"num-examples": update.num_samples,
                                 "train-loss": float(update.metrics.get("train_loss", 0.0)),
                                 **({WITHIN: float(update.metrics[WITHIN_CLIP])} if WITHIN_CLIP in update.metrics
                                    else {})}),
        "config": ConfigRecord({"client": update.client, "spec": json.dumps(update.spec.to_dict()),
                                **({} if update.classes is None else {"classes": json.dumps(list(update.classes))})}),
    })


def read_reply(content: RecordDict) -> Update:
    """The update a reply carries; ValueError naming what is missing or unreadable."""
    for name, records in (("arrays", content.array_records), ("metrics", content.metric_records),
                          ("config", content.config_records)):
        if name not in records:
            raise ValueError(f"the reply has no '{name}' record")
    metrics, config = content["metrics"], content["config"]
    for key, record in (("num-examples", metrics), ("train-loss", metrics), ("client", config), ("spec", config)):
        if key not in record:
            raise ValueError(f"the reply has no '{key}'")
    try:
        spec = SubModel.from_dict(json.loads(str(config["spec"])))
        state = dict(content["arrays"].to_torch_state_dict())
        classes = json.loads(str(config["classes"])) if "classes" in config else None
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"the reply's sub-model, tensors or classes cannot be read: {e}") from None
    return Update(client=config["client"], spec=spec, state=state, num_samples=metrics["num-examples"],
                  metrics={"train_loss": float(metrics["train-loss"]),
                           **({WITHIN_CLIP: float(metrics[WITHIN])} if WITHIN in metrics else {})},
                  classes=tuple(classes) if isinstance(classes, list) else classes)  # check_update checks them


def wire_bytes(content: RecordDict) -> int:
    """Bytes of the serialised tensors in ``content`` (each array's bytes, its small header included)."""
    return sum(len(array.data) for record in content.array_records.values() for array in record.values())
