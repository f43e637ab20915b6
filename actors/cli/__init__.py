"""The ``reverie`` command: ``main`` (the parser and most subcommands), and one
module per command group: ``doctor``, ``memory`` (digest, profile),
``timeline``.
"""
