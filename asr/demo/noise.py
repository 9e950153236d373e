"""The demo's noise corpus: seven synthetic noise types, in train and held-out test types.

Made by the project itself, for training with noise augmentation and for noisy test sets
whose noise types were never heard in training.

It writes, under OUT (the demo corpus root, e.g. data/demo):

- ``noise/<split>/<type>/<type>-<NNNN>.flac``: 16 kHz mono FLAC clips, 8-16 s each;
- ``manifests/noise_cuts_{train,test}.jsonl.gz``: lhotse cuts, one per clip spanning the
  whole file, no supervisions, ``custom["noise_type"]``; the cut id is the file's stem;
- ``noise/demo_noise.json``: the parameters, so a re-run with the same ones skips.

Types. Training noise: ``white`` (Gaussian), ``pink`` (1/f power), ``tones`` (1-4 steady
sinusoids of 100-4000 Hz with a slow amplitude wobble: the hum and whine of machines) and
``babble`` (3-6 espeak-ng talkers at once, voices of the demo's unlabelled speakers, never
heard with transcripts). Test noise, held out: ``brown`` (1/f^2), ``clicks`` (short decaying
bursts at Poisson times over a very low floor) and ``chatter`` (2-4 talkers whose
voice+variant combinations occur nowhere else in the demo). The two splits share no type,
so the test split measures robustness to noise the model never heard in training, not
how well it learned the training noise.

Every clip is normalized to -25 dBFS RMS, then scaled down if its peak exceeds 0.99 (only
clicks are: they end near -40 dBFS RMS; the augmentation scales noise to a target SNR).
Every random draw of a clip comes from ``numpy.random.default_rng([seed, split, type,
clip])`` and each clip is made in a fresh process (espeak-ng keeps state between
utterances, see `asr.demo.synth`), so the corpus is the same whatever the number of
processes.

Command line: ``asr-make-demo-noise OUT [--clips-per-type N] [--clip-seconds MIN MAX]
[--seed S] [--num-jobs J]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import soundfile as sf
from rich.console import Console
from rich.progress import MofNCompleteColumn, Progress, TimeElapsedColumn

from asr.cli import command
from asr.demo import lexicon as lex
from asr.demo.plan import UNLABELLED_SPEAKERS, Speaker
from asr.demo.synth import check_voices, write_json
from asr.frames import SAMPLE_RATE

MARKER = "demo_noise.json"
_VERSION = 1  # bump when the generator changes, so old noise corpora are rebuilt
SPLITS = ("train", "test")
NOISE_TYPES: dict[str, tuple[str, ...]] = {
    "train": ("white", "pink", "tones", "babble"),
    "test": ("brown", "clicks", "chatter"),  # held out: never in training
}
LEVEL_DBFS = -25.0  # every clip's RMS
MAX_PEAK = 0.99
# Coloured noise follows its power law above this frequency and is flat below it (as a
# leaky integrator's output is): without it brown noise is mostly inaudible sub-Hz drift.
CORNER_HZ = 20.0
# Training babble: the unlabelled part's voices (synthesized speakers never heard with a
# transcript). Test chatter: voice+variant combinations found in no list of asr.demo.plan.
BABBLE_SPEAKERS: tuple[Speaker, ...] = UNLABELLED_SPEAKERS
CHATTER_SPEAKERS = (
    Speaker(3001, "en-us+m7", 165, 45, 55),
    Speaker(3002, "en+f4", 175, 60, 50),
    Speaker(3003, "en-gb-x-rp+m2", 155, 40, 45),
    Speaker(3004, "en-029+f5", 180, 65, 60),
    Speaker(3005, "en-gb-scotland+m8", 160, 45, 50),
    Speaker(3006, "en-us-nyc+f2", 170, 55, 65),
)
_TALKERS = {"babble": (3, 6), "chatter": (2, 4)}


def manifest_path(out_dir: str | Path, split: str) -> Path:
    """The cuts manifest of a split's noise clips under the demo corpus root `out_dir`."""
    return Path(out_dir) / "manifests" / f"noise_cuts_{split}.jsonl.gz"


# ---------------------------------------------------------------------------------------
# Signals (float64 arrays at SAMPLE_RATE)


