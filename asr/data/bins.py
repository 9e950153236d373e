"""Bucket bins for the bucketing sampler: 1D duration bins, 2D (duration x tokens) bins and
per-bucket tokens-per-second (TPS) limits, estimated from a cut manifest.

Bins are *upper edges*, inclusive: a cut belongs to the first bucket whose edges it does not
exceed. 1D: ``[d_1, ..., d_K]`` seconds, ``d_K`` the longest cut. 2D: ``[[d, t], ...]``
sorted by duration then tokens; inside each duration bin the token edges split its cuts
into sub-buckets of equal total tokens. A cut longer than every edge is not sampled.

    asr-estimate-bins data/demo/manifests/librispeech_cuts_train-clean-100.jsonl.gz \\
        --tokenizer data/demo/tokenizer/bpe128.model --num-buckets 8 \\
        --num-token-buckets 3 -o data/demo/bins.yaml

The output is a YAML file whose keys are ``data.sampler`` keys (``bucket_duration_bins``,
``max_tps``); point ``data.sampler.bins_file`` at it or copy its keys into a config.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from lhotse.cut import Cut
from rich.progress import track

from asr.cli import command
from asr.data.corpus import cut_text, open_cuts
from asr.data.tokenizer import Tokenizer

log = logging.getLogger(__name__)

Bin = float | tuple[float, int]


@dataclass(frozen=True)
class CutLengths:
    """Durations (seconds) and token counts of a set of cuts, aligned by index."""

    ids: list[str]
    durations: np.ndarray
    tokens: np.ndarray

    @property
    def tps(self) -> np.ndarray:
        return self.tokens / self.durations

    @classmethod
    def of(cls, cuts: Iterable[Cut], tokenizer: Tokenizer, progress: bool = True) -> CutLengths:
        """Measure every cut (one tokenization each); cuts without a transcript are left out
        and counted in the log."""
        ids, durations, tokens, empty = [], [], [], 0
        items = track(cuts, description="measuring cuts") if progress else cuts
        for cut in items:
            text = cut_text(cut)
            if not text:
                empty += 1
                continue
            ids.append(cut.id)
            durations.append(cut.duration)
            tokens.append(len(tokenizer.encode(text)))
        if empty:
            log.warning("%d cuts without a transcript were left out of the bins", empty)
        if not ids:
            raise ValueError("no cut with a transcript to estimate bins from")
        return cls(ids, np.asarray(durations, float), np.asarray(tokens, np.int64))


def equal_total_edges(values: Sequence[float] | np.ndarray, num_buckets: int) -> list[float]:
    """Upper edges that split `values` into `num_buckets` groups of about equal sum (each
    within one value of sum/num_buckets; ties, which must share a group, can force more).
    Equal edges are merged, so fewer groups come back when many values are identical."""
    if num_buckets < 1:
        raise ValueError(f"num_buckets must be >= 1, got {num_buckets}")
    v = np.sort(np.asarray(values, dtype=float))
    if len(v) < num_buckets:
        raise ValueError(f"{len(v)} values cannot fill {num_buckets} buckets")
    cumulative = np.cumsum(v)
    edges = {float(v[-1])}
    for target in cumulative[-1] * np.arange(1, num_buckets) / num_buckets:
        # The value that reaches the target, or the one before it when stopping there
        # (leaving out every tie of the reaching value) lands closer to the target.
        reach = v[np.searchsorted(cumulative, target)]
        last_tie = np.searchsorted(v, reach, side="right") - 1
        before = np.searchsorted(v, reach, side="left") - 1
        if before >= 0 and target - cumulative[before] < cumulative[last_tie] - target:
            reach = v[before]
        edges.add(float(reach))
    return sorted(edges)


def bucket_of(values: np.ndarray, edges: Sequence[float]) -> np.ndarray:
    """Index of the first edge >= each value (len(edges) when above the last): the one
    bucket rule of the package, as lhotse's samplers apply it (bisect_left)."""
    return np.searchsorted(np.asarray(edges, dtype=float), values, side="left")


