from collections import Counter

import pytest

from asr.data.corpus import load_cuts, open_cuts
from asr.data.datamodule import AsrDataModule

TRAIN, DEV, TEST = "train-clean-100", "dev-clean", "test-clean"
SAMPLER = {"max_duration": 10, "max_cut_duration": 10, "num_buckets": 4}


@pytest.fixture
def datamodule(tiny_corpus) -> AsrDataModule:
    return AsrDataModule(
        train_cuts=[str(tiny_corpus.cuts(TRAIN))],
        valid_cuts=[str(tiny_corpus.cuts(DEV))],
        test_cuts=[str(tiny_corpus.cuts(TEST))],
        tokenizer=str(tiny_corpus.tokenizer),
        sampler=SAMPLER,
        valid_max_duration=60,
        num_workers=0,
    )


def ids_of(tiny_corpus, part: str) -> Counter:
    return Counter(c.id for c in load_cuts(tiny_corpus.cuts(part)))


def seen(batches) -> Counter:
    """Cut ids of the batches, used or skipped."""
    return Counter(
        i for b in batches for i in [*b.cut_ids, *(j for ids in b.skipped.values() for j in ids)]
    )


def epoch_of(loader, epoch: int) -> list[list[str]]:
    loader.sampler.set_epoch(epoch)  # what Lightning does before each epoch
    return [b.cut_ids for b in loader]


def test_train_loader_covers_every_cut_each_epoch(tiny_corpus, datamodule) -> None:
    loader = datamodule.train_dataloader()
    for epoch in (0, 1):
        loader.sampler.set_epoch(epoch)
        batches = list(loader)
        assert seen(batches) == ids_of(tiny_corpus, TRAIN)
        assert all(b.skipped == {} for b in batches)  # x4 subsampling carries every transcript
    assert datamodule.count_train_batches() == len(epoch_of(loader, 0))


def test_resume_inside_an_epoch_skips_the_batches_done(datamodule) -> None:
    full = epoch_of(datamodule.train_dataloader(), 1)
    assert len(full) > 6
    datamodule.load_state_dict({"epoch": 1, "batches_done": 5})  # as from a checkpoint
    loader = datamodule.train_dataloader()
    assert epoch_of(loader, 1) == full[5:]
    assert epoch_of(loader, 1) == full  # only the first iteration resumes


def test_resume_survives_an_iter_probe(datamodule) -> None:
    # Lightning's fit calls iter(train_loader) once to check it is iterable
    # (data_connector._check_dataloader_iterable), then iterates it for the epoch.
    full = epoch_of(datamodule.train_dataloader(), 0)
    datamodule.load_state_dict({"epoch": 0, "batches_done": 5})
    loader = datamodule.train_dataloader()
    loader.sampler.set_epoch(0)
    iter(loader)
    assert [b.cut_ids for b in loader] == full[5:]


def test_resume_position_sets_the_epoch(datamodule) -> None:
    # Lightning fetches a resumed run's first batch before it calls set_epoch: the position
    # in the checkpoint says which epoch, not the sampler's state at that moment.
    full = epoch_of(datamodule.train_dataloader(), 2)
    assert full != epoch_of(datamodule.train_dataloader(), 0)
    datamodule.load_state_dict({"epoch": 2, "batches_done": 3})
    loader = datamodule.train_dataloader()
    assert loader.sampler.epoch == 0
    assert [b.cut_ids for b in loader] == full[3:]


def test_a_position_at_an_epochs_last_step_resumes_the_next_epoch_whole(datamodule) -> None:
    # A checkpoint written after an epoch's last step is still inside that epoch; Lightning
    # may end the epoch without drawing a batch and set the next one: it runs whole.
    steps = len(epoch_of(datamodule.train_dataloader(), 1))
    full = epoch_of(datamodule.train_dataloader(), 2)
    datamodule.load_state_dict({"epoch": 1, "batches_done": steps})
    assert epoch_of(datamodule.train_dataloader(), 2) == full


def test_state_dict_is_empty_without_a_trainer(datamodule) -> None:
    assert datamodule.state_dict() == {}
    datamodule.load_state_dict({})
    assert epoch_of(datamodule.train_dataloader(), 0)[0]  # no resume happened, no error


def test_validation_loader_covers_every_cut_once(tiny_corpus, datamodule) -> None:
    assert seen(datamodule.val_dataloader()) == ids_of(tiny_corpus, DEV)


def test_test_loader_covers_every_cut_once(tiny_corpus, datamodule) -> None:
    assert seen(datamodule.test_dataloader()) == ids_of(tiny_corpus, TEST)


def test_no_test_cuts_is_an_error(tiny_corpus) -> None:
    dm = AsrDataModule(
        train_cuts=[str(tiny_corpus.cuts(TRAIN))],
        valid_cuts=[str(tiny_corpus.cuts(DEV))],
        tokenizer=str(tiny_corpus.tokenizer),
    )
    with pytest.raises(ValueError, match="data.test_cuts is empty"):
        dm.test_dataloader()


def test_bad_settings_fail_at_construction(tiny_corpus) -> None:
    paths = {"train_cuts": [], "valid_cuts": [], "tokenizer": str(tiny_corpus.tokenizer)}
    with pytest.raises(ValueError, match="data.features.source='stored' is unknown"):
        AsrDataModule(**paths, features={"source": "stored"})
    with pytest.raises(ValueError, match="unknown config key data.sampler.max_seconds"):
        AsrDataModule(**paths, sampler={"max_seconds": 10})


def test_several_manifests_are_interleaved(tiny_corpus) -> None:
    cuts = list(open_cuts([tiny_corpus.cuts(TRAIN), tiny_corpus.cuts(DEV)]))
    train, dev = ids_of(tiny_corpus, TRAIN), ids_of(tiny_corpus, DEV)
    assert Counter(c.id for c in cuts) == train + dev
    # mixed in proportion to their sizes, not one after the other
    assert any(c.id in dev for c in cuts[: len(train)])
