"""Checkpoint(s) -> ONNX files that leave Python: `asr-export CKPT --format onnx -o DIR`.

A transducer is written in the sherpa-onnx contract its parts fit (`contract_of`), so that
sherpa-onnx decodes it unchanged: `encoder.onnx`, `decoder.onnx`, `joiner.onnx`,
`tokens.txt` (and `*.int8.onnx`, onnxruntime's dynamic int8 quantization of the same
graphs). sherpa-onnx computes the filterbank itself, a different one per contract
(`asr.data.features`, `frontend`); the normalization training used lives in `encoder.onnx`.
`asr-transcribe --onnx DIR` (`asr.inference.onnx_runtime`) decodes every offline export with
this package's searches over onnxruntime. The exporter is torch's dynamo exporter
(`torch.onnx.export(dynamo=True)`, which needs onnxscript: the `deploy` extra).

The graphs it traces, one per file of each contract: `asr.inference.onnx_graphs`.
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
from asr.inference.bundle import (
    CHECKPOINT_SUFFIX,
    bundle_from_checkpoints,
    check_decodable,
    load_bundle,
    model_from_bundle,
)
from asr.inference.onnx_durations import (
    DURATIONS_KEY,
    ONLINE_TDT,
    TDT_URL,
    TDT_URL_KEY,
    installed_sherpa_onnx,
    sherpa_tdt_note,
)
from asr.inference.onnx_graphs import (
    AedDecoderGraph,
    EncoderGraph,
    JoinerGraph,
    LstmDecoderGraph,
    NemoDecoderGraph,
    NemoEncoderGraph,
    NemoJoinerGraph,
    NemoStreamingEncoderGraph,
    StatelessDecoderGraph,
    history_slots,
)
from asr.inference.onnx_runtime import (
    DECODER,
    ENCODER,
    FORMAT,
    JOINER,
    TOKENS,
    onnx_file,
    open_session,
)
from asr.inference.streaming import chunking_of_ms, tail_padding_seconds
from asr.models.aed import EncoderDecoder
from asr.models.conformer import Chunking
from asr.models.transducer import Transducer

log = logging.getLogger(__name__)

SHERPA_FEATURE_DIM = 80  # sherpa-onnx's default filterbank (feature_dim= changes it)
LSTM_NOT_FOR_SHERPA = (
    "sherpa-onnx cannot decode this export as trained: it follows sherpa-onnx's NeMo "
    "transducer contract, whose offline recognizer computes the librosa_povey front end, and "
    "this model was trained on another (data.features.frontend); asr-transcribe --onnx "
    "decodes it"
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


def contract_of(model: Transducer | EncoderDecoder) -> str:
    """The layout `model` is exported in: `icefall` (a stateless predictor), `nemo` (an
    LSTM predictor: sherpa-onnx's offline NeMo transducer), `nemo_streaming` (a streaming
    encoder: sherpa-onnx's online NeMo transducer, an LSTM predictor needed), `aed`."""
    if isinstance(model, EncoderDecoder):
        return "aed"
    streaming = getattr(model.encoder, "streaming", None)
    if streaming is not None and streaming.streaming_chunk_sizes:
        if model.durations is not None:
            raise ValueError(ONLINE_TDT)
        if model.predictor.kind != "lstm":
            raise ValueError(
                "a streaming model is exported in sherpa-onnx's online NeMo contract, which "
                "needs an LSTM predictor (model.predictor.kind=lstm)"
            )
        if model.encoder.config.running_mean_frames:
            raise ValueError(
                "model.encoder.running_mean_frames keeps a running sum per stream, which "
                "sherpa-onnx's online NeMo contract has no cache for: it cannot be exported"
            )
        return "nemo_streaming"
    return "icefall" if model.predictor.kind == "stateless" else "nemo"


def export_onnx(
    paths: list[Path],
    output_dir: str | Path,
    ema: bool = False,
    int8: bool = True,
    report: Callable[[str], None] | None = None,
    chunk_ms: float | None = None,
    left_context_ms: float | None = None,
) -> OnnxExport:
    """Write the ONNX files of the model averaged over `paths` (with `ema`, its EMA weights;
    or of the bundle `paths[0]` that asr-export wrote) into `output_dir`, fp32 and (`int8`)
    quantized; each graph is checked against PyTorch on inputs of another size than the
    traced ones before anything is written. `report` receives one line per graph done (the
    export takes tens of seconds). A streaming model is exported at its trained chunk of
    `chunk_ms` and left context of `left_context_ms` milliseconds (None: the largest
    trained)."""
    if len(paths) == 1 and Path(paths[0]).suffix != CHECKPOINT_SUFFIX:
        model, tokenizer, features = load_bundle(paths[0], ema)
    else:
        bundle = bundle_from_checkpoints(paths, ema)
        check_decodable(bundle, paths[-1])
        model, tokenizer, features = model_from_bundle(bundle)
    features_config = FeatureConfig(**features)
    contract = contract_of(model)
    chunking = None
    if contract == "nemo_streaming":
        chunking = chunking_of_ms(model, chunk_ms, left_context_ms)
    elif chunk_ms is not None or left_context_ms is not None:
        raise ValueError("this model was trained with full context: no chunk to export at")
    graphs = _graphs(model, features_config, contract, chunking)
    metadata = _metadata(model, tokenizer, features_config, contract, chunking)
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
        (staging / TOKENS).write_text(tokens_txt(tokenizer, blank_last=contract.startswith("nemo")))
        names.append(TOKENS)
        files = []
        for name in names:  # each file appears whole (a rename), never half-written
            (staging / name).replace(output_dir / name)
            files.append(output_dir / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    kind = "aed" if isinstance(model, EncoderDecoder) else "transducer"
    return OnnxExport(output_dir, files, kind, _sherpa_note(model, features_config, contract))


def _sherpa_note(
    model: Transducer | EncoderDecoder, features: FeatureConfig, contract: str
) -> str | None:
    """Why sherpa-onnx cannot decode the export of `model` as it is; None when it can."""
    if contract == "aed":
        return "sherpa-onnx has no contract for this attention decoder: asr-transcribe --onnx"
    if model.durations is not None and (tdt := sherpa_tdt_note(contract, installed_sherpa_onnx())):
        return tdt
    if contract == "nemo_streaming" and features.frontend != "librosa":
        return (
            f"sherpa-onnx's online NeMo recognizer computes the librosa front end; this model "
            f"was trained on data.features.frontend={features.frontend}"
        )
    if contract == "nemo" and features.frontend != "librosa_povey":
        return LSTM_NOT_FOR_SHERPA
    if contract == "icefall" and features.frontend != "kaldi":
        return (
            "sherpa-onnx cannot decode this export as trained: icefall's contract brings the "
            f"Kaldi filterbank, and this model was trained on data.features.frontend="
            f"{features.frontend}; asr-transcribe --onnx decodes it"
        )
    if features.num_mel_bins != SHERPA_FEATURE_DIM:
        return (
            f"sherpa-onnx needs feature_dim={features.num_mel_bins} when loading it "
            f"(its default is {SHERPA_FEATURE_DIM})"
        )
    return None


def tokens_txt(tokenizer: Tokenizer, blank_last: bool = False) -> str:
    """sherpa-onnx's symbol table: one `piece id` line per id (▁ stays; it reads it as a
    space). `blank_last`: NeMo's order, our ids shifted down by one and the blank (our 0,
    `<blk>`) last."""
    vocab = tokenizer.vocab_size
    ours = [(i + 1) % vocab for i in range(vocab)] if blank_last else range(vocab)
    return "".join(f"{tokenizer.id_to_piece(j)} {i}\n" for i, j in enumerate(ours))


# One graph to export: the module, example inputs, their names and dynamic axes, and the
# output names.
@dataclass
class _Graph:
    module: nn.Module
    inputs: dict[str, torch.Tensor]
    dynamic: dict[str, dict[int, Any]]
    outputs: list[str]
    check_inputs: dict[str, torch.Tensor]


def _graphs(
    model: Transducer | EncoderDecoder,
    features: FeatureConfig,
    contract: str,
    chunking: Chunking | None,
) -> dict[str, _Graph]:
    """The graphs of `model` in `contract`'s layout (a streaming one at `chunking`), by
    file stem, with example inputs (and other-sized inputs for the check after export)."""
    model = copy.deepcopy(model).eval()
    # channels-last strides depend on the batch size: the tracer would fix it
    model.encoder.subsampling.use_memory_format(torch.contiguous_format)
    dyn = torch.export.Dim.DYNAMIC
    gen = torch.Generator().manual_seed(0)
    bins = features.num_mel_bins

    def feats(n: int, t: int) -> dict[str, torch.Tensor]:
        lens = torch.tensor([t - 7 * i for i in range(n)], dtype=torch.int64)
        return {"x": torch.randn(n, t, bins, generator=gen), "x_lens": lens}

    if contract.startswith("nemo"):
        return _nemo_graphs(model, features, gen, chunking)
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


def _nemo_graphs(
    model: Transducer, features: FeatureConfig, gen: torch.Generator, chunking: Chunking | None
) -> dict[str, _Graph]:
    """The encoder, decoder and joiner in sherpa-onnx's NeMo contract: the online one at
    `chunking` for a streaming encoder, else the offline one."""
    dyn = torch.export.Dim.DYNAMIC
    bins, joint = features.num_mel_bins, model.joiner.output.in_features
    encoder = model.encoder
    if chunking is not None:
        span = chunking.chunk * encoder.subsampling_factor
        slots = history_slots(encoder)

        def chunks(n: int) -> dict[str, torch.Tensor]:
            state = encoder.initial_state(n, chunking)
            b, layers, d, k = state.conv.shape
            return {
                "audio_signal": torch.randn(n, bins, span, generator=gen) * 2 - 8,
                "length": torch.full((n,), span, dtype=torch.int64),
                "cache_last_channel": torch.randn(state.attention.shape, generator=gen),
                "cache_last_time": torch.randn(b, layers + slots, d, k, generator=gen),
                "cache_last_channel_len": torch.randint(0, chunking.left + 1, (n,)),
            }

        encoder_graph = _Graph(
            NemoStreamingEncoderGraph(model, chunking),
            chunks(3),
            {name: {0: dyn} for name in chunks(1)},
            [
                "outputs",
                "encoded_lengths",
                "cache_last_channel_next",
                "cache_last_time_next",
                "cache_last_channel_len_next",
            ],
            chunks(1),
        )
    else:

        def feats(n: int, t: int) -> dict[str, torch.Tensor]:
            lens = torch.tensor([t - 7 * i for i in range(n)], dtype=torch.int64)
            return {"audio_signal": torch.randn(n, bins, t, generator=gen), "length": lens}

        encoder_graph = _Graph(
            NemoEncoderGraph(model, features.normalize == "per_utterance"),
            feats(3, 131),
            {"audio_signal": {0: dyn, 2: dyn}, "length": {0: dyn}},
            ["outputs", "encoded_lengths"],
            feats(1, 259),
        )
    layers, hidden = model.predictor.lstm.num_layers, model.predictor.lstm.hidden_size

    def decoder_inputs(n: int) -> dict[str, torch.Tensor]:
        return {
            "targets": torch.randint(0, model.vocab_size, (n, 1), generator=gen, dtype=torch.int32),
            "target_length": torch.ones(n, dtype=torch.int32),
            "states_h": torch.randn(layers, n, hidden, generator=gen),
            "states_c": torch.randn(layers, n, hidden, generator=gen),
        }

    def joiner_inputs(n: int) -> dict[str, torch.Tensor]:
        return {
            "encoder_outputs": torch.randn(n, joint, 1, generator=gen),
            "decoder_outputs": torch.randn(n, joint, 1, generator=gen),
        }

    return {
        ENCODER: encoder_graph,
        DECODER: _Graph(
            NemoDecoderGraph(model),
            decoder_inputs(3),
            {
                "targets": {0: dyn},
                "target_length": {0: dyn},
                "states_h": {1: dyn},
                "states_c": {1: dyn},
            },
            ["outputs", "prednet_lengths", "next_h", "next_c"],
            decoder_inputs(1),
        ),
        JOINER: _Graph(
            NemoJoinerGraph(model),
            joiner_inputs(3),
            {"encoder_outputs": {0: dyn}, "decoder_outputs": {0: dyn}},
            ["outputs"],
            joiner_inputs(1),
        ),
    }


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
        # equal infinities (a TDT joiner's untrained skips) are equal; a NaN is a difference
        same, gap = want == have, np.zeros(want.shape)
        np.subtract(want, have, out=gap, where=~same, dtype=np.float64)
        diff = float(np.nan_to_num(np.abs(gap), nan=np.inf).max()) if want.size else 0.0
        finite = np.abs(want[np.isfinite(want)])
        if diff > tolerance * max(1.0, float(finite.max()) if finite.size else 0.0):
            raise RuntimeError(f"{path}: {name} differs from PyTorch's by {diff:.3g}")


def _quantize(source: Path, target: Path) -> None:
    """onnxruntime's dynamic int8 quantization of the MatMul weights (icefall's choice)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _quiet(None):
        quantize_dynamic(
            str(source), str(target), op_types_to_quantize=["MatMul"], weight_type=QuantType.QInt8
        )


def _metadata(
    model: Transducer | EncoderDecoder,
    tokenizer: Tokenizer,
    features: FeatureConfig,
    contract: str,
    chunking: Chunking | None,
) -> dict[str, dict[str, Any]]:
    """Metadata per graph ("all": every graph): what sherpa-onnx reads (`model_type`,
    `vocab_size`, `context_size`; NeMo's keys) and what `asr.inference.onnx_runtime` needs."""
    encoder = model.encoder
    common = {
        "asr_format": FORMAT,
        "asr_kind": "aed" if isinstance(model, EncoderDecoder) else "transducer",
        "asr_contract": contract,
        "vocab_size": tokenizer.vocab_size,
        "sample_rate": SAMPLE_RATE,
        "feature_dim": features.num_mel_bins,
        "normalize": features.normalize,
        "frontend": features.frontend,
        "subsampling_factor": encoder.subsampling_factor,
    }
    durations = None if isinstance(model, EncoderDecoder) else model.durations
    if durations is not None:
        common[DURATIONS_KEY] = ",".join(map(str, durations))
    if contract.startswith("nemo"):
        return _nemo_metadata(model, features, common, chunking)
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


def _nemo_metadata(
    model: Transducer, features: FeatureConfig, common: dict[str, Any], chunking: Chunking | None
) -> dict[str, dict[str, Any]]:
    """sherpa-onnx's NeMo keys (its exporter scripts': the vocabulary without the blank,
    which is last; no feature normalization outside the graph) and ours: a streaming
    export's chunk and left context in encoder frames, and the silence its clients send
    after the audio (`tail_padding_seconds`)."""
    lstm, encoder = model.predictor.lstm, model.encoder
    nemo = {
        **common,
        "vocab_size": model.vocab_size - 1,
        "normalize_type": "",
        "pred_rnn_layers": lstm.num_layers,
        "pred_hidden": lstm.hidden_size,
        "feat_dim": features.num_mel_bins,
        "model_type": "EncDecRNNTBPEModel",
        "model_author": "asr",
    }
    if model.durations is not None:
        nemo[TDT_URL_KEY] = TDT_URL  # sherpa-onnx: a TDT joiner (asr.inference.onnx_durations)
    if chunking is not None:  # the online contract
        span = chunking.chunk * encoder.subsampling_factor
        layers, d = len(encoder.layers), encoder.output_dim
        nemo |= {
            "window_size": span,
            "chunk_shift": span,
            "chunk_frames": chunking.chunk,
            "left_context": chunking.left,
            "tail_padding_seconds": tail_padding_seconds(model, chunking),
            "cache_last_channel_dim1": layers,
            "cache_last_channel_dim2": chunking.left,
            "cache_last_channel_dim3": d,
            "cache_last_time_dim1": layers + history_slots(encoder),
            "cache_last_time_dim2": d,
            "cache_last_time_dim3": encoder.config.conv_kernel_size - 1,
        }
    decoder = {
        "predictor_kind": "lstm",
        "blank_id": model.vocab_size - 1,
        "num_layers": lstm.num_layers,
        "hidden_size": lstm.hidden_size,
    }
    return {"all": common, ENCODER: nemo, DECODER: decoder}
