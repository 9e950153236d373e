"""On-the-fly augmentation of training audio: speed, volume, reverberation and noise.

Each training cut is changed as it is sampled, in that order, by lhotse's lazy cut
operations (`perturb_speed`, `perturb_volume`, `reverb_rir`, `mix`): the sampler only
records what to do, and the audio is changed when a data loader worker reads it. Every
draw comes from (seed, epoch, cut id, transform) through `numpy.random.default_rng`:

- a resumed run sees the same augmented audio as an uninterrupted one, since it replays
  the epoch's cuts with the same ids;
- the ranks of a data-parallel run never repeat each other's draws (each rank has its own
  cuts), and a cut is changed differently in every epoch;
- turning one transform on or off leaves the draws of the others unchanged.

Speed perturbation changes a cut's duration (a 0.9 factor makes it 1/0.9 = 1.11 times
longer), so it is applied *before* the bucketing sampler sees the cut (`augmented_cuts`
wraps the sampler's input): the sampler buckets, budgets and filters every cut by its
perturbed duration, and no batch holds more padded seconds than its bucket allows.

Noise comes from cut manifests (MUSAN through the LibriSpeech recipe, the demo's own
noise corpus, any corpus): a noise cut longer than the utterance is cut at a random
offset, a shorter one is followed by further noise cuts until the utterance is covered,
all at one SNR drawn per utterance. Reverberation convolves with a recorded impulse
response (`reverb.rirs` manifests) or with that of one of `reverb.rooms` rooms lhotse's
generator makes up (each made once per process).

`asr-mix-noise` applies the same noise and reverberation once to a test set and writes
the result as audio files, for measuring a model on noisy or reverberant speech:

    asr-mix-noise data/demo/manifests/librispeech_cuts_test-clean.jsonl.gz \\
        --noise data/demo/manifests/noise_cuts_test.jsonl.gz --snr 10 \\
        -o data/demo/manifests/librispeech_cuts_test-clean-snr10.jsonl.gz
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import torch
from lhotse import CutSet, Recording, RecordingSet, fastcopy, load_manifest
from lhotse.augmentation import AudioTransform, ReverbWithImpulseResponse
from lhotse.augmentation.utils import FastRandomRIRGenerator
from lhotse.cut import Cut, MonoCut
from rich.progress import track

from asr.cli import command
from asr.config_keys import ConfigError
from asr.errors import first_line
from asr.frames import SAMPLE_RATE

log = logging.getLogger(__name__)

# Each transform draws from its own stream, so that one being on or off does not change
# what the others draw.
SPEED, VOLUME, REVERB, NOISE = range(4)
MIN_NOISE_SECONDS = 0.05  # a shorter remainder of an utterance gets no further noise cut
MAX_SPEED_FACTOR = 2.0


def _probability(key: str, p: float) -> float:
    if not 0.0 <= p <= 1.0:
        raise ConfigError(f"{key}={p}: a probability lies in [0, 1]")
    return float(p)


def _numbers(key: str, values: Any, count: int | None = None) -> tuple[float, ...]:
    """`values` as a tuple of finite numbers (`count` of them if given), or a ConfigError
    naming `key`."""
    if isinstance(values, (int, float)) or not isinstance(values, Sequence):
        raise ConfigError(f"{key}={values!r}: expected a list of numbers")
    try:
        numbers = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}={list(values)!r}: expected a list of numbers") from None
    if not numbers or not all(math.isfinite(v) for v in numbers):
        raise ConfigError(f"{key}={list(values)!r}: expected finite numbers")
    if count is not None and len(numbers) != count:
        raise ConfigError(f"{key}={list(numbers)}: expected {count} numbers")
    return numbers


def _range(key: str, values: Any) -> tuple[float, float]:
    low, high = _numbers(key, values, count=2)
    if low > high:
        raise ConfigError(f"{key}=[{low}, {high}]: the range's low end exceeds its high end")
    return low, high


@dataclass(frozen=True)
class SpeedConfig:
    """Speed perturbation (keys of `data.augment.speed`).

    - `factors`: speeds drawn with equal probability per cut and epoch (1.0 leaves the cut
      as it is; 0.9 makes it 11 % longer and lower, as sox's `speed` does).
    """

    factors: tuple[float, ...] = (0.9, 1.0, 1.1)

    def __post_init__(self) -> None:
        factors = _numbers("data.augment.speed.factors", self.factors)
        if not all(1 / MAX_SPEED_FACTOR <= f <= MAX_SPEED_FACTOR for f in factors):
            raise ConfigError(
                f"data.augment.speed.factors={list(factors)}: each factor must lie in "
                f"[{1 / MAX_SPEED_FACTOR}, {MAX_SPEED_FACTOR}] (1.0: unchanged)"
            )
        object.__setattr__(self, "factors", factors)


@dataclass(frozen=True)
class VolumeConfig:
    """Volume perturbation (keys of `data.augment.volume`).

    - `scale`: [low, high] gain, drawn log-uniformly per cut (0.5: 6 dB quieter).
    - `p`: the probability that a cut's volume is changed.
    """

    scale: tuple[float, float] = (0.5, 2.0)
    p: float = 1.0

    def __post_init__(self) -> None:
        low, high = _range("data.augment.volume.scale", self.scale)
        if low <= 0:
            raise ConfigError(f"data.augment.volume.scale=[{low}, {high}]: gains must be > 0")
        object.__setattr__(self, "scale", (low, high))
        object.__setattr__(self, "p", _probability("data.augment.volume.p", self.p))


@dataclass(frozen=True)
class ReverbConfig:
    """Reverberation (keys of `data.augment.reverb`).

    - `rirs`: recording or cut manifests of recorded room impulse responses, one drawn per
      cut; empty: impulse responses lhotse's generator makes for random rooms.
    - `rooms`: without `rirs`, how many generated rooms a cut's is drawn from (each made
      once per process, then reused: generating one costs about 60 ms).
    - `p`: the probability that a cut is reverberated.
    """

    rirs: tuple[str, ...] = ()
    rooms: int = 1000
    p: float = 0.5

    def __post_init__(self) -> None:
        object.__setattr__(self, "rirs", tuple(str(path) for path in self.rirs))
        if not isinstance(self.rooms, int) or self.rooms < 1:
            raise ConfigError(f"data.augment.reverb.rooms={self.rooms!r}: expected a count >= 1")
        object.__setattr__(self, "p", _probability("data.augment.reverb.p", self.p))


@dataclass(frozen=True)
class NoiseConfig:
    """Additive noise (keys of `data.augment.noise`).

    - `cuts`: cut manifests of noise recordings (their transcripts, if any, are ignored).
    - `snr`: [low, high] signal-to-noise ratio in dB, drawn uniformly per cut.
    - `p`: the probability that noise is added to a cut.
    """

    cuts: tuple[str, ...] = ()
    snr: tuple[float, float] = (10.0, 20.0)
    p: float = 0.5

    def __post_init__(self) -> None:
        if isinstance(self.cuts, str) or not self.cuts:
            raise ConfigError(
                f"data.augment.noise.cuts={self.cuts!r}: give a list of noise cut manifests "
                "(or data.augment.noise=null for no noise)"
            )
        object.__setattr__(self, "cuts", tuple(str(path) for path in self.cuts))
        object.__setattr__(self, "snr", _range("data.augment.noise.snr", self.snr))
        object.__setattr__(self, "p", _probability("data.augment.noise.p", self.p))


@dataclass(frozen=True)
class AugmentConfig:
    """On-the-fly augmentation of training cuts (keys of `data.augment`; a transform that
    is null is off). Needs audio: `data.features.source=on_the_fly`.

    - `speed`: speed perturbation (`SpeedConfig`).
    - `volume`: volume perturbation (`VolumeConfig`).
    - `reverb`: reverberation (`ReverbConfig`).
    - `noise`: additive noise (`NoiseConfig`).
    """

    speed: SpeedConfig | None = None
    volume: VolumeConfig | None = None
    reverb: ReverbConfig | None = None
    noise: NoiseConfig | None = None

    def is_active(self) -> bool:
        """Whether any transform is on."""
        return any(t is not None for t in (self.speed, self.volume, self.reverb, self.noise))


@dataclass(frozen=True)
class Draw:
    """What augmentation does to one cut in one epoch (None: that transform is skipped).

    `reverb` is an impulse response's index in the pool, or a generated room's number;
    `noise` the noise cuts as (index, offset in the noise cut,
    seconds), laid end to end from the utterance's start."""

    speed: float | None = None
    volume: float | None = None
    reverb: int | None = None
    snr: float | None = None
    noise: tuple[tuple[int, float, float], ...] = ()


