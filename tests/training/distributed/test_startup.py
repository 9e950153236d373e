"""What the multi-process path decides before any process starts: DDP's options from the
loss, the config's checks, threads per process, how a lost peer is recognized, and the
straggler debug option. The tests with real processes are in test_ddp.py."""

from __future__ import annotations

import logging
import os
import time

import pytest
import torch

from asr.models.build import build_model
from asr.training.distributed.communication.adascale import AdaScaleConfig
from asr.training.distributed.communication.adpsgd import DecentralizedConfig
from asr.training.distributed.communication.dgc.state import DGCConfig
from asr.training.distributed.communication.hooked_ddp import HookedDDPStrategy
from asr.training.distributed.communication.straggler import Straggler
from asr.training.distributed.config import DistributedConfig
from asr.training.distributed.ddp import is_peer_failure, processes_per_node, set_cpu_threads
from asr.training.distributed.setup import build_strategy
from asr.training.objective import build_objective


def test_parts_without_gradient_follow_the_loss(tiny_transducer_config) -> None:
    model = build_model(tiny_transducer_config, 16)

    def parts(loss: dict) -> list[str]:
        return build_objective("transducer", loss).parts_without_gradient(model)

    assert parts({"ctc_weight": 0.3}) == []
    assert parts({"ctc_weight": 0.3, "transducer_start_step": 10}) == ["predictor", "joiner"]
    assert parts({"ctc_weight": 0.0}) == ["ctc_head"]


def test_ddp_looks_for_unused_parameters_only_when_needed() -> None:
    auto = DistributedConfig()
    plain = build_strategy("ddp", world_size=2, config=auto, parts_without_gradient=[])
    warm_up = build_strategy(
        "ddp", world_size=2, config=auto, parts_without_gradient=["predictor", "joiner"]
    )
    assert plain._ddp_kwargs["find_unused_parameters"] is False
    assert warm_up._ddp_kwargs["find_unused_parameters"] is True
    assert plain._timeout.total_seconds() == auto.timeout
    # "auto" with several processes is DDP too; with one, Lightning's choice stays
    many = build_strategy("auto", world_size=4, config=auto, parts_without_gradient=[])
    assert many._timeout.total_seconds() == auto.timeout
    assert build_strategy("auto", world_size=1, config=auto, parts_without_gradient=[]) == "auto"


def test_turning_unused_parameter_search_off_when_needed_fails_at_start_up() -> None:
    off = DistributedConfig(find_unused_parameters=False)
    with pytest.raises(ValueError, match="leaves predictor, joiner without a gradient"):
        build_strategy(
            "ddp", world_size=2, config=off, parts_without_gradient=["predictor", "joiner"]
        )


def test_adpsgd_warns_against_momentum_sgd(caplog: pytest.LogCaptureFixture) -> None:
    config = DistributedConfig()
    with caplog.at_level(logging.WARNING, logger="asr.training.distributed.ddp"):
        build_strategy("adpsgd", world_size=2, config=config, parts_without_gradient=[])
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="asr.training.distributed.ddp"):
        strategy = build_strategy(
            "adpsgd",
            world_size=2,
            config=config,
            parts_without_gradient=[],
            optimizer_momentum=0.9,
        )
    assert "one step of staleness acts as added momentum" in caplog.text
    assert type(strategy).__name__ == "DecentralizedStrategy"
    caplog.clear()
    synchronous = DistributedConfig(gossip=DecentralizedConfig(synchronous=True))
    with caplog.at_level(logging.WARNING, logger="asr.training.distributed.ddp"):
        build_strategy(
            "adpsgd",
            world_size=2,
            config=synchronous,
            parts_without_gradient=[],
            optimizer_momentum=0.9,
        )
    assert not caplog.records  # without staleness momentum SGD trains


def test_fsdp_with_the_samplewise_loss_is_refused() -> None:
    with pytest.raises(ValueError, match="trainer.strategy=fsdp cannot train with model.loss"):
        build_strategy(
            "fsdp",
            world_size=2,
            config=DistributedConfig(),
            parts_without_gradient=[],
            loss_kind="samplewise",
        )


def test_distributed_config_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match=r"unknown config key distributed\.timout;"):
        DistributedConfig.from_mapping({"timout": 5})
    with pytest.raises(ValueError, match="distributed.find_unused_parameters must be"):
        DistributedConfig.from_mapping({"find_unused_parameters": "sometimes"})


