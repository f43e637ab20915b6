"""Recall: finding the memories a turn needs.

``hybrid`` (turn-zero recall: vectors, FTS5, decay, the token budget),
``temporal`` (spans named in a question), ``indexing`` (what is embedded and
indexed), ``pull`` (pull mode: the model asks for memories through a tool),
``browse`` and ``timeline`` (listing memories and a period's story),
``reader`` (the prompt parts read from the store on every turn),
``policy`` (settings chosen by the store's shape: a store of long turns).

May import: :mod:`runtime.time`, :mod:`runtime.config`, :mod:`runtime.store`,
:mod:`runtime.llm`, :mod:`runtime.memories`. Never a job or Ray.
"""
