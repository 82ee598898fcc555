"""Client-level differential privacy for models that clients hold in part: DP-FedAvg on masked sums.

The mechanism (McMahan et al., "Learning Differentially Private Recurrent Language Models", ICLR 2018; adaptive
clipping: Andrew et al., "Differentially Private Learning with Adaptive Clipping", NeurIPS 2021), as hetfl runs it:

1. A client clips its update, everything it sends minus the global slice it received, to L2 norm C
   (``clipping``: the client side, run wherever a client trains).
2. The server folds the clipped updates into the masked sums with uniform weights, adds Gaussian noise
   N(0, (z C)^2) to every coordinate of the sums, and only then divides each coordinate by the number of clients
   that held it (``mechanism``). The counts depend only on who was sampled and their devices' levels, so the
   division, the server optimizer and any server step that reads only the means are post-processing.
3. With adaptive clipping, each client also sends one bit, whether its update was within C; the noised sum of the
   bits moves C geometrically towards the target quantile of the update norms.
4. The accountant (``accounting``: Google's dp-accounting, RDP) composes the rounds for hetfl's own sampling,
   a fixed number of clients per round drawn without replacement, under replace-one-client adjacency.

docs/privacy.md gives the threat model and what the guarantee covers.
"""
