"""Decode an ONNX export (`asr-export --format onnx`) with onnxruntime.

The graphs are wrapped in objects with the decoding interface of the PyTorch models
(`encode`; a transducer's `predictor.step` and `joiner.joint`; an attention decoder's
`decoder.init_state` and `decoder.step`), so the greedy and beam searches of
`asr.decoding` run over onnxruntime unchanged: `asr-transcribe --onnx DIR a.flac`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from asr.data.features import FeatureConfig
from asr.decoding.search import default_options
from asr.errors import first_line
from asr.frames import FRAME_SHIFT_SECONDS
from asr.inference.longform import WindowConfig
from asr.inference.onnx_durations import durations_of, exported_columns
from asr.inference.recognizer import Recognizer
from asr.models.conformer import Chunking
from asr.tokens import WORD_START

# The files of an export and how they are opened: what asr.inference.onnx_export writes.
ENCODER, DECODER, JOINER, TOKENS = "encoder", "decoder", "joiner", "tokens.txt"
FORMAT = "asr-onnx-1"  # metadata `asr_format` of every graph


def onnx_file(name: str, int8: bool = False) -> str:
    """`encoder.onnx` or `encoder.int8.onnx` (icefall's and sherpa-onnx's names)."""
    return f"{name}.int8.onnx" if int8 else f"{name}.onnx"


def open_session(path: Path, threads: int = 1) -> Any:
    """An onnxruntime session of `path` on the CPU with `threads` intra-op threads, with an
    error naming the file when it is missing or not an ONNX model."""
    import onnxruntime as ort

    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found (asr-export --format onnx writes it)")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime's InvalidProtobuf, Fail, ... share no base class
        raise ValueError(f"{path} is not a readable ONNX model ({first_line(err)})") from err


def _metadata(session: Any) -> dict[str, str]:
    return dict(session.get_modelmeta().custom_metadata_map)


class TokenTable:
    """Ids -> text from `tokens.txt` (`piece id` per line), as sherpa-onnx reads it: the
    pieces joined, ▁ read as a space."""

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: not found (asr-export --format onnx writes it)")
        pieces: dict[int, str] = {}
        for number, line in enumerate(path.read_text().splitlines(), 1):
            parts = line.rsplit(" ", 1)
            if len(parts) != 2 or not parts[1].isdigit():
                raise ValueError(f"{path}:{number}: expected 'piece id', got {line!r}")
            pieces[int(parts[1])] = parts[0]
        self.pieces = [pieces.get(i, "") for i in range(max(pieces, default=-1) + 1)]

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    def id_to_piece(self, idx: int) -> str:
        return self.pieces[idx]

    def decode(self, ids: list[int]) -> str:
        text = "".join(self.pieces[i] for i in ids)
        return " ".join(text.replace(WORD_START, " ").split())


def _run(session: Any, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    return session.run(None, feed)


def _numpy(x: Tensor) -> np.ndarray:
    return x.detach().cpu().numpy()


class _Encoder:
    def __init__(self, session: Any) -> None:
        self.session = session

    def __call__(self, features: Tensor, feature_lens: Tensor) -> tuple[Tensor, Tensor]:
        out, lens = _run(
            self.session,
            {"x": _numpy(features.float()), "x_lens": _numpy(feature_lens.long())},
        )
        return torch.from_numpy(out), torch.from_numpy(lens)


class _StatelessPredictor:
    """decoder.onnx over the last `context_size` tokens (the state: the ones before)."""

    kind = "stateless"

    def __init__(self, session: Any, context_size: int, blank_id: int) -> None:
        self.session, self.context_size, self.blank_id = session, context_size, blank_id

    def init_state(self, batch_size: int, device: Any = "cpu") -> Tensor:
        return torch.full((batch_size, self.context_size - 1), self.blank_id, dtype=torch.long)

    def step(self, last_tokens: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        context = torch.cat([state, last_tokens[:, None].long()], dim=1)
        (out,) = _run(self.session, {"y": _numpy(context)})
        return torch.from_numpy(out), context[:, 1:]


class _LstmPredictor:
    """decoder.onnx of an LSTM predictor: one token and (h, c) in, the next (h, c) out."""

    kind = "lstm"

    def __init__(self, session: Any, num_layers: int, hidden_size: int) -> None:
        self.session, self.shape = session, (num_layers, hidden_size)

    def init_state(self, batch_size: int, device: Any = "cpu") -> tuple[Tensor, Tensor]:
        zeros = torch.zeros(batch_size, *self.shape)
        return zeros, zeros.clone()

    def step(
        self, last_tokens: Tensor, state: tuple[Tensor, Tensor]
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        y, (h, c) = _numpy(last_tokens[:, None].long()), state
        out, h, c = _run(self.session, {"y": y, "h": _numpy(h), "c": _numpy(c)})
        return torch.from_numpy(out), (torch.from_numpy(h), torch.from_numpy(c))


class _NemoEncoder(_Encoder):
    """encoder.onnx in sherpa-onnx's NeMo layout: features and outputs channels first."""

    def __call__(self, features: Tensor, feature_lens: Tensor) -> tuple[Tensor, Tensor]:
        feed = {
            "audio_signal": _numpy(features.float().transpose(1, 2)),
            "length": _numpy(feature_lens.long()),
        }
        out, lens = _run(self.session, feed)
        return torch.from_numpy(out).transpose(1, 2), torch.from_numpy(lens)


