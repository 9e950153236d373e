"""How much of each mini-batch is padding, per batching strategy; prints JSON lines.

    python scripts/benchmark_batching.py --synthetic                 # 20k LibriSpeech-like cuts
    python scripts/benchmark_batching.py --tokenizer data/demo/tokenizer/bpe128.model \\
        --cuts data/demo/manifests/librispeech_cuts_train-clean-100.jsonl.gz
    python scripts/benchmark_batching.py --synthetic --write-bins bins.yaml   # for asr-oomptimizer
    python scripts/benchmark_batching.py --synthetic --searched sizes.yaml    # its output

Strategies (one epoch each, cut metadata only, no audio is read):
- `random`: shuffled batches of up to `--max-duration` seconds (lhotse's DynamicCutSampler);
- `buckets_1d`: `--num-buckets` duration buckets, `--max-duration` each;
- `buckets_2d`: the same duration bins split into `--num-token-buckets` token sub-buckets;
- `buckets_2d_searched`: 2D buckets with the per-bucket batch sizes that `asr-oomptimizer`
  found (`--searched`, a YAML with `bucket_duration_bins` and `bucket_batch_size`), next to
  `max_duration_same_budget`: one `max_duration` that fits the same memory, i.e. the largest
  M with M / d_k <= batch_size_k for every bucket k (d_k its longest duration), run as 1D.

Per strategy: padding fraction of input frames, of output tokens and of a transducer's
T x (U + 1) lattice nodes (1 - real / padded; `asr.data.buckets.padding_stats`), mean audio
seconds per batch, batches per epoch; for `--ranks` simulated data-parallel
ranks, with and without `sync_buckets`, the mean and the 95th percentile over steps of the
slowest rank's padded frames over the fastest rank's (a proxy for time lost waiting at each
all-reduce); and the same for Shar's per-rank streams (`synchronized_schedule`) on the same
cuts, with the share of its steps whose ranks drew from one bucket and of its batches that
are empty. Shar's ranks read whole shards: `--shard-cuts N` writes the cuts, in the order
given, into shards of N and deals the shards to the ranks in turn (0: cut i to rank i mod
ranks); `--speakers S` makes the synthetic cuts a corpus in speaker order (each speaker's
speech rate its own), as shards written in corpus order hold them.

    python scripts/benchmark_batching.py --synthetic --speakers 251 --shard-cuts 1000 --ranks 8
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import yaml
from lhotse import CutSet
from lhotse.dataset import DynamicCutSampler

from asr.data.bins import equal_total_edges, token_sub_bins, write_bins
from asr.data.buckets import build_sampler, count_tokens, cut_lengths, padding_stats
from asr.data.shar_sampler import SYNC_WINDOW, synchronized_schedule
from asr.data.synthetic_cuts import synthetic_cuts


def batch_stats(batches: Iterable[CutSet]) -> dict[str, float]:
    """`padding_stats` of one epoch, rounded for printing."""
    return {k: round(v, 4) for k, v in padding_stats(batches).items()}


def padded_seconds(batch: CutSet) -> float:
    return len(batch) * max(c.duration for c in batch)


def mean_and_p95(name: str, ratios: Iterable[float]) -> dict[str, float]:
    """`name` and `name_p95`: the mean and the 95th percentile of per-step ratios."""
    values = np.asarray(list(ratios), dtype=float)
    return {
        name: round(float(values.mean()), 3),
        f"{name}_p95": round(float(np.percentile(values, 95)), 3),
    }


def rank_imbalance(cuts: CutSet, cfg: dict, ranks: int, shard_cuts: int = 0) -> dict[str, float]:
    """Mean and 95th percentile over steps of max/min padded frames across `ranks`: one
    stream split by `RankSynchronizedSampler` (manifests' way) with and without sync, and
    per-rank streams kept in step by `synchronized_schedule` (Shar's way: each rank its own
    cuts, whole shards of `shard_cuts` dealt in turn; 0: cut i to rank i mod `ranks`)."""
    out = {}
    for sync in (True, False):
        per_rank = []
        for rank in range(ranks):
            sampler = build_sampler(
                cuts, {**cfg, "sync_buckets": sync}, rank=rank, world_size=ranks
            )
            per_rank.append([padded_seconds(b) for b in sampler])
        steps = np.array(per_rank)  # (ranks, steps): equal step counts on every rank
        name = "imbalance_sync" if sync else "imbalance_no_sync"
        out |= mean_and_p95(name, steps.max(axis=0) / steps.min(axis=0))
    return out | per_rank_streams(cuts, cfg, ranks, shard_cuts)


def rank_parts(cuts: list, ranks: int, shard_cuts: int) -> list[list]:
    """Each rank's cuts: whole shards of `shard_cuts` consecutive cuts dealt in turn (as
    Shar's ranks read them), or cut i to rank i mod `ranks` (`shard_cuts` 0)."""
    if shard_cuts <= 0:
        return [cuts[rank::ranks] for rank in range(ranks)]
    shards = [cuts[i : i + shard_cuts] for i in range(0, len(cuts), shard_cuts)]
    return [[c for shard in shards[rank::ranks] for c in shard] for rank in range(ranks)]


def per_rank_streams(cuts: CutSet, cfg: dict, ranks: int, shard_cuts: int = 0) -> dict[str, float]:
    """Shar's schedule on the same cuts, each rank's part (`rank_parts`), a sampler per
    rank, steps from `synchronized_schedule`: the imbalance over steps where every rank has
    a batch, the share of steps whose batches share a bucket, and the share of batches that
    are empty (a rank that ran out)."""
    parts = rank_parts(list(cuts), ranks, shard_cuts)
    batches, buckets = [], []
    for rank in range(ranks):
        sampler = build_sampler(CutSet.from_cuts(parts[rank]), cfg)
        made = list(sampler)
        batches.append(made)
        buckets.append([sampler.bucket_of(b) for b in made])
    schedule = synchronized_schedule(buckets, SYNC_WINDOW)
    full = [s for s in schedule if all(i is not None for i in s)]
    ratios = [
        max(padded_seconds(batches[r][i]) for r, i in enumerate(s))
        / min(padded_seconds(batches[r][i]) for r, i in enumerate(s))
        for s in full
    ]
    same = [len({buckets[r][i] for r, i in enumerate(s) if i is not None}) == 1 for s in schedule]
    empty = sum(i is None for s in schedule for i in s)
    return {
        **mean_and_p95("imbalance_per_rank_streams", ratios),
        "same_bucket_steps_per_rank_streams": round(float(np.mean(same)), 3),
        "empty_batches_per_rank_streams": round(empty / (len(schedule) * ranks), 4),
        "steps_sync": sum(1 for _ in build_sampler(cuts, cfg, rank=0, world_size=ranks)),
        "steps_per_rank_streams": len(schedule),
    }


def load_cuts(args: argparse.Namespace) -> CutSet:
    """Cuts with `custom[\"num_tokens\"]`, in memory."""
    if args.synthetic:
        return synthetic_cuts(args.num_cuts, seed=args.seed, speakers=args.speakers)
    from asr.data.corpus import load_cuts as load
    from asr.data.tokenizer import Tokenizer

    if not args.tokenizer:
        raise SystemExit("--cuts needs --tokenizer (token counts)")
    tokenizer = Tokenizer.load(args.tokenizer)
    return CutSet.from_cuts(count_tokens(load(args.cuts), tokenizer))  # kept in memory


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--synthetic", action="store_true", help="LibriSpeech-like, no audio")
    source.add_argument("--cuts", help="a cut manifest")
    parser.add_argument("--tokenizer", help="SentencePiece model (with --cuts)")
    parser.add_argument("--num-cuts", type=int, default=20_000)
    parser.add_argument("--max-duration", type=float, default=600.0)
    parser.add_argument("--num-buckets", type=int, default=30)
    parser.add_argument("--num-token-buckets", type=int, default=6)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument(
        "--shard-cuts",
        type=int,
        default=0,
        help="Shar's ranks: shards of this many cuts in the given order, dealt in turn "
        "(0: cut i to rank i mod ranks)",
    )
    parser.add_argument(
        "--speakers",
        type=int,
        default=None,
        help="--synthetic: the cuts in corpus order, this many speakers one after another",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write-bins", help="write the 2D bins here (for asr-oomptimizer)")
    parser.add_argument("--searched", help="asr-oomptimizer output for the 2D bins")
    args = parser.parse_args(argv)

    cuts = load_cuts(args)
    lengths = cut_lengths(cuts)
    longest = float(lengths.durations.max())
    duration_bins = equal_total_edges(lengths.durations, args.num_buckets)
    bins_2d = [list(b) for b in token_sub_bins(lengths, duration_bins, args.num_token_buckets)]
    if args.write_bins:
        write_bins(args.write_bins, {"bucket_duration_bins": bins_2d}, "benchmark_batching.py")
    common = {"max_cut_duration": longest, "min_cut_duration": 0.0, "seed": args.seed}
    common["buffer_size"] = min(len(cuts), 20_000)
    max_d = {"max_duration": max(args.max_duration, longest)}
    strategies = {
        "buckets_1d": {**common, **max_d, "bucket_duration_bins": duration_bins},
        "buckets_2d": {**common, **max_d, "bucket_duration_bins": bins_2d},
    }
    if args.searched:
        searched = yaml.safe_load(Path(args.searched).read_text())
        edges = [b[0] if isinstance(b, list) else b for b in searched["bucket_duration_bins"]]
        sizes = searched["bucket_batch_size"]
        strategies["buckets_2d_searched"] = {**common, **searched}
        same_budget = min(size * edge for size, edge in zip(sizes, edges, strict=True))
        strategies["max_duration_same_budget"] = {
            **common,
            "max_duration": same_budget,
            "max_cut_duration": min(longest, same_budget),
            "bucket_duration_bins": duration_bins,
        }

    base = {"cuts": len(cuts), "hours": round(lengths.durations.sum() / 3600, 1)}
    base |= {"ranks": args.ranks, "shard_cuts": args.shard_cuts, "speakers": args.speakers}
    random_batches = DynamicCutSampler(cuts, max_duration=max_d["max_duration"], shuffle=True)
    line = {"strategy": "random", **base, **max_d, **batch_stats(random_batches)}
    print(json.dumps(line), flush=True)
    for name, cfg in strategies.items():
        stats = batch_stats(build_sampler(cuts, cfg))
        line = {"strategy": name, **base, "max_duration": cfg.get("max_duration"), **stats}
        if name == "max_duration_same_budget":
            line["max_duration"] = round(cfg["max_duration"], 1)
        line |= rank_imbalance(cuts, cfg, args.ranks, args.shard_cuts)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
