"""hetfl's ClientApp: a SuperNode says who it is (``query``) and runs ``client.client_update`` (``train``).

The client side of hetfl, on Flower: the same free function the simulator calls, on the node's
own data, with the client's own state on the node's disk (``node``). It imports nothing from the
server side (methods, aggregation, the simulator, the config).
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from .identity import NodeIdentity

app = ClientApp()


@app.query()
def identify(msg: Message, context: Context) -> Message:
    """The reply to ``query``: the node's identity (its checked node config)."""
    identity = NodeIdentity.from_config(dict(context.node_config))
    return Message(RecordDict({"config": ConfigRecord(identity.to_config())}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """The reply to ``train``: the client's update of its task, trained on the node's data."""
    # imported here: Flower starts a process per message, and a query must not wait seconds for torch
    from ..client import client_update
    from ..faults import corrupt
    from .node import OwnStates, client_data, state_root
    from .wire import read_work, reply_content

    node = NodeIdentity.from_config(dict(context.node_config))
    work = read_work(msg.content)
    task = work.task
    data = client_data(node, task.client, work.data)
    if tuple(data.x.shape[1:]) != tuple(task.family.input_shape):
        raise ValueError(f"this node's samples have shape {tuple(data.x.shape[1:])}, the run's model takes "
                         f"{tuple(task.family.input_shape)}")
    states = OwnStates(state_root(node), work.run, task.client)
    update, own = client_update(work.local, task, data, states.load(work.state_round))
    if own is not None:
        states.save(task.round, own, work.keep_round)
    if node.corrupt:
        update = corrupt(update, node.corrupt)
    return Message(reply_content(update), reply_to=msg)
