"""Clustering episode embeddings for roll-up: UMAP to 10 dimensions, then HDBSCAN.

Embeddings are L2-normalised; their 15 nearest neighbours are found exactly
(cosine = 1 - dot product of unit vectors, in blocks: no approximate search,
and none of pynndescent's uncacheable compiled code); UMAP (cosine, pinned
seed, so single-threaded) reduces them to 10 dimensions; HDBSCAN (minimum
cluster size 10, euclidean) labels the reduced points. Noise (label -1) is
never force-assigned to a cluster. Below :data:`MIN_POINTS` points nothing is
clustered (every label is -1).

The numba compile. UMAP and pynndescent compile their numba functions in every
new process (8-30 s). Most of pynndescent's are declared ``cache=True``, but
UMAP's are not; :func:`configure_cache` points ``NUMBA_CACHE_DIR`` at a
directory (in the data dir) and the first import of UMAP through this module
makes ``numba.njit`` default to ``cache=True`` while UMAP's modules are
decorated, so its functions are cached on disk as well. :func:`warm_up` runs
the whole pipeline once on a small synthetic set, so that the compile is paid
once per installation (and again after a numba or UMAP upgrade, which changes
the cache keys) instead of once per job. If UMAP was imported before this
module could set that up, clustering still works, it just compiles again in
each process (logged once).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

N_COMPONENTS = 10
N_NEIGHBORS = 15
MIN_CLUSTER_SIZE = 10
RANDOM_STATE = 42
N_EPOCHS = 200  # UMAP's own choice for large sets; enough to separate clusters
MIN_POINTS = 2 * MIN_CLUSTER_SIZE  # HDBSCAN needs two clusters to find one
_KNN_BLOCK = 1024

_lock = threading.Lock()
_modules: tuple[ModuleType, ModuleType] | None = None
_cached_import = False


def configure_cache(cache_dir: Path) -> Path:
    """Make numba cache compiled code in ``cache_dir`` (created 0700); return it.

    Call it before the first clustering in a process. Works whether or not
    numba is imported already (its configuration is re-read)."""
    cache_dir = Path(cache_dir).expanduser()
    cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.environ["NUMBA_CACHE_DIR"] = str(cache_dir)
    if "numba" in sys.modules:
        from numba.core import config

        config.reload_config()
    return cache_dir


def load() -> tuple[ModuleType, ModuleType]:
    """UMAP and HDBSCAN, imported once; UMAP's numba functions cached on disk."""
    global _modules, _cached_import
    with _lock:
        if _modules is not None:
            return _modules
        fresh = "umap" not in sys.modules
        import numba

        original = numba.njit
        wrapped: set[int] = set()

        def cached(func: Any, *args: Any, **kwargs: Any) -> Any:
            # A function compiled twice with different flags (UMAP's layout epoch,
            # serial and parallel) would share one cache entry (numba's cache key
            # ignores the flags): only its first wrapping is cached.
            if id(func) not in wrapped:
                wrapped.add(id(func))
                kwargs.setdefault("cache", True)
            return original(func, *args, **kwargs)

        def njit(*args: Any, **kwargs: Any) -> Any:
            if args and callable(args[0]):
                return cached(*args, **kwargs)
            if args:  # an explicit signature: numba hands back the decorator
                kwargs.setdefault("cache", True)
                return original(*args, **kwargs)
            return lambda func: cached(func, **kwargs)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Tensorflow not installed" and the like
            numba.njit = njit
            try:
                import umap
            finally:
                numba.njit = original
            import hdbscan
        _cached_import = fresh
        if not fresh:
            log.warning("umap was imported before runtime.mind.clustering: its numba code is "
                        "compiled in this process instead of loaded from the cache")
        _modules = (umap, hdbscan)
        return _modules


def normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (float32); a zero row stays zero."""
    x = np.asarray(vectors, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"expected a 2-d array of embeddings, got shape {x.shape}")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def knn(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact ``k`` nearest neighbours of unit rows under cosine distance, each row's
    own index first; (indices int32, distances float32), nearest first."""
    n = len(x)
    idx = np.empty((n, k), dtype=np.int32)
    dist = np.empty((n, k), dtype=np.float32)
    for start in range(0, n, _KNN_BLOCK):
        sims = x[start:start + _KNN_BLOCK] @ x.T
        rows = np.arange(len(sims))
        sims[rows, rows + start] = 2.0  # itself first, even among duplicates
        part = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        part_sims = np.take_along_axis(sims, part, axis=1)
        order = np.lexsort((part, -part_sims), axis=1)  # nearest first, ties by index
        idx[start:start + _KNN_BLOCK] = np.take_along_axis(part, order, axis=1)
        dist[start:start + _KNN_BLOCK] = np.clip(
            1.0 - np.take_along_axis(part_sims, order, axis=1), 0.0, 2.0)
    dist[:, 0] = 0.0
    return idx, dist


