"""A tiny corpus without a speech synthesizer, for the GPU check's training runs.

Low-level Gaussian noise with random transcripts of words, in LibriSpeech's layout
(`<part>/<speaker>/<chapter>/<speaker>-<chapter>-<utt>.flac` beside
`<speaker>-<chapter>.trans.txt`), so that the real data path (`prepare_manifests`, lhotse,
on-the-fly features, the tokenizer) runs; nothing can be learned from it. It needs neither
espeak-ng nor the network: the GPU machines have neither.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import soundfile as sf

from asr.data.corpus import CorpusDir, prepare_manifests
from asr.data.tokenizer import train_tokenizer
from asr.demo.lexicon import ADJECTIVES, ANIMALS, PEOPLE, PLACES, THINGS

SAMPLE_RATE = 16000
TRAIN, DEV = "train-clean-100", "dev-clean"
WORDS = sorted(set(PEOPLE + ANIMALS + THINGS + PLACES + ADJECTIVES))
WORDS_PER_SECOND = 1.5  # few enough tokens for CTC at x4 or x8 subsampling
NOISE_STD = 0.01  # about -40 dBFS: no digital silence at the log-mel floor
UTTERANCES_PER_CHAPTER = 6


def make_noise_corpus(
    root: Path,
    *,
    train: int = 24,
    dev: int = 6,
    min_seconds: float = 1.0,
    max_seconds: float = 4.0,
    vocab_size: int = 64,
    seed: int = 0,
) -> CorpusDir:
    """Write `train` and `dev` utterances of `min_seconds`..`max_seconds` of noise (FLAC,
    16 kHz) under `root/LibriSpeech`, their manifests and a BPE tokenizer of `vocab_size`
    pieces trained on the training transcripts. Same seed, same corpus."""
    corpus = CorpusDir(Path(root), vocab_size)
    rng = random.Random(seed)
    noise = np.random.default_rng(seed)
    texts: dict[str, list[str]] = {}
    chapters: dict[Path, list[str]] = {}
    for speaker, (part, count) in enumerate(((TRAIN, train), (DEV, dev)), start=100):
        texts[part] = []
        for number in range(count):
            chapter = number // UTTERANCES_PER_CHAPTER
            folder = corpus.librispeech / part / str(speaker) / str(chapter)
            folder.mkdir(parents=True, exist_ok=True)
            utt_id = f"{speaker}-{chapter}-{number:04d}"
            seconds = rng.uniform(min_seconds, max_seconds)
            samples = noise.normal(0.0, NOISE_STD, round(seconds * SAMPLE_RATE))
            sf.write(folder / f"{utt_id}.flac", samples.astype(np.float32), SAMPLE_RATE)
            words = max(1, round(seconds * WORDS_PER_SECOND))
            text = " ".join(rng.choice(WORDS) for _ in range(words)).upper()
            texts[part].append(text)
            trans = folder / f"{speaker}-{chapter}.trans.txt"
            chapters.setdefault(trans, []).append(f"{utt_id} {text}\n")
    for trans, lines in chapters.items():
        trans.write_text("".join(lines))
    prepare_manifests(corpus.librispeech, corpus.manifests, parts=[TRAIN, DEV])
    train_tokenizer(texts[TRAIN], corpus.tokenizer, vocab_size=vocab_size)
    return corpus