def coloured_noise(num_samples: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """Gaussian noise with power spectrum ~ 1/f^alpha above CORNER_HZ (flat below): white
    noise shaped in the frequency domain (0: white, 1: pink, 2: brown), without DC."""
    white = rng.standard_normal(num_samples)
    if alpha == 0:
        return white - white.mean()
    spectrum = np.fft.rfft(white)
    freqs = np.fft.rfftfreq(num_samples, 1 / SAMPLE_RATE)
    spectrum *= np.maximum(freqs, CORNER_HZ) ** (-alpha / 2)
    spectrum[0] = 0.0
    return np.fft.irfft(spectrum, num_samples)


def normalize(x: np.ndarray, level_dbfs: float = LEVEL_DBFS) -> np.ndarray:
    """`x` without DC at RMS `level_dbfs` (re full scale 1.0), scaled down further if its
    peak would exceed MAX_PEAK."""
    x = x - x.mean()
    rms = np.sqrt(np.mean(x**2))
    if rms == 0:
        raise ValueError("cannot normalize a silent clip")
    x = x * (10 ** (level_dbfs / 20) / rms)
    peak = np.abs(x).max()
    return x * (MAX_PEAK / peak) if peak > MAX_PEAK else x


def _tones(n: int, rng: np.random.Generator) -> np.ndarray:
    """1-4 steady sinusoids (log-uniform 100-4000 Hz, random amplitudes and phases), each
    with a slow amplitude wobble (0.1-2 Hz, 5-40% deep)."""
    t = np.arange(n) / SAMPLE_RATE
    x = np.zeros(n)
    for _ in range(int(rng.integers(1, 5))):
        freq = np.exp(rng.uniform(np.log(100), np.log(4000)))
        amplitude = rng.uniform(0.2, 1.0)
        depth, rate = rng.uniform(0.05, 0.4), rng.uniform(0.1, 2.0)
        wobble = 1 + depth * np.sin(2 * np.pi * rate * t + rng.uniform(0, 2 * np.pi))
        x += amplitude * wobble * np.sin(2 * np.pi * freq * t + rng.uniform(0, 2 * np.pi))
    return x


def _clicks(n: int, rng: np.random.Generator) -> np.ndarray:
    """Clicks and ticks at Poisson times (1.5-6 per second, at least one): bursts of noise
    or of a 1-6 kHz resonance, decaying in 0.3-3 ms, amplitudes over 30 dB, over a white
    floor 60 dB below the loudest click."""
    x = rng.standard_normal(n) * 10 ** (-60 / 20)
    rate = rng.uniform(1.5, 6.0)
    count = max(1, int(rng.poisson(rate * n / SAMPLE_RATE)))
    for start in np.sort(rng.integers(0, n, count)):
        tau = rng.uniform(0.3e-3, 3e-3) * SAMPLE_RATE  # decay time constant, samples
        k = np.arange(min(int(np.ceil(7 * tau)), n - start))
        if rng.random() < 0.5:
            carrier = rng.standard_normal(len(k))
        else:
            freq = rng.uniform(1000, 6000)
            carrier = np.sin(2 * np.pi * freq * k / SAMPLE_RATE + rng.uniform(0, 2 * np.pi))
        amplitude = 10 ** rng.uniform(-1.5, 0)
        x[start : start + len(k)] += amplitude * np.exp(-k / tau) * carrier
    return x


def _babble(
    n: int, rng: np.random.Generator, speakers: Sequence[Speaker], talkers: tuple
) -> np.ndarray:
    """Several espeak-ng talkers at once: each says random sentences of the demo's grammar
    back to back with random gaps, from a random start (perhaps mid-sentence), at its own
    level; their sum. Run in a fresh process (see `_make_clip`)."""
    from asr.demo.espeak import Espeak, postprocess

    engine = Espeak()
    grammar = lex.Grammar(random.Random(int(rng.integers(2**63))))
    count = int(rng.integers(talkers[0], talkers[1] + 1))
    mix = np.zeros(n)
    for index in rng.choice(len(speakers), size=count, replace=False):
        speaker = speakers[int(index)]
        rate = round(speaker.rate * rng.uniform(0.9, 1.1))
        pitch = int(np.clip(speaker.pitch + rng.integers(-8, 9), 1, 99))
        gain = 10 ** (rng.uniform(-6, 0) / 20)
        position = round(rng.uniform(-1.5, 0.5) * SAMPLE_RATE)  # < 0: already talking
        while position < n:
            text = " ".join(grammar.sentence())
            speech = engine.synthesize(
                text, speaker.voice, rate=rate, pitch=pitch, pitch_range=speaker.range,
                seed=int(rng.integers(2**31)),
            )  # fmt: skip
            samples, _ = postprocess(speech.samples, speech.sample_rate, rng)
            audio = samples.astype(np.float64) / 32768
            begin = max(position, 0)
            piece = audio[begin - position : begin - position + n - begin]
            mix[begin : begin + len(piece)] += gain * piece
            position += len(audio) + round(rng.uniform(0.05, 0.6) * SAMPLE_RATE)
    return mix


def noise_clip(kind: str, num_samples: int, rng: np.random.Generator) -> np.ndarray:
    """One clip of noise type `kind` (a type of NOISE_TYPES), normalized (`normalize`).
    Babble and chatter synthesize speech: call them in a fresh process for the same samples
    from the same `rng` (espeak-ng keeps hidden state)."""
    if kind in ("white", "pink", "brown"):
        x = coloured_noise(num_samples, {"white": 0, "pink": 1, "brown": 2}[kind], rng)
    elif kind == "tones":
        x = _tones(num_samples, rng)
    elif kind == "clicks":
        x = _clicks(num_samples, rng)
    elif kind in _TALKERS:
        speakers = BABBLE_SPEAKERS if kind == "babble" else CHATTER_SPEAKERS
        x = _babble(num_samples, rng, speakers, _TALKERS[kind])
    else:
        raise ValueError(f"unknown noise type {kind!r}; known: {sorted(_all_types())}")
    return normalize(x)


def _all_types() -> list[str]:
    return [kind for split in SPLITS for kind in NOISE_TYPES[split]]


# ---------------------------------------------------------------------------------------
# Corpus


def _make_clip(job: tuple[Path, str, str, int, int, tuple[float, float]]) -> tuple:
    """Worker, one clip per fresh process (a Pool with maxtasksperchild=1): draw its
    length, make it, write the FLAC. Returns (split, type, seconds)."""
    import torch

    torch.set_num_threads(1)  # one process per core already
    path, split, kind, index, seed, (low, high) = job
    rng = np.random.default_rng([seed, SPLITS.index(split), NOISE_TYPES[split].index(kind), index])
    num_samples = round(rng.uniform(low, high) * SAMPLE_RATE)
    try:
        audio = noise_clip(kind, num_samples, rng)
    except ValueError as err:
        raise RuntimeError(f"{path.name}: {err}") from err
    sf.write(path, np.round(audio * 32767).astype(np.int16), SAMPLE_RATE, "PCM_16", format="FLAC")
    return split, kind, num_samples / SAMPLE_RATE


def _prepare_output(root: Path, noise: Path, params: dict) -> dict | None:
    """The summary of an existing complete noise corpus with `params`, or None after
    clearing what an earlier, different or interrupted run left behind."""
    marker = noise / MARKER
    try:
        previous = json.loads(marker.read_text())
    except (OSError, ValueError):
        previous = {}
    manifests = [manifest_path(root, split) for split in SPLITS]
    complete = "summary" in previous and all(path.is_file() for path in manifests)
    if previous.get("params") == params and complete:
        return previous["summary"]
    if noise.exists() and not previous:
        raise FileExistsError(
            f"{noise} exists but was not written by make_demo_noise (no {MARKER}); "
            "remove it or choose another output directory"
        )
    if noise.exists():
        Console(stderr=True).print(f"{noise}: replacing an unfinished or different noise corpus")
    try:
        if noise.exists():
            shutil.rmtree(noise)
        noise.mkdir(parents=True)
        write_json(marker, {"params": params})  # no summary yet: marks an unfinished run
    except OSError as err:
        raise OSError(f"cannot write the noise corpus to {noise}: {err}") from err
    return None


def _synthesize_all(jobs: list[tuple], num_jobs: int) -> dict[str, dict[str, float]]:
    """Run `_make_clip` on every job, one fresh process each: seconds per split and type."""
    # Import torch once here so that forked workers (one per clip) inherit it.
    import torchaudio.functional  # noqa: F401

    context = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else None)
    progress = Progress(*Progress.get_default_columns(), MofNCompleteColumn(), TimeElapsedColumn())
    seconds: dict[str, dict[str, float]] = {s: dict.fromkeys(NOISE_TYPES[s], 0.0) for s in SPLITS}
    with context.Pool(num_jobs, maxtasksperchild=1) as pool, progress:
        task = progress.add_task(f"noise clips x{num_jobs}", total=len(jobs))
        for split, kind, clip_seconds in pool.imap_unordered(_make_clip, jobs):
            seconds[split][kind] += clip_seconds
            progress.advance(task)
    return seconds


