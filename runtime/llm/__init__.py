"""Language and embedding models: what talks to a model, and what we say to it.

``providers`` (the configured language models and the offline fallback),
``queue`` (the durable queue of requests that wait for a model), ``prompt``
(the turn's prompt: memory sections, bullets), ``persona`` (the assistant's
persona file), ``embedder`` (the local ONNX embedding model) and
``onnx_export`` (exporting it from the packaged weights).

May import: :mod:`runtime.time`, :mod:`runtime.config`, :mod:`runtime.store`
(files only). Never a memory service, recall or a job.
"""
