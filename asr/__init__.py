"""asr: Conformer-Transducer and attention encoder-decoder speech recognition on lhotse,
Lightning and Hydra."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asr.inference.recognizer import Recognizer

__version__ = "0.1.0"


def load_model(path: str | Path, device: str = "cpu", beam_size: int = 1) -> Recognizer:
    """Load an exported bundle (or a training checkpoint, or the directory of an ONNX export,
    decoded with onnxruntime on the CPU) of any model kind; `.transcribe(audio) -> list[str]`
    takes file paths or 16 kHz mono arrays of any length, and with `timestamps=True` gives
    each word's start and end (transducers; docs/transcribe.md). `beam_size` above 1: beam
    search (for transducers up to 3 tokens per frame, as greedy search). Needs neither
    Hydra nor Lightning."""
    from asr.inference.recognizer import load_recognizer

    if Path(path).is_dir():
        from asr.inference.onnx_runtime import load_onnx_recognizer

        return load_onnx_recognizer(path, beam_size)
    return load_recognizer(path, device, beam_size)
