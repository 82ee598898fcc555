"""The Flower engine: hetfl's rounds over a Flower SuperLink and SuperNodes (needs ``pip install 'hetfl[flower]'``).

* ``server_app``: the ServerApp; ``deployment.deployment`` runs the simulator's rounds with every
  client on a SuperNode, reached through Flower's Grid (server side).
* ``client_app``: the ClientApp; it runs ``client.client_update`` on the node's own data with its
  own state on its own disk (``node``); it imports nothing from the server side.
* ``wire``: what travels in Flower's records (a task and the client's local tensors down, its
  update up), shared by both sides.
* ``federation``, ``credentials``, ``deploy``: ``hetfl deploy``, a SuperLink and SuperNodes on
  loopback (with TLS and node authentication on request) running the app.

Nothing here is imported by the rest of hetfl, which runs without Flower installed.
"""