def _write_manifest(out: Path, files: list[tuple[Path, str]]) -> None:
    """One cut per file (id: its stem), whole file, no supervisions; written atomically."""
    from lhotse import CutSet, MonoCut, Recording

    cuts = []
    for path, kind in files:
        recording = Recording.from_file(path, recording_id=path.stem)
        cuts.append(
            MonoCut(
                id=path.stem,
                start=0.0,
                duration=recording.duration,
                channel=0,
                recording=recording,
                custom={"noise_type": kind},
            )  # fmt: skip
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.jsonl.gz")
    CutSet.from_cuts(cuts).to_file(tmp)
    tmp.replace(out)


def make_demo_noise(
    out_dir: str | Path,
    *,
    clips_per_type: int = 24,
    clip_seconds: tuple[float, float] = (8.0, 16.0),
    seed: int = 0,
    num_jobs: int | None = None,
) -> dict:
    """Write the noise clips under OUT/noise and their cuts manifests under OUT/manifests
    (see the module docstring); return ``{split: {type: {"clips": n, "seconds": s}}}``.

    Skips the work (and says so) if OUT already holds a complete noise corpus made with the
    same parameters; other parameters rebuild it, deleting OUT/noise first. Same seed, same
    samples, whatever `num_jobs` (default: os.cpu_count()). Paths in the manifests are
    built from `out_dir` as given (relative stays relative), as `prepare_manifests` does.
    """
    low, high = (float(s) for s in clip_seconds)
    if clips_per_type < 1 or not 0 < low <= high or seed < 0:
        raise ValueError(
            f"need clips_per_type >= 1, 0 < clip_seconds[0] <= clip_seconds[1] and seed >= 0; "
            f"got {clips_per_type}, {clip_seconds}, {seed}"
        )
    num_jobs = num_jobs or os.cpu_count() or 1
    root = Path(out_dir)
    noise = root / "noise"
    params = {
        "version": _VERSION,
        "clips_per_type": clips_per_type,
        "clip_seconds": [low, high],
        "seed": seed,
    }
    summary = _prepare_output(root, noise, params)
    if summary is not None:
        Console(stderr=True).print(f"{noise}: noise corpus with these parameters exists; skipping")
        return summary
    check_voices((*BABBLE_SPEAKERS, *CHATTER_SPEAKERS))
    files: dict[str, list[tuple[Path, str]]] = {split: [] for split in SPLITS}
    jobs = []
    for split in SPLITS:
        for kind in NOISE_TYPES[split]:
            folder = noise / split / kind
            folder.mkdir(parents=True)
            for index in range(clips_per_type):
                path = folder / f"{kind}-{index:04d}.flac"
                files[split].append((path, kind))
                jobs.append((path, split, kind, index, seed, (low, high)))
    jobs.sort(key=lambda job: job[2] not in _TALKERS)  # the slow speech clips first
    seconds = _synthesize_all(jobs, num_jobs)
    for split in SPLITS:
        _write_manifest(manifest_path(root, split), files[split])
    summary = {
        split: {
            kind: {"clips": clips_per_type, "seconds": round(seconds[split][kind], 3)}
            for kind in NOISE_TYPES[split]
        }
        for split in SPLITS
    }
    write_json(noise / MARKER, {"params": params, "summary": summary})
    return summary


@command
def main(argv: Sequence[str] | None = None) -> None:
    """Console script `asr-make-demo-noise OUT [--clips-per-type N] [--seed S] ...`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the demo corpus root (noise/ is created inside)")
    parser.add_argument("--clips-per-type", type=int, default=24)
    parser.add_argument(
        "--clip-seconds", type=float, nargs=2, default=[8.0, 16.0], metavar=("MIN", "MAX"),
        help="each clip's length is drawn uniformly between these",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-jobs", type=int, default=None, help="processes (default: all cores)")
    args = parser.parse_args(argv)
    summary = make_demo_noise(
        args.out,
        clips_per_type=args.clips_per_type,
        clip_seconds=tuple(args.clip_seconds),
        seed=args.seed,
        num_jobs=args.num_jobs,
    )
    for split, types in summary.items():
        figures = (f"{kind} {f['clips']} clips {f['seconds']:.0f} s" for kind, f in types.items())
        print(f"{split}: {', '.join(figures)}")
    for split in SPLITS:
        print(f"{split} manifest: {manifest_path(args.out, split)}")


if __name__ == "__main__":
    main()
