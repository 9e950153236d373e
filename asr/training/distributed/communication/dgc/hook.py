"""Deep Gradient Compression (Lin et al., ICLR 2018, arXiv 1712.01887) as a DDP
communication hook, with its two exchanges.

Instead of all-reducing each gradient bucket, every rank sends only the k entries of
largest magnitude of what it has accumulated (a top-k through a threshold estimated on a
sample), as (index, value) pairs; the rest stays in its residual until it has grown, so no
gradient is lost, only delayed. With momentum SGD the hook applies momentum correction and
masking; with AdamW, after dense steps, a frozen second moment (`dgc.adam`). `exchange:
allgather` (the paper's) gathers every rank's pairs; `exchange: reduce_scatter` (after
Ok-Topk) sums interleaved regions at their owners, keeps each region's largest sums and
all-gathers those, returning what no region kept to its sender's residual. Each step's bytes
are counted in `StepTraffic` (`dgc.traffic`); the state lives in `DGCState` and goes with
`last.ckpt` (`dgc.state`). How a step works, the keys and the measured accuracy:
docs/savers.md#deep-gradient-compression.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor

from asr.training.distributed.communication.dgc.adam import (
    adam_direction,
    refresh_second_moment,
    track_local_moments,
)
from asr.training.distributed.communication.dgc.state import (
    BucketLayout,
    DGCState,
    bucket_buffer,
    current_layout,
    working_precision,
)
from asr.training.distributed.communication.dgc.traffic import StepTraffic
from asr.training.distributed.communication.hooks import comm_hook

INDEX_DTYPE = torch.int32
PAD = -1  # the index of a padding pair in the reduce-scatter exchange's all-gather


def top_k_indices(
    magnitudes: Tensor, k: int, sample_fraction: float, generator: torch.Generator
) -> Tensor:
    """Indices of the `k` largest entries of the 1D tensor `magnitudes` (ties broken
    arbitrarily), found through a threshold estimated on a random sample."""
    n = magnitudes.numel()
    if k >= n:
        return torch.arange(n, device=magnitudes.device)
    samples = min(n, max(math.ceil(n * sample_fraction), 1))
    picked = torch.randint(n, (samples,), device=magnitudes.device, generator=generator)
    sample = magnitudes[picked]
    k_sample = min(samples, max(1, math.ceil(samples * k / n)))
    threshold = torch.topk(sample, k_sample, sorted=False).values.min()
    candidates = torch.nonzero(magnitudes >= threshold).squeeze(1)
    if candidates.numel() < k:  # the sample over-estimated the threshold
        return torch.topk(magnitudes, k, sorted=False).indices
    best = torch.topk(magnitudes[candidates], k, sorted=False).indices
    return candidates[best]


def clip_locally(state: DGCState, grad: Tensor) -> Tensor:
    """`grad` (one bucket) scaled down to `clip_norm` x N^-1/2 x sqrt(its share of all
    gradient entries) when its norm is above that; as it is otherwise or without
    `clip_norm`."""
    if state.config.clip_norm is None:
        return grad
    share = grad.numel() / max(state.total_entries, grad.numel())
    limit = state.config.clip_norm * math.sqrt(share / state.world_size())
    norm = float(torch.linalg.vector_norm(grad))
    return grad * (limit / norm) if norm > limit else grad


def accumulate(state: DGCState, index: int, grad: Tensor, rate: float = 1.0) -> Tensor:
    """Fold this step's local gradient `grad` (a flat bucket) into the residual of bucket
    `index` and return that residual (`rate`: the step's learning rate, for AdamW's
    directions)."""
    grad = clip_locally(state, working_precision(grad))
    residual = bucket_buffer(state.residual, index, grad)
    if state.freezes_variance and state.config.variance_refresh_steps > 0:
        track_local_moments(state, index, grad)
        if state.refreshes_variance():
            refresh_second_moment(state, index)
    if state.adam is not None:
        # The update itself (rate x direction): a coordinate sent later, at another rate,
        # still moves by what each step asked (decode divides by the rate of the send).
        direction = adam_direction(state, index, grad, frozen=True)
        residual.add_(direction, alpha=rate)
    elif state.momentum > 0:
        velocity = bucket_buffer(state.velocity, index, grad)
        velocity.mul_(state.momentum).add_(grad)
        residual.add_(velocity)
    else:
        residual.add_(grad)
    return residual


def select(state: DGCState, layout: BucketLayout, residual: Tensor, sparsity: float) -> Tensor:
    """Indices of the entries of `residual` to send besides the dense ones: with
    `selection: bucket` the top k = (1 - sparsity) x the bucket's other entries; with
    `selection: tensor` the top-k of each tensor, k = its size x (1 - sparsity), at least
    one (the paper's layer-wise threshold: every layer moves each step, whatever the scale
    of its gradients)."""
    magnitudes = residual.abs()
    generator = state.random(residual.device)
    fraction = state.config.sample_fraction
    if state.config.selection == "bucket":
        sparse_entries = residual.numel() - layout.dense.numel()
        if sparse_entries == 0:
            return torch.zeros(0, dtype=torch.long, device=residual.device)
        magnitudes[layout.dense] = -1.0  # sent anyway: never among the top-k
        k = max(1, round(sparse_entries * (1.0 - sparsity)))
        return top_k_indices(magnitudes, k, fraction, generator)
    parts = [
        offset
        + top_k_indices(
            magnitudes[offset : offset + size],
            max(1, round(size * (1.0 - sparsity))),
            fraction,
            generator,
        )
        for offset, size in layout.segments
    ]
    if not parts:
        return torch.zeros(0, dtype=torch.long, device=residual.device)
    return torch.cat(parts)


@comm_hook
def dgc_hook(state: DGCState, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
    """The DDP communication hook: sparse exchange of one bucket (dense at sparsity 0)."""
    buffer = bucket.buffer()
    world = state.world_size()
    sparsity = state.sparsity()
    index = bucket.index()
    traffic = state.traffic
    traffic.world = world
    traffic.count_bucket(buffer)
    is_last = bucket.is_last()
    if sparsity == 0.0 and not state.moments_in_hook and not state.residual:
        traffic.count_all_reduce(buffer)
        buffer.copy_(clip_locally(state, buffer))
        work = dist.all_reduce(buffer.div_(world), group=state.process_group, async_op=True)
        return _finish(work.get_future(), state, is_last, lambda fut: fut.value()[0])
    if state.in_dense_adam():
        return _dense_adam(state, bucket)

    if buffer.numel() >= 2**31:
        raise ValueError(
            f"a gradient bucket of {buffer.numel()} entries is too large for int32 indices: "
            "lower DDP's bucket_cap_mb"
        )
    layout = current_layout(state, bucket)
    rate = state.rate()  # read once: a bucket decoded after the step's last one sees this rate
    residual = accumulate(state, index, buffer, rate)
    indices = select(state, layout, residual, sparsity)
    dense_values = residual[layout.dense]
    values = residual[indices]
    sent = torch.cat([layout.dense, indices])
    residual[sent] = 0.0
    if state.config.exchange == "reduce_scatter":
        pairs = (sent, torch.cat([dense_values, values]))
        return _reduce_scatter(state, bucket, layout, residual, pairs, rate)
    return _all_gather(state, bucket, layout, residual, (indices, values, dense_values), rate)


def _all_gather(
    state: DGCState,
    bucket: dist.GradBucket,
    layout: BucketLayout,
    residual: Tensor,
    picked: tuple[Tensor, Tensor, Tensor],
    rate: float,
) -> torch.futures.Future[Tensor]:
    """`exchange: allgather`: every rank gathers every rank's pairs (`picked`: the top-k
    indices, their values and the dense entries' values, taken out of `residual`)."""
    indices, values, dense_values = picked
    index, buffer, world = bucket.index(), bucket.buffer(), state.world_size()
    sent = torch.cat([layout.dense, indices])
    state.last_sent[index] = sent
    if state.config.momentum_masking and state.moments_in_hook:
        state.velocity[index][sent] = 0.0  # momentum factor masking (SGD's u, or Adam's m)
    payload = torch.cat(
        [
            dense_values.view(torch.uint8),
            indices.to(INDEX_DTYPE).view(torch.uint8),
            values.view(torch.uint8),
        ]
    )
    state.traffic.count_all_gather(payload, sent.numel())
    gathered = [torch.empty_like(payload) for _ in range(world)]
    work = dist.all_gather(gathered, payload, group=state.process_group, async_op=True)
    dense_bytes = dense_values.numel() * dense_values.element_size()
    index_end = dense_bytes + indices.numel() * INDEX_DTYPE.itemsize

    def decode(fut: torch.futures.Future) -> Tensor:
        total = torch.zeros_like(residual)
        for part in gathered:
            total.index_add_(0, layout.dense, part[:dense_bytes].view(residual.dtype))
            where = part[dense_bytes:index_end].view(INDEX_DTYPE).long()
            total.index_add_(0, where, part[index_end:].view(residual.dtype))
        if state.adam is not None:
            total.div_(rate)  # the optimizer multiplies by the rate again
        return total.div_(world).to(buffer.dtype)

    return _finish(work.get_future(), state, bucket.is_last(), decode)


