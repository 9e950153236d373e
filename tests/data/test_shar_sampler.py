"""Training batches from Shar shards: the epoch's plan, every cut once across ranks with
equal batch counts, cut manifests beside shards, faults skipped and counted, resume."""

import io
import logging
import shutil
import tarfile
from pathlib import Path

import pytest
from lhotse import CutSet

from asr.data.augment import AugmentConfig, CutAugmenter, SpeedConfig, VolumeConfig
from asr.data.buckets import SamplerConfig
from asr.data.corpus import load_cuts
from asr.data.dataset import UNREADABLE, AsrDataset
from asr.data.rank_sync import RankSynchronizedSampler, ResumePosition, simulate_ranks
from asr.data.shar import export_shar
from asr.data.shar_sampler import manifest_shards, open_shards, plan_epoch, shard_sampler
from tests.conftest import TRAIN, TinyCorpus

SHARD_SIZE = 7  # 30 cuts: 5 shards, an odd number (some shared by the ranks)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("num_shards", [1, 2, 5, 8, 9])
def test_the_plan_reads_every_cut_of_every_shard_once(num_shards, world_size):
    cuts_per_shard = 12  # divisible by every world size here
    for epoch in (0, 1):
        plan = plan_epoch(num_shards, world_size, seed=7, epoch=epoch)
        assert plan == plan_epoch(num_shards, world_size, seed=7, epoch=epoch)  # every rank
        taken = [
            (part.index, i)
            for parts in plan
            for part in parts
            for i in range(cuts_per_shard)
            if i % part.every == part.offset
        ]
        assert sorted(taken) == [(s, i) for s in range(num_shards) for i in range(cuts_per_shard)]
        whole = [p.index for parts in plan for p in parts if p.every == 1]
        assert len(whole) == num_shards - num_shards % world_size  # the rest are shared
    orders = {tuple(p.index for p in plan_epoch(8, 1, seed=7, epoch=e)[0]) for e in range(4)}
    assert len(orders) > 1  # shuffled per epoch


