"""The mind: the background jobs (the "subconscious") and what runs them.

``contract`` (what a job is given and answers: ``JobContext``, ``JobResult``,
the ``MemoryWriter`` it writes through), ``registry`` (which jobs exist, when
each may run, the record of runs), ``idle`` (the idle gate), ``reminders``,
``llm_json`` (a language model asked for one validated JSON object); one
module per job: ``consolidate`` (``distil``, ``rollup`` with ``clustering``),
``extract`` (the facts job, with ``extract_rules``, ``spoken_profile``,
``support`` and ``remember``), ``janitor`` (decay), ``patterns``,
``synthesis`` (the portrait, then the digests: ``digest_job``), ``dmn``,
``research``, ``geo_job`` (with ``geo``) and ``sync``.

A new job is one module here plus its line in ``registry.JOBS``.

May import: everything in :mod:`runtime` below it (time, config, store, llm,
memories, recall). Never Ray, and nothing imports a job but the registry,
the entry points and the actors that run it.
"""
