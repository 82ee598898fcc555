"""Secure aggregation's wire, torch-free (both sides import it; a node's ClientApp shim stays light).

Under ``hetfl deploy --secure-aggregation`` a round is Flower's SecAgg+ protocol (``SecAggPlusWorkflow`` on the
server, ``secaggplus_mod`` on the nodes): four ``train`` messages per client, the third of which carries the
client's work as a legacy ``FitIns`` (its local tensors as ``fitins.parameters``, hetfl's ``Work`` config and the
round's vector layout in ``fitins.config``) and is answered, after training, with a ``FitRes`` whose one array
is the client's flat vector (``secure_vector.Layout``), which ``secaggplus_mod`` quantizes, masks and uploads in place of
it. This module converts between those legacy layouts and hetfl's own records (``wire``), and re-encodes the masked
vector for transport: ``secaggplus_mod`` serialises it as int64 although every entry is below the 2^32 modulus, so
the node sends it as uint32 (``pack_masked``) and the server widens it back (``unpack_masked``) before Flower's
workflow reads it: half the bytes up, not one value changed.
"""

from __future__ import annotations

import json

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common import Code, FitRes, Parameters, Status, bytes_to_ndarray, ndarray_to_bytes, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.compat.common import recorddict_compat as compat

LAYOUT = "secure-layout"  # in a work's config: the round's vector layout (JSON, secure_vector.Layout)
ROWS = "secure-rows"  # in a work's config: the local names whose classifier rows label masking masks (JSON list)
NAMES = "hetfl-names"  # in fitins.config: the names of the local tensors in fitins.parameters, in order (JSON)
PREFIX = "hetfl."  # in fitins.config: hetfl's work config entries under this prefix
VECTOR = "vector"  # the worker's secure reply: one ArrayRecord holding the flat vector
MODULUS = 1 << 32  # SecAgg+'s modulus_range: the largest Flower allows


# ---- the server's side ---------------------------------------------------------------------------------------
def fitins_of(work: RecordDict):
    """The legacy ``FitIns`` carrying a ``train`` message's hetfl work content (``wire.work_content`` plus the
    secure config entries): the local tensors as parameters, in order, their names and the config as config."""
    from flwr.common import FitIns

    arrays = work["arrays"]
    names = list(arrays)
    parameters = Parameters(tensors=[arrays[n].data for n in names], tensor_type="numpy.ndarray")
    config = {PREFIX + k: v for k, v in work["config"].items()}
    config[NAMES] = json.dumps(names)
    return FitIns(parameters, config)


# ---- the node's side -------------------------------------------------------------------------------------------
def is_secure(content: RecordDict) -> bool:
    """Whether a ``train`` message's content is secure aggregation's stage that trains (a legacy FitIns)."""
    return "fitins.config" in content.config_records


def work_of(content: RecordDict) -> RecordDict:
    """hetfl's work content (``wire.read_work`` reads it) of the FitIns content ``fitins_of`` made."""
    fitins = compat.recorddict_to_fitins(content, keep_input=True)
    names = json.loads(str(fitins.config[NAMES]))
    arrays = parameters_to_ndarrays(fitins.parameters)
    if len(names) != len(arrays):
        raise ValueError(f"the secure work names {len(names)} tensors but carries {len(arrays)}")
    config = {k[len(PREFIX):]: v for k, v in fitins.config.items() if k.startswith(PREFIX)}
    return RecordDict({"arrays": ArrayRecord({n: Array(a) for n, a in zip(names, arrays)}),
                       "config": ConfigRecord(config)})


def vector_content(vector: np.ndarray) -> RecordDict:
    """The worker's reply to secure work: the client's flat vector (``secure_vector.client_vector``)."""
    return RecordDict({VECTOR: ArrayRecord({"v": Array(np.ascontiguousarray(vector))})})


def fitres_content(reply: RecordDict) -> RecordDict:
    """The legacy FitRes content ``secaggplus_mod`` masks: the vector as the one parameter, weight 1 (so Flower's
    weighted mean is the plain mean and the server's sum is that mean times the survivors), and no metrics: nothing
    of the client's travels in plaintext."""
    vector = reply[VECTOR]["v"].numpy()
    fitres = FitRes(Status(Code.OK, "ok"), Parameters(tensors=[ndarray_to_bytes(vector)], tensor_type="numpy.ndarray"),
                    num_examples=1, metrics={})
    return compat.fitres_to_recorddict(fitres, keep_input=False)


def secagg_if_asked(msg: Message, context, call_next) -> Message:
    """A ClientApp mod: Flower's ``secaggplus_mod`` for the messages of the SecAgg+ protocol (those carrying its
    configs record), every other message passed on untouched; the masked vector it uploads is packed as uint32."""
    if RECORD_KEY_CONFIGS not in msg.content.config_records:
        return call_next(msg, context)
    from flwr.client.mod import secaggplus_mod  # its cryptography only where it is used

    reply = secaggplus_mod(msg, context, call_next)
    if reply.has_content():
        pack_masked(reply.content)
    return reply


def pack_masked(content: RecordDict) -> None:
    """Returns None; the masked vector in ``content`` (a reply of stage 'collect masked vectors') as uint32."""
    configs = content.config_records.get(RECORD_KEY_CONFIGS)
    if configs is None or Key.MASKED_PARAMETERS not in configs:
        return
    packed = []
    for data in configs[Key.MASKED_PARAMETERS]:
        array = bytes_to_ndarray(data)
        if array.dtype != np.uint32:
            if array.size and (array.min() < 0 or array.max() >= MODULUS):
                raise ValueError("a masked entry lies outside [0, 2^32): the vector was not reduced mod 2^32")
            array = array.astype(np.uint32)
        packed.append(ndarray_to_bytes(array))
    configs[Key.MASKED_PARAMETERS] = packed


def unpack_masked(content: RecordDict) -> None:
    """Returns None; the masked vector in ``content`` widened back to the int64 Flower's workflow adds up."""
    configs = content.config_records.get(RECORD_KEY_CONFIGS)
    if configs is None or Key.MASKED_PARAMETERS not in configs:
        return
    configs[Key.MASKED_PARAMETERS] = [ndarray_to_bytes(bytes_to_ndarray(data).astype(np.int64))
                                      for data in configs[Key.MASKED_PARAMETERS]]


def content_bytes(content: RecordDict) -> int:
    """Bytes of what ``content`` carries: its arrays' serialised bytes (as ``wire.wire_bytes``) and the bytes values
    of its config records (SecAgg+'s keys, encrypted shares and masked vector)."""
    total = sum(len(array.data) for record in content.array_records.values() for array in record.values())
    for record in content.config_records.values():
        for value in record.values():
            if isinstance(value, bytes):
                total += len(value)
            elif isinstance(value, list):
                total += sum(len(v) for v in value if isinstance(v, bytes))
    return total


def stage_of(message: Message) -> str | None:
    """The SecAgg+ stage a server's message asks for (None: not one of the protocol's)."""
    if not message.has_content():
        return None
    configs = message.content.config_records.get(RECORD_KEY_CONFIGS)
    return None if configs is None else str(configs.get(Key.STAGE))


STAGES = Stage.all()
