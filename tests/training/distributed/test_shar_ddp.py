"""Training from Shar shards with 2 real gloo processes: shards served over HTTP by a local
server (the object-storage path without leaving the machine) and read from local disk give
the same weights; every cut is trained on once per epoch across the ranks; a run killed
with -9 mid-epoch and started again with the same command trains no cut twice."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from processes import kill_when_checkpointed, records, run, worker

from asr.data.corpus import load_cuts
from asr.data.shar import export_shar, local_http_server
from tests.conftest import TRAIN

pytestmark = pytest.mark.slow
SHARD_SIZE = 7  # the tiny corpus's train part in an odd number of shards: one is shared
EPOCHS = 2


@pytest.fixture(scope="module")
def shards(tiny_corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shar") / "train"
    export_shar(load_cuts(tiny_corpus.cuts(TRAIN)), out, shard_size=SHARD_SIZE)
    return out


@pytest.fixture(scope="module")
def served(shards: Path) -> Iterator[str]:
    """The shard folder served by `python -m http.server` on 127.0.0.1: its URL."""
    with local_http_server(shards) as url:
        yield url


def shar_overrides(train_overrides, exp_dir: Path, source: str) -> list[str]:
    return [
        *train_overrides(exp_dir),
        "experiment=demo",
        "trainer=cpu_ddp",
        "trainer.devices=2",
        f"trainer.max_epochs={EPOCHS}",
        "data.train_cuts=[]",
        f"data.train_shar=[{source}]",
        "data.features.source=on_the_fly",
        "checkpoint.every_n_train_steps=2",
        "run_test=false",
    ]


@pytest.fixture(scope="module")
def runs(train_overrides, shards, served, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("shar_ddp")
    out = {}
    for name, source in (("http", served), ("local", str(shards))):
        overrides = shar_overrides(train_overrides, root / name, source)
        run(worker(root / f"{name}_record", overrides), root / f"{name}.log")
        out[name] = {"records": records(root / f"{name}_record"), "overrides": overrides}
    out["root"] = root
    return out


def test_each_cut_is_trained_once_per_epoch_across_both_ranks(runs, tiny_corpus) -> None:
    everything = {c.id for c in load_cuts(tiny_corpus.cuts(TRAIN))}
    ranks = runs["http"]["records"]
    assert len(ranks[0]["steps"]) == len(ranks[1]["steps"]) > 0  # the same steps on each
    for epoch in range(EPOCHS):
        used = Counter()
        for rank in ranks:
            for step in (s for s in rank["steps"] if s["epoch"] == epoch):
                used.update(step["cut_ids"])
                assert not step["skipped"]
        assert set(used) == everything and set(used.values()) == {1}, used.most_common(2)


def test_both_ranks_draw_from_the_same_bucket_at_most_steps(runs) -> None:
    ranks = runs["http"]["records"]
    pairs = [
        (a["bucket"], b["bucket"])
        for a, b in zip(ranks[0]["steps"], ranks[1]["steps"], strict=True)
        if a["bucket"] is not None and b["bucket"] is not None
    ]
    assert sum(a == b for a, b in pairs) >= 0.75 * len(pairs), pairs


def test_http_and_local_shards_train_the_same_weights(runs) -> None:
    http, local = runs["http"]["records"], runs["local"]["records"]
    assert [s["cut_ids"] for s in http[0]["steps"]] == [s["cut_ids"] for s in local[0]["steps"]]
    assert http[0]["digest"] == http[1]["digest"] == local[0]["digest"]


@pytest.mark.long
def test_kill_mid_epoch_then_resume_trains_no_cut_twice(runs, served) -> None:
    root = runs["root"]
    overrides = [
        o.replace(str(root / "http"), str(root / "killed")) for o in runs["http"]["overrides"]
    ]
    command = worker(root / "killed_record", overrides)
    last = root / "killed" / "checkpoints" / "last.ckpt"
    kill_when_checkpointed(command, last, 2, root / "killed.log")
    state = torch.load(last, map_location="cpu", weights_only=False)["AsrDataModule"]
    assert state["batches_done"] > 0 and state["world_size"] == 2, state  # inside an epoch
    run(command, root / "resumed.log")  # the same command again
    resumed = records(root / "killed_record")
    whole = runs["http"]["records"]
    first = resumed[0]["steps"][0]["step"]
    for rank in range(2):
        after = [s["cut_ids"] for s in whole[rank]["steps"] if s["step"] >= first]
        assert [s["cut_ids"] for s in resumed[rank]["steps"]] == after
    assert resumed[0]["digest"] == resumed[1]["digest"] == whole[0]["digest"]
