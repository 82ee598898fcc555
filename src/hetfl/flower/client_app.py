"""hetfl's ClientApp: a SuperNode says who it is (``query``) and trains its client's update (``train``).

The client side of hetfl, on Flower: ``node.NodeTrainer`` runs ``client.client_update`` (the same
free function the simulator calls) on the node's own data, with the client's own state on the
node's disk. A ``train`` message goes to the node's warm worker (``worker``: torch, the data and the
model stay loaded across messages) unless the node config says ``worker=off`` or the platform has
no Unix sockets; then this process trains it, cold. It imports nothing from the server side.
"""

from __future__ import annotations

import os
import time

from flwr.app import ConfigRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from .identity import NodeIdentity
from .secure_wire import fitres_content, is_secure, secagg_if_asked, work_of
from .timing import MessageClock

app = ClientApp()


@app.query()
def identify(msg: Message, context: Context) -> Message:
    """The reply to ``query``: the node's identity (its checked node config)."""
    identity = NodeIdentity.from_config(dict(context.node_config))
    return Message(RecordDict({"config": ConfigRecord(identity.to_config())}), reply_to=msg)


@app.train(mods=[secagg_if_asked])
def train(msg: Message, context: Context) -> Message:
    """The reply to ``train``: the client's update of its task, trained on the node's data. Under secure aggregation
    (``secure_wire``: the stage of Flower's SecAgg+ that trains, its work in a legacy FitIns) the reply is the
    client's vector, which ``secaggplus_mod`` masks before it leaves."""
    clock = MessageClock(msg.metadata.message_id, msg.metadata.created_at, msg.metadata.group_id)  # worker.log's
    node_config = dict(context.node_config)
    node = NodeIdentity.from_config(node_config)
    secure = is_secure(msg.content)
    content = work_of(msg.content) if secure else msg.content
    if node.warm and os.name == "posix":
        from . import worker  # no torch: the worker has it loaded

        meta = msg.metadata
        timeout = meta.created_at + meta.ttl - time.time()  # the server counts the message lost after that
        try:
            reply = worker.ask(node_config, node.state_root, content, timeout,
                               label=f"message {meta.message_id[:12]} (round {meta.group_id or '?'})", clock=clock)
        except worker.WorkerLost as e:
            if secure:  # secaggplus_mod takes a reply's content: the error travels as the ClientApp's failure
                raise
            return Message(Error(ErrorCode.CLIENT_APP_CRASHED, f"the node's hetfl worker {e}"), reply_to=msg)
    else:
        from .node import NodeTrainer  # imported here: a query must not wait seconds for torch

        reply = NodeTrainer(node).train(content)
    return Message(fitres_content(reply) if secure else reply, reply_to=msg)