def _reduce_scatter(
    state: DGCState,
    bucket: dist.GradBucket,
    layout: BucketLayout,
    residual: Tensor,
    pairs: tuple[Tensor, Tensor],
    rate: float,
) -> torch.futures.Future[Tensor]:
    """`exchange: reduce_scatter` (the module's last section) of this
    rank's `pairs` (indices and values, taken out of `residual`)."""
    sent, values = pairs
    index, buffer, world = bucket.index(), bucket.buffer(), state.world_size()
    k = sent.numel() - layout.dense.numel()
    work, finish = reduce_scatter_exchange(
        residual, sent, values, layout.dense, k, state.process_group, state.traffic
    )

    def decode(fut: torch.futures.Future) -> Tensor:
        total, applied = finish()
        state.last_sent[index] = sent[applied]
        if state.config.momentum_masking and state.moments_in_hook:
            state.velocity[index][sent[applied]] = 0.0  # where this rank's entry moved
        if state.adam is not None:
            total.div_(rate)
        return total.div_(world).to(buffer.dtype)

    return _finish(work.get_future(), state, bucket.is_last(), decode)


def _dense_adam(state: DGCState, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
    """One of an AdamW run's dense steps: all-reduce the (locally clipped) gradient and
    return AdamW's direction of the mean, from moments every rank keeps alike."""
    buffer = bucket.buffer()
    current_layout(state, bucket)  # the moments are kept per bucket, moved on rebuilds
    grad = clip_locally(state, working_precision(buffer))
    grad = grad.div(state.world_size())
    state.traffic.count_all_reduce(buffer)
    work = dist.all_reduce(grad, group=state.process_group, async_op=True)
    index = bucket.index()

    def direction(fut: torch.futures.Future) -> Tensor:
        return adam_direction(state, index, fut.value()[0]).to(buffer.dtype)

    return _finish(work.get_future(), state, bucket.is_last(), direction)


def _finish(
    future: torch.futures.Future, state: DGCState, is_last: bool, result
) -> torch.futures.Future[Tensor]:
    def done(fut: torch.futures.Future) -> Tensor:
        out = result(fut)
        if is_last:
            state.end_step()
        return out

    return future.then(done)


# The reduce-scatter exchange (`exchange: reduce_scatter`).


def pack(indices: Tensor, values: Tensor) -> Tensor:
    """(index, value) pairs as one uint8 row each: int32 index bytes, then value bytes."""
    index_bytes = indices.to(INDEX_DTYPE).view(torch.uint8).view(-1, INDEX_DTYPE.itemsize)
    value_bytes = values.contiguous().view(torch.uint8).view(-1, values.element_size())
    return torch.cat([index_bytes, value_bytes], dim=1)


def unpack(rows: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """The indices (int64) and values of `pack`'s rows."""
    rows = rows.view(-1, INDEX_DTYPE.itemsize + torch.empty(0, dtype=dtype).element_size())
    indices = rows[:, : INDEX_DTYPE.itemsize].contiguous().view(INDEX_DTYPE).view(-1).long()
    values = rows[:, INDEX_DTYPE.itemsize :].contiguous().view(dtype).view(-1)
    return indices, values


def region_size(entries: int, world: int, rank: int) -> int:
    """How many of `entries` (0 .. entries - 1) lie in `rank`'s region (i mod world)."""
    return max(0, (entries - rank + world - 1) // world)


def kept_per_region(dense: Tensor, k: int, world: int) -> int:
    """P: the pairs each rank keeps of its region, the same on every rank (the layout and
    k are)."""
    forced = torch.bincount(dense % world, minlength=world) if dense.numel() else None
    most_forced = int(forced.max()) if forced is not None else 0
    return most_forced + math.ceil(k / world)


def reduce_to_regions(
    indices: Tensor,
    values: Tensor,
    entries: int,
    group: dist.ProcessGroup | None,
    traffic: StepTraffic,
) -> Tensor:
    """Round 1: send each rank the pairs in its region, sum what this rank receives; the
    sums of this rank's region (position j holds entry j x W + rank)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    owner = indices % world
    order = torch.argsort(owner, stable=True)
    rows = pack(indices[order], values[order])
    send_counts = torch.bincount(owner, minlength=world)
    receive_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(receive_counts, send_counts, group=group)
    row_bytes = rows.shape[1]
    sent_rows = int(send_counts.sum() - send_counts[rank])
    received_rows = int(receive_counts.sum() - receive_counts[rank])
    counts_bytes = (world - 1) * send_counts.element_size()
    traffic.count_exchange(
        sent=counts_bytes + sent_rows * row_bytes, received=counts_bytes + received_rows * row_bytes
    )
    received = torch.empty(
        (int(receive_counts.sum()), row_bytes), dtype=torch.uint8, device=rows.device
    )
    dist.all_to_all_single(
        received.view(-1),
        rows.view(-1),
        output_split_sizes=(receive_counts * row_bytes).tolist(),
        input_split_sizes=(send_counts * row_bytes).tolist(),
        group=group,
    )
    their_indices, their_values = unpack(received, values.dtype)
    sums = torch.zeros(region_size(entries, world, rank), dtype=values.dtype, device=values.device)
    sums.index_add_(0, their_indices // world, their_values)
    return sums


def keep_largest(sums: Tensor, dense: Tensor, kept: int, world: int, rank: int) -> Tensor:
    """Round 2: this rank's `kept` pairs as `pack` rows (bucket indices and sums): the
    region's `dense` entries, then its largest sums; padded with index `PAD`."""
    magnitudes = sums.abs()
    mine = dense[dense % world == rank]
    magnitudes[mine // world] = math.inf  # always kept
    picked = torch.topk(magnitudes, min(kept, sums.numel()), sorted=False).indices
    indices = picked * world + rank
    values = sums[picked]
    missing = kept - picked.numel()
    if missing:
        indices = torch.cat([indices, indices.new_full((missing,), PAD)])
        values = torch.cat([values, values.new_zeros(missing)])
    return pack(indices, values)


def reduce_scatter_exchange(
    residual: Tensor,
    sent: Tensor,
    values: Tensor,
    dense: Tensor,
    k: int,
    group: dist.ProcessGroup | None,
    traffic: StepTraffic,
) -> tuple[dist.Work, Callable[[], tuple[Tensor, Tensor]]]:
    """Start the exchange of this rank's pairs (`sent` indices, their `values`, already
    taken out of `residual`). Returns the all-gather's work and a function to call when it
    is done: it returns the sum over ranks of the kept pairs (dense, like `residual`) and
    the mask of `sent` entries applied; the others are back in `residual`."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    traffic.count_payload(pack(sent, values), sent.numel())
    sums = reduce_to_regions(sent, values, residual.numel(), group, traffic)
    kept = kept_per_region(dense, k, world)
    rows = keep_largest(sums, dense, kept, world, rank)
    traffic.count_exchange(sent=(world - 1) * rows.numel(), received=(world - 1) * rows.numel())
    gathered = [torch.empty_like(rows) for _ in range(world)]
    work = dist.all_gather(gathered, rows, group=group, async_op=True)

    def finish() -> tuple[Tensor, Tensor]:
        indices, sums = unpack(torch.cat(gathered), residual.dtype)
        real = indices != PAD
        indices, sums = indices[real], sums[real]
        total = torch.zeros_like(residual)
        total[indices] = sums  # each index is kept by its one owner
        applied = torch.zeros(residual.numel(), dtype=torch.bool, device=residual.device)
        applied[indices] = True
        sent_applied = applied[sent]
        dropped = ~sent_applied
        residual.index_add_(0, sent[dropped], values[dropped])  # back where it came from
        return total, sent_applied

    return work, finish
