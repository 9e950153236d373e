"""How fast training batches arrive from Shar shards against per-utterance audio files, and
the reader's memory over an epoch. Prints one JSON line per run.

    python scripts/benchmark_loading.py --tokenizer data/demo/tokenizer/bpe128.model \\
        --cuts data/demo/manifests/librispeech_cuts_train-clean-100.jsonl.gz
    python scripts/benchmark_loading.py --tokenizer data/demo/tokenizer/bpe128.model \\
        --synthetic-hours 10

Each run iterates one training epoch as `asr-train` does (the bucketing sampler, then
`AsrDataset` with on-the-fly features in 0, 1 or 2 dataloader workers), from:
- `files`: the cut manifest, one audio file per utterance (random reads);
- `shar`: Shar shards of the same cuts (`asr-export-shar`, FLAC) on local disk;
- `shar_http`: the same shards served by `python -m http.server` on 127.0.0.1 (the
  object-storage path, without leaving the machine).
Per run: audio seconds per wall second delivered to the loop (features of real audio, not
padding), batches, and the main process's resident memory (where the sampler reads the
shards) every batch: its peak, and its peak in the epoch's first and last quarter (flat
when they match). From shards the sampler's buffer (`--buffer-size` cuts) holds each cut's
compressed audio until its batch leaves: the reader's memory grows with the buffer, not
with the corpus or the time. `--synthetic-hours N` writes a corpus of N hours of synthetic FLAC
(tones and noise, 8-20 s each, the demo's transcripts reused) under `--work-dir` first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from pathlib import Path

import numpy as np
import soundfile as sf
from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

from asr.data.buckets import SamplerConfig, build_sampler
from asr.data.corpus import cut_text, load_cuts
from asr.data.datamodule import TrainLoader
from asr.data.dataset import AsrDataset
from asr.data.features import FeatureConfig
from asr.data.shar import export_shar, local_http_server
from asr.data.shar_sampler import open_shards, shard_sampler
from asr.data.tokenizer import Tokenizer
from asr.frames import FRAMES_PER_SECOND, SAMPLE_RATE

SOURCES = ("files", "shar", "shar_http")
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def synthetic_corpus(hours: float, texts: list[str], out: Path) -> Path:
    """`hours` of FLAC utterances (8-20 s of tones in noise) with `texts` cycled as
    transcripts; returns the cut manifest (written once, reused)."""
    manifest = out / f"synthetic_{hours:g}h.jsonl.gz"
    if manifest.exists():
        return manifest
    audio = out / f"synthetic_{hours:g}h"
    audio.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    cuts, total, i = [], 0.0, 0
    while total < hours * 3600:
        seconds = float(rng.uniform(8, 20))
        t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
        tone = 0.1 * np.sin(2 * np.pi * rng.uniform(100, 400) * t)
        samples = (tone + 0.02 * rng.standard_normal(t.size)).astype(np.float32)
        path = audio / f"syn-{i:06d}.flac"
        sf.write(path, samples, SAMPLE_RATE)
        recording = Recording.from_file(path)
        text = texts[i % len(texts)]
        sup = SupervisionSegment(recording.id, recording.id, 0.0, recording.duration, text=text)
        cuts.append(MonoCut(recording.id, 0.0, recording.duration, 0, recording=recording,
                            supervisions=[sup]))  # fmt: skip
        total += recording.duration
        i += 1
    CutSet.from_cuts(cuts).to_file(manifest)
    return manifest


def one_epoch(sampler, tokenizer: Tokenizer, features: FeatureConfig, workers: int) -> dict:
    dataset = AsrDataset(tokenizer, features=features)
    loader = TrainLoader(dataset, sampler, workers)
    samples: list[int] = []
    seconds = 0.0
    batches = 0
    began = time.perf_counter()
    for batch in loader:
        seconds += float(batch.feature_lens.sum()) / FRAMES_PER_SECOND
        batches += 1
        samples.append(rss())
    wall = time.perf_counter() - began
    quarter = max(1, len(samples) // 4)
    return {
        "audio_seconds": round(seconds, 1),
        "wall_seconds": round(wall, 2),
        "audio_seconds_per_second": round(seconds / wall, 1),
        "batches": batches,
        "reader_peak_rss_mb": round(max(samples) / 2**20, 1),
        "reader_first_quarter_peak_mb": round(max(samples[:quarter]) / 2**20, 1),
        "reader_last_quarter_peak_mb": round(max(samples[-quarter:]) / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cuts", type=Path, help="cut manifest (per-utterance audio files)")
    parser.add_argument("--synthetic-hours", type=float, help="instead: a synthetic corpus")
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--work-dir", type=Path, default=Path("exp/benchmark_loading"))
    parser.add_argument("--workers", default="0,1,2")
    parser.add_argument("--sources", default=",".join(SOURCES))
    parser.add_argument("--shard-size", type=int, default=200)
    parser.add_argument("--max-duration", type=float, default=120.0)
    parser.add_argument("--frontend", default="kaldi")
    parser.add_argument(
        "--buffer-size", type=int, default=SamplerConfig().buffer_size,
        help="cuts the bucketing sampler holds (from Shar: with their compressed audio)",
    )  # fmt: skip
    args = parser.parse_args()
    if (args.cuts is None) == (args.synthetic_hours is None):
        parser.error("give --cuts or --synthetic-hours")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.load(args.tokenizer)
    if args.synthetic_hours is not None:
        demo = Path("data/demo/manifests/librispeech_cuts_train-clean-100.jsonl.gz")
        texts = [cut_text(c) for c in load_cuts(demo)] if demo.exists() else ["hello world"]
        manifest = synthetic_corpus(args.synthetic_hours, texts, args.work_dir)
    else:
        manifest = args.cuts
    cuts = load_cuts(manifest)
    shar_dir = args.work_dir / f"shar_{manifest.name.split('.')[0]}"
    sources = args.sources.split(",")
    if any(s.startswith("shar") for s in sources) and not (shar_dir / "shar_index.json").exists():
        export_shar(cuts, shar_dir, shard_size=args.shard_size)
    features = FeatureConfig(source="on_the_fly", frontend=args.frontend)
    cfg = SamplerConfig.from_mapping(
        {"max_duration": args.max_duration, "num_buckets": 8, "buffer_size": args.buffer_size}
    )
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(local_http_server(shar_dir)) if "shar_http" in sources else ""
        for source in sources:
            for workers in (int(w) for w in args.workers.split(",")):
                if source == "files":
                    sampler = build_sampler(load_cuts(manifest), cfg, tokenizer=tokenizer)
                else:
                    where = url if source == "shar_http" else str(shar_dir)
                    shards = open_shards([where], ["recording"])
                    sampler = shard_sampler(shards, ["recording"], cfg, tokenizer=tokenizer)
                result = one_epoch(sampler, tokenizer, features, workers)
                line = {"corpus": manifest.name, "source": source, "workers": workers}
                line |= {"buffer_size": args.buffer_size, **result}
                print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
