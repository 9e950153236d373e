"""Data-parallel training with real processes: 2 (or 1) CPU processes over gloo, launched as
a user launches them (Lightning's launcher, torchrun, one command per node), with faults
injected for real: a corrupt feature file, a NaN loss, kill -9, SIGSTOP.

The main run (`main_run`) trains the demo preset, shrunk, for 2 epochs on 2 processes with a
CTC-only warm-up, a NaN loss on rank 1 at step 5 and every cut of rank 1's step-6 batch
unreadable; several tests read its per-rank records (see ddp_worker.py).
"""

from __future__ import annotations

import csv
import os
import signal
import socket
import subprocess
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import hydra
import lightning as L
import pytest
import torch
from lhotse import CutSet
from omegaconf import OmegaConf
from processes import BIN, ENV, TIMEOUT, kill_when_checkpointed, records, run, start, worker

from asr.data.buckets import build_sampler
from asr.data.corpus import load_cuts, open_cuts
from asr.data.rank_sync import simulate_ranks
from asr.data.tokenizer import Tokenizer
from asr.training.command import CONFIG_DIR
from asr.training.train import build

NAN_RANK, NAN_STEP = 1, 5
CORRUPT_RANK, CORRUPT_STEP = 1, 6  # every cut of rank 1's 7th batch of epoch 0
EPOCHS = 2


# --- real processes ------------------------------------------------------------------------


def main_overrides(train_overrides, exp_dir: Path, train_cuts: Path) -> list[str]:
    return [
        *train_overrides(exp_dir),
        "experiment=demo",
        "trainer=cpu_ddp",
        "trainer.devices=2",
        f"trainer.max_epochs={EPOCHS}",
        "model.loss.transducer_start_step=3",
        "checkpoint.every_n_train_steps=2",
        "data.valid_max_duration=1000",  # one validation batch: rank 1 gets none
        "faults.max_skipped_fraction=0.5",  # the corrupt batch is ~5 % of this tiny corpus
        f"data.train_cuts=[{train_cuts}]",
        "run_test=false",
    ]


def compose(overrides: list[str]):
    with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return hydra.compose("train", overrides=overrides)


def rank_batches(cfg, rank: int, world_size: int, epoch: int = 0) -> list[list[str]]:
    """The cut ids of each of rank `rank`'s training batches in `epoch`, as training draws
    them (the ranks' decisions follow from the seed, the epoch and the data: simulated here
    in one process)."""
    data = OmegaConf.to_container(cfg.data, resolve=True)
    tokenizer = Tokenizer.load(data["tokenizer"])
    samplers = [
        build_sampler(
            open_cuts(data["train_cuts"]),
            data["sampler"],
            rank=r,
            world_size=world_size,
            tokenizer=tokenizer,
        )  # fmt: skip
        for r in range(world_size)
    ]
    return [list(step[rank].ids) for step in simulate_ranks(samplers, epoch, cut_lists=False)]


def corrupt_manifest(manifest: Path, victims: list[str], out: Path) -> Path:
    """A copy of `manifest` whose `victims` point at broken feature storage: the first at a
    missing file, the others at a truncated copy of the real one."""
    cuts = list(load_cuts(manifest))
    storage = Path(cuts[0].features.storage_path)
    truncated = out / "truncated_feats.lca"
    truncated.write_bytes(storage.read_bytes()[:1000])
    broken = {v: str(truncated) for v in victims} | {victims[0]: str(out / "missing.lca")}
    fixed = [
        replace(c, features=replace(c.features, storage_path=broken[c.id])) if c.id in broken else c
        for c in cuts
    ]
    path = out / "train-corrupt.jsonl.gz"
    CutSet.from_cuts(fixed).to_file(path)
    return path


