"""The store: one SQLite file and the files beside it.

``database`` (the :class:`~runtime.store.database.Store`: connection, the one
write path with its write log, forget), ``migrations``, ``files`` (owner-only
files and directories), ``fts`` (FTS5 query text), ``vector_index`` (hnswlib),
``fact_kinds`` (the closed set of fact kinds the store enforces), ``job_state``
(the jobs' own bookkeeping rows), ``backup`` (snapshots, verify, restore) and
``rollback`` (undo from the write log).

May import: :mod:`runtime.time`, :mod:`runtime.config`, and the edge's
replicator settings (``device.replicator``, for backups). Never a memory
service, recall, a job or Ray.
"""
