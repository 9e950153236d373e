"""On-the-fly augmentation (asr.data.augment) on the tiny corpus's speech: the SNR heard,
reverberation's decay, speed's durations, the sampler's budgets, draws keyed by (seed,
epoch, cut id), and the start-up checks of the noise and impulse-response manifests."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from lhotse import CutSet, Recording, RecordingSet
from lhotse.cut import MixedCut

from asr.config_keys import ConfigError
from asr.data.augment import (
    AugmentConfig,
    CutAugmenter,
    NoiseConfig,
    ReverbConfig,
    SpeedConfig,
    VolumeConfig,
    generated_rir,
    main,
    noisy_copy,
)
from asr.data.bins import bin_index
from asr.data.buckets import build_sampler
from asr.data.corpus import load_cuts
from asr.data.datamodule import AsrDataModule
from asr.data.dataset import UNREADABLE, AsrDataset
from asr.data.features import FeatureConfig
from asr.data.rank_sync import ResumePosition, simulate_ranks
from asr.frames import SAMPLE_RATE

TRAIN = "train-clean-100"


def _write(path: Path, audio: np.ndarray) -> Path:
    sf.write(path, audio.astype(np.float32), SAMPLE_RATE)
    return path


@pytest.fixture(scope="module")
def noise_manifest(tmp_path_factory) -> Path:
    """Two noise recordings: 0.7 s of white noise (shorter than every utterance, so that
    several are laid end to end) and 6 s of a 1/f-shaped one."""
    root = tmp_path_factory.mktemp("noise")
    rng = np.random.default_rng(0)
    white = _write(root / "white.flac", rng.normal(0, 0.1, int(0.7 * SAMPLE_RATE)))
    spectrum = np.fft.rfft(rng.normal(0, 1, 6 * SAMPLE_RATE))
    spectrum /= np.sqrt(np.maximum(np.arange(len(spectrum)), 1))
    pink = np.fft.irfft(spectrum)
    pink_path = _write(root / "pink.flac", 0.1 * pink / np.abs(pink).max())
    cuts = CutSet.from_cuts(Recording.from_file(p).to_cut() for p in (white, pink_path))
    path = root / "noise_cuts.jsonl.gz"
    cuts.to_file(path)
    return path


@pytest.fixture(scope="module")
def speech(tiny_corpus) -> CutSet:
    return load_cuts(tiny_corpus.cuts(TRAIN)).to_eager()


def _augmenter(noise_manifest: Path, **config) -> CutAugmenter:
    return CutAugmenter.from_config(AugmentConfig(**config), seed=3)


def _energy(audio: np.ndarray) -> float:
    return float(np.sum(audio.astype(np.float64) ** 2))


def test_the_snr_of_the_output_is_the_drawn_one(speech, noise_manifest) -> None:
    """Over speech reverberated, sped up and scaled, the noise added is `snr` dB below the
    speech, measured on the audio (within 0.5 dB); every other draw is the same with noise
    on or off (each transform has its own random stream)."""
    others = {"speed": SpeedConfig(), "volume": VolumeConfig(), "reverb": ReverbConfig(p=0.5)}
    noise = NoiseConfig(cuts=(str(noise_manifest),), snr=(0.0, 20.0), p=1.0)
    noisy = _augmenter(noise_manifest, **others, noise=noise)
    clean = _augmenter(noise_manifest, **others)
    measured = []
    for epoch in range(2):
        for cut in list(speech)[:6]:
            mixed, draw = noisy.apply(cut, epoch)
            reference, clean_draw = clean.apply(cut, epoch)
            assert dataclasses.replace(draw, snr=None, noise=()) == clean_draw
            assert isinstance(mixed, MixedCut) and mixed.id == cut.id
            assert mixed.duration == pytest.approx(reference.duration, abs=1e-6)
            out, ref = mixed.load_audio()[0], reference.load_audio()[0]
            snr = 10 * np.log10(_energy(ref) / _energy(out - ref))
            assert snr == pytest.approx(draw.snr, abs=0.5), (cut.id, epoch, draw)
            measured.append(draw.snr)
    assert max(measured) - min(measured) > 5  # drawn over the range, not one value


def test_noise_shorter_than_the_utterance_covers_it_end_to_end(speech, noise_manifest) -> None:
    noise = NoiseConfig(cuts=(str(noise_manifest),), p=1.0)
    augmenter = _augmenter(noise_manifest, noise=noise)
    cut = max(speech, key=lambda c: c.duration)
    mixed, draw = augmenter.apply(cut, 0)
    assert sum(seconds for _, _, seconds in draw.noise) == pytest.approx(cut.duration, abs=0.06)
    out = mixed.load_audio()[0] - cut.load_audio()[0]
    tenths = out[: len(out) // 1600 * 1600].reshape(-1, 1600)  # 0.1 s frames
    assert (np.sqrt((tenths**2).mean(axis=1)) > 1e-4).all()  # no stretch without noise


def _decay_seconds(audio: np.ndarray, drop_db: float = 30.0) -> float:
    """Seconds from the loudest 5 ms frame until the energy stays `drop_db` below it."""
    frame = SAMPLE_RATE // 200
    energy = (audio[: len(audio) // frame * frame].reshape(-1, frame) ** 2).mean(axis=1)
    db = 10 * np.log10(energy + 1e-20)
    peak = int(np.argmax(db))
    above = np.nonzero(db[peak:] > db[peak] - drop_db)[0]
    return (above[-1] + 1) * frame / SAMPLE_RATE


def test_reverberation_lengthens_the_energy_decay(tmp_path) -> None:
    """A 2 ms click in silence: dry, its energy falls 30 dB within 10 ms; reverberated in a
    generated room, or by a recorded impulse response with a 0.3 s decay, it takes far
    longer (the recorded one: about the response's own decay)."""
    click = np.zeros(SAMPLE_RATE)
    click[4000:4032] = np.hanning(32)
    cut = Recording.from_file(_write(tmp_path / "click.flac", click)).to_cut()
    dry = _decay_seconds(cut.load_audio()[0])
    generated = _augmenter(tmp_path, reverb=ReverbConfig(p=1.0))
    wet = [_decay_seconds(generated(cut, epoch).load_audio()[0]) for epoch in range(3)]
    assert dry < 0.01
    assert min(wet) > 5 * dry and min(wet) > 0.03, wet
    t = np.arange(int(0.5 * SAMPLE_RATE)) / SAMPLE_RATE
    rng = np.random.default_rng(1)
    rt30 = 0.3  # seconds for the response to fall 30 dB
    rir = rng.normal(0, 1, len(t)) * 10 ** (-30 / 20 * t / rt30)
    rir_path = _write(tmp_path / "rir.flac", 0.5 * rir / np.abs(rir).max())
    rirs = tmp_path / "rirs.jsonl.gz"
    RecordingSet.from_recordings([Recording.from_file(rir_path)]).to_file(rirs)
    recorded = _augmenter(tmp_path, reverb=ReverbConfig(rirs=(str(rirs),), p=1.0))
    decay = _decay_seconds(recorded(cut, 0).load_audio()[0])
    assert decay == pytest.approx(rt30, abs=0.08)


def test_generated_rooms_come_from_a_pool_made_once(speech) -> None:
    """Rooms are drawn from `rooms` of them: the same number, the same impulse response
    (made once per process), another run seed, other rooms."""
    augmenter = CutAugmenter(AugmentConfig(reverb=ReverbConfig(rooms=2, p=1.0)), seed=4)
    rooms = {}
    generated_rir.cache_clear()
    for cut in speech:
        changed, draw = augmenter.apply(cut, 0)
        (reverb,) = changed.recording.transforms
        rooms.setdefault(draw.reverb, set()).add((reverb.room_seed, reverb.source_seed))
        changed.load_audio()
    assert set(rooms) == {0, 1} and all(len(seeds) == 1 for seeds in rooms.values())
    assert generated_rir.cache_info().currsize == 2
    other = CutAugmenter(AugmentConfig(reverb=ReverbConfig(rooms=2, p=1.0)), seed=5)
    (reverb,) = other(next(iter(speech)), 0).recording.transforms
    assert (reverb.room_seed, reverb.source_seed) not in set.union(*rooms.values())


def test_speed_factors_change_durations_as_stated(speech) -> None:
    augmenter = CutAugmenter(AugmentConfig(speed=SpeedConfig(factors=(0.9, 1.0, 1.1))))
    seen = Counter()
    for epoch in range(3):
        for cut in speech:
            changed, draw = augmenter.apply(cut, epoch)
            factor = draw.speed or 1.0
            seen[factor] += 1
            assert changed.id == cut.id
            assert changed.duration == pytest.approx(cut.duration / factor, abs=2 / SAMPLE_RATE)
            assert changed.load_audio().shape[1] == changed.num_samples
            supervision = changed.supervisions[0]
            assert supervision.duration == pytest.approx(
                cut.supervisions[0].duration / factor, abs=2 / SAMPLE_RATE
            )
    assert set(seen) == {0.9, 1.0, 1.1}
    assert min(seen.values()) > 0.2 * sum(seen.values())  # about a third each


def _batches(sampler) -> list[list]:
    sampler.set_epoch(0)
    return [list(batch) for batch in sampler]


def test_slowed_cuts_are_bucketed_and_budgeted_by_their_own_duration(speech, tokenizer) -> None:
    """All cuts slowed to 0.9: every cut a batch holds is 1/0.9 longer than in the manifest,
    and the budgets count that length. With max_duration, lhotse's limit is soft (a batch
    closes once a cut has crossed it, augmented or not), so a batch without its last cut
    is within it; with fixed batch sizes (the OOM prober's budgets) every cut lies in its
    batch's buckets by its slowed duration (one, or adjacent ones at the epoch's end) and no
    batch exceeds the batch size of any of them."""
    slow = CutAugmenter(AugmentConfig(speed=SpeedConfig(factors=(0.9,))))
    original = {cut.id: cut.duration for cut in speech}
    budget = {"max_duration": 12.0, "max_cut_duration": 10.0, "num_buckets": 3, "seed": 1}
    batches = _batches(build_sampler(speech, budget, augmenter=slow))
    assert sum(len(b) for b in batches) > 0
    for batch in batches:
        for cut in batch:
            assert cut.duration == pytest.approx(original[cut.id] / 0.9, abs=1e-3)
        assert (len(batch) - 1) * max(c.duration for c in batch[:-1] or batch) <= 12.0
    longest = max(original.values()) / 0.9
    bins = [2.0, 3.0, round(longest + 0.1, 2)]
    fixed = {"bucket_duration_bins": bins, "bucket_batch_size": [6, 4, 3], "seed": 1}
    fixed["max_cut_duration"] = 30.0
    sampler = build_sampler(speech, fixed, augmenter=slow, tokenizer=tokenizer)
    for batch in _batches(sampler):
        buckets = {bin_index(bins, cut.duration) for cut in batch}
        assert max(buckets) < len(bins)
        assert len(batch) <= min(fixed["bucket_batch_size"][b] for b in buckets)


def _draws(sampler, augmenter: CutAugmenter, epoch: int) -> list:
    sampler.set_epoch(epoch)
    return [(cut.id, cut.to_dict()) for batch in sampler for cut in batch]


def test_draws_follow_seed_epoch_and_cut_id_and_resume_mid_epoch(speech, noise_manifest) -> None:
    """The same (seed, epoch) gives the same augmented cuts in the same batches, from the
    start or resumed after 3 steps; another epoch draws otherwise; the two ranks of a
    2-process run share no cut and no noise draw."""
    config = AugmentConfig(
        speed=SpeedConfig(),
        reverb=ReverbConfig(p=0.5),
        noise=NoiseConfig(cuts=(str(noise_manifest),), snr=(0.0, 20.0), p=0.8),
    )
    augmenter = CutAugmenter.from_config(config, seed=5)
    budget = {"max_duration": 8.0, "max_cut_duration": 8.0, "num_buckets": 2, "seed": 5}
    first = _draws(build_sampler(speech, budget, augmenter=augmenter), augmenter, 1)
    again = _draws(build_sampler(speech, budget, augmenter=augmenter), augmenter, 1)
    assert first == again
    other = dict(_draws(build_sampler(speech, budget, augmenter=augmenter), augmenter, 2))
    assert sum(other[i] != d for i, d in first) > len(first) // 2
    resumed = build_sampler(speech, budget, augmenter=augmenter)
    resumed.resume_from(ResumePosition(epoch=1, steps_done=3, world_size=1))
    tail = [(cut.id, cut.to_dict()) for batch in resumed for cut in batch]
    assert tail and len(tail) < len(first) and tail == first[len(first) - len(tail) :]
    ranks, by_id = [], {cut.id: cut for cut in speech}
    samplers = [
        build_sampler(speech, budget, rank=rank, world_size=2, augmenter=augmenter)
        for rank in range(2)
    ]
    steps = list(simulate_ranks(samplers, epoch=1, cut_lists=False))
    for rank in range(2):
        ids = {c.id for step in steps for c in step[rank]}
        ranks.append({i: augmenter.apply(by_id[i], 1)[1] for i in ids})
    assert not set(ranks[0]) & set(ranks[1])
    snrs = [{d.snr for d in r.values() if d.snr is not None} for r in ranks]
    assert snrs[0] and snrs[1] and not snrs[0] & snrs[1]


def test_the_dataset_reads_augmented_audio_and_skips_a_lost_noise_file(
    speech, tokenizer, tmp_path
) -> None:
    rng = np.random.default_rng(2)
    noise_file = _write(tmp_path / "hum.flac", rng.normal(0, 0.1, 3 * SAMPLE_RATE))
    manifest = tmp_path / "noise.jsonl.gz"
    CutSet.from_cuts([Recording.from_file(noise_file).to_cut()]).to_file(manifest)
    noise = NoiseConfig(cuts=(str(manifest),), p=1.0)
    augmenter = CutAugmenter.from_config(AugmentConfig(noise=noise), seed=0)
    cuts = CutSet.from_cuts(augmenter(cut, 0) for cut in list(speech)[:3])
    dataset = AsrDataset(tokenizer, FeatureConfig())
    clean = dataset[CutSet.from_cuts(list(speech)[:3])]
    batch = dataset[cuts]
    assert batch.cut_ids == clean.cut_ids and not batch.skipped
    assert batch.features.shape == clean.features.shape
    assert not np.allclose(batch.features.numpy(), clean.features.numpy())
    noise_file.unlink()  # lost after start-up: each cut is skipped and counted, naming it
    batch = dataset[cuts]
    assert len(batch.skipped[UNREADABLE]) == 3 and not batch.cut_ids
    assert "hum.flac" in batch.first_fault


def test_bad_noise_and_impulse_response_manifests_fail_at_start_up(tmp_path, speech) -> None:
    def noise_error(path) -> str:
        with pytest.raises(ConfigError) as err:
            CutAugmenter.from_config(AugmentConfig(noise=NoiseConfig(cuts=(str(path),))), 0)
        message = str(err.value)
        assert "\n" not in message and str(path) in message
        return message

    assert "does not exist" in noise_error(tmp_path / "missing.jsonl.gz")
    CutSet.from_cuts([]).to_file(tmp_path / "empty.jsonl.gz")
    assert "holds no cuts" in noise_error(tmp_path / "empty.jsonl.gz")
    (tmp_path / "text.jsonl").write_text("this is not json\n")
    assert "not a lhotse manifest" in noise_error(tmp_path / "text.jsonl")
    corrupt = tmp_path / "corrupt.flac"
    _write(corrupt, np.zeros(SAMPLE_RATE))
    recording = Recording.from_file(corrupt)
    corrupt.write_bytes(b"fLaC" + bytes(200))
    CutSet.from_cuts([recording.to_cut()]).to_file(tmp_path / "corrupt.jsonl.gz")
    assert "cannot be read" in noise_error(tmp_path / "corrupt.jsonl.gz")
    recordings = tmp_path / "recordings.jsonl.gz"
    RecordingSet.from_recordings([recording]).to_file(recordings)
    assert "not a cut manifest" in noise_error(recordings)
    with pytest.raises(ConfigError, match="reverb.rirs: .*missing.jsonl.gz does not exist"):
        CutAugmenter.from_config(AugmentConfig(reverb=ReverbConfig(rirs=("missing.jsonl.gz",))), 0)


@pytest.mark.parametrize(
    ("make", "key"),
    [
        (lambda: NoiseConfig(cuts=("n",), snr=(20.0, 10.0)), "data.augment.noise.snr"),
        (lambda: NoiseConfig(cuts=("n",), snr=(10.0,)), "data.augment.noise.snr"),
        (lambda: NoiseConfig(cuts=("n",), snr=("ten", 20)), "data.augment.noise.snr"),
        (lambda: NoiseConfig(cuts=("n",), p=1.5), "data.augment.noise.p"),
        (lambda: NoiseConfig(cuts=()), "data.augment.noise.cuts"),
        (lambda: SpeedConfig(factors=()), "data.augment.speed.factors"),
        (lambda: SpeedConfig(factors=(0.0, 1.0)), "data.augment.speed.factors"),
        (lambda: SpeedConfig(factors=(1.0, float("nan"))), "data.augment.speed.factors"),
        (lambda: SpeedConfig(factors=1.1), "data.augment.speed.factors"),
        (lambda: VolumeConfig(scale=(0.0, 2.0)), "data.augment.volume.scale"),
        (lambda: ReverbConfig(p=-0.1), "data.augment.reverb.p"),
        (lambda: ReverbConfig(rooms=0), "data.augment.reverb.rooms"),
    ],
)
def test_nonsensical_settings_are_refused_naming_the_key(make, key) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as err:
        make()
    assert "\n" not in str(err.value)


def test_augmentation_needs_audio_not_stored_features(tiny_corpus, noise_manifest) -> None:
    noise = {"noise": {"cuts": [str(noise_manifest)]}}
    with pytest.raises(ConfigError, match="data.features.source=on_the_fly"):
        AsrDataModule(
            train_cuts=[str(tiny_corpus.cuts(TRAIN))], valid_cuts=[],
            features={"source": "precomputed"}, augment=noise,
        )  # fmt: skip
    module = AsrDataModule(
        train_cuts=[str(tiny_corpus.cuts(TRAIN))], valid_cuts=[], augment=noise,
        sampler={"max_duration": 10, "max_cut_duration": 10, "num_buckets": 2},
    )  # fmt: skip
    assert module.augmenter is not None and len(module.augmenter.noise) == 2
    assert module.count_train_batches() > 0


def test_mix_noise_writes_a_noisy_copy_at_the_snr(tiny_corpus, noise_manifest, tmp_path, capsys):
    out = tmp_path / "manifests" / "test-snr5.jsonl.gz"
    args = [str(tiny_corpus.cuts(TRAIN)), "-o", str(out), "--noise", str(noise_manifest)]
    main([*args, "--snr", "5", "--reverb", "--seed", "1"])
    assert "wrote" in capsys.readouterr().out
    clean = {cut.id: cut for cut in load_cuts(tiny_corpus.cuts(TRAIN))}
    noisy = list(load_cuts(out))
    assert [c.id for c in noisy] == list(clean)
    first = noisy[0]
    assert Path(first.recording.sources[0].source).parent == tmp_path / "manifests" / "test-snr5"
    assert first.supervisions[0].text == clean[first.id].supervisions[0].text
    assert first.duration == pytest.approx(clean[first.id].duration, abs=1e-3)
    # the noise alone (without reverberation) is measured against reverberated speech
    again = tmp_path / "again.jsonl.gz"
    noisy_copy(tiny_corpus.cuts(TRAIN), again, noise=[str(noise_manifest)], snr=5.0, seed=1)
    noisy_copy(tiny_corpus.cuts(TRAIN), tmp_path / "b.jsonl.gz", noise=[str(noise_manifest)],
               snr=5.0, seed=1)  # fmt: skip
    a = next(iter(load_cuts(again))).load_audio()[0]
    b = next(iter(load_cuts(tmp_path / "b.jsonl.gz"))).load_audio()[0]
    assert np.array_equal(a, b)  # same seed, same audio
    speech = clean[first.id].load_audio()[0]
    snr = 10 * np.log10(_energy(speech) / _energy(a - speech))
    assert snr == pytest.approx(5.0, abs=0.5)
    with pytest.raises(ValueError, match="--snr needs --noise"):
        noisy_copy(tiny_corpus.cuts(TRAIN), again, snr=5.0)


def test_a_noisy_copy_keeps_the_supervisions_of_a_cut_that_starts_late(
    speech, noise_manifest, tmp_path
):
    """A segment of a long recording (the cut starts at 5 s): its supervision times are
    relative to the cut, and so are the noisy copy's, which starts at 0."""
    from lhotse import SupervisionSegment

    utterance = speech[0].load_audio()[0]
    long = _write(tmp_path / "long.flac", np.concatenate([np.zeros(5 * SAMPLE_RATE), utterance]))
    recording = Recording.from_file(long, recording_id="long")
    segment = recording.to_cut().truncate(offset=5.0, duration=len(utterance) / SAMPLE_RATE)
    supervision = SupervisionSegment(
        "long-seg", "long", start=0.25, duration=segment.duration - 0.5, text="A WORD"
    )
    segment = dataclasses.replace(segment, id="long-seg", supervisions=[supervision])
    assert segment.start == 5.0
    clean = tmp_path / "clean.jsonl.gz"
    CutSet.from_cuts([segment]).to_file(clean)
    noisy_copy(clean, tmp_path / "noisy.jsonl.gz", noise=[str(noise_manifest)], snr=10.0)
    (copy,) = load_cuts(tmp_path / "noisy.jsonl.gz")
    assert copy.start == 0.0 and copy.duration == pytest.approx(segment.duration, abs=1e-3)
    (kept,) = copy.supervisions
    assert (kept.start, kept.duration, kept.text) == (0.25, supervision.duration, "A WORD")