class _NemoLstmPredictor(_LstmPredictor):
    """decoder.onnx in sherpa-onnx's NeMo layout: int32 ids, states (layers, N, H); kept
    batch-first here, as the searches pick rows."""

    def step(
        self, last_tokens: Tensor, state: tuple[Tensor, Tensor]
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        h, c = (_numpy(s.transpose(0, 1).contiguous()) for s in state)
        feed = {
            "targets": _numpy(last_tokens[:, None].int()),
            "target_length": np.ones(len(last_tokens), dtype=np.int32),
            "states_h": h,
            "states_c": c,
        }
        out, _, h, c = _run(self.session, feed)
        state = (torch.from_numpy(h).transpose(0, 1), torch.from_numpy(c).transpose(0, 1))
        return torch.from_numpy(out)[:, :, 0], state


class _Joiner:
    """joiner.onnx: the encoder and predictor outputs come projected from their graphs. A
    TDT joiner's logits are given back as the model's: V token logits, then one per
    duration in the order of `durations` (`split` parts them)."""

    def __init__(
        self, session: Any, vocab_size: int, durations: tuple[int, ...] | None = None
    ) -> None:
        self.session, self.vocab_size, self.durations = session, vocab_size, durations
        self.num_durations = 0 if durations is None else len(durations)
        columns = None if durations is None else exported_columns(vocab_size, durations)
        self._columns = None if columns is None else torch.tensor(columns)

    def split(self, logits: Tensor) -> tuple[Tensor, Tensor | None]:
        """As `asr.models.transducer.Joiner.split`: (token logits, duration logits or None)."""
        if self.durations is None:
            return logits, None
        return logits[..., : self.vocab_size], logits[..., self.vocab_size :]

    def _logits(self, exported: np.ndarray, shape: torch.Size) -> Tensor:
        logits = torch.from_numpy(exported).view(*shape, -1)
        return logits if self._columns is None else logits.index_select(-1, self._columns)

    def project_encoder(self, x: Tensor) -> Tensor:
        return x

    def project_predictor(self, x: Tensor) -> Tensor:
        return x

    def joint(self, encoder_out: Tensor, decoder_out: Tensor) -> Tensor:
        enc, dec = torch.broadcast_tensors(encoder_out, decoder_out)
        feed = {
            "encoder_out": _numpy(enc.reshape(-1, enc.size(-1)).float()),
            "decoder_out": _numpy(dec.reshape(-1, dec.size(-1)).float()),
        }
        (logit,) = _run(self.session, feed)
        return self._logits(logit, enc.shape[:-1])


class _NemoJoiner(_Joiner):
    """joiner.onnx in sherpa-onnx's NeMo layout: (N, J, 1) inputs, (N, 1, 1, V) logits."""

    def joint(self, encoder_out: Tensor, decoder_out: Tensor) -> Tensor:
        enc, dec = torch.broadcast_tensors(encoder_out, decoder_out)
        feed = {
            "encoder_outputs": _numpy(enc.reshape(-1, enc.size(-1), 1).float()),
            "decoder_outputs": _numpy(dec.reshape(-1, dec.size(-1), 1).float()),
        }
        (logit,) = _run(self.session, feed)
        return self._logits(logit, enc.shape[:-1])


class _Model:
    """What `Recognizer` asks of a model besides decoding: `to`, `eval`, `encode`."""

    def __init__(self, encoder: _Encoder, subsampling_factor: int) -> None:
        self._encoder = encoder
        self.subsampling_factor = subsampling_factor

    def to(self, device: Any) -> _Model:
        if torch.device(device).type != "cpu":
            raise ValueError(f"ONNX models decode on the CPU here, not {device}")
        return self

    def eval(self) -> _Model:
        return self

    @property
    def frame_seconds(self) -> float:
        """Seconds of audio per encoder output frame."""
        return FRAME_SHIFT_SECONDS * self.subsampling_factor

    def encode(
        self, features: Tensor, feature_lens: Tensor, chunking: Chunking | None = None
    ) -> tuple[Tensor, Tensor]:
        if chunking is not None and not chunking.is_full:
            raise ValueError("an offline ONNX export encodes whole utterances: no chunking")
        return self._encoder(features, feature_lens)


class OnnxTransducer(_Model):
    """encoder.onnx, decoder.onnx and joiner.onnx as a transducer for `asr.decoding` (a
    token-and-duration one where `durations` is set, as `Transducer.durations`)."""

    def __init__(
        self, encoder: _Encoder, predictor: Any, joiner: _Joiner, blank_id: int, factor: int
    ) -> None:
        super().__init__(encoder, factor)
        self.predictor, self.joiner, self.blank_id = predictor, joiner, blank_id
        self.vocab_size = joiner.vocab_size

    @property
    def durations(self) -> tuple[int, ...] | None:
        return self.joiner.durations


@dataclass
class AedState:
    """An attention decoder's state over onnxruntime, for N rows: the encoder's memory
    (N, T, 2 x layers x D) and lengths, and the self-attention cache (layers, N, H, S, Dh)."""

    memory: Tensor
    memory_lens: Tensor
    self_k: Tensor
    self_v: Tensor

    @property
    def length(self) -> int:
        return self.self_k.size(3)

    def select(self, index: Tensor, same_memory: bool = False) -> AedState:
        memory, lens = self.memory, self.memory_lens
        if not same_memory:
            memory, lens = memory.index_select(0, index), lens.index_select(0, index)
        return AedState(
            memory, lens, self.self_k.index_select(1, index), self.self_v.index_select(1, index)
        )


class _AedDecoder:
    def __init__(self, session: Any, meta: dict[str, str]) -> None:
        self.session = session
        self.num_layers, self.num_heads = int(meta["num_layers"]), int(meta["num_heads"])
        self.head_dim = int(meta["d_model"]) // self.num_heads
        self.max_positions = int(meta["max_positions"])

    def init_state(self, memory: Tensor, memory_lens: Tensor) -> AedState:
        empty = torch.zeros(self.num_layers, memory.size(0), self.num_heads, 0, self.head_dim)
        return AedState(memory, memory_lens, empty, empty.clone())

    def step(self, tokens: Tensor, state: AedState) -> tuple[Tensor, AedState]:
        if state.length >= self.max_positions:
            raise ValueError(
                f"the ONNX decoder has {self.max_positions} positions (model.decoder."
                "max_positions): this utterance needs more tokens"
            )
        feed = {
            "tokens": _numpy(tokens[:, None].long()),
            "self_k": _numpy(state.self_k),
            "self_v": _numpy(state.self_v),
            "memory": _numpy(state.memory),
            "memory_lens": _numpy(state.memory_lens.long()),
        }
        log_probs, self_k, self_v = _run(self.session, feed)
        grown = AedState(
            state.memory, state.memory_lens, torch.from_numpy(self_k), torch.from_numpy(self_v)
        )
        return torch.from_numpy(log_probs), grown


class OnnxEncoderDecoder(_Model):
    """encoder.onnx and decoder.onnx as an attention encoder-decoder for `asr.decoding`
    (`vocab_size`: the decoder's output width, which a fused LM must match)."""

    is_attention_decoder = True

    def __init__(self, encoder: _Encoder, decoder: _AedDecoder, meta: dict[str, str]) -> None:
        super().__init__(encoder, int(meta["subsampling_factor"]))
        self.decoder = decoder  # `meta`: the decoder graph's metadata
        self.bos_id, self.eos_id = int(meta["bos_id"]), int(meta["eos_id"])
        self.vocab_size = int(meta["vocab_size"])


def load_onnx_model(
    directory: str | Path, int8: bool = False, threads: int = 1
) -> tuple[OnnxTransducer | OnnxEncoderDecoder, TokenTable, FeatureConfig]:
    """(model, tokens, feature config) of an ONNX export directory."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"ONNX export directory not found: {directory}")
    encoder_session = open_session(directory / onnx_file(ENCODER, int8), threads)
    meta = _metadata(encoder_session)
    path = directory / onnx_file(ENCODER, int8)
    if meta.get("asr_format") != FORMAT:
        raise ValueError(f"{path} was not written by asr-export --format onnx (no asr_format)")
    contract = meta.get("asr_contract", "icefall")
    if contract == "nemo_streaming":
        raise ValueError(
            f"{directory} is a streaming export (sherpa-onnx's online NeMo contract): decode it "
            "with sherpa-onnx's online recognizer, or the model's bundle with asr-transcribe "
            "--streaming (docs/streaming.md)"
        )
    tokens = TokenTable(directory / TOKENS)
    features = FeatureConfig(
        num_mel_bins=int(meta["feature_dim"]),
        normalize="none",
        frontend=meta.get("frontend", "kaldi"),
    )
    nemo = contract == "nemo"
    encoder = (_NemoEncoder if nemo else _Encoder)(encoder_session)
    decoder_session = open_session(directory / onnx_file(DECODER, int8), threads)
    decoder_meta = _metadata(decoder_session)
    if meta["asr_kind"] == "aed":
        model: Any = OnnxEncoderDecoder(
            encoder, _AedDecoder(decoder_session, decoder_meta), decoder_meta
        )
        return model, tokens, features
    blank = int(decoder_meta["blank_id"])
    if decoder_meta["predictor_kind"] == "stateless":
        predictor: Any = _StatelessPredictor(
            decoder_session, int(decoder_meta["context_size"]), blank
        )
    else:
        layers, hidden = int(decoder_meta["num_layers"]), int(decoder_meta["hidden_size"])
        predictor = (_NemoLstmPredictor if nemo else _LstmPredictor)(
            decoder_session, layers, hidden
        )
    joiner = (_NemoJoiner if nemo else _Joiner)(
        open_session(directory / onnx_file(JOINER, int8), threads),
        tokens.vocab_size,
        durations_of(meta),
    )
    factor = int(meta["subsampling_factor"])
    return OnnxTransducer(encoder, predictor, joiner, blank, factor), tokens, features


def load_onnx_recognizer(
    directory: str | Path,
    beam_size: int = 1,
    max_symbols_per_frame: int | None = None,
    int8: bool = False,
    threads: int = 1,
    windows: WindowConfig | None = None,
) -> Recognizer:
    """A `Recognizer` over the ONNX export in `directory` (`*.int8.onnx` with `int8`);
    `windows`: how long recordings are cut."""
    model, tokens, features = load_onnx_model(directory, int8, threads)
    options = default_options(model, beam_size, max_symbols_per_frame)  # type: ignore[arg-type]
    return Recognizer(model, tokens, features, "cpu", options, windows)  # type: ignore[arg-type]
