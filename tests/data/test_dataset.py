import logging
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from lhotse import CutSet
from lhotse.audio import AudioSource
from lhotse.cut import Cut
from lhotse.utils import compute_num_frames

from asr.data.corpus import load_cuts
from asr.data.datamodule import AsrDataModule
from asr.data.dataset import AsrDataset
from asr.data.features import FeatureConfig
from asr.frames import subsampled_length
from asr.tokens import PAD_ID

DEV = "dev-clean"


@pytest.fixture(scope="module")
def dev_cuts(tiny_corpus) -> CutSet:
    return load_cuts(tiny_corpus.cuts(DEV)).to_eager()


def _with_text(cut: Cut, text: str, cut_id: str) -> Cut:
    return replace(cut, id=cut_id, supervisions=[replace(cut.supervisions[0], text=text)])


def _with_audio_file(cut: Cut, path: Path, cut_id: str) -> Cut:
    source = AudioSource(type="file", channels=[0], source=str(path))
    return replace(cut, id=cut_id, recording=replace(cut.recording, sources=[source]))


def test_batch_shapes_padding_and_lengths(dev_cuts: CutSet, tokenizer) -> None:
    cuts = dev_cuts.subset(first=4)
    batch = AsrDataset(tokenizer)[cuts]
    frames = [compute_num_frames(c.duration, 0.01, 16_000) for c in cuts]
    texts = [c.supervisions[0].text for c in cuts]
    token_ids = [tokenizer.encode(t) for t in texts]
    assert len(set(frames)) > 1 and len({len(t) for t in token_ids}) > 1  # padding happens

    assert len(batch) == 4 and batch.cut_ids == list(cuts.ids) and batch.texts == texts
    assert batch.skipped == {}
    assert batch.features.shape == (4, max(frames), 80)
    assert batch.features.dtype == torch.float32
    assert batch.feature_lens.tolist() == frames
    assert batch.tokens.shape == (4, max(map(len, token_ids)))
    assert batch.token_lens.tolist() == [len(t) for t in token_ids]
    for i, (n, ids) in enumerate(zip(frames, token_ids, strict=True)):
        assert batch.features[i, n:].abs().sum() == 0
        assert batch.features[i, :n].abs().sum(dim=1).min() > 0
        # per-utterance normalization: each bin has mean 0 over the utterance's frames
        assert batch.features[i, :n].mean(dim=0).abs().max() < 1e-3
        assert batch.tokens[i, : len(ids)].tolist() == ids
        assert (batch.tokens[i, len(ids) :] == PAD_ID).all()


def test_precomputed_features_agree_with_on_the_fly(
    feature_manifests: dict[str, Path], dev_cuts: CutSet, tokenizer
) -> None:
    stored = load_cuts(feature_manifests[DEV]).to_eager()
    assert all(c.has_features for c in stored) and not any(c.has_features for c in dev_cuts)
    on_the_fly = AsrDataset(tokenizer, FeatureConfig(source="on_the_fly"))[dev_cuts]
    precomputed = AsrDataset(tokenizer, FeatureConfig(source="precomputed"))[stored]
    assert precomputed.cut_ids == on_the_fly.cut_ids
    assert torch.equal(precomputed.feature_lens, on_the_fly.feature_lens)
    assert torch.equal(precomputed.tokens, on_the_fly.tokens)
    # lilcom storage is lossy: normalized features differ by ~1e-3 on average
    diff = (precomputed.features - on_the_fly.features).abs()
    assert diff.max() < 0.05 and diff.mean() < 0.005


def test_spec_augment_only_in_training(tiny_corpus, dev_cuts: CutSet, tokenizer) -> None:
    manifest = str(tiny_corpus.cuts(DEV))
    dm = AsrDataModule(
        train_cuts=[manifest],
        valid_cuts=[manifest],
        tokenizer=str(tiny_corpus.tokenizer),
        spec_augment={"num_frame_masks": 2, "frames_mask_size": 20, "p": 1.0},
        sampler={"max_duration": 10, "max_cut_duration": 10, "num_buckets": 2},
        valid_max_duration=10,
        num_workers=0,
    )
    random.seed(0)
    torch.manual_seed(0)
    train, valid = _features_by_cut(dm.train_dataloader()), _features_by_cut(dm.val_dataloader())
    plain = _features_by_cut([AsrDataset(tokenizer)[dev_cuts]])
    assert sorted(train) == sorted(plain)
    assert len(valid) > 0 and set(valid) <= set(plain)
    for cut_id, feats in valid.items():
        assert torch.equal(feats, plain[cut_id]), cut_id
    for cut_id, feats in train.items():
        assert feats.shape == plain[cut_id].shape
        changed = feats != plain[cut_id]
        assert changed.any() and not changed.all(), f"{cut_id}: masks hide a part, not all"


def _features_by_cut(batches) -> dict[str, torch.Tensor]:
    return {
        cut_id: batch.features[i, : batch.feature_lens[i]]
        for batch in batches
        for i, cut_id in enumerate(batch.cut_ids)
    }


