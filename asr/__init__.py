"""asr: Conformer-Transducer and attention encoder-decoder speech recognition on lhotse,
Lightning and Hydra."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asr.inference.recognizer import Recognizer
    from asr.inference.streaming import StreamingRecognizer

__version__ = "0.1.0"


def load_model(
    path: str | Path,
    device: str = "cpu",
    beam_size: int = 1,
    *,
    streaming: bool = False,
    chunk_ms: float | None = None,
    left_context_ms: float | None = None,
) -> Recognizer | StreamingRecognizer:
    """Load an exported bundle (or a training checkpoint, or the directory of an ONNX export,
    decoded with onnxruntime on the CPU) of any model kind; `.transcribe(audio) -> list[str]`
    takes file paths or 16 kHz mono arrays of any length, with `timestamps=True` gives
    each word's start, end and confidence (transducers; docs/transcribe.md), with
    `biasing=[...]` boosts phrases (docs/decoding.md), and with `lm="lm.arpa"` (and
    `lm_weight=`, `lodr=`, `lodr_weight=`, or an `asr.decoding.fusion.LmFusion`) fuses a
    token n-gram language model, read once and kept. `beam_size` above 1: beam search
    (for transducers up to 3 tokens per frame, as greedy search). Needs neither Hydra nor
    Lightning.

    `streaming=True` (a streaming transducer, docs/streaming.md): a `StreamingRecognizer`
    whose streams take audio pieces as they arrive (`create_stream`, `decode`), at a
    trained chunk of `chunk_ms` milliseconds and left context of `left_context_ms` (None:
    the largest trained); `create_stream(lm=...)` fuses a language model the same way."""
    if streaming:
        from asr.inference.streaming import load_streaming_recognizer

        return load_streaming_recognizer(
            path, chunk_ms, left_context_ms, beam_size=beam_size, device=device
        )
    if chunk_ms is not None or left_context_ms is not None:
        raise ValueError("chunk_ms and left_context_ms go with streaming=True")
    from asr.inference.recognizer import load_recognizer

    if Path(path).is_dir():
        from asr.inference.onnx_runtime import load_onnx_recognizer

        return load_onnx_recognizer(path, beam_size)
    return load_recognizer(path, device, beam_size)
