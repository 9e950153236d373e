"""Checkpoint(s) -> ONNX files that leave Python: `asr-export CKPT --format onnx -o DIR`.

A transducer with the stateless predictor is written in icefall's contract, which
sherpa-onnx's `OfflineRecognizer.from_transducer` decodes unchanged: `encoder.onnx`,
`decoder.onnx`, `joiner.onnx`, `tokens.txt` (and `*.int8.onnx`, onnxruntime's dynamic
int8 quantization of the same graphs). The graphs and their inputs are described in
`asr.inference.onnx_graphs`. sherpa-onnx computes the 80-bin Kaldi filterbank itself with
lhotse's `Fbank` defaults, and the per-utterance normalization lives in `encoder.onnx`.

An LSTM predictor and the attention encoder-decoder export too; `asr-transcribe --onnx DIR`
(`asr.inference.onnx_runtime`) decodes every export with this package's searches over
onnxruntime. The exporter is torch's dynamo exporter (`torch.onnx.export(dynamo=True)`,
which needs onnxscript: the `deploy` extra).
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from asr.data.features import FeatureConfig
from asr.data.tokenizer import Tokenizer
from asr.frames import SAMPLE_RATE
from asr.inference.bundle import bundle_from_checkpoints, check_decodable, model_from_bundle
from asr.inference.onnx_files import (
    DECODER,
    ENCODER,
    FORMAT,
    JOINER,
    TOKENS,
    onnx_file,
    open_session,
)
from asr.inference.onnx_graphs import (
    AedDecoderGraph,
    EncoderGraph,
    JoinerGraph,
    LstmDecoderGraph,
    StatelessDecoderGraph,
)
from asr.models.aed import EncoderDecoder
from asr.models.transducer import Transducer

log = logging.getLogger(__name__)

SHERPA_FEATURE_DIM = 80  # sherpa-onnx's default filterbank (feature_dim= changes it)
LSTM_NOT_FOR_SHERPA = (
    "sherpa-onnx cannot load this export: its offline transducer runs a stateless predictor "
    "over the last tokens (icefall's contract), and its LSTM contract is NeMo's, with NeMo's "
    "features and the blank id last; asr-transcribe --onnx decodes it (train with "
    "model.predictor.kind=stateless for sherpa-onnx)"
)


@dataclass(frozen=True)
class OnnxExport:
    """What `export_onnx` wrote: the directory, its files, and whether sherpa-onnx loads it
    (`sherpa_note` says why not when it does not)."""

    directory: Path
    files: list[Path]
    kind: str
    sherpa_note: str | None

    @property
    def sherpa_onnx(self) -> bool:
        return self.sherpa_note is None


def export_onnx(
    paths: list[Path],
    output_dir: str | Path,
    ema: bool = False,
    int8: bool = True,
    report: Callable[[str], None] | None = None,
) -> OnnxExport:
    """Write the ONNX files of the model averaged over `paths` (with `ema`, its EMA weights)
    into `output_dir`, fp32 and (with `int8`) quantized; each graph is checked against
    PyTorch on inputs of another size than the traced ones before anything is written.
    `report` receives one line per graph done (the export takes tens of seconds)."""
    bundle = bundle_from_checkpoints(paths, ema)
    check_decodable(bundle, paths[-1])
    model, tokenizer, features = model_from_bundle(bundle)
    features_config = FeatureConfig(**features)
    graphs = _graphs(model, features_config)
    metadata = _metadata(model, tokenizer, features_config)
    output_dir = Path(output_dir)
    staging = output_dir / f".export-tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        names = []
        for name, graph in graphs.items():
            start = time.perf_counter()
            proto = _export_graph(graph)
            for key, value in {**metadata["all"], **metadata.get(name, {})}.items():
                proto.metadata_props.add(key=key, value=str(value))
            _save(proto, staging / onnx_file(name))
            _check_graph(graph, staging / onnx_file(name))
            names.append(onnx_file(name))
            if int8:
                _quantize(staging / onnx_file(name), staging / onnx_file(name, int8=True))
                names.append(onnx_file(name, int8=True))
            if report:
                took = time.perf_counter() - start
                report(f"{onnx_file(name)}: exported and checked against PyTorch ({took:.0f} s)")
        (staging / TOKENS).write_text(tokens_txt(tokenizer))
        names.append(TOKENS)
        files = []
        for name in names:  # each file appears whole (a rename), never half-written
            (staging / name).replace(output_dir / name)
            files.append(output_dir / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    kind = "aed" if isinstance(model, EncoderDecoder) else "transducer"
    return OnnxExport(output_dir, files, kind, _sherpa_note(model, features_config))


def _sherpa_note(model: Transducer | EncoderDecoder, features: FeatureConfig) -> str | None:
    """Why sherpa-onnx cannot decode the export of `model` as it is; None when it can."""
    if isinstance(model, EncoderDecoder):
        return "sherpa-onnx has no contract for this attention decoder: asr-transcribe --onnx"
    if model.predictor.kind != "stateless":
        return LSTM_NOT_FOR_SHERPA
    if features.num_mel_bins != SHERPA_FEATURE_DIM:
        return (
            f"sherpa-onnx needs feature_dim={features.num_mel_bins} when loading it "
            f"(its default is {SHERPA_FEATURE_DIM})"
        )
    return None


def tokens_txt(tokenizer: Tokenizer) -> str:
    """sherpa-onnx's symbol table: one `piece id` line per id (▁ stays; it reads it as a
    space)."""
    return "".join(f"{tokenizer.id_to_piece(i)} {i}\n" for i in range(tokenizer.vocab_size))


# One graph to export: the module, example inputs, their names and dynamic axes, and the
# output names.
@dataclass
class _Graph:
    module: nn.Module
    inputs: dict[str, torch.Tensor]
    dynamic: dict[str, dict[int, Any]]
    outputs: list[str]
    check_inputs: dict[str, torch.Tensor]


def _graphs(model: Transducer | EncoderDecoder, features: FeatureConfig) -> dict[str, _Graph]:
    """The graphs of `model`, by file stem, with example inputs (and other-sized inputs for
    the check after export)."""
    model = copy.deepcopy(model).eval()
    # channels-last strides depend on the batch size: the tracer would fix it
    model.encoder.subsampling.use_memory_format(torch.contiguous_format)
    dyn = torch.export.Dim.DYNAMIC
    gen = torch.Generator().manual_seed(0)
    bins = features.num_mel_bins

    def feats(n: int, t: int) -> dict[str, torch.Tensor]:
        lens = torch.tensor([t - 7 * i for i in range(n)], dtype=torch.int64)
        return {"x": torch.randn(n, t, bins, generator=gen), "x_lens": lens}

    graphs = {
        ENCODER: _Graph(
            EncoderGraph(model, features.normalize == "per_utterance"),
            feats(3, 131),
            {"x": {0: dyn, 1: dyn}, "x_lens": {0: dyn}},
            ["encoder_out", "encoder_out_lens"],
            feats(1, 259),
        )
    }
    if isinstance(model, EncoderDecoder):
        graphs[DECODER] = _aed_decoder_graph(model, gen)
    else:
        graphs.update(_transducer_graphs(model, gen))
    return graphs


def _transducer_graphs(model: Transducer, gen: torch.Generator) -> dict[str, _Graph]:
    """The decoder (predictor) and joiner graphs of a transducer."""
    dyn = torch.export.Dim.DYNAMIC
    graphs = {}
    joint = model.joiner.output.in_features
    vocab = model.vocab_size

    def ids(n: int, width: int) -> torch.Tensor:
        return torch.randint(-1 if width > 1 else 0, vocab, (n, width), generator=gen)

    predictor = model.predictor
    if predictor.kind == "stateless":
        c = predictor.context_size
        graphs[DECODER] = _Graph(
            StatelessDecoderGraph(model), {"y": ids(3, c)}, {"y": {0: dyn}}, ["decoder_out"],
            {"y": ids(1, c)},
        )  # fmt: skip
    else:
        layers, hidden = predictor.lstm.num_layers, predictor.lstm.hidden_size

        def lstm_inputs(n: int) -> dict[str, torch.Tensor]:
            h, c = (torch.randn(n, layers, hidden, generator=gen) for _ in range(2))
            return {"y": ids(n, 1), "h": h, "c": c}

        graphs[DECODER] = _Graph(
            LstmDecoderGraph(model),
            lstm_inputs(3),
            {"y": {0: dyn}, "h": {0: dyn}, "c": {0: dyn}},
            ["decoder_out", "next_h", "next_c"],
            lstm_inputs(1),
        )

    def joiner_inputs(n: int) -> dict[str, torch.Tensor]:
        return {
            "encoder_out": torch.randn(n, joint, generator=gen),
            "decoder_out": torch.randn(n, joint, generator=gen),
        }

    graphs[JOINER] = _Graph(
        JoinerGraph(model),
        joiner_inputs(3),
        {"encoder_out": {0: dyn}, "decoder_out": {0: dyn}},
        ["logit"],
        joiner_inputs(1),
    )
    return graphs


def _aed_decoder_graph(model: EncoderDecoder, gen: torch.Generator) -> _Graph:
    decoder = model.decoder
    layers, heads = len(decoder.layers), decoder.layers[0].num_heads
    width = decoder.d_model
    dyn = torch.export.Dim.DYNAMIC

    def inputs(n: int, cached: int, frames: int) -> dict[str, torch.Tensor]:
        cache = (layers, n, heads, cached, width // heads)
        return {
            "tokens": torch.randint(0, model.vocab_size, (n, 1), generator=gen),
            "self_k": torch.randn(cache, generator=gen),
            "self_v": torch.randn(cache, generator=gen),
            "memory": torch.randn(n, frames, 2 * layers * width, generator=gen),
            "memory_lens": torch.tensor([frames - 3 * i for i in range(n)]),
        }

    return _Graph(
        AedDecoderGraph(model),
        inputs(3, 4, 37),
        {
            "tokens": {0: dyn},
            "self_k": {1: dyn, 3: dyn},
            "self_v": {1: dyn, 3: dyn},
            "memory": {0: dyn, 1: dyn},
            "memory_lens": {0: dyn},
        },
        ["log_probs", "next_self_k", "next_self_v"],
        inputs(1, 0, 53),  # the first step: an empty cache
    )


@contextmanager
def _quiet(logger_name: str | None):
    """Only errors from `logger_name` (None: the root logger) inside the block: the exporter
    logs a warning per missing torchvision op and progress lines, the quantizer its advice
    to pre-process, each time."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _export_graph(graph: _Graph) -> Any:
    """The ONNX ModelProto of `graph`, every axis in `graph.dynamic` left free."""
    with _quiet("torch.onnx"), torch.no_grad():
        program = torch.onnx.export(
            graph.module,
            (),
            kwargs=graph.inputs,
            input_names=list(graph.inputs),
            output_names=graph.outputs,
            dynamic_shapes=graph.dynamic,
            dynamo=True,
            verbose=False,
        )
    return program.model_proto