def test_bad_cuts_are_skipped_counted_and_the_rest_survive(
    dev_cuts: CutSet, tokenizer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = list(dev_cuts.subset(first=3))
    garbage = tmp_path / "garbage.flac"
    garbage.write_bytes(b"not audio at all" * 100)
    # 0.3 s -> 30 frames -> 8 encoder frames at x4: fewer than the transcript's tokens
    short = replace(good[1].truncate(duration=0.3), id="too-many-tokens")
    assert len(tokenizer.encode(short.supervisions[0].text)) > subsampled_length(30, 4)
    bad = [
        _with_audio_file(good[0], garbage, "unreadable"),
        _with_audio_file(good[0], tmp_path / "missing.flac", "missing-file"),
        _with_text(good[0], "", "empty"),
        _with_text(good[0], "   ", "blank"),
        _with_text(good[0], "SWIM 42 TIMES", "digits"),
        short,
    ]
    cuts = CutSet.from_cuts([good[0], *bad[:3], good[1], *bad[3:], good[2]])
    with caplog.at_level(logging.WARNING, logger="asr.data.dataset"):
        batch = AsrDataset(tokenizer, subsampling_factor=4)[cuts]
    assert batch.cut_ids == [c.id for c in good]
    assert batch.skipped == {
        "unreadable audio": ["unreadable", "missing-file"],
        "empty transcript": ["empty", "blank"],
        "character outside the tokenizer": ["digits"],
        "more tokens than encoder frames": ["too-many-tokens"],
    }
    assert batch.features.shape[0] == batch.tokens.shape[0] == 3
    for cut in bad:
        assert f"skipping cut {cut.id}" in caplog.text


def test_token_limit_follows_the_subsampling_factor(dev_cuts: CutSet, tokenizer) -> None:
    def fits(cut: Cut, factor: int) -> bool:
        frames = compute_num_frames(cut.duration, 0.01, 16_000)
        return len(tokenizer.encode(cut.supervisions[0].text)) <= subsampled_length(frames, factor)

    # a cut whose transcript fits the encoder frames at x4 but not at x8
    cut = next(c for c in dev_cuts if fits(c, 4) and not fits(c, 8))
    kept = AsrDataset(tokenizer, subsampling_factor=4)[CutSet.from_cuts([cut])]
    dropped = AsrDataset(tokenizer, subsampling_factor=8)[CutSet.from_cuts([cut])]
    assert kept.cut_ids == [cut.id] and kept.skipped == {}
    assert len(dropped) == 0 and dropped.skipped == {"more tokens than encoder frames": [cut.id]}


def test_all_cuts_bad_gives_an_empty_batch(dev_cuts: CutSet, tokenizer) -> None:
    cuts = CutSet.from_cuts([_with_text(c, "", c.id) for c in dev_cuts.subset(first=2)])
    batch = AsrDataset(tokenizer)[cuts]
    assert len(batch) == 0
    assert batch.features.shape == (0, 0, 80) and batch.tokens.shape == (0, 0)
    assert batch.skipped == {"empty transcript": list(cuts.ids)}


def test_corrupt_or_missing_stored_features_are_skipped_as_unreadable(
    feature_manifests: dict[str, Path], tokenizer, tmp_path: Path
) -> None:
    stored = list(load_cuts(feature_manifests[DEV]).subset(first=3))
    truncated = tmp_path / "truncated.lca"
    truncated.write_bytes(Path(stored[0].features.storage_path).read_bytes()[:1000])
    broken = [
        replace(stored[0], features=replace(stored[0].features, storage_path=str(truncated))),
        replace(stored[1], features=replace(stored[1].features, storage_path="/nonexistent.lca")),
    ]
    batch = AsrDataset(tokenizer, FeatureConfig(source="precomputed"))[
        CutSet.from_cuts([*broken, stored[2]])
    ]
    assert batch.cut_ids == [stored[2].id]
    assert batch.skipped == {"unreadable audio": [stored[0].id, stored[1].id]}
    assert batch.first_fault.startswith(f"cut {stored[0].id}: unreadable (")


def test_an_unreadable_relative_path_names_the_directory_it_was_read_from(
    dev_cuts: CutSet, tokenizer, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cut = _with_audio_file(dev_cuts[0], Path("audio/gone.flac"), "gone")
    batch = AsrDataset(tokenizer)[CutSet.from_cuts([cut, dev_cuts[1]])]
    assert batch.cut_ids == [dev_cuts[1].id] and batch.skipped == {"unreadable audio": ["gone"]}
    assert batch.first_fault.startswith("cut gone: unreadable (")
    relative = f"a relative path, read from the working directory {tmp_path})"
    assert batch.first_fault.endswith(f"'audio/gone.flac' failed.; {relative}")


def test_a_wrong_sample_rate_stops_instead_of_skipping(dev_cuts: CutSet, tokenizer) -> None:
    cut = dev_cuts[0]
    at_8k = replace(cut, recording=replace(cut.recording, sampling_rate=8000))
    with pytest.raises(ValueError, match=rf"cut {cut.id} is 8000 Hz audio .* 16000 Hz"):
        AsrDataset(tokenizer)[CutSet.from_cuts([at_8k])]


def test_errors_that_are_not_about_one_file_propagate(
    dev_cuts: CutSet, tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Out of memory (or a bug) while loading is not a bad file: it must stop the run.
    def out_of_memory(self, *args, **kwargs):
        raise MemoryError("no memory left")

    monkeypatch.setattr(type(dev_cuts[0]), "load_audio", out_of_memory)
    with pytest.raises(MemoryError):
        AsrDataset(tokenizer)[dev_cuts.subset(first=2)]