def cut_rng(seed: int, epoch: int, cut_id: str, stream: int) -> np.random.Generator:
    """The generator of one transform's draws for one cut in one epoch (stable across
    processes and Python versions: the id is hashed with BLAKE2, not `hash`)."""
    digest = hashlib.blake2b(cut_id.encode(), digest_size=16).digest()
    return np.random.default_rng([seed, epoch, stream, int.from_bytes(digest, "little")])


def load_noise(paths: Sequence[str]) -> list[Cut]:
    """The noise cuts of `paths` in memory (supervisions and custom fields dropped,
    resampled to 16 kHz), checked at start-up: a manifest that is missing, empty, not a cut
    manifest, or whose first cut's audio cannot be read raises one line naming it."""
    noise: list[Cut] = []
    for path in paths:
        cuts = _load_cut_manifest(path, "data.augment.noise.cuts")
        if not cuts:
            raise ConfigError(f"data.augment.noise.cuts: {path} holds no cuts")
        for cut in cuts:
            if not cut.has_recording:
                raise ConfigError(f"data.augment.noise.cuts: {path}: cut {cut.id} has no audio")
            if cut.num_channels != 1:
                raise ConfigError(
                    f"data.augment.noise.cuts: {path}: cut {cut.id} has {cut.num_channels} "
                    "channels; give mono noise"
                )
            # a mix's custom fields merge its tracks': keep the speech's (num_tokens) alone
            cut = fastcopy(cut.drop_supervisions(), custom=None)
            if cut.sampling_rate != SAMPLE_RATE:
                cut = cut.resample(SAMPLE_RATE)
            noise.append(cut)
        _check_readable(cuts[0], path, "data.augment.noise.cuts")
    return noise


