"""How a full-context model's symmetric convolution kernels are best made causal, to start a
streaming model from it (`init_from`): the WER of the model with its kernels mapped each way,
before any training; prints JSON lines.

    python scripts/benchmark_conv_mapping.py exp/demo/model.bundle.pt \\
        data/demo/manifests/librispeech_cuts_dev-clean.jsonl.gz [--chunk-ms 640]

Per line: the mapping (`symmetric`: the model as trained, the reference; then each of
`asr.training.encoder_init.CONV_MAPPINGS`), the chunk it was decoded at (null: full
context) and its WER, greedy search, on the model's own features. The model keeps its
feature normalization; only the kernels and, at a chunk, the attention change.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
from pathlib import Path

import torch

from asr.data.features import FeatureConfig
from asr.data.tokenizer import Tokenizer
from asr.inference.manifest_decoding import decode_manifest
from asr.inference.recognizer import Recognizer
from asr.models.build import build_model
from asr.models.conformer import Chunking
from asr.training.encoder_init import CONV_MAPPINGS, causal_kernel

FRAME_MS = 40  # an encoder frame at subsampling 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="a full-context bundle (asr-export)")
    parser.add_argument("manifest", type=Path, help="lhotse cuts to decode")
    parser.add_argument("--chunk-ms", type=int, default=640, help="the chunk also decoded at")
    parser.add_argument("--left-ms", type=int, default=2560, help="its left context")
    args = parser.parse_args()

    bundle = torch.load(args.model, map_location="cpu", weights_only=True)
    if bundle["model"]["encoder"].get("streaming"):
        raise SystemExit(f"{args.model} is a streaming model already: give a full-context one")
    tokenizer = Tokenizer.from_bytes(bundle["tokenizer"])
    features = FeatureConfig(**bundle["features"])
    chunk, left = args.chunk_ms // FRAME_MS, args.left_ms // FRAME_MS
    streaming = copy.deepcopy(bundle["model"])
    streaming["encoder"]["streaming"] = {"chunk_sizes": [chunk, -1], "left_contexts": [left]}

    with tempfile.TemporaryDirectory() as scratch:
        for mapping in ("symmetric", *CONV_MAPPINGS):
            state = dict(bundle["state_dict"])
            if mapping == "symmetric":
                model = build_model(bundle["model"], tokenizer.vocab_size)
            else:
                model = build_model(streaming, tokenizer.vocab_size)
                for key in state:
                    if key.endswith("depthwise.weight"):
                        state[key] = causal_kernel(state[key], mapping)
            model.load_state_dict(state)
            chunkings = [None] if mapping == "symmetric" else [None, Chunking(chunk, left)]
            for chunking in chunkings:
                recognizer = Recognizer(model, tokenizer, features, chunking=chunking)
                out = Path(scratch) / f"{mapping}-{chunking}"
                wer = decode_manifest(recognizer, args.manifest, out)["wer"]
                chunk_ms = None if chunking is None else args.chunk_ms
                print(json.dumps({"mapping": mapping, "chunk_ms": chunk_ms, "wer": round(wer, 2)}))


if __name__ == "__main__":
    main()
