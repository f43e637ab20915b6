"""The ``reverie`` command (``python -m actors.cli``; the ``reverie`` script).

- ``main``: the parser (every subcommand and flag) and ``main()``;
- ``common``: what the commands share: the exit codes, ``Remote`` (the running
  runtime through the actors' typed clients), the yes/no question, local times;
- ``lifecycle``: ``run``, ``init``, ``status``;
- ``talk``: ``say``, ``chat``, ``recall``;
- ``changes``: ``remember``, ``forget``, ``disable``, ``enable``, ``sensitive``;
- ``transfer``: ``import``, ``reindex``, ``backup verify|restore``;
- ``jobs``: ``jobs [run]``, ``presence``, ``remind``;
- ``graph``: ``graph neighbours|map``, ``place list|name``, ``viz``;
- ``doctor``: ``doctor log|rollback|check-facts``;
- ``memory``: ``digest``, ``profile [show|set]``;
- ``timeline``: ``timeline "EXPR"``.
"""