@pytest.fixture(scope="module")
def main_setup(train_overrides, demo_feature_manifests, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("ddp")
    clean = main_overrides(
        train_overrides, root / "probe", demo_feature_manifests["train-clean-100"]
    )
    victims = rank_batches(compose(clean), CORRUPT_RANK, 2)[CORRUPT_STEP]
    corrupt = corrupt_manifest(demo_feature_manifests["train-clean-100"], victims, root)
    steps = sum(len(rank_batches(compose(clean), 0, 2, epoch)) for epoch in range(EPOCHS))
    return {"root": root, "victims": victims, "train_cuts": corrupt, "steps": steps}


@pytest.fixture(scope="module")
def main_run(train_overrides, main_setup) -> dict:
    root = main_setup["root"]
    overrides = main_overrides(train_overrides, root / "exp", main_setup["train_cuts"])
    extra = ("--nan-at", f"{NAN_RANK}:{NAN_STEP}", "--validate")
    run(worker(root / "record", overrides, *extra), root / "main.log")
    return {
        "overrides": overrides,
        "extra": extra,
        "records": records(root / "record"),
        "exp_dir": root / "exp",
        "record": root / "record",
        "log": (root / "main.log").read_text(),
    }


@pytest.mark.slow
def test_parameters_are_bitwise_identical_on_both_ranks(main_run, main_setup) -> None:
    ranks = main_run["records"]
    assert [r["global_step"] for r in ranks] == [main_setup["steps"]] * 2
    assert ranks[0]["digest"] == ranks[1]["digest"]
    for a, b in zip(ranks[0]["steps"], ranks[1]["steps"], strict=True):
        assert a["step"] == b["step"] and a["digest"] == b["digest"], a["step"]
    assert len({s["digest"] for s in ranks[0]["steps"]}) == main_setup["steps"] - 1  # (the NaN)


def step_size(step: dict) -> int:
    """The cuts a rank drew for a step: trained on or skipped."""
    return len(step["cut_ids"]) + sum(len(ids) for ids in step["skipped"].values())


@pytest.mark.slow
def test_both_ranks_draw_as_many_cuts_from_the_same_bucket(main_run) -> None:
    ranks = main_run["records"]
    both = [
        (a, b)
        for a, b in zip(ranks[0]["steps"], ranks[1]["steps"], strict=True)
        if a["bucket"] is not None and b["bucket"] is not None
    ]
    assert all(step_size(a) == step_size(b) for a, b in both)
    same = [a["bucket"] == b["bucket"] for a, b in both]
    assert sum(same) >= 0.75 * len(both)  # the rest: adjacent buckets at an epoch's end
    assert len({a["bucket"] for a, _ in both}) > 1  # more than one bucket was drawn


@pytest.mark.slow
def test_every_usable_cut_is_trained_on_exactly_once_per_epoch(
    main_run, main_setup, demo_feature_manifests
) -> None:
    all_ids = {c.id for c in load_cuts(demo_feature_manifests["train-clean-100"])}
    victims = set(main_setup["victims"])
    for epoch in range(EPOCHS):
        used, skipped = Counter(), Counter()
        for rank in main_run["records"]:
            for step in (s for s in rank["steps"] if s["epoch"] == epoch):
                used.update(step["cut_ids"])
                skipped.update(i for ids in step["skipped"].values() for i in ids)
        assert all(n == 1 for n in used.values()), used.most_common(3)  # none repeated
        assert set(skipped) == victims and all(n == 1 for n in skipped.values())
        assert set(used) == all_ids - victims, "no usable cut is lost"


@pytest.mark.slow
def test_ctc_only_warm_up_then_transducer_steps_under_ddp(main_run, main_setup) -> None:
    with open(main_run["exp_dir"] / "csv" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    steps = {
        name: sorted({int(r["step"]) for r in rows if r[name]})
        for name in ("train/ctc", "train/transducer")
    }
    assert steps["train/ctc"][0] == 0
    assert steps["train/transducer"][0] == 3  # transducer_start_step: no crash at the switch
    assert steps["train/transducer"][-1] == main_setup["steps"] - 1


@pytest.mark.slow
def test_a_nan_on_one_rank_skips_that_step_on_both(main_run) -> None:
    for rank in main_run["records"]:
        assert rank["nonfinite_steps"] == 1 and rank["finite"]
        digests = {s["step"]: s["digest"] for s in rank["steps"]}
        # the step taken at global step NAN_STEP (recorded as NAN_STEP + 1) changed nothing
        assert digests[NAN_STEP + 1] == digests[NAN_STEP]
        assert digests[NAN_STEP + 2] != digests[NAN_STEP + 1]
    assert main_run["log"].count(f"step {NAN_STEP} skipped (non-finite loss on 1 rank(s))") == 2


@pytest.mark.slow
def test_a_rank_whose_cuts_are_all_corrupt_still_steps(main_run, main_setup) -> None:
    ranks = main_run["records"]
    step = ranks[CORRUPT_RANK]["steps"][CORRUPT_STEP]
    assert step["cut_ids"] == []
    assert step["skipped"] == {"unreadable audio": main_setup["victims"]}
    other = ranks[1 - CORRUPT_RANK]["steps"][CORRUPT_STEP]
    assert other["cut_ids"] and other["digest"] == step["digest"]
    before = ranks[CORRUPT_RANK]["steps"][CORRUPT_STEP - 1]["digest"]
    assert step["digest"] != before  # the other rank's data moved the weights on both


def _validate_one_process(overrides: list[str], ckpt: Path) -> dict[str, float]:
    cfg = compose([*overrides, "trainer.devices=1", "trainer.strategy=auto"])
    L.seed_everything(cfg.seed)
    trainer, module, datamodule, _ = build(cfg)
    trainer.validate(module, datamodule=datamodule, ckpt_path=ckpt, verbose=False)
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


@pytest.mark.slow
def test_validation_during_fit_with_an_idle_rank(main_run, single_thread) -> None:
    # One validation batch: rank 1 validates nothing, yet makes the same collective calls.
    ranks = [r["validation"] for r in main_run["records"]]
    assert ranks[0] == ranks[1]  # every rank logs the same, summed values (best.ckpt works)
    assert (main_run["exp_dir"] / "checkpoints" / "best.ckpt").is_file()
    last_epoch = main_run["exp_dir"] / "checkpoints" / f"epoch={EPOCHS - 1:02d}.ckpt"
    one = _validate_one_process(main_run["overrides"], last_epoch)
    assert ranks[0]["val/words"] == one["val/words"] > 0
    assert ranks[0]["val/wer"] == one["val/wer"]
    # (the loss is not compared: it depends on the step, which validate() does not restore)


@pytest.mark.slow
@pytest.mark.parametrize("max_duration", ["10", "1000"])  # batches on both ranks / on one
def test_validation_wer_over_two_ranks_equals_one_process(
    validated_on_two_ranks, train_overrides, trained_run, tmp_path, single_thread, max_duration
) -> None:
    overrides, two = validated_on_two_ranks
    one = _validate_one_process(
        [*overrides, f"data.valid_max_duration={max_duration}"],
        trained_run.checkpoints / "last.ckpt",
    )
    assert two[0][max_duration] == two[1][max_duration]
    two = two[0][max_duration]
    for key in ("val/words", "val/wer", "val/ctc_wer"):
        assert two[key] == one[key], key
    assert 0 < one["val/wer"] != 100.0  # errors that are not all deletions
    assert two["val/loss"] == pytest.approx(one["val/loss"], rel=1e-6)


@pytest.fixture(scope="module")
def validated_on_two_ranks(trained_run, train_overrides, tmp_path_factory):
    """A trained checkpoint (its hypotheses are not empty), validated by 2 processes."""
    tmp = tmp_path_factory.mktemp("validate")
    overrides = [
        *train_overrides(tmp / "exp"),
        "experiment=demo",
        "~ema",  # as trained_run: its checkpoint's own weights
        "trainer=cpu_ddp",
        "trainer.devices=2",
    ]
    extra = ("--validate-only", str(trained_run.checkpoints / "last.ckpt"))
    extra += ("--eval-max-durations", "10,1000")
    run(worker(tmp / "rec", overrides, *extra), tmp / "log")
    return overrides, records(tmp / "rec")


# --- kill -9 and resume --------------------------------------------------------------------


@pytest.fixture(scope="module")
def killed_two_process_run(main_run, main_setup) -> dict:
    root = main_setup["root"]
    overrides = [o.replace(str(root / "exp"), str(root / "killed")) for o in main_run["overrides"]]
    command = worker(root / "killed_record", overrides, *main_run["extra"])
    last = root / "killed" / "checkpoints" / "last.ckpt"
    inside_epoch_1 = main_setup["steps"] // EPOCHS + 2  # even: a checkpoint every 2 steps
    kill_when_checkpointed(command, last, inside_epoch_1 // 2 * 2, root / "killed.log")
    stopped = torch.load(last, map_location="cpu", weights_only=False)
    (root / "stopped.ckpt").write_bytes(last.read_bytes())
    run(command, root / "resumed.log")  # the same command again
    return {"stopped": stopped, "records": records(root / "killed_record"), "root": root}


@pytest.mark.slow
@pytest.mark.long
def test_kill_two_processes_mid_epoch_then_resume(main_run, killed_two_process_run) -> None:
    stopped = killed_two_process_run["stopped"]
    state = stopped["AsrDataModule"]
    assert state["batches_done"] > 0 and state["world_size"] == 2, state  # inside an epoch
    resumed = killed_two_process_run["records"]
    assert [r["global_step"] for r in resumed] == [r["global_step"] for r in main_run["records"]]
    assert resumed[0]["steps"][0]["step"] == stopped["global_step"] + 1
    # deterministic on the CPU: the same weights, bit for bit
    assert resumed[0]["digest"] == resumed[1]["digest"] == main_run["records"][0]["digest"]
    assert [r["nonfinite_steps"] for r in resumed] == [1, 1]  # restored from the checkpoint


@pytest.mark.slow
@pytest.mark.long  # needs the killed run
def test_resuming_inside_an_epoch_with_another_world_size_fails_clearly(
    main_run, killed_two_process_run, single_thread
) -> None:
    overrides = [*main_run["overrides"], "trainer.devices=1", "trainer.strategy=auto"]
    cfg = compose(overrides)
    trainer, module, datamodule, _ = build(cfg)
    ckpt = killed_two_process_run["root"] / "stopped.ckpt"
    with pytest.raises(ValueError, match=r"stopped inside epoch 1 after \d+ steps of 2 data-par"):
        trainer.fit(module, datamodule=datamodule, ckpt_path=str(ckpt))


@pytest.mark.slow
def test_an_end_of_epoch_checkpoint_resumes_with_any_world_size(
    main_run, tmp_path, single_thread
) -> None:
    epoch0 = tmp_path / "epoch=00.ckpt"
    epoch0.write_bytes((main_run["exp_dir"] / "checkpoints" / "epoch=00.ckpt").read_bytes())
    state = torch.load(epoch0, weights_only=False)
    assert state["AsrDataModule"] == {"epoch": 1, "batches_done": 0, "world_size": 2}
    exp = tmp_path / "exp"
    overrides = [o for o in main_run["overrides"] if not o.startswith("exp_dir=")]
    cfg = compose([*overrides, f"exp_dir={exp}", "trainer.devices=1", "trainer.strategy=auto"])
    trainer, module, datamodule, _ = build(cfg)
    recorder: list[list[str]] = []
    trainer.callbacks.append(_BatchIds(recorder))
    trainer.fit(module, datamodule=datamodule, ckpt_path=str(epoch0))
    assert trainer.current_epoch == EPOCHS
    assert trainer.global_step == state["global_step"] + len(recorder)
    assert recorder == [sorted(b) for b in rank_batches(cfg, 0, 1, epoch=1)]  # epoch 1's


class _BatchIds(L.Callback):
    def __init__(self, out: list) -> None:
        self.out = out

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self.out.append(sorted([*batch.cut_ids, *(i for v in batch.skipped.values() for i in v)]))


@pytest.mark.slow
@pytest.mark.long
def test_kill_one_process_mid_epoch_then_resume(
    train_overrides, demo_feature_manifests, tmp_path
) -> None:
    def command(name: str) -> list[str]:
        overrides = [
            *train_overrides(tmp_path / name),
            "experiment=demo",
            "trainer.max_steps=14",  # of ~16 batches an epoch: killed and resumed in epoch 0
            "checkpoint.every_n_train_steps=2",
            "trainer.check_val_every_n_epoch=100",
            "run_test=false",
        ]
        return worker(tmp_path / f"{name}_record", overrides)

    run(command("straight"), tmp_path / "straight.log")
    last = tmp_path / "killed" / "checkpoints" / "last.ckpt"
    kill_when_checkpointed(command("killed"), last, 6, tmp_path / "killed.log")
    stopped = torch.load(last, map_location="cpu", weights_only=False)
    assert stopped["AsrDataModule"]["batches_done"] > 0  # inside an epoch
    run(command("killed"), tmp_path / "resumed.log")
    straight, resumed = (
        records(tmp_path / "straight_record", 1),
        records(tmp_path / "killed_record", 1),
    )
    assert resumed[0]["global_step"] == straight[0]["global_step"] == 14
    assert resumed[0]["steps"][0]["step"] == stopped["global_step"] + 1
    assert resumed[0]["digest"] == straight[0]["digest"]


# --- a process dies or hangs --------------------------------------------------------------


def _local_rank_one(pid: int) -> int:
    """The process Lightning's launcher started as LOCAL_RANK=1 from `pid`."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    for child in map(int, out.stdout.split()):
        if b"\0LOCAL_RANK=1\0" in Path(f"/proc/{child}/environ").read_bytes():
            return child
    raise AssertionError(f"no LOCAL_RANK=1 child of {pid}")


def _start_long_run(
    train_overrides, tmp_path: Path, *overrides: str
) -> tuple[subprocess.Popen, Path, int]:
    """A 2-process run that would train for long; returns once both ranks are training."""
    exp = tmp_path / "exp"
    args = [*train_overrides(exp), "experiment=demo", "trainer=cpu_ddp", "trainer.devices=2"]
    args += ["trainer.max_epochs=1000", "checkpoint.every_n_train_steps=2", *overrides]
    log = tmp_path / "run.log"
    proc = start([str(BIN / "asr-train"), *args], log)
    deadline = time.monotonic() + TIMEOUT
    while not (exp / "checkpoints" / "last.ckpt").exists():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.2)
    return proc, log, _local_rank_one(proc.pid)


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize(("fault", "timeout"), [(signal.SIGKILL, 600), (signal.SIGSTOP, 8)])
def test_a_rank_that_dies_or_hangs_stops_the_others_with_a_clear_error(
    train_overrides, tmp_path, fault, timeout
) -> None:
    proc, log, rank1 = _start_long_run(train_overrides, tmp_path, f"distributed.timeout={timeout}")
    try:
        start = time.monotonic()
        os.kill(rank1, fault)
        proc.wait(timeout=TIMEOUT)
        elapsed = time.monotonic() - start
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    text = log.read_text()
    assert "rank 0 of 2 lost contact with the other processes" in text, text[-3000:]
    # a dead peer is noticed at the next collective; a hung one after the timeout
    limit = 20 if fault == signal.SIGKILL else timeout + 20
    assert elapsed < limit, elapsed


# --- launchers -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _short_run_overrides(train_overrides, exp: Path) -> list[str]:
    return [
        *train_overrides(exp),
        "experiment=demo",
        "trainer=cpu_ddp",
        "trainer.max_steps=3",
        "run_test=false",
        "trainer.check_val_every_n_epoch=100",
    ]


@pytest.mark.slow
def test_torchrun_launch(train_overrides, tmp_path) -> None:
    # with a CTC head of weight 0, which never gets a gradient (find_unused_parameters: auto)
    exp = tmp_path / "exp"
    command = [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(_free_port())]
    command += [
        str(BIN / "asr-train"),
        *_short_run_overrides(train_overrides, exp),
        "trainer.devices=2",
        "model.loss.ctc_weight=0",
    ]
    run(command, tmp_path / "log")
    ckpt = torch.load(exp / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == 3 and ckpt["AsrDataModule"]["world_size"] == 2


LATE_NODE_TIMEOUT = 8  # seconds


@pytest.mark.slow
@pytest.mark.long
def test_two_nodes_simulated_on_one_machine(train_overrides, tmp_path) -> None:
    # node 1 starts later than distributed.timeout: the rendezvous waits startup_timeout
    exp = tmp_path / "exp"
    args = [*_short_run_overrides(train_overrides, exp), "trainer.devices=1", "trainer.num_nodes=2"]
    args.append(f"distributed.timeout={LATE_NODE_TIMEOUT}")
    env = {**ENV, "MASTER_ADDR": "localhost", "MASTER_PORT": str(_free_port())}
    logs = [tmp_path / f"node{n}.log" for n in range(2)]
    procs = [start([str(BIN / "asr-train"), *args], logs[0], {**env, "NODE_RANK": "0"})]
    deadline = time.monotonic() + TIMEOUT
    while "Initializing distributed" not in logs[0].read_text():
        assert procs[0].poll() is None and time.monotonic() < deadline, logs[0].read_text()
        time.sleep(0.2)
    time.sleep(LATE_NODE_TIMEOUT + 2)
    procs.append(start([str(BIN / "asr-train"), *args], logs[1], {**env, "NODE_RANK": "1"}))
    try:
        codes = [p.wait(timeout=TIMEOUT) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert codes == [0, 0], [log.read_text()[-2000:] for log in logs]
    ckpt = torch.load(exp / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == 3 and ckpt["AsrDataModule"]["world_size"] == 2
