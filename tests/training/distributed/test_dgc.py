"""The DGC communication hook with 2 real processes over gloo: exact at sparsity 0,
nothing lost at high sparsity, momentum factor masking; and its config and schedule."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from asr.config_keys import ConfigError, dataclass_from_keys
from asr.training.distributed.communication.dgc.adam import adam_step_bound, check_variance_freeze
from asr.training.distributed.communication.dgc.hook import dgc_hook, top_k_indices
from asr.training.distributed.communication.dgc.state import AdamMoments, DGCConfig, DGCState

# Scenarios: each runs on every rank (rank_runner.py, through the `run_ranks` fixture) and
# returns what that rank saw; the tests below assert on the records.

ADAM = AdamMoments(0.9, 0.98, 1e-8)  # the moments _adam_directions computes with
THREE_PARTS = [(700,), (300,), (1500,)]  # a bucket each (DDP buckets of 5 kB)
ONE_PART = [(3000,)]


def _hooked(shapes, config=None, momentum=0.0, adam=None, bucket_mb=0.005, rate=False):
    """A DDP model of `shapes` with the DGC hook of `config` (none: DDP's own all-reduce);
    with `rate`, a learning rate that changes every step, as a schedule's (0.1 x (step + 1))."""
    from exchange import Vectors
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(Vectors(shapes), bucket_cap_mb=bucket_mb)
    if config is None:
        return model, None
    sizes = [math.prod(shape) for shape in shapes]
    state = DGCState(config, momentum=momentum, adam=adam, total_entries=sum(sizes))
    if rate:
        state.learning_rate = lambda: 0.1 * (state.step + 1)
    model.register_comm_hook(state, dgc_hook)
    return model, state


def _exchange(rank: int, steps: int, shapes, config=None, scales=None, **hook) -> dict:
    from exchange import record_exchange

    model, state = _hooked(shapes, config, **hook)
    return record_exchange(model, rank, steps, shapes, scales, state)


def _sparse(sparsity: float = 0.9, **keys) -> DGCConfig:
    """At 90 % (or `sparsity`) after 2 dense AdamW steps, no refresh, unless `keys` say."""
    base = {"sparsity": sparsity, "variance_freeze_step": 2, "variance_refresh_steps": 0}
    return DGCConfig(**{**base, **keys})


def dense_ddp(rank: int, world: int, out_dir: Path, steps: int) -> dict:
    return _exchange(rank, steps, THREE_PARTS)


def dgc_sparsity_zero(rank: int, world: int, out_dir: Path, steps: int) -> dict:
    return _exchange(rank, steps, THREE_PARTS, _sparse(0.0))


def dgc_ninety_percent(rank: int, world: int, out_dir: Path, steps: int) -> dict:
    return _exchange(rank, steps, ONE_PART, _sparse())


def dgc_momentum_sgd(rank: int, world: int, out_dir: Path, steps: int) -> dict:
    return _exchange(rank, steps, ONE_PART, _sparse(), momentum=0.9)


def dgc_adamw_masked(rank: int, world: int, out_dir: Path, steps: int) -> dict:
    """AdamW: 2 dense steps, then sparse ones with the first moment masked."""
    return _exchange(rank, steps, ONE_PART, _sparse(), adam=ADAM)


def dgc_mixed_tensors(rank: int, world: int, out_dir: Path, steps: int) -> dict:
    """One bucket: a 30x100 matrix, a 10x100 matrix with gradients 1,000x smaller, a
    vector; each tensor its own top-k, vectors whole."""
    config = _sparse(selection="tensor", dense_vectors=True)
    shapes, scales = [(30, 100), (10, 100), (50,)], [1.0, 1e-3, 1.0]
    return _exchange(rank, steps, shapes, config, scales, bucket_mb=1.0)


def dgc_adamw_unmasked(rank: int, world: int, out_dir: Path, steps: int, **keys) -> dict:
    """AdamW's `frozen_variance` without masking (Adam exactly): 2 dense steps, then the
    second moment frozen; `keys` of DGCConfig, `rate` for a changing learning rate."""
    rate = keys.pop("rate", False)
    config = _sparse(**{"momentum_masking": False, **keys})
    return _exchange(rank, steps, ONE_PART, config, adam=ADAM, rate=rate)


def dgc_resumed(rank: int, world: int, out_dir: Path, steps: int, optimizer: str) -> dict:
    """Exchanged gradients of `steps` steps of a DGC run on three buckets (DDP rebuilds
    them after the first step), uninterrupted and with the hook state saved after half the
    steps and restored into a new model and hook. Each tensor takes its own top-k
    (`selection: tensor`): DDP's first step puts all three in one bucket (its 1 MB first
    bucket) and its rebuilt buckets one in each, so a bucket-wide top-k in the resumed
    run's first step would choose among other entries than the uninterrupted run's (then
    the runs differ in what is sent when, though nothing is lost)."""
    from exchange import exchanged, rank_gradients

    from asr.training.distributed.communication.dgc.state import (
        load_rank_state,
        save_rank_state,
    )

    config = DGCConfig(
        sparsity=0.9, sample_fraction=0.1, selection="tensor", variance_freeze_step=2
    )
    hook = {"momentum": 0.9} if optimizer == "momentum" else {"adam": ADAM}

    def hooked():
        return _hooked(THREE_PARTS, config, rate=True, **hook)

    def run(model, first: int, last: int) -> list[torch.Tensor]:
        return [exchanged(model, rank_gradients(THREE_PARTS, t, rank)) for t in range(first, last)]

    half = steps // 2
    uninterrupted = run(hooked()[0], 0, steps)
    model, state = hooked()
    before = run(model, 0, half)
    names = {p.data_ptr(): n for n, p in model.module.named_parameters()}
    checkpoint = out_dir / "last.ckpt"
    save_rank_state(state, names, checkpoint, half, rank, world)
    model, state = hooked()
    addresses = {n: p.data_ptr() for n, p in model.module.named_parameters()}
    restored = load_rank_state(state, addresses, checkpoint, half, rank, world)
    after = run(model, half, steps)
    refused = [  # another step, another number of processes, no file: start at zero
        load_rank_state(hooked()[1], addresses, checkpoint, half + 1, rank, world),
        load_rank_state(hooked()[1], addresses, checkpoint, half, rank, world + 1),
        load_rank_state(hooked()[1], addresses, out_dir / "best.ckpt", half, rank, world),
    ]
    return {
        "uninterrupted": uninterrupted,
        "resumed": before + after,
        "restored": [restored],
        "refused": refused,
    }


@pytest.mark.slow  # real processes over gloo
def test_sparsity_zero_gives_exactly_ddps_averaged_gradient(run_ranks, tmp_path: Path) -> None:
    dense = run_ranks(tmp_path, dense_ddp, steps=3)
    dgc = run_ranks(tmp_path, dgc_sparsity_zero, steps=3)
    for rank in range(2):
        for step in range(3):
            assert torch.equal(dgc[rank]["exchanged"][step], dense[rank]["exchanged"][step])
    expected = (dense[0]["local"][0] + dense[1]["local"][0]) / 2
    assert torch.allclose(dense[0]["exchanged"][0], expected)


@pytest.mark.slow  # real processes over gloo
def test_at_high_sparsity_nothing_is_lost_only_delayed(run_ranks, tmp_path: Path) -> None:
    steps = 6
    ranks = run_ranks(tmp_path, dgc_ninety_percent, steps=steps)
    sent_total = sum(2 * ranks[0]["exchanged"][t] for t in range(steps))  # summed over ranks
    local_total = sum(r["local"][t] for r in ranks for t in range(steps))
    residual_total = sum(r["residual"][0] for r in ranks)
    assert torch.allclose(sent_total + residual_total, local_total, atol=1e-10)
    for rank in ranks:  # both ranks applied the same update
        assert torch.equal(rank["exchanged"][-1], ranks[0]["exchanged"][-1])
        assert all(len(sent) == 300 for sent in rank["sent"])  # 10 % of 3,000
    traffic = ranks[0]["traffic"]
    assert traffic["sent_entries"] == 300 and traffic["entries"] == 3000
    # two ranks: each sends its payload to the other, and receives the other's
    assert traffic["payload_bytes"] == traffic["sent_bytes"] == 300 * (4 + 8)  # int32 + float64
    assert traffic["received_bytes"] == traffic["sent_bytes"]
    assert traffic["dense_bytes"] == 3000 * 8  # a ring all-reduce of 2: the bucket each way


@pytest.mark.slow  # real processes over gloo
@pytest.mark.parametrize("world", [3])  # 2 ranks: the test above; more: only slower
def test_traffic_is_counted_both_ways_against_the_dense_ring(
    run_ranks, tmp_path: Path, world: int
) -> None:
    """An all-gather of W payloads moves W - 1 of them each way per rank; the dense
    reference is a ring all-reduce's 2 (W - 1) / W of the bucket each way."""
    ranks = run_ranks(tmp_path, dgc_ninety_percent, steps=2, world=world)
    payload, bucket = 300 * (4 + 8), 3000 * 8  # int32 indices + float64 values; float64
    for rank in ranks:
        traffic = rank["traffic"]
        assert traffic["payload_bytes"] == payload and traffic["world"] == world
        assert traffic["sent_bytes"] == traffic["received_bytes"] == (world - 1) * payload
        assert traffic["dense_bytes"] == round(2 * (world - 1) * bucket / world)
    compression = ranks[0]["traffic"]["dense_bytes"] / ((world - 1) * payload)
    assert compression == pytest.approx(2 * bucket / (world * payload))  # shrinks with W


@pytest.mark.slow  # real processes over gloo
@pytest.mark.parametrize("scenario", [dgc_momentum_sgd, dgc_adamw_masked])
def test_momentum_factor_masking_clears_exactly_the_sent_coordinates(
    run_ranks, tmp_path: Path, scenario
) -> None:
    # SGD's velocity, or AdamW's first moment (2 dense steps, then 2 sparse ones)
    ranks = run_ranks(tmp_path, scenario, steps=4)
    for rank in ranks:
        assert rank["masked"] and all(m == (0.0, 0.0) for m in rank["masked"])
        residual = rank["residual"][0]
        unsent = torch.ones_like(residual, dtype=torch.bool)
        unsent[rank["sent"][-1]] = False
        assert bool((residual[unsent] != 0).all())  # everything else is kept


@pytest.mark.slow  # real processes over gloo
def test_every_tensor_sends_its_own_top_k_and_vectors_go_whole(run_ranks, tmp_path: Path) -> None:
    # one bucket: a 30x100 matrix, a 10x100 matrix with gradients 1,000x smaller, a vector
    steps = 4
    ranks = run_ranks(tmp_path, dgc_mixed_tensors, steps=steps)
    layout = ranks[0]["layout"]
    sizes = sorted(size for _, size in layout["segments"])
    assert sizes == [1000, 3000] and len(layout["dense"]) == 50
    starts = {size: offset for offset, size in layout["segments"]}
    for rank in ranks:
        # at 90 %: a tenth of each matrix, however small its entries (from step 1: DDP
        # rebuilds its bucket after step 0, in another order, which the hook follows)
        for sent in rank["sent"][1:]:
            for size, offset in starts.items():
                inside = ((sent >= offset) & (sent < offset + size)).sum().item()
                assert inside == size // 10
            assert set(layout["dense"].tolist()) <= set(sent.tolist())
        traffic = rank["traffic"]
        assert traffic["sent_bytes"] == 50 * 8 + 400 * (4 + 8)  # float64 values, int32 indices
    for t in range(steps):  # the vector's exchange is DDP's average, every step
        expected = (ranks[0]["local"][t][-50:] + ranks[1]["local"][t][-50:]) / 2
        assert torch.allclose(ranks[0]["exchanged"][t][-50:], expected, atol=1e-12)
    # nothing lost: what was applied plus what waits is every local gradient
    applied = sum(2 * ranks[0]["exchanged"][t] for t in range(steps))
    local = sum(r["local"][t] for r in ranks for t in range(steps))
    waiting = sum(_in_parameter_order(r["residual"][0], layout) for r in ranks)
    assert torch.allclose(applied + waiting, local, atol=1e-10)


def _in_parameter_order(flat: torch.Tensor, layout: dict) -> torch.Tensor:
    """A bucket-ordered flat tensor of the mixed model, in the model's parameter order
    (matrix 3,000, matrix 1,000, vector 50)."""
    starts = {size: offset for offset, size in layout["segments"]}
    pieces = [flat[starts[3000] : starts[3000] + 3000], flat[starts[1000] : starts[1000] + 1000]]
    return torch.cat([*pieces, flat[layout["dense"]]])


def _adam_directions(
    gradients: list[torch.Tensor], freeze: int | None = None
) -> list[torch.Tensor]:
    """AdamW's bias-corrected directions (betas 0.9, 0.98, eps 1e-8) of a gradient sequence;
    with `freeze`, the second moment stops changing after that many steps."""
    first, second, out = torch.zeros_like(gradients[0]), torch.zeros_like(gradients[0]), []
    for step, grad in enumerate(gradients, start=1):
        first = 0.9 * first + 0.1 * grad
        second_step = step if freeze is None else min(step, freeze)
        if second_step == step:
            second = 0.98 * second + 0.02 * grad * grad
        denominator = (second / (1 - 0.98**second_step)).sqrt() + 1e-8
        out.append((first / (1 - 0.9**step)) / denominator)
    return out


def _frozen_variance_directions(
    local: list[list[torch.Tensor]], freeze: int, clamp: bool = True
) -> list[torch.Tensor]:
    """Per step, the ranks' mean of `frozen_variance`'s directions for their gradient
    sequences `local` (betas 0.9, 0.98): AdamW on the mean gradient for `freeze` steps, then
    each rank's own first moment over the frozen second moment, clamped to Adam's bound."""
    bound = adam_step_bound(ADAM)
    first, second = torch.zeros_like(local[0][0]), torch.zeros_like(local[0][0])
    out = []
    for t in range(freeze):
        mean = sum(grads[t] for grads in local) / len(local)
        first, second = 0.9 * first + 0.1 * mean, 0.98 * second + 0.02 * mean * mean
        out.append(
            (first / (1 - 0.9 ** (t + 1))) / ((second / (1 - 0.98 ** (t + 1))).sqrt() + 1e-8)
        )
    denominator = (second / (1 - 0.98**freeze)).sqrt() + 1e-8
    firsts = [first.clone() for _ in local]
    for t in range(freeze, len(local[0])):
        directions = []
        for rank, grads in enumerate(local):
            firsts[rank] = 0.9 * firsts[rank] + 0.1 * grads[t]
            direction = (firsts[rank] / (1 - 0.9 ** (t + 1))) / denominator
            directions.append(direction.clamp(-bound, bound) if clamp else direction)
        out.append(sum(directions) / len(local))
    return out


@pytest.mark.slow  # real processes over gloo
def test_frozen_variance_is_dense_adamw_then_linear_and_loses_nothing(
    run_ranks, tmp_path: Path
) -> None:
    steps, freeze = 6, 2
    exact = run_ranks(tmp_path, dgc_adamw_unmasked, steps=steps, sparsity=0.0)
    local = [rank["local"] for rank in exact]
    mean = [(local[0][t] + local[1][t]) / 2 for t in range(steps)]
    expected = _frozen_variance_directions(local, freeze)
    for t in range(steps):
        # the dense steps are AdamW on the mean gradient; after them, at sparsity 0, the
        # mean of the ranks' own first moments over the frozen second moment, each clamped
        for rank in exact:
            assert torch.allclose(rank["exchanged"][t], expected[t], rtol=1e-10, atol=1e-12)
    assert torch.allclose(expected[1], _adam_directions(mean)[1])
    assert not torch.allclose(expected[-1], _adam_directions(mean)[-1])  # the freeze is real
    # where no rank's direction is clamped it is exactly the frozen-variance Adam of the mean
    # gradient (the update is linear in the gradient); the clamp acts on some coordinates
    unclamped = _frozen_variance_directions(local, freeze, clamp=False)
    linear = _adam_directions(mean, freeze=freeze)
    assert torch.allclose(unclamped[-1], linear[-1], rtol=1e-10, atol=1e-12)
    inside = expected[-1] == unclamped[-1]
    assert 0 < int((~inside).sum()) < inside.numel() // 4  # v from 2 steps: often small
    # at 90 % after the dense steps, with a rate 0.1 x (step + 1): what the optimizer
    # applies (rate x exchanged) plus what waits is every step's frozen-variance update
    sparse = run_ranks(tmp_path, dgc_adamw_unmasked, steps=steps, rate=True)
    rates = [0.1 * (t + 1) for t in range(steps)]
    directions = _frozen_variance_directions([rank["local"] for rank in sparse], freeze)
    updates = sum(2 * r * d for r, d in zip(rates, directions, strict=True))
    applied = sum(2 * r * sparse[0]["exchanged"][t] for t, r in enumerate(rates))
    residual = sum(rank["residual"][0] for rank in sparse)
    assert torch.allclose(applied + residual, updates, atol=1e-9)
    assert all(len(sent) == 300 for sent in sparse[0]["sent"])  # sparse from step 2 on
    assert len(sparse[0]["sent"]) == steps - freeze


@pytest.mark.slow  # real processes over gloo
def test_frozen_variance_is_refreshed_from_the_ranks_local_moments(
    run_ranks, tmp_path: Path
) -> None:
    # dense AdamW for 2 steps, then sparse; the second moment refreshed every 2 sparse steps
    # (at steps 4 and 6) from each rank's unmasked moments of its own gradients
    steps = 7
    ranks = run_ranks(tmp_path, dgc_adamw_unmasked, steps=steps, variance_refresh_steps=2)
    local = [rank["local"] for rank in ranks]
    first, second = torch.zeros_like(local[0][0]), torch.zeros_like(local[0][0])
    for t in range(2):  # the dense steps: moments of the mean gradient
        mean = (local[0][t] + local[1][t]) / 2
        first, second = 0.9 * first + 0.1 * mean, 0.98 * second + 0.02 * mean * mean
    frozen = second.clone()
    moments = [(first.clone(), second.clone()) for _ in ranks]
    for t in range(2, steps):
        moments = [
            (0.9 * m + 0.1 * grad[t], 0.98 * v + 0.02 * grad[t] * grad[t])
            for (m, v), grad in zip(moments, local, strict=True)
        ]
    estimates = [m * m + (v - m * m).clamp(min=0) / 2 for m, v in moments]
    expected = (estimates[0] + estimates[1]) / 2 * (1 - 0.98**2)
    for rank in ranks:
        got = rank["second_moment"][0]
        assert torch.allclose(got, expected, rtol=2e-2, atol=0)  # exchanged in bf16
        assert torch.equal(got, ranks[0]["second_moment"][0])  # one second moment for all
    assert (ranks[0]["second_moment"][0] - frozen).abs().max() > 0.5 * frozen.abs().max()
    # 2 bytes an entry on the refresh step, beside the sparse (index, value) pairs
    assert ranks[0]["traffic"]["sent_bytes"] == 300 * (4 + 8) + 3000 * 2


@pytest.mark.slow  # real processes over gloo
@pytest.mark.parametrize("optimizer", ["adam", "momentum"])
def test_a_resumed_hook_exchanges_what_the_uninterrupted_one_does(
    run_ranks, tmp_path: Path, optimizer: str
) -> None:
    # the residual, the velocity or Adam's moments and step, the hook's step and its
    # sampling generator, saved per parameter after 3 of 8 steps and read back into a new
    # model whose buckets DDP rebuilds again
    ranks = run_ranks(tmp_path, dgc_resumed, steps=8, optimizer=optimizer)
    for rank in ranks:
        assert rank["restored"] == [True] and rank["refused"] == [False, False, False]
        for resumed, uninterrupted in zip(rank["resumed"], rank["uninterrupted"], strict=True):
            assert torch.equal(resumed, uninterrupted)
    # the exchange is not trivially the same: the sparse steps differ from the dense mean
    assert not torch.equal(ranks[0]["uninterrupted"][5], ranks[0]["uninterrupted"][6])


def test_adams_own_directions_stay_within_the_clamp_bound() -> None:
    bound = adam_step_bound(ADAM)
    assert bound == pytest.approx(1.698, abs=1e-3)
    # heavy-tailed gradients, and the sequence that reaches the bound (g_k ~ (b1 / b2)^k
    # backwards from the last step): AdamW's bias-corrected direction never exceeds it
    generator = torch.Generator().manual_seed(0)
    heavy = torch.randn(300, 1000, generator=generator, dtype=torch.float64) ** 5
    worst = torch.tensor([(0.9 / 0.98) ** (299 - k) for k in range(300)], dtype=torch.float64)
    largest = 0.0
    for sequence in (heavy, worst[:, None]):
        directions = _adam_directions(list(sequence))
        largest = max(largest, max(float(d.abs().max()) for d in directions))
    assert 1.6 < largest <= bound


def test_top_k_through_a_sampled_threshold_is_the_exact_top_k() -> None:
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(100_000, generator=generator).abs()
    for k in (1, 10, 100, 5_000):
        got = top_k_indices(values, k, 0.01, generator)
        assert len(got) == k
        assert torch.equal(got.sort().values, torch.topk(values, k).indices.sort().values)


def test_warm_up_schedule_and_config_checks() -> None:
    config = DGCConfig(sparsity=0.999, warmup_steps=10)
    stages = [config.sparsity_at(step) for step in (0, 9, 10, 25, 39, 40, 10_000)]
    assert stages == [0.75, 0.75, 0.9375, 0.984375, 0.996, 0.999, 0.999]
    assert DGCConfig().sparsity_at(0) == DGCConfig().sparsity  # no warm-up by default
    frozen = DGCState(
        DGCConfig(sparsity=0.999, variance_freeze_step=5, warmup_steps=10),
        adam=ADAM,
    )
    phases = []
    for step, dense_from in ((0, 0), (4, 0), (5, 0), (44, 0), (45, 0), (50, 48), (53, 48)):
        frozen.step, frozen.dense_from = step, dense_from  # 48: a state lost at step 48
        phases.append((frozen.in_dense_adam(), frozen.sparsity()))
    assert phases == [
        (True, 0.0),
        (True, 0.0),
        (False, 0.75),
        (False, 0.996),
        (False, 0.999),
        (True, 0.0),
        (False, 0.75),
    ]
    # the AdamW modes measured and removed: an old config's key is named, not ignored
    with pytest.raises(ConfigError, match=r"unknown config key distributed\.compression\.adamw"):
        dataclass_from_keys(DGCConfig, {"adamw": "direction"}, "distributed.compression")
    with pytest.raises(ConfigError, match="variance_freeze_step"):
        DGCConfig(variance_freeze_step=0)
    with pytest.raises(ConfigError, match="variance_refresh_steps"):
        DGCConfig(variance_refresh_steps=-1)
    check_variance_freeze(DGCConfig(variance_freeze_step=500), first_full_loss_step=280)
    with pytest.raises(ConfigError, match="transducer_start_step"):
        check_variance_freeze(DGCConfig(variance_freeze_step=280), first_full_loss_step=280)
    with pytest.raises(ConfigError, match="sparsities must be in"):
        DGCConfig(sparsity=1.0)
    with pytest.raises(ConfigError, match="sample_fraction"):
        DGCConfig(sample_fraction=0.0)