@pytest.fixture(scope="module")
def shar_dir(tiny_corpus: TinyCorpus, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shar")
    export_shar(load_cuts(tiny_corpus.cuts(TRAIN)), out, shard_size=SHARD_SIZE)
    return out


def _sampler(shards, world_size=1, rank=0, augmenter=None, **keys) -> RankSynchronizedSampler:
    keys = {"max_duration": 20, "max_cut_duration": 20, "num_buckets": 3, "seed": 1} | keys
    cfg = SamplerConfig.from_mapping(keys)
    return shard_sampler(
        shards, ["recording"], cfg, rank=rank, world_size=world_size, augmenter=augmenter
    )


def _ranks(shards, world_size, epoch=0, **keys) -> list[list[CutSet]]:
    """Each step's batches of every rank (simulated in this process, reading the audio)."""
    samplers = [_sampler(shards, world_size, rank, **keys) for rank in range(world_size)]
    return list(simulate_ranks(samplers, epoch, cut_lists=False))


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_ranks_train_every_cut_once_in_as_many_steps(shar_dir, tiny_corpus, world_size):
    shards = open_shards([str(shar_dir)], ["recording"])
    everything = sorted(c.id for c in load_cuts(tiny_corpus.cuts(TRAIN)))
    assert len(shards) == -(-len(everything) // SHARD_SIZE) and len(shards) % 2 == 1
    for epoch in (0, 1):
        steps = _ranks(shards, world_size, epoch)  # the same number of steps on every rank
        seen = [cut.id for step in steps for batch in step for cut in batch]
        assert sorted(seen) == everything  # each cut once, none lost
        for rank in range(world_size):  # each rank reads only its own shards
            plan = plan_epoch(len(shards), world_size, seed=1, epoch=epoch)[rank]
            own = {
                cut.id
                for part in plan
                for i, cut in enumerate(CutSet.from_jsonl(shards[part.index]["cuts"]))
                if i % part.every == part.offset
            }
            assert {cut.id for step in steps for cut in step[rank]} == own


def test_cut_manifests_read_beside_shards(shar_dir, tiny_corpus):
    shards = open_shards([str(shar_dir)], ["recording"])
    dev = str(tiny_corpus.cuts("dev-clean"))
    both = shards + manifest_shards([dev])
    seen = [c.id for step in _ranks(both, 2) for b in step for c in b]
    expected = [c.id for c in load_cuts(tiny_corpus.cuts(TRAIN))] + [c.id for c in load_cuts(dev)]
    assert sorted(seen) == sorted(expected)


def test_batches_carry_the_shards_audio(shar_dir, tiny_corpus, tokenizer):
    shards = open_shards([str(shar_dir)], ["recording"])
    dataset = AsrDataset(tokenizer)
    originals = {c.id: c for c in load_cuts(tiny_corpus.cuts(TRAIN))}
    batch = next(iter(_sampler(shards)))
    for cut in batch:
        assert (cut.load_audio() == originals[cut.id].load_audio()).all()  # FLAC: lossless
    loaded = dataset[batch]
    assert len(loaded) == len(batch) and not loaded.skipped


def test_resume_continues_with_the_same_batches(shar_dir):
    shards = open_shards([str(shar_dir)], ["recording"])
    whole = _sampler(shards)
    whole.set_epoch(3)
    expected = [[c.id for c in b] for b in whole]
    first = _sampler(shards)
    first.set_epoch(3)
    taken = []
    for batch in first:
        taken.append([c.id for c in batch])
        if len(taken) == 2:
            break
    position = ResumePosition(epoch=3, steps_done=2, world_size=1)  # as Lightning counted
    resumed = _sampler(shards)
    resumed.resume_from(position)
    rest = [[c.id for c in b] for b in resumed]
    assert taken + rest == expected and len(rest) > 1
    with pytest.raises(ValueError, match="data-parallel"):
        _sampler(shards, 2, 0).resume_from(position)


def _damaged_copy(shar_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "shar"
    shutil.copytree(shar_dir, copy)
    return copy


def test_faults_are_skipped_named_and_counted(shar_dir, tokenizer, tmp_path, caplog):
    copy = _damaged_copy(shar_dir, tmp_path)
    tars = sorted(copy.glob("recording.*.tar"))
    # a truncated shard, a missing one, and one whose first member is not audio
    data = tars[0].read_bytes()
    tars[0].write_bytes(data[: len(data) // 2])
    tars[1].unlink()
    members = []
    with tarfile.open(tars[2]) as tar:
        for member in tar.getmembers():
            members.append((member, tar.extractfile(member).read()))
    with tarfile.open(tars[2], "w") as tar:
        for i, (member, payload) in enumerate(members):
            if i == 0:
                payload = b"not audio" * 10
                member.size = len(payload)
            tar.addfile(member, io.BytesIO(payload))
    cut_lists = {p.name: [c.id for c in CutSet.from_jsonl(p)] for p in copy.glob("cuts.*")}
    shards = open_shards([str(copy)], ["recording"])
    dataset = AsrDataset(tokenizer)
    with caplog.at_level(logging.WARNING):
        batches = [dataset[b] for b in _sampler(shards)]
    skipped = [cut for b in batches for cut in b.skipped.get(UNREADABLE, [])]
    trained = [cut for b in batches for cut in b.cut_ids]
    shard_1 = cut_lists[tars[1].name.replace("recording", "cuts").replace(".tar", ".jsonl.gz")]
    assert set(shard_1) <= set(skipped)  # the missing tar: all its cuts
    assert cut_lists["cuts.000002.jsonl.gz"][0] in skipped  # the member that is not audio
    assert 1 <= len(set(skipped) & set(cut_lists["cuts.000000.jsonl.gz"])) <= SHARD_SIZE
    assert sorted(skipped + trained) == sorted(c for ids in cut_lists.values() for c in ids)
    named = [r.getMessage() for r in caplog.records]
    for tar, why in zip(tars, ("ReadError", "No such file", "Format not recognised"), strict=False):
        assert any(tar.name in m and why in m for m in named), (tar.name, why)


def test_ranks_draw_from_the_same_bucket_at_most_steps(shar_dir):
    shards = open_shards([str(shar_dir)], ["recording"])
    samplers = [_sampler(shards, 2, rank) for rank in range(2)]
    steps = list(simulate_ranks(samplers))
    both = [(a, b) for a, b in steps if len(a) and len(b)]
    assert all(len(a) == len(b) for a, b in both)  # the same size on both
    same = [samplers[0].bucket_of(a) == samplers[1].bucket_of(b) for a, b in both]
    assert sum(same) >= 0.75 * len(both)


def test_augmented_shards_keep_the_schedule_the_ranks_agreed_on(shar_dir, tiny_corpus):
    """With speed perturbation every rank plans its epoch from the cut lists and the same
    speed draws (without the audio's other changes), so its batches are the planned ones:
    as many, every cut once, each at its drawn speed's duration; the estimated bins cover
    the slowest copy of the longest cut, so that no cut is lost to its own perturbation."""
    factors = (0.9, 1.0, 1.1)
    config = AugmentConfig(speed=SpeedConfig(factors=factors), volume=VolumeConfig())
    augmenter = CutAugmenter(config, seed=1)
    shards = open_shards([str(shar_dir)], ["recording"])
    original = {c.id: c.duration for c in load_cuts(tiny_corpus.cuts(TRAIN))}
    cfg = SamplerConfig.from_mapping({"max_duration": 20, "max_cut_duration": 20, "seed": 1})
    for epoch in (0, 1):
        samplers = [
            shard_sampler(shards, ["recording"], cfg, rank=r, world_size=2, augmenter=augmenter)
            for r in range(2)
        ]
        planned = list(simulate_ranks(samplers, epoch))  # from the cut lists
        steps = list(simulate_ranks(samplers, epoch, cut_lists=False))  # with the audio
        assert [[list(b.ids) for b in step] for step in steps] == [
            [list(b.ids) for b in step] for step in planned
        ]
        seen = []
        for cut in (cut for step in steps for batch in step for cut in batch):
            assert any(
                cut.duration == pytest.approx(original[cut.id] / f, abs=1e-3) for f in factors
            )
            seen.append(cut.id)
        for sampler in samplers:
            assert not sampler.cut_filter.dropped, sampler.cut_filter.dropped
        assert sorted(seen) == sorted(original)


def test_the_data_module_makes_the_sampler_once(shar_dir, tiny_corpus):
    """Counting the epoch's batches (for the schedule) and training share one sampler:
    Shar's bins are estimated once; the count is the batches an epoch gives."""
    from asr.data.datamodule import AsrDataModule

    module = AsrDataModule(
        train_cuts=[], train_shar=[str(shar_dir)], valid_cuts=[],
        tokenizer=str(tiny_corpus.tokenizer), num_workers=0,
        sampler={"max_duration": 10, "max_cut_duration": 10, "num_buckets": 2},
    )  # fmt: skip
    batches = module.count_train_batches()
    sampler = module.train_dataloader().sampler
    assert sampler is module.train_sampler(0, 1)
    assert sum(1 for _ in sampler) == batches > 2