def load_rirs(paths: Sequence[str]) -> list[Recording]:
    """The impulse responses of `paths` (recording or cut manifests), resampled to 16 kHz
    and checked like `load_noise`'s."""
    rirs: list[Recording] = []
    for path in paths:
        manifest = _load_manifest(path, "data.augment.reverb.rirs")
        if isinstance(manifest, CutSet):
            recordings = [cut.recording for cut in manifest if cut.has_recording]
        elif isinstance(manifest, RecordingSet):
            recordings = list(manifest)
        else:
            raise ConfigError(
                f"data.augment.reverb.rirs: {path} is a {type(manifest).__name__}, not a "
                "recording or cut manifest"
            )
        if not recordings:
            raise ConfigError(f"data.augment.reverb.rirs: {path} holds no recordings")
        _check_readable(recordings[0].to_cut(), path, "data.augment.reverb.rirs")
        rirs += [
            r if r.sampling_rate == SAMPLE_RATE else r.resample(SAMPLE_RATE) for r in recordings
        ]
    return rirs


def _load_manifest(path: str, key: str) -> Any:
    if not Path(path).is_file():
        raise ConfigError(f"{key}: {path} does not exist")
    try:
        return load_manifest(path)
    except Exception as err:  # lhotse raises many kinds for a file that is not a manifest
        raise ConfigError(f"{key}: {path} is not a lhotse manifest ({first_line(err)})") from None


