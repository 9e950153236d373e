"""DGC's `exchange: reduce_scatter` (asr.training.distributed.communication.dgc.hook): with 2-5
real processes over gloo, nothing lost and the same update on every rank; its regions'
selection and padding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

# The scenario runs on every rank (rank_runner.py, through the `run_ranks` fixture), where
# this folder is on sys.path: it takes test_dgc.py's helpers from there.


def dgc_reduce_scatter(rank: int, world: int, out_dir: Path, steps: int) -> dict:
    """The reduce-scatter exchange at 90 % with momentum SGD, on one bucket: a matrix
    with its own top-k and a vector sent whole (forced into its region owners' picks)."""
    from exchange import exchanged, rank_gradients
    from test_dgc import _hooked, _sparse

    from asr.training.distributed.communication.dgc.hook import kept_per_region

    shapes = [(30, 100), (50,)]
    config = _sparse(exchange="reduce_scatter", dense_vectors=True)
    model, state = _hooked(shapes, config, bucket_mb=1.0, momentum=0.9)
    record: dict = {"local": [], "exchanged": [], "applied": [], "masked": []}
    for step in range(steps):
        coefficients = rank_gradients(shapes, step, rank)
        record["exchanged"].append(exchanged(model, coefficients))
        record["local"].append(torch.cat([c.flatten() for c in coefficients]))
        # this step's bucket (DDP rebuilds it after the first step) to parameter order
        order = _parameter_order(state.layouts[0])
        where = torch.empty_like(order)
        where[order] = torch.arange(order.numel())
        sent = state.last_sent[0]
        record["applied"].append(where[sent])
        residual, velocity = state.residual[0], state.velocity[0]
        record["masked"].append(
            (residual[sent].abs().max().item(), velocity[sent].abs().max().item())
        )
        record["residual"] = residual[order].clone()
    record["traffic"] = vars(state.last_traffic)
    record["kept"] = kept_per_region(torch.arange(3000, 3050), 300, world)
    return record


def _parameter_order(layout) -> torch.Tensor:
    """The bucket positions of the matrix's 3,000 entries, then the vector's 50."""
    ((offset, size),) = layout.segments
    return torch.cat([torch.arange(offset, offset + size), layout.dense])


@pytest.mark.slow  # real processes over gloo
@pytest.mark.parametrize("world", [2, 5])  # an even and an odd count of regions
def test_the_reduce_scatter_exchange_loses_nothing_and_receives_flat_in_the_ranks(
    run_ranks, tmp_path: Path, world: int
) -> None:
    """What a rank sent and no region kept is back in its residual: the applied sums plus
    the residuals are the local gradients' sum (momentum corrected), whatever rank dropped
    an entry; every rank applies the same update; the bytes a rank receives are two
    rounds of about (W - 1) / W x k pairs, not the all-gather's (W - 1) x k."""
    steps = 4
    ranks = run_ranks(tmp_path, dgc_reduce_scatter, steps=steps, world=world)
    applied = sum(world * ranks[0]["exchanged"][t] for t in range(steps))
    residuals = sum(rank["residual"] for rank in ranks)
    for rank in ranks:
        same = zip(rank["exchanged"], ranks[0]["exchanged"], strict=True)
        assert all(torch.equal(a, b) for a, b in same)
        assert all(bool((rank["exchanged"][t][3000:] != 0).all()) for t in range(steps))
        assert rank["masked"] and all(m == (0.0, 0.0) for m in rank["masked"])
    dropped = sum(300 + 50 - len(sent) for rank in ranks for sent in rank["applied"])
    assert dropped > 0  # regions dropped entries some rank sent
    row, kept = 4 + 8, ranks[0]["kept"]
    received = [rank["traffic"]["received_bytes"] for rank in ranks]
    sent = [rank["traffic"]["sent_bytes"] for rank in ranks]
    assert sum(received) == sum(sent)  # every byte sent is received by someone
    gather = (world - 1) * kept * row
    counts = (world - 1) * 8
    for rank in ranks:
        to_regions = rank["traffic"]["received_bytes"] - gather - counts
        assert 0 <= to_regions <= (world - 1) * 350 * row
        assert rank["traffic"]["payload_bytes"] == 350 * row
    mean_received = sum(received) / world
    assert mean_received <= 2.1 * (world - 1) / world * 350 * row
    assert torch.allclose(applied + residuals, _accumulated(ranks, steps), atol=1e-9)


def _accumulated(ranks: list[dict], steps: int) -> torch.Tensor:
    """What the ranks accumulated, summed: each rank's velocity u <- 0.9 u + g added to
    its residual every step, u cleared where the rank's entry was applied (masking)."""
    total = torch.zeros(3050, dtype=torch.float64)
    u = [torch.zeros(3050, dtype=torch.float64) for _ in ranks]
    for t in range(steps):
        for r, rank in enumerate(ranks):
            u[r] = 0.9 * u[r] + rank["local"][t]
            total += u[r]
            u[r][rank["applied"][t]] = 0.0
    return total


def test_regions_keep_the_forced_entries_then_the_largest_sums_padded_alike() -> None:
    from asr.training.distributed.communication.dgc.hook import (
        PAD,
        keep_largest,
        kept_per_region,
        pack,
        region_size,
        unpack,
    )

    indices, values = torch.tensor([7, 0, 2_000_000]), torch.tensor([1.5, -2.0, 0.25])
    assert all(
        torch.equal(a, b)
        for a, b in zip(unpack(pack(indices, values), values.dtype), (indices, values), strict=True)
    )
    assert [region_size(10, 3, r) for r in range(3)] == [4, 3, 3]  # 0 3 6 9 | 1 4 7 | 2 5 8
    assert region_size(2, 3, 2) == 0
    dense = torch.tensor([9, 10, 11])  # regions 0, 1, 2 of 3 hold 1 each
    assert kept_per_region(dense, k=5, world=3) == 1 + 2
    # rank 1's region of 12 entries: 1, 4, 7, 10; entry 10 is forced in, then the 2 largest
    sums = torch.tensor([0.5, -3.0, 2.0, 0.1], dtype=torch.float64)
    kept_indices, kept = unpack(keep_largest(sums, dense, 3, world=3, rank=1), sums.dtype)
    assert sorted(kept_indices.tolist()) == [4, 7, 10]
    assert sorted(kept.tolist()) == [-3.0, 0.1, 2.0]
    # a region smaller than the pairs every rank sends is padded with PAD
    tiny_indices, _ = unpack(
        keep_largest(torch.ones(1), dense[:0], 3, world=3, rank=2), torch.float32
    )
    assert tiny_indices.tolist() == [2, PAD, PAD]
