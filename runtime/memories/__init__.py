"""The memory services: each table's one writer, and the rules they keep.

The layers: ``transcript``, ``episodes``, ``facts`` (the typed graph),
``digests``, ``portrait``, ``mood``, ``threads``, ``user_profile``; what
governs them: ``decay``, ``levels``, ``privacy``, ``profiles`` (source memory
profiles), ``refs`` (``fact:12``-style references and what a user may do to
one), ``duplicates``, ``derived`` (what is forgotten with a memory),
``retention`` (the write log's), ``location``, ``emotion``; read-only views:
``graph_views``, ``viz``.

Policy lives here: an actor or a job calls a service, never writes a table.

May import: :mod:`runtime.time`, :mod:`runtime.config`, :mod:`runtime.store`,
:mod:`runtime.llm` (the embedder), ``device.records``. Never recall, a job
(:mod:`runtime.mind`) or Ray.
"""