def _duration_edge(b: Bin) -> float:
    return b[0] if isinstance(b, tuple) else b


def duration_index(bins: Sequence[Bin], duration: float) -> int:
    """The first bin whose duration edge holds `duration`; len(bins) beyond the last. The
    rule of `bucket_of` for one cut, without building arrays (it runs for every cut)."""
    return bisect_left(bins, duration, key=_duration_edge)


def bin_index(bins: Sequence[Bin], duration: float, tokens: int | None = None) -> int:
    """The bucket of one cut: the first bin whose duration edge holds `duration` and, for 2D
    bins, whose token edge holds `tokens`; len(bins) when none does."""
    first = duration_index(bins, duration)
    if first == len(bins) or not isinstance(bins[0], tuple):
        return first
    return next((i for i in range(first, len(bins)) if tokens <= bins[i][1]), len(bins))


def tps_limits(
    lengths: CutLengths, duration_bins: Sequence[float], num_std: float = 4.0
) -> list[float]:
    """Per duration bin, the largest TPS that is not an outlier: the bin's mean plus
    `num_std` standard deviations (one pass; cuts above it are the outliers)."""
    which = bucket_of(lengths.durations, duration_bins)
    tps = lengths.tps
    limits = []
    for k in range(len(duration_bins)):
        inside = tps[which == k]
        if len(inside) == 0:
            limits.append(float("inf"))
            continue
        limit = float(inside.mean() + num_std * inside.std())
        limits.append(math.ceil(limit * 1000) / 1000)  # rounded up: keeps what it kept
    return limits


def token_sub_bins(
    lengths: CutLengths, duration_bins: Sequence[float], num_token_buckets: int
) -> list[tuple[float, int]]:
    """2D bins: inside each duration bin, token edges giving sub-buckets of equal total
    tokens. Duration bins whose cuts are too few get fewer sub-buckets."""
    which = bucket_of(lengths.durations, duration_bins)
    bins = []
    for k, edge in enumerate(duration_bins):
        tokens = lengths.tokens[which == k]
        if len(tokens) == 0:
            continue
        parts = min(num_token_buckets, len(tokens))
        bins.extend((float(edge), int(t)) for t in equal_total_edges(tokens, parts))
    return bins


@dataclass(frozen=True)
class TpsFilterReport:
    """Cuts dropped by the TPS limits while estimating bins, per reason."""

    above_max: int
    below_min: int


def estimate_bins(
    lengths: CutLengths,
    num_buckets: int,
    num_token_buckets: int = 1,
    num_std: float = 4.0,
    min_tps: float | None = None,
) -> tuple[dict[str, Any], TpsFilterReport]:
    """Sampler keys for `lengths`: `bucket_duration_bins` (1D when `num_token_buckets` is 1,
    else 2D) and per-bucket `max_tps`. TPS outliers (and cuts under `min_tps`) are dropped
    before the token sub-buckets are estimated, so they do not stretch the token edges."""
    duration_bins = equal_total_edges(lengths.durations, num_buckets)
    limits = tps_limits(lengths, duration_bins, num_std)
    per_cut_limit = np.asarray(limits + [float("inf")])[bucket_of(lengths.durations, duration_bins)]
    tps = lengths.tps
    above = tps > per_cut_limit
    below = tps < min_tps if min_tps is not None else np.zeros_like(above)
    keep = ~(above | below)
    report = TpsFilterReport(int(above.sum()), int((below & ~above).sum()))
    kept = CutLengths(
        [i for i, k in zip(lengths.ids, keep, strict=True) if k],
        lengths.durations[keep],
        lengths.tokens[keep],
    )
    if num_token_buckets <= 1:
        return {"bucket_duration_bins": duration_bins, "max_tps": limits}, report
    bins = token_sub_bins(kept, duration_bins, num_token_buckets)
    limit_of = dict(zip(duration_bins, limits, strict=True))
    keys = {"bucket_duration_bins": [list(b) for b in bins]}
    return keys | {"max_tps": [limit_of[d] for d, _ in bins]}, report


