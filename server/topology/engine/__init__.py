"""The engine process: one process owns the model and batches the windows of every front process of a
host (vLLM's engine core, Triton's scheduler), so N fronts (HTTP, the door, tokenizing, decoding) share
one model, one queue and one set of per-key limits.

``wire.py`` is the protocol, ``service.py`` the engine's side (a ROUTER socket over the micro-batcher),
``client.py`` a front's side (the ``WindowQueue`` and ``DoorLimits`` the app uses), ``failures.py``
the errors both sides name the same way, ``__main__.py`` the process (``python -m server.topology.engine``,
started by ``server.topology.supervisor``).
"""

LOAD_FAILED = 3  # the engine's exit status when its model fails to load: the supervisor stops the server