def _load_cut_manifest(path: str, key: str) -> list[Cut]:
    manifest = _load_manifest(path, key)
    if not isinstance(manifest, CutSet):
        raise ConfigError(f"{key}: {path} is a {type(manifest).__name__}, not a cut manifest")
    return list(manifest)


def _check_readable(cut: Cut, path: str, key: str) -> None:
    try:
        cut.truncate(duration=min(cut.duration, 0.1)).load_audio()
    except Exception as err:  # the decoders raise many kinds: report any, in one line
        raise ConfigError(
            f"{key}: {path}: the audio of cut {cut.id} cannot be read ({first_line(err)})"
        ) from None


def mix_noise(
    cut: Cut, noise: Sequence[Cut], snr: float, rng: np.random.Generator
) -> tuple[Cut, tuple[tuple[int, float, float], ...]]:
    """`cut` with noise cuts drawn from `noise` laid end to end over its whole duration,
    each scaled to `snr` dB below the cut's energy; also the pieces drawn, as `Draw.noise`."""
    pieces = []
    filled = 0.0
    while cut.duration - filled > MIN_NOISE_SECONDS:
        index = int(rng.integers(len(noise)))
        need = cut.duration - filled
        seconds = min(noise[index].duration, need)
        offset = float(rng.uniform(0.0, noise[index].duration - seconds))
        pieces.append((index, offset, seconds))
        filled += seconds
    return apply_noise(cut, noise, snr, pieces), tuple(pieces)


def apply_noise(
    cut: Cut, noise: Sequence[Cut], snr: float, pieces: Sequence[tuple[int, float, float]]
) -> Cut:
    """`cut` mixed with the noise `pieces` (index, offset, seconds) end to end at `snr`."""
    mixed, filled = cut, 0.0
    for index, offset, seconds in pieces:
        piece = noise[index]
        if offset > 0 or seconds < piece.duration:
            piece = piece.truncate(offset=offset, duration=seconds, preserve_id=True)
        mixed = mixed.mix(piece, offset_other_by=filled, snr=snr, preserve_id="left")
        filled += seconds
    if mixed.duration > cut.duration:  # float sums may overshoot by a sample
        mixed = mixed.truncate(duration=cut.duration, preserve_id=True)
    return mixed


@dataclass
class CutAugmenter:
    """Draws and applies `config`'s transforms per cut (see the module docstring).
    `noise` and `rirs` are the pools (`load_noise`, `load_rirs`)."""

    config: AugmentConfig
    seed: int = 0
    noise: list[Cut] = field(default_factory=list)
    rirs: list[Recording] = field(default_factory=list)

    @classmethod
    def from_config(cls, config: AugmentConfig, seed: int) -> CutAugmenter:
        """Load and check the noise and impulse-response manifests (at start-up)."""
        noise = load_noise(config.noise.cuts) if config.noise is not None else []
        rirs = load_rirs(config.reverb.rirs) if config.reverb is not None else []
        if noise or rirs:
            log.info("augmentation: %d noise cuts, %d impulse responses", len(noise), len(rirs))
        return cls(config, seed, noise, rirs)

    def durations_only(self) -> CutAugmenter | None:
        """The transforms that change a cut's duration (speed), drawn as here; None if
        there is none. What a sampler needs to plan batches without the audio's changes."""
        if self.config.speed is None:
            return None
        return CutAugmenter(AugmentConfig(speed=self.config.speed), self.seed)

    def __call__(self, cut: Cut, epoch: int) -> Cut:
        """`cut` augmented for `epoch` (its id unchanged)."""
        return self.apply(cut, epoch)[0]

    def apply(self, cut: Cut, epoch: int) -> tuple[Cut, Draw]:
        """`cut` augmented for `epoch`, and what was drawn."""
        cfg, draw = self.config, {}
        if cfg.speed is not None:
            factor = float(cut_rng(self.seed, epoch, cut.id, SPEED).choice(cfg.speed.factors))
            if factor != 1.0:
                cut = cut.perturb_speed(factor, affix_id=False)
                draw["speed"] = factor
        if cfg.volume is not None:
            rng = cut_rng(self.seed, epoch, cut.id, VOLUME)
            if rng.random() < cfg.volume.p:
                low, high = np.log(cfg.volume.scale)
                draw["volume"] = float(np.exp(rng.uniform(low, high)))
                cut = cut.perturb_volume(draw["volume"], affix_id=False)
        if cfg.reverb is not None:
            rng = cut_rng(self.seed, epoch, cut.id, REVERB)
            if rng.random() < cfg.reverb.p:
                rooms = (self.seed, cfg.reverb.rooms)
                cut, draw["reverb"] = reverberate(cut, self.rirs, rng, rooms)
        if cfg.noise is not None:
            rng = cut_rng(self.seed, epoch, cut.id, NOISE)
            if rng.random() < cfg.noise.p:
                draw["snr"] = float(rng.uniform(*cfg.noise.snr))
                cut, draw["noise"] = mix_noise(cut, self.noise, draw["snr"], rng)
        return cut, Draw(**draw)