def write_bins(path: str | Path, keys: dict[str, Any], comment: str = "") -> None:
    """Write sampler keys as YAML (a header comment says how they were made)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = "".join(f"# {line}\n" for line in comment.splitlines())
    path.write_text(header + yaml.safe_dump(keys, default_flow_style=None, sort_keys=False))


def read_bins(path: str | Path) -> dict[str, Any]:
    """The sampler keys of a bins file (from `asr-estimate-bins` or `asr-oomptimizer`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"bins file not found: {path} (make it with asr-estimate-bins)")
    keys = yaml.safe_load(path.read_text()) or {}
    if "bucket_duration_bins" not in keys:
        raise ValueError(f"{path} has no bucket_duration_bins key")
    return keys


def _duration_bins(args: argparse.Namespace, command: str) -> None:
    """`asr-estimate-bins` without a tokenizer: 1D bins of equal total duration over every
    cut, with a transcript or not."""
    if args.num_token_buckets > 1 or args.min_tps is not None:
        raise ValueError(
            "--num-token-buckets and --min-tps count tokens: give --tokenizer, or bin by "
            "duration alone without them"
        )
    durations = [cut.duration for cut in track(open_cuts(args.manifests), "measuring cuts")]
    if not durations:
        raise ValueError(f"no cuts in {' '.join(args.manifests)}")
    keys = {"bucket_duration_bins": equal_total_edges(durations, args.num_buckets)}
    hours = sum(durations) / 3600
    comment = f"{command.strip()}\n{len(durations)} cuts, {hours:.2f} h; by duration alone"
    write_bins(args.output, keys, comment)
    print(f"{len(keys['bucket_duration_bins'])} 1D buckets by duration alone -> {args.output}")


@command
def main(argv: list[str] | None = None) -> None:
    """asr-estimate-bins: 1D or 2D bucket bins and per-bucket TPS limits from manifests."""

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("manifests", nargs="+", help="cut manifests (jsonl.gz)")
    parser.add_argument(
        "--tokenizer", help="SentencePiece model (without: bins by duration alone, for "
        "pre-training on audio without transcripts; no token bins, no TPS limits)",
    )  # fmt: skip
    parser.add_argument("--num-buckets", type=int, default=30, help="duration bins")
    parser.add_argument(
        "--num-token-buckets", type=int, default=1, help="token sub-buckets per bin (1: 1D)"
    )
    parser.add_argument("--tps-num-std", type=float, default=4.0, help="outlier threshold")
    parser.add_argument("--min-tps", type=float, default=None)
    parser.add_argument("-o", "--output", default="bins.yaml")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")

    command = "asr-estimate-bins " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.tokenizer is None:
        _duration_bins(args, command)
        return
    lengths = CutLengths.of(open_cuts(args.manifests), Tokenizer.load(args.tokenizer))
    keys, report = estimate_bins(
        lengths, args.num_buckets, args.num_token_buckets, args.tps_num_std, args.min_tps
    )
    comment = (
        f"{command.strip()}\n{len(lengths.ids)} cuts, {lengths.durations.sum() / 3600:.2f} h; "
        f"TPS outliers: {report.above_max} above the per-bucket limit, "
        f"{report.below_min} below min_tps"
    )
    write_bins(args.output, keys, comment)
    kind = "2D" if args.num_token_buckets > 1 else "1D"
    print(f"{len(keys['bucket_duration_bins'])} {kind} buckets -> {args.output}")
    print(f"TPS outliers: {report.above_max} above the limits, {report.below_min} below min_tps")


if __name__ == "__main__":
    main()
