"""The one door (`setup_distributed`): which strategy, callbacks and module features each
`distributed` config gives, and what it records as resolved. No process starts here (the
accelerator is named `gpu` so that nothing sets this process's CPU threads; nothing touches
CUDA while a strategy is built); the runs with real processes are in test_ddp.py and
test_savers.py."""

from __future__ import annotations

import pytest
from lightning.pytorch.strategies import DDPStrategy

from asr.config_keys import config_keys
from asr.training.distributed.communication.adascale import AdaScaleConfig, AdaScaleLearningRate
from asr.training.distributed.communication.adpsgd import DecentralizedStrategy, GossipMonitor
from asr.training.distributed.communication.dgc.state import DGCConfig
from asr.training.distributed.communication.dgc.traffic import CompressionMonitor
from asr.training.distributed.communication.hooked_ddp import HookedDDPStrategy
from asr.training.distributed.communication.straggler import Straggler
from asr.training.distributed.config import DistributedConfig
from asr.training.distributed.features import DENSE
from asr.training.distributed.setup import TrainingFacts, setup_distributed
from asr.training.distributed.startup import StartupGraceDDPStrategy
from asr.training.optimizer import optim_config
from asr.training.run_config import DebugConfig, TrainerConfig
from asr.training.step_guard import LOCAL
from asr.training.step_times import StepTimes

ADAMW = optim_config({"lr": 1e-3})
SGD = optim_config({"lr": 0.05, "kind": "sgd"})


def facts(**changes) -> TrainingFacts:
    """Two GPU processes of DDP with AdamW and no clipping, but for `changes` (trainer,
    debug or objective keys)."""
    trainer = {"strategy": "ddp", "accelerator": "gpu", "devices": 2, "gradient_clip_val": None}
    trainer |= {k: changes.pop(k) for k in config_keys(TrainerConfig) if k in changes}
    debug = DebugConfig(**{k: changes.pop(k) for k in config_keys(DebugConfig) if k in changes})
    changes.setdefault("optim", ADAMW)
    return TrainingFacts(trainer=TrainerConfig(**trainer), debug=debug, **changes)


def test_one_process_keeps_lightnings_strategy_and_asks_nothing_special() -> None:
    setup = setup_distributed(DistributedConfig(), facts(strategy="auto", devices=1))
    assert setup.strategy == "auto" and setup.strategy_features is DENSE and setup.callbacks == []
    assert setup.resolved == {"world_size": 1, "strategy": "auto"}


def test_plain_ddp_is_lightnings_with_its_unused_parameter_search_resolved() -> None:
    warm_up = facts(parts_without_gradient=("predictor", "joiner"), num_nodes=2)
    setup = setup_distributed(DistributedConfig(), warm_up)
    assert type(setup.strategy) is StartupGraceDDPStrategy and setup.strategy_features is DENSE
    assert isinstance(setup.strategy, DDPStrategy)
    assert setup.resolved == {
        "world_size": 4,
        "find_unused_parameters": True,
        "strategy": "StartupGraceDDPStrategy",
    }
    assert (
        setup.strategy_features.step_group() is None and not setup.strategy_features.clips_in_hook
    )


def test_dgc_takes_the_trainers_clipping_into_its_hook_and_says_so() -> None:
    config = DistributedConfig(compression=DGCConfig())
    setup = setup_distributed(config, facts(gradient_clip_val=5.0))
    strategy = setup.strategy
    assert isinstance(strategy, HookedDDPStrategy) and setup.strategy_features is strategy
    assert strategy.compression is not None and strategy.compression.config.clip_norm == 5.0
    assert (
        setup.strategy_features.clips_in_hook and setup.strategy_features.moments_in_hook
    )  # AdamW's
    assert not setup.strategy_features.sets_learning_rate
    assert [type(c) for c in setup.callbacks] == [CompressionMonitor]
    assert setup.resolved["compression"] == {"clip_norm": 5.0}
    assert setup.resolved["find_unused_parameters"] is False
    # a clip_norm of its own wins; the config object given is not changed
    own = DistributedConfig(compression=DGCConfig(clip_norm=1.0))
    assert setup_distributed(own, facts(gradient_clip_val=5.0)).resolved["compression"] == {
        "clip_norm": 1.0
    }
    assert config.compression is not None and config.compression.clip_norm is None
    # SGD without momentum: error feedback only, the optimizer keeps nothing in the hook
    plain_sgd = optim_config({"lr": 0.05, "kind": "sgd", "momentum": 0.0})
    assert not setup_distributed(config, facts(optim=plain_sgd)).strategy_features.moments_in_hook