def test_peer_failures_are_told_from_other_errors() -> None:
    # gloo's messages for a dead peer and for a hung one (seen in the process tests below)
    dead = "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:538] Read error [127.0.0.1]"
    hung = "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out"
    assert is_peer_failure(RuntimeError(dead + ": Connection reset by peer"))
    assert is_peer_failure(RuntimeError(hung + " waiting 20000ms for recv operation"))
    assert is_peer_failure(torch.distributed.DistBackendError("NCCL watchdog"))
    # seen once from DDP's buffer broadcast while rank 1 was stopped (SIGSTOP)
    assert is_peer_failure(RuntimeError("Application timeout caused pair closure"))
    assert not is_peer_failure(RuntimeError("CUDA out of memory"))
    assert not is_peer_failure(ValueError("manifest not found"))


def test_processes_per_node() -> None:
    assert processes_per_node("cpu", 2) == 2
    assert processes_per_node("cpu", "auto") == 1
    assert processes_per_node("gpu", [0, 3]) == 2
    assert processes_per_node("gpu", "0,1,2") == 3


def test_cpu_threads_one_per_process_unless_told(monkeypatch, single_thread) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert set_cpu_threads(DistributedConfig(), world_size=1) is None  # torch's default
    assert set_cpu_threads(DistributedConfig(), world_size=2) == 1 == torch.get_num_threads()
    assert os.environ["OMP_NUM_THREADS"] == "1"  # what Lightning's child processes inherit
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert set_cpu_threads(DistributedConfig(), world_size=2) == 2
    assert set_cpu_threads(DistributedConfig(cpu_threads=1), world_size=2) == 1


def test_the_straggler_sleeps_its_own_step_time_times_slowdown_minus_one() -> None:
    class Trainer:  # the one attribute the callback reads
        global_rank = 1

    slow, other = Straggler(rank=1, slowdown=3.0), Straggler(rank=0, slowdown=3.0)
    for callback in (slow, other):
        before = time.perf_counter()
        callback.on_train_batch_start(Trainer())
        time.sleep(0.05)  # the step's work
        work = time.perf_counter() - before
        callback.on_train_batch_end(Trainer())
        callback.work = work
    assert slow.slept == pytest.approx(2 * slow.work, rel=0.05)  # (3 - 1) x its own step time
    assert other.slept == 0.0  # not its rank
    with pytest.raises(ValueError, match="debug.straggler_slowdown must be >= 1"):
        Straggler(rank=0, slowdown=0.5)


def test_a_communication_hook_gets_a_strategy_that_registers_it_on_any_device() -> None:
    dgc = DistributedConfig(compression=DGCConfig(warmup_steps=10))
    strategy = build_strategy(
        "ddp", world_size=2, config=dgc, parts_without_gradient=[], optimizer_momentum=0.9
    )
    assert isinstance(strategy, HookedDDPStrategy)
    assert strategy.compression is not None and strategy.compression.momentum == 0.9
    assert strategy.adascale is None
    adascale = DistributedConfig(adascale=AdaScaleConfig())
    strategy = build_strategy("ddp", world_size=2, config=adascale, parts_without_gradient=[])
    assert strategy.adascale is not None and strategy.compression is None
    with pytest.raises(ValueError, match="exclude each other"):
        build_strategy(
            "ddp",
            world_size=2,
            config=DistributedConfig(compression=DGCConfig(), adascale=AdaScaleConfig()),
            parts_without_gradient=[],
        )
    with pytest.raises(ValueError, match="distributed.compression needs trainer.strategy=ddp"):
        build_strategy("auto", world_size=1, config=dgc, parts_without_gradient=[])
    with pytest.raises(ValueError, match="adascale needs at least 2 processes"):
        build_strategy("ddp", world_size=1, config=adascale, parts_without_gradient=[])


def test_compression_keys_are_read_from_the_config() -> None:
    config = DistributedConfig.from_mapping(
        {"compression": {"kind": "dgc", "sparsity": 0.99, "warmup_steps": 5}}
    )
    assert config.compression == DGCConfig(sparsity=0.99, warmup_steps=5)
    with pytest.raises(ValueError, match="unknown config key distributed.compression.sparsty"):
        DistributedConfig.from_mapping({"compression": {"sparsty": 0.9}})
    with pytest.raises(ValueError, match="distributed.compression.kind='topk' is unknown"):
        DistributedConfig.from_mapping({"compression": {"kind": "topk"}})
