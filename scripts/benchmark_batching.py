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
seconds per batch, batches per epoch. Then `--ranks` simulated data-parallel ranks
(`asr.data.rank_sync.simulate_ranks`: the training sampler's own decisions, without
processes), each reading only its own part: its slice of the manifest, with and without
`sync_buckets`, and whole Shar shards (`per_rank_streams`). For each: the mean and the 95th
percentile over steps of the slowest rank's padded seconds over the fastest rank's (a
proxy for the time lost waiting at each all-reduce; over the steps where every rank has a
batch), the steps, the share of batches that are empty (a rank that ran out at the end of
the epoch) and the padding of all ranks' batches. Shar's ranks read whole shards:
`--shard-cuts N` writes the cuts, in the order given, into shards of N and deals the shards
to the ranks in turn (0: cut i to rank i mod ranks); `--speakers S` makes the synthetic cuts
a corpus in speaker order (each speaker's speech rate its own), as shards written in corpus
order hold them; `--buffer-size` sets the cuts each rank's bucket buffers hold.

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
from asr.data.rank_sync import WholeStream, simulate_ranks
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
    """`ranks` simulated data-parallel ranks (`asr.data.rank_sync.simulate_ranks`), each
    reading only its own part: its slice of the manifest, with and without `sync_buckets`
    (`imbalance_sync`, `imbalance_no_sync`), and its whole shards (`per_rank_streams`:
    shards of `shard_cuts` consecutive cuts dealt in turn; 0: cut i to rank i mod `ranks`)."""
    out: dict[str, float] = {}
    for sync in (True, False):
        samplers = [
            build_sampler(cuts, {**cfg, "sync_buckets": sync}, rank=rank, world_size=ranks)
            for rank in range(ranks)
        ]
        stats = step_stats(list(simulate_ranks(samplers)))
        name = "sync" if sync else "no_sync"
        out |= {f"{k}_{name}": v for k, v in stats.items() if sync or k.startswith("imbalance")}
    parts = rank_parts(list(cuts), ranks, shard_cuts)
    samplers = [
        build_sampler(WholeStream(parts[rank]), cfg, rank=rank, world_size=ranks)
        for rank in range(ranks)
    ]
    stats = step_stats(list(simulate_ranks(samplers)))
    return out | {f"{k}_per_rank_streams": v for k, v in stats.items()}


def step_stats(steps: list[list[CutSet]]) -> dict[str, float]:
    """Over an epoch's steps (each every rank's batch): the slowest over the fastest rank's
    padded seconds (mean and 95th percentile over the steps where every rank has a batch),
    `wait_share` (the share of the ranks' time spent waiting for the slowest, if a step
    takes as long as its padded seconds: 1 - sum of the mean over ranks / sum of the
    slowest, empty batches included), the steps, the share of batches that are empty (a
    rank that ran out at the epoch's end) and the padding of all ranks' batches."""
    full = [step for step in steps if all(len(batch) for batch in step)]
    ratios = [
        max(padded_seconds(b) for b in step) / min(padded_seconds(b) for b in step) for step in full
    ]
    empty = sum(not len(batch) for step in steps for batch in step)
    padded = np.array([[padded_seconds(b) if len(b) else 0.0 for b in step] for step in steps])
    wait_share = 1 - padded.mean(axis=1).sum() / padded.max(axis=1).sum()
    padding = padding_stats(batch for step in steps for batch in step if len(batch))
    return {
        **mean_and_p95("imbalance", ratios),
        "wait_share": round(float(wait_share), 4),
        "steps": len(steps),
        "empty_batches": round(empty / (len(steps) * len(steps[0])), 4),
        "frame_padding": round(padding["frame_padding"], 4),
        "token_padding": round(padding["token_padding"], 4),
    }


def rank_parts(cuts: list, ranks: int, shard_cuts: int) -> list[list]:
    """Each rank's cuts: whole shards of `shard_cuts` consecutive cuts dealt in turn (as
    Shar's ranks read them), or cut i to rank i mod `ranks` (`shard_cuts` 0)."""
    if shard_cuts <= 0:
        return [cuts[rank::ranks] for rank in range(ranks)]
    shards = [cuts[i : i + shard_cuts] for i in range(0, len(cuts), shard_cuts)]
    return [[c for shard in shards[rank::ranks] for c in shard] for rank in range(ranks)]


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
    parser.add_argument(
        "--buffer-size",
        type=int,
        default=None,
        help="cuts each rank's bucket buffers hold (default: the corpus, at most 20,000)",
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
    common["buffer_size"] = args.buffer_size or min(len(cuts), 20_000)
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
    base |= {"buffer_size": common["buffer_size"]}
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
