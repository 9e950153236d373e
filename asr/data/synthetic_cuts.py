"""Audio-free cuts with LibriSpeech-like durations and transcript lengths, for sampler
tests and the batching benchmark (`scripts/benchmark_batching.py --synthetic`).

Durations: 1-35 s, most between 10 and 17 s (LibriSpeech's training segments); speech rate
about 2.7 words per second, varying by speaker (sd 0.3 words/s, no heavy tail).
Transcripts are drawn from `vocabulary` when given (so a real tokenizer can count them);
otherwise each cut stores `custom["num_tokens"]` directly. `duration_scale` shrinks every
cut (its duration and its token count) for toy sizes, as the GPU check's CPU rehearsals use.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from lhotse import CutSet, MonoCut, SupervisionSegment


def librispeech_like_durations(num_cuts: int, rng: np.random.Generator) -> np.ndarray:
    """85 % from a normal around 14.5 s (sd 2 s), 15 % spread uniformly over 1-35 s."""
    main = rng.normal(14.5, 2.0, num_cuts)
    spread = rng.uniform(1.0, 35.0, num_cuts)
    durations = np.where(rng.random(num_cuts) < 0.85, main, spread)
    return np.round(np.clip(durations, 1.0, 35.0), 2)


def synthetic_cuts(
    num_cuts: int,
    seed: int = 0,
    *,
    vocabulary: Sequence[str] | None = None,
    words_per_second: float = 2.7,
    tokens_per_word: float = 1.4,
    duration_scale: float = 1.0,
    speakers: int | None = None,
) -> CutSet:
    """`num_cuts` cuts without audio (ids `syn-00000`, ...), eagerly in memory; durations
    and stored token counts times `duration_scale` (at least 1 token). `speakers`: the cuts
    in a corpus's order instead, one speaker's after another's (LibriSpeech's
    train-clean-100 has 251), each speaker's speech rate drawn once (sd 0.3 words/s) and
    varying little within (sd 0.1), as shards written in corpus order hold them; None:
    every cut's rate drawn on its own."""
    if not duration_scale > 0:
        raise ValueError(f"duration_scale must be positive, got {duration_scale}")
    if vocabulary is not None and duration_scale != 1.0:
        raise ValueError("duration_scale shrinks stored token counts: it needs vocabulary=None")
    rng = np.random.default_rng(seed)
    durations = librispeech_like_durations(num_cuts, rng)
    if speakers is None:
        rates = np.clip(rng.normal(words_per_second, 0.3, num_cuts), 1.0, None)
    else:
        if speakers < 1:
            raise ValueError(f"speakers must be >= 1, got {speakers}")
        speaker_rates = rng.normal(words_per_second, 0.3, speakers)
        speaker_of = np.arange(num_cuts) * speakers // num_cuts  # consecutive runs
        rates = np.clip(speaker_rates[speaker_of] + rng.normal(0.0, 0.1, num_cuts), 1.0, None)
    words = np.maximum(1, np.round(rates * durations)).astype(int)
    cuts = []
    for i, (duration, count) in enumerate(zip(durations.tolist(), words.tolist(), strict=True)):
        cut_id = f"syn-{i:05d}"
        if vocabulary is not None:
            text = " ".join(rng.choice(list(vocabulary), size=count))
            custom = None
        else:
            text = ""
            tokens = max(1, round(count * tokens_per_word))
            custom = {"num_tokens": max(1, round(tokens * duration_scale))}
        duration *= duration_scale
        sup = SupervisionSegment(cut_id, cut_id, 0.0, duration, text=text or None)
        cuts.append(MonoCut(cut_id, 0.0, duration, 0, supervisions=[sup], custom=custom))
    return CutSet.from_cuts(cuts)