def _save(proto: Any, path: Path) -> None:
    """Write `proto` without the exporter's shapes of intermediate values (onnx's shape
    inference, which the quantizer runs, rejects some of them for the joiner)."""
    import onnx

    del proto.graph.value_info[:]
    onnx.save(proto, str(path))


def _check_graph(graph: _Graph, path: Path, tolerance: float = 1e-3) -> None:
    """Raise unless onnxruntime's outputs of `path` match PyTorch's on `check_inputs`
    (another batch size and length than the example that was traced)."""
    with torch.no_grad():
        expected = graph.module(**graph.check_inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    feed = {k: v.numpy() for k, v in graph.check_inputs.items()}
    got = open_session(path).run(None, feed)
    for name, want, have in zip(graph.outputs, expected, got, strict=True):
        want = want.numpy()
        if want.shape != have.shape:
            raise RuntimeError(f"{path}: {name} has shape {have.shape}, PyTorch's {want.shape}")
        diff = float(np.abs(want.astype(np.float64) - have).max()) if want.size else 0.0
        if diff > tolerance * max(1.0, float(np.abs(want).max())):
            raise RuntimeError(f"{path}: {name} differs from PyTorch's by {diff:.3g}")


def _quantize(source: Path, target: Path) -> None:
    """onnxruntime's dynamic int8 quantization of the MatMul weights (icefall's choice)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _quiet(None):
        quantize_dynamic(
            str(source), str(target), op_types_to_quantize=["MatMul"], weight_type=QuantType.QInt8
        )


def _metadata(
    model: Transducer | EncoderDecoder, tokenizer: Tokenizer, features: FeatureConfig
) -> dict[str, dict[str, Any]]:
    """Metadata per graph ("all": every graph): what sherpa-onnx reads (`model_type`,
    `vocab_size`, `context_size`) and what `asr.inference.onnx_runtime` needs."""
    encoder = model.encoder
    common = {
        "asr_format": FORMAT,
        "asr_kind": "aed" if isinstance(model, EncoderDecoder) else "transducer",
        "vocab_size": tokenizer.vocab_size,
        "sample_rate": SAMPLE_RATE,
        "feature_dim": features.num_mel_bins,
        "normalize": features.normalize,
        "subsampling_factor": encoder.subsampling_factor,
    }
    meta: dict[str, dict[str, Any]] = {"all": common, ENCODER: {"model_type": "conformer"}}
    if isinstance(model, EncoderDecoder):
        decoder = model.decoder
        meta[DECODER] = {
            "num_layers": len(decoder.layers),
            "num_heads": decoder.layers[0].num_heads,
            "d_model": decoder.d_model,
            "bos_id": model.bos_id,
            "eos_id": model.eos_id,
            "max_positions": decoder.max_positions,
        }
        return meta
    predictor = model.predictor
    decoder_meta: dict[str, Any] = {"predictor_kind": predictor.kind, "blank_id": model.blank_id}
    if predictor.kind == "stateless":
        decoder_meta["context_size"] = predictor.context_size
    else:
        decoder_meta["num_layers"] = predictor.lstm.num_layers
        decoder_meta["hidden_size"] = predictor.lstm.hidden_size
    meta[DECODER] = decoder_meta
    meta[JOINER] = {"joiner_dim": model.joiner.output.in_features}
    return meta