def test_dgc_checks_the_variance_freeze_against_the_ctc_warm_up() -> None:
    config = DistributedConfig(compression=DGCConfig(variance_freeze_step=100))
    with pytest.raises(ValueError, match="transducer_start_step"):
        setup_distributed(config, facts(first_full_loss_step=280))


def test_adascale_sets_the_learning_rate_and_wants_momentum_sgd() -> None:
    config = DistributedConfig(adascale=AdaScaleConfig())
    setup = setup_distributed(config, facts(optim=SGD))
    assert setup.strategy_features.sets_learning_rate and not setup.strategy_features.clips_in_hook
    (callback,) = setup.callbacks
    assert isinstance(callback, AdaScaleLearningRate) and callback.world_size == 2
    with pytest.raises(ValueError, match="momentum SGD"):
        setup_distributed(config, facts(optim=ADAMW))


def test_decentralized_training_decides_steps_within_the_replica() -> None:
    setup = setup_distributed(DistributedConfig(), facts(strategy="adpsgd"))
    assert (
        isinstance(setup.strategy, DecentralizedStrategy)
        and setup.strategy_features is setup.strategy
    )
    assert setup.strategy_features.step_group() == LOCAL  # before H-ADPSGD's node groups exist
    assert [type(c) for c in setup.callbacks] == [GossipMonitor]
    assert "find_unused_parameters" not in setup.resolved


def test_the_straggler_is_a_callback_of_the_door() -> None:
    setup = setup_distributed(DistributedConfig(), facts(straggler_rank=1, straggler_slowdown=3))
    (straggler,) = setup.callbacks
    assert isinstance(straggler, Straggler) and (straggler.rank, straggler.slowdown) == (1, 3.0)


def test_step_times_time_plain_ddps_allreduce_and_no_other_hook(tmp_path) -> None:
    times = str(tmp_path / "times")
    setup = setup_distributed(DistributedConfig(), facts(step_times_dir=times, straggler_rank=1))
    strategy = setup.strategy
    assert isinstance(strategy, HookedDDPStrategy) and strategy.allreduce_clock is not None
    assert strategy.compression is None and strategy.adascale is None
    step_times, straggler = setup.callbacks  # the step is recorded before the straggler sleeps
    assert isinstance(step_times, StepTimes) and isinstance(straggler, Straggler)
    assert step_times.allreduce_wait == strategy.allreduce_clock.take_wait
    assert not setup.strategy_features.clips_in_hook  # dense, as without the timer
    # DGC keeps its own hook, AD-PSGD has no all-reduce, one process no DDP: no wait recorded
    dgc = setup_distributed(DistributedConfig(compression=DGCConfig()), facts(step_times_dir=times))
    decentralized = setup_distributed(
        DistributedConfig(), facts(strategy="adpsgd", step_times_dir=times)
    )
    alone = setup_distributed(
        DistributedConfig(), facts(strategy="auto", devices=1, step_times_dir=times)
    )
    assert dgc.strategy.compression is not None and dgc.strategy.allreduce_clock is None
    for other in (dgc, decentralized, alone):
        (recorder,) = [c for c in other.callbacks if isinstance(c, StepTimes)]
        assert recorder.allreduce_wait is None


def test_the_rendezvous_waits_at_least_the_collectives_timeout() -> None:
    config = DistributedConfig(timeout=8.0, startup_timeout=300.0)
    strategy = setup_distributed(config, facts()).strategy
    assert isinstance(strategy, StartupGraceDDPStrategy)
    assert strategy._timeout.total_seconds() == 8.0
    assert strategy.startup_timeout.total_seconds() == 300.0
    longer = setup_distributed(DistributedConfig(timeout=900.0), facts()).strategy
    assert longer.startup_timeout.total_seconds() == 900.0
    with pytest.raises(ValueError, match="distributed.startup_timeout"):
        DistributedConfig.from_mapping({"startup_timeout": 0})
