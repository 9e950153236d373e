"""Decoding speed (RTFx) measurement for the decoding benchmarks: test utterances' features
computed once, batches of them, one timed batch (encoder and search apart), the shared
command-line options."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from rich.progress import track

from asr.data.corpus import load_cuts
from asr.data.features import normalize_features
from asr.decoding.search import SearchOptions, decode
from asr.inference.recognizer import Recognizer


def utterance_features(recognizer: Recognizer, manifest: Path, limit: int | None) -> list[dict]:
    """Id, features, duration and reference of the first `limit` cuts (longest first)."""
    cuts = list(load_cuts(manifest))[:limit]
    extractor = recognizer.features.extractor()
    out = []
    for cut in track(cuts, description="features", transient=True):
        feats = extractor.extract(cut.load_audio()[0], cut.sampling_rate)
        feats = normalize_features(feats, recognizer.features.normalize)
        text = " ".join(s.text for s in cut.supervisions if s.text)
        out.append(
            {"id": cut.id, "feats": torch.from_numpy(feats), "seconds": cut.duration, "text": text}
        )
    return sorted(out, key=lambda u: -u["seconds"])


def batches(utterances: list[dict], size: int) -> list[list[dict]]:
    """`utterances` in consecutive batches of `size` (the last one may be shorter)."""
    return [utterances[i : i + size] for i in range(0, len(utterances), size)]


@torch.inference_mode()
def decode_batch(
    recognizer: Recognizer, batch: list[dict], options: SearchOptions
) -> tuple[float, float, list[list[int]]]:
    """(encoder seconds, search seconds, token ids) of one batch."""
    model = recognizer.model
    lens = torch.tensor([u["feats"].shape[0] for u in batch])
    padded = torch.nn.utils.rnn.pad_sequence([u["feats"] for u in batch], batch_first=True)
    start = time.perf_counter()
    enc, enc_lens = model.encode(padded, lens)
    encoded = time.perf_counter()
    ids = decode(model, enc, enc_lens, options)
    done = time.perf_counter()
    return encoded - start, done - encoded, ids


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    """The options the decoding-speed benchmarks share."""
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--max-utterances", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