def cluster(vectors: np.ndarray, min_cluster_size: int = MIN_CLUSTER_SIZE,
            random_state: int = RANDOM_STATE) -> np.ndarray:
    """HDBSCAN labels (int, -1 = noise) of the rows of ``vectors`` after UMAP to
    10 dimensions. Deterministic for the same input. Fewer than
    ``2 * min_cluster_size`` rows: all noise, nothing is computed."""
    x = normalise(vectors)
    n = len(x)
    if n < max(MIN_POINTS, 2 * min_cluster_size):
        return np.full(n, -1, dtype=np.int64)
    umap, hdbscan = load()
    k = min(N_NEIGHBORS, n - 1)
    indices, distances = knn(x, k)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "n_jobs overridden by random_state", etc.
        reducer = umap.UMAP(n_components=N_COMPONENTS, n_neighbors=k, metric="cosine",
                            min_dist=0.0, n_epochs=N_EPOCHS, random_state=random_state,
                            precomputed_knn=(indices, distances, None))
        reduced = reducer.fit_transform(x)
        labels = hdbscan.HDBSCAN(min_cluster_size=min_cluster_size,
                                 metric="euclidean").fit_predict(reduced)
    return consistent(np.asarray(labels, dtype=np.int64), indices, distances,
                      min_cluster_size)


def consistent(labels: np.ndarray, indices: np.ndarray, distances: np.ndarray,
               min_cluster_size: int) -> np.ndarray:
    """Labels with every member that the original space does not support moved to
    noise; it only ever takes points out of clusters, never puts one in.

    UMAP connects every point to its nearest neighbours however far they are,
    so an outlier lands inside the cluster it is least far from and HDBSCAN
    labels it a member. In the original (cosine) space a member stays only if

    - at least half of its nearest neighbours (as many as its cluster could
      supply) are in its cluster, and
    - its distance to the nearest other member is not an outlier for the
      cluster: at most twice the cluster's median of that distance, or within
      the median plus 4 scaled MADs.

    Then clusters left smaller than ``min_cluster_size`` dissolve into noise."""
    out = labels.copy()
    if not (labels >= 0).any():
        return out
    sizes = np.bincount(labels[labels >= 0])
    neighbours, dists = indices[:, 1:], distances[:, 1:]
    same = labels[neighbours] == labels[:, None]
    nearest = np.where(same.any(axis=1), np.where(same, dists, np.inf).min(axis=1), np.inf)
    for label in range(len(sizes)):
        members = np.flatnonzero(labels == label)
        if not len(members):
            continue
        d = nearest[members]
        finite = d[np.isfinite(d)]
        median = float(np.median(finite)) if len(finite) else 0.0
        mad = float(np.median(np.abs(finite - median))) if len(finite) else 0.0
        limit = max(2.0 * median, median + 4.0 * 1.4826 * mad)
        could = min(neighbours.shape[1], int(sizes[label]) - 1)
        support = same[members].sum(axis=1)
        out[members[(2 * support < could) | (d > limit)]] = -1
    kept = np.bincount(out[out >= 0], minlength=len(sizes))
    for label, size in enumerate(kept):
        if 0 < size < min_cluster_size:
            out[out == label] = -1
    return out


def synthetic(n: int, clusters: int, dim: int = 384, spread: float = 0.25,
              noise: int = 0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` unit vectors in ``clusters`` groups plus ``noise`` scattered ones, and
    their true group (-1 for noise); for warm-up, tests and benchmarks."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(max(clusters, 1), dim))
    truth = np.concatenate([np.arange(n) % max(clusters, 1), np.full(noise, -1)])
    points = centres[truth[:n]] + spread * rng.normal(size=(n, dim))
    if noise:
        points = np.vstack([points, rng.normal(size=(noise, dim))])
    return normalise(points), truth


def warm_up(cache_dir: Path) -> float:
    """Compile (or load from ``cache_dir``) everything :func:`cluster` runs; return
    the seconds it took. Call once per process before the first real clustering,
    or once after installation so the cache is filled."""
    started = time.perf_counter()
    configure_cache(cache_dir)
    vectors, _ = synthetic(60, 3, seed=1)
    cluster(vectors)
    took = time.perf_counter() - started
    log.info("clustering warmed up in %.1f s (numba cache %s, %s)", took, cache_dir,
             "in effect" if _cached_import else "not in effect")
    return took


def cache_in_effect() -> bool:
    """Whether UMAP's numba code in this process is cached on disk."""
    return _cached_import
