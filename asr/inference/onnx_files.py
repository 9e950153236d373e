"""The files of an ONNX export and how they are opened: what `asr.inference.onnx_export`
writes and `asr.inference.onnx_runtime` reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asr.errors import first_line

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
