"""FedRolex (Alam et al., "FedRolex: Model-Heterogeneous Federated Learning with Rolling Sub-Model Extraction",
NeurIPS 2022): HeteroFL's width-scaled sub-models, cut from a window that rolls by one channel per round.

The algorithm, step by step, and where each step lives:

1. The server holds the full-width global model -> ``init_state`` (inherited).
2. Round j: a client of capacity beta_n (its level's width ratio r) gets, in every layer k of K_k
   hidden channels, the window of its local size s_k that starts at j mod K_k and wraps around
   (Sec. 3, rolling sub-model extraction: S_{n,k}^(j) = {i_kj, ..., i_kj + s_k - 1} mod K_k with
   i_kj = j mod K_k) -> ``plan`` gives the level's width and ``window_offset(round)``; the cut
   itself is ``slicing.window`` / ``slicing.extract``. Image channels and the class dimension are
   never sliced (s = K there), so they stay whole; every sliced dimension uses the same j, so a
   layer's output window is the next layer's input window.
3. The client trains its sub-model with local SGD -> ``client.client_update``, unchanged (with
   HeteroFL's Scaler and label masking, as the authors' code runs it; see below).
4. The server averages every element over the clients whose window held it ("selective
   averaging"); an element no client held keeps its value -> ``Method.aggregate`` with
   ``aggregation.MaskedMean``, which places each update at its window (with label masking, a
   classifier row counts only from the clients holding its class: ``HeteroFL.held_rows``).
5. Inference with the full-width global model -> ``eval_specs``: "global", plus, as HeteroFL,
   every level width as its leading-corner sub-model (one window among the equally trained
   ones; reported for comparison with HeteroFL, the paper evaluates the global model).

Offset convention. The paper starts the window at j mod K_k in round j, advancing one index per
round whatever the layer's size (not scaled by it). Its public code (AIoT-MLSys-Lab/FedRolex,
``resnet_server.py``, ``split_model``) counts rounds from 0, so its first round is the leading
corner; hetfl counts rounds from 1, so j = round - 1 (``window_offset``): round 1 trains
HeteroFL's corner, round 2 starts at index 1, and so on, wrapping modulo each layer's size. The
code rolls the other way (``torch.roll(arange(K), j)[:s]`` starts at -j mod K); hetfl follows the
paper's direction, which trains every channel equally often just the same.

Horizon. Moving one index a round, a level's window starts at every index of a K-channel layer only after K rounds;
then each channel has been held exactly r K times by a width-r window (tests/test_fedrolex.py). Before that the roll
has not left the first channels: after 30 rounds a width-1/4 window of a 256-channel layer has touched channels 0-92
only, so a table shorter than its widest layer measures FedRolex near HeteroFL's corner (``width-peers``); the preset
``fedrolex-regime`` runs as many rounds as its widest layer has channels.

Where the paper and the code differ, hetfl follows the paper: the window's size is the family's
width-r size (as HeteroFL's, so FedRolex and HeteroFL train the same architectures), every element
is a plain mean over its holders (the code weights biases and the classifier by running update
counts, which the paper does not describe), and the server optimizer is the configured one (FedAvg by
default). Scaler and static BN as HeteroFL.

Label masking (``label_mask``, on by default; ``methods.options.LabelMask``) is the code's, which it keeps from
HeteroFL's: in training the logits of the classes a client holds no sample of are set to 0 (``models/resnet.py``'s
``masked_fill``, the ``mask`` field of its ``control_name``, 1 in every command its README gives), and in aggregation
each classifier row is averaged over the clients that hold its class only (``ResnetServerRoll.combine`` indexes the
``linear`` layer by each client's ``label_split``). Under IID it changes nothing.

The code's own training setup (CIFAR: SGD momentum 0.9, weight decay 1e-3, batch 10, gradient norm clipped at 1,
capacities 1, 1/2, 1/4, 1/8, 1/16 redrawn every round, thousands of rounds) is the preset ``fedrolex-regime``'s and
``width-peers-own``'s FedRolex rows; hetfl's common setup (``width-peers``) is the generic SGD of every other row.

The window is over raw channel indices, so a backbone that splits its width into attention heads
(the ViT, MiniLM, ReeFL's head) would see heads cut across by a rolled window; FedRolex runs on
convolutional backbones (the authors' transformer code disables the roll too).
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import HetflError
from ..slicing import SubModel
from .heterofl import HeteroFL


def window_offset(round_index: int) -> int:
    """j of 1-based round ``round_index``: the first index of every sliced dimension's window before the modulo."""
    return round_index - 1


class FedRolex(HeteroFL):
    name = "fedrolex"
    summary = "HeteroFL's width-scaled sub-models from a channel window rolling one index per round (FedRolex)"

    def __init__(self, cfg, family, num_levels, device="cpu"):
        super().__init__(cfg, family, num_levels, device)
        model = self.models.module(self.full_spec())
        if any(hasattr(layer, "heads") for layer in model.modules()):
            raise HetflError(f"method 'fedrolex' rolls a window over channels, which would cut across the attention "
                             f"heads of model '{family.name}'; use a convolutional model (cnn or a ResNet)")

    def plan(self, client, budget, round_index) -> SubModel:
        """Step 2: the width of the client's level (or the widest its budget fits), in this round's window."""
        return replace(self.fit(budget), offset=window_offset(round_index))