def reverberate(
    cut: Cut, rirs: Sequence[Recording], rng: np.random.Generator, rooms: tuple[int, int]
) -> tuple[Cut, int]:
    """`cut` convolved with an impulse response drawn from `rirs`, or, when `rirs` is
    empty, with that of a generated room drawn from `rooms` = (seed, count): the seed's
    rooms 0 .. count - 1 (its energy kept); also what was drawn."""
    if rirs:
        index = int(rng.integers(len(rirs)))
        return cut.reverb_rir(rirs[index], affix_id=False), index
    seed, count = rooms
    room = int(rng.integers(count))
    room_seed, source_seed = (
        int(s) for s in np.random.default_rng([seed, REVERB, room]).integers(2**31, size=2)
    )
    recording = cut.recording
    reverb = GeneratedRoomReverb(room_seed, source_seed)
    transforms = [*(recording.transforms or []), reverb]
    return fastcopy(cut, recording=fastcopy(recording, transforms=transforms)), room


@functools.lru_cache(maxsize=4096)
def generated_rir(room_seed: int, source_seed: int, sampling_rate: int) -> np.ndarray:
    """The (1, samples) impulse response of lhotse's `FastRandomRIRGenerator` for these
    seeds, the same at every call (see `GeneratedRoomReverb`); kept once made."""
    generator = FastRandomRIRGenerator(
        sr=sampling_rate, room_seed=room_seed, source_seed=source_seed
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # it scatter-adds reflections in an order threads change
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(source_seed)
            rir = generator(nsource=1)
    finally:
        torch.set_num_threads(threads)
    rir.setflags(write=False)
    return rir


@dataclass
class GeneratedRoomReverb(AudioTransform):
    """lhotse's reverberation in a room its `FastRandomRIRGenerator` makes up, the same
    room at every call for the same seeds. lhotse's own (`reverb_rir()` without an impulse
    response) is not reproducible: its generator keeps drawing from its seeded state call
    after call, draws part of each room from torch's global generator, and adds up
    reflections in an order that depends on torch's threads. Here the generator starts
    afresh, with torch's generator seeded, on one thread (`generated_rir`)."""

    room_seed: int
    source_seed: int

    def __call__(self, samples: np.ndarray, sampling_rate: int) -> np.ndarray:
        rir = generated_rir(self.room_seed, self.source_seed, sampling_rate)
        reverb = ReverbWithImpulseResponse(rir_generator=lambda nsource: rir)
        return reverb(samples, sampling_rate)

    def reverse_timestamps(
        self, offset: float, duration: float | None, sampling_rate: int
    ) -> tuple[float, float | None]:
        """Reverberation keeps the timing."""
        return offset, duration


# ---------------------------------------------------------------------------------------
# asr-mix-noise: a noisy or reverberant copy of a test set


def noisy_copy(
    cuts_path: str | Path,
    output: str | Path,
    *,
    noise: Sequence[str] = (),
    snr: float | None = None,
    reverb: bool = False,
    rirs: Sequence[str] = (),
    seed: int = 0,
    audio_dir: str | Path | None = None,
) -> int:
    """Write `output`: every cut of `cuts_path` reverberated (if `reverb`) and mixed with
    noise from `noise` at `snr` dB, its audio stored as 16-bit FLAC under `audio_dir`
    (default: beside `output`, in a folder named after it). Scaled down where the mix
    would clip. Same seed, same audio. The number of cuts written."""
    if snr is None and not reverb:
        raise ValueError("nothing to do: give --snr (with --noise) and/or --reverb")
    if snr is not None and not noise:
        raise ValueError("--snr needs --noise: the noise cut manifests to mix in")
    config = AugmentConfig(
        reverb=ReverbConfig(rirs=tuple(rirs), p=1.0) if reverb else None,
        noise=NoiseConfig(cuts=tuple(noise), snr=(snr, snr), p=1.0) if snr is not None else None,
    )
    augmenter = CutAugmenter.from_config(config, seed)
    output = Path(output)
    name = output.name.removesuffix(".gz").removesuffix(".jsonl")
    audio_dir = Path(audio_dir) if audio_dir is not None else output.parent / name
    audio_dir.mkdir(parents=True, exist_ok=True)
    source = _load_cut_manifest(str(cuts_path), "--cuts")
    tmp = output.with_name(output.name.replace(".jsonl", ".tmp.jsonl"))
    with CutSet.open_writer(tmp) as writer:
        for cut in track(source, description=f"Mixing {name}"):
            writer.write(_stored(augmenter(cut, epoch=0), cut, audio_dir))
    tmp.replace(output)
    return len(source)


def _stored(mixed: Cut, clean: Cut, audio_dir: Path) -> MonoCut:
    """`mixed`'s audio written to `audio_dir/<id>.flac`; a cut of it with `clean`'s
    supervisions (the same timing: neither noise nor reverberation shifts speech, and a
    supervision's start is relative to its cut, which the copy keeps)."""
    audio = mixed.load_audio()[0]
    peak = float(np.abs(audio).max(initial=0.0))
    if peak > 0.99:
        audio = audio * (0.99 / peak)
    path = audio_dir / f"{clean.id}.flac"
    sf.write(path, audio, clean.sampling_rate, format="FLAC", subtype="PCM_16")
    recording = Recording.from_file(path, recording_id=clean.id)
    supervisions = [fastcopy(s, recording_id=recording.id) for s in clean.supervisions]
    return MonoCut(
        id=clean.id,
        start=0.0,
        duration=recording.duration,
        channel=0,
        recording=recording,
        supervisions=supervisions,
        custom=clean.custom,
    )


@command
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Write a noisy and/or reverberant copy of a cut manifest (a test set)."
    )
    parser.add_argument("cuts", type=Path, help="cut manifest of the clean speech")
    parser.add_argument("-o", "--output", type=Path, required=True, help="cut manifest to write")
    parser.add_argument("--noise", nargs="+", default=[], help="noise cut manifests")
    parser.add_argument("--snr", type=float, help="signal-to-noise ratio, dB")
    parser.add_argument(
        "--reverb", action="store_true", help="reverberate (before the noise is added)"
    )
    parser.add_argument(
        "--rirs", nargs="+", default=[], help="impulse-response manifests (default: generated)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--audio-dir", type=Path, help="default: beside the output manifest")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    count = noisy_copy(
        args.cuts, args.output, noise=args.noise, snr=args.snr, reverb=args.reverb,
        rirs=args.rirs, seed=args.seed, audio_dir=args.audio_dir,
    )  # fmt: skip
    print(f"wrote {args.output}: {count} cuts")


if __name__ == "__main__":
    main()
