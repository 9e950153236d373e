"""`asr-oomptimizer`: the largest batch size per duration bucket that fits in memory.

After Żelasko et al. (arXiv 2503.05931) and NeMo's "oomptimizer". For every bucket of the
bucketing sampler, the worst-case batch (every utterance at the bucket's maximum duration
and maximum token count) runs forward, backward and an optimizer step of the real model
(built as `asr-train` builds it). A `BatchSizeSearch` state machine picks the sizes: it
doubles from a start size until the first failure, then bisects between the largest fit
and the smallest failure down to a relative tolerance. Buckets are searched from the
longest to the shortest, each search starting from the previous result, since a longer
bucket's batch size is a lower bound for a shorter one's.

    asr-oomptimizer experiment=demo --bins-file data/demo/bins.yaml --memory-budget 4GiB \\
        -o data/demo/batch_sizes.yaml

The output YAML holds `data.sampler` keys: `bucket_duration_bins`, `bucket_batch_size` and,
when the bins file has per-bucket limits, `max_tps`.

How memory is measured: every probe makes the optimizer's state before its step (Adam's
moments live through every step of a run after the first; without them the found sizes ran
out of memory: recipes/librispeech/RESULTS.md, "The GPU check").

- **CUDA**: in this process. The caching allocator is capped at the budget
  (`torch.cuda.set_per_process_memory_fraction`) and uses expandable segments, as
  `asr-train` does (`asr.training.cuda_allocator`: less memory reserved in unusable gaps);
  a probe fits unless it raises `torch.cuda.OutOfMemoryError`; the peak is
  `torch.cuda.max_memory_allocated()`.
- **CPU**: every probe runs in a fresh process forked from a server that has imported
  the code and run one tiny step (`serve_cpu_probes`), so nothing of an earlier probe
  remains. The process resets its resident-memory high-water mark (VmHWM) and reports
  the growth of VmHWM above its resident size at that point: model, optimizer state,
  gradients and activations all count. A probe fits when that peak is within the
  budget. A watchdog thread stops a probe as soon as its anonymous resident memory
  passes the budget; a probe process that dies (killed by a signal, `MemoryError`) does
  not fit. The server runs with glibc's mmap threshold fixed at 128 KiB
  (`MALLOC_MMAP_THRESHOLD_`): every tensor gets its own mapping, returned when freed, so
  resident memory follows the live tensors and grows with the batch size. With glibc's
  default, adaptive threshold the peak of one step is not monotonic in the batch size
  (a larger batch can measure less); a training process under that default may hold
  more than measured here, so leave headroom (or train with the same setting).

Both modes keep one extra copy of the parameters by default, like the gradient buckets
of DistributedDataParallel (`--no-ddp-grad-copy` for single-device training), and run the
step in the training's precision (`trainer.precision`; "auto" resolved for the probe's
device): bf16 autocast keeps smaller activations, so its batches are larger. A transducer's
probes compute the loss as training will (`model.loss.lattice`: with `auto` on CUDA the
Triton kernels, or the PyTorch lattice from the moment they fail); the output file names
the lattice that ran.
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import hydra
import torch
import yaml
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from asr.cli import command
from asr.data.bins import read_bins, write_bins
from asr.losses.lattice_choice import active_lattice
from asr.models.build import model_kind
from asr.training.command import CONFIG_DIR
from asr.training.cuda_allocator import use_expandable_segments
from asr.training.objective import TransducerObjective, build_objective
from asr.training.precision import resolve_precision
from asr.training.probes import (
    ModelSetup,
    Probe,
    ProbeResult,
    cpu_probe,
    cuda_probe,
    format_bytes,
)

# Tokens per second a 1D bucket's probes are sized for when no bins file gives a limit.
PROBE_TPS = 12.0

log = logging.getLogger(__name__)


# --- the search state machine ------------------------------------------------------------


@dataclass
class BatchSizeSearch:
    """The batch-size search as a state machine; a driver feeds it "fits / does not fit".

    Doubles from `start` until the first failure (halves instead while nothing has fit),
    then bisects between `fit` (the largest size that fitted) and `fail` (the smallest
    that did not) until `(fail - fit) / fit <= rel_tolerance` or they are 1 apart. With
    `max_size`, sizes never exceed it. `result` is 0 when even size 1 does not fit.

        search = BatchSizeSearch(start=16)
        while (size := search.next_size()) is not None:
            search.report(size, fits=try_batch(size))
        search.result
    """

    start: int = 16
    rel_tolerance: float = 0.05
    max_size: int | None = None
    fit: int = 0  # largest size that fitted; 0: none yet
    fail: int | None = None  # smallest size that did not fit; None: none yet
    probes: int = 0

    def __post_init__(self) -> None:
        if self.start < 1:
            raise ValueError(f"start must be >= 1, got {self.start}")
        if self.rel_tolerance < 0:
            raise ValueError(f"rel_tolerance must be >= 0, got {self.rel_tolerance}")
        if self.max_size is not None:
            if self.max_size < 1:
                raise ValueError(f"max_size must be >= 1 or None, got {self.max_size}")
            self.start = min(self.start, self.max_size)

    def next_size(self) -> int | None:
        """The batch size to try next, or None when the search is over."""
        if self.fail is None:
            if self.fit == 0:
                return self.start
            if self.max_size is not None and self.fit >= self.max_size:
                return None
            return min(2 * self.fit, self.max_size or 2 * self.fit)
        if self.fit == 0:
            return self.fail // 2 or None  # halving; None once size 1 failed
        gap = self.fail - self.fit
        if gap <= 1 or gap / self.fit <= self.rel_tolerance:
            return None
        return (self.fit + self.fail) // 2

    def report(self, size: int, fits: bool) -> None:
        """Record the outcome of trying `size`, which must be what `next_size` asked for."""
        expected = self.next_size()
        if expected is None:
            raise RuntimeError(f"the search is over (result {self.fit}); nothing to report")
        if size != expected:
            raise ValueError(f"expected the outcome of batch size {expected}, got {size}")
        self.probes += 1
        if fits:
            self.fit = size
        else:
            self.fail = size

    @property
    def done(self) -> bool:
        return self.next_size() is None

    @property
    def result(self) -> int:
        """The largest batch size that fitted (0: not even 1); only once `done`."""
        if not self.done:
            raise RuntimeError(f"the search is not over: try batch size {self.next_size()}")
        return self.fit


# --- buckets and the search over them ----------------------------------------------------


@dataclass(frozen=True)
class Bucket:
    """A bucket's worst case: its upper duration edge (seconds) and the most tokens;
    `max_tps` is the bucket's tokens-per-second limit from a bins file, if any."""

    max_duration: float
    max_tokens: int
    max_tps: float | None = None


@dataclass(frozen=True)
class BucketResult:
    bucket: Bucket
    batch_size: int
    peak_bytes: int | None  # of the largest probe that fitted
    probes: int

    @property
    def audio_seconds(self) -> float:
        """Seconds of audio in a full batch of the longest utterances."""
        return self.batch_size * self.bucket.max_duration


def buckets_from_bins(
    bins: Sequence[Any], max_tps: float | Sequence[float] = PROBE_TPS
) -> tuple[list[Bucket], bool]:
    """Upper edges -> (buckets, is_2d). 1D `[d, ...]`: max tokens ceil(d * max_tps);
    2D `[[d, t], ...]`: the given token edges. Edges must be increasing. `max_tps` is one
    limit or one per bucket (a bins file's); a per-bucket list is kept on the buckets so
    that the output carries it on to the sampler."""
    if not isinstance(bins, Sequence) or isinstance(bins, str) or not bins:
        raise ValueError(f"bucket bins must be a non-empty list, got {bins!r}")
    is_2d = [isinstance(b, Sequence) and not isinstance(b, str) for b in bins]
    if any(is_2d) and not all(is_2d):
        raise ValueError(f"bucket bins mix 1D (seconds) and 2D ([seconds, tokens]) edges: {bins}")
    per_bucket = isinstance(max_tps, Sequence) and not isinstance(max_tps, str)
    limits = [float(x) for x in max_tps] if per_bucket else [float(max_tps)] * len(bins)
    if len(limits) != len(bins):
        raise ValueError(f"{len(limits)} max_tps values for {len(bins)} buckets: {max_tps}")
    if any(not limit > 0 for limit in limits):
        raise ValueError(f"max_tps must be positive, got {max_tps}")
    kept = limits if per_bucket else [None] * len(bins)
    if all(is_2d):
        if any(len(b) != 2 for b in bins):
            raise ValueError(f"a 2D bucket edge is [seconds, tokens], got {bins}")
        buckets = [Bucket(float(d), int(t), k) for (d, t), k in zip(bins, kept, strict=True)]
    else:
        # Rounded first, so that 2.0 x 12 is 24 tokens, not 25. An infinite limit (a bins
        # file's empty bucket) cannot bound tokens: such a bucket gets the global default.
        buckets = [
            Bucket(
                float(d), max(1, math.ceil(round(d * (x if math.isfinite(x) else PROBE_TPS), 6))), k
            )
            for d, x, k in zip(bins, limits, kept, strict=True)
        ]
    keys = [(b.max_duration, b.max_tokens) for b in buckets]
    if any(b.max_duration <= 0 for b in buckets) or keys != sorted(set(keys)):
        raise ValueError(f"bucket edges must be positive and increasing, got {bins}")
    return buckets, all(is_2d)


def search_bucket(
    bucket: Bucket,
    probe: Probe,
    search: BatchSizeSearch,
    on_probe: Callable[[Bucket, int, ProbeResult], None] | None = None,
) -> BucketResult:
    """Run `search` on one bucket; an error naming the bucket if batch size 1 fails."""
    peak, failure = None, None
    while (size := search.next_size()) is not None:
        outcome = probe(bucket.max_duration, bucket.max_tokens, size)
        search.report(size, outcome.fits)
        log.info(
            "bucket %.2f s / %d tokens: batch %d %s, peak %s%s (%.1f s)",
            bucket.max_duration,
            bucket.max_tokens,
            size,
            "fits" if outcome.fits else "does NOT fit",
            format_bytes(outcome.peak_bytes),
            f": {outcome.reason}" if outcome.reason else "",
            outcome.seconds,
        )
        if on_probe is not None:
            on_probe(bucket, size, outcome)
        if outcome.fits:
            peak = outcome.peak_bytes
        else:
            failure = outcome
    if search.result == 0:
        reason = failure.reason if failure is not None else ""
        raise RuntimeError(
            f"bucket {bucket.max_duration:g} s / {bucket.max_tokens} tokens: even batch size 1 "
            f"does not fit ({reason}); lower the bucket's edge, shrink the model or raise "
            "--memory-budget"
        )
    return BucketResult(bucket, search.result, peak, search.probes)


def search_buckets(
    buckets: Sequence[Bucket],
    probe: Probe,
    *,
    start: int = 16,
    rel_tolerance: float = 0.05,
    max_size: int | None = None,
    on_probe: Callable[[Bucket, int, ProbeResult], None] | None = None,
) -> list[BucketResult]:
    """The batch size of every bucket (in the given order), searched from the last
    (largest) bucket to the first, each search starting from the previous result."""
    results: list[BucketResult] = []
    size = start
    for bucket in reversed(buckets):
        search = BatchSizeSearch(start=size, rel_tolerance=rel_tolerance, max_size=max_size)
        results.append(search_bucket(bucket, probe, search, on_probe))
        size = results[-1].batch_size
    return results[::-1]


def merge_equal_sizes(results: Sequence[BucketResult]) -> list[BucketResult]:
    """Merge adjacent (1D) buckets of equal batch size into the one with the larger edge:
    its batch size fits every shorter utterance too. Probes are summed. With per-bucket
    `max_tps`, only when the larger bucket's limit is not below the shorter's, so that the
    merged bucket keeps every cut either kept and no cut has more tokens than was probed."""
    merged: list[BucketResult] = []
    for result in results:
        if merged and merged[-1].batch_size == result.batch_size:
            shorter, longer = merged[-1].bucket.max_tps, result.bucket.max_tps
            if shorter is None or longer is None or longer >= shorter:
                result = replace(result, probes=result.probes + merged.pop().probes)
        merged.append(result)
    return merged


def audio_only_buckets(buckets: Sequence[Bucket], is_2d: bool) -> list[Bucket]:
    """The buckets of a pre-training model (`model.kind: ssl`), which reads no tokens:
    their durations alone, no token count, no TPS limit."""
    if is_2d:
        raise ValueError(
            "model.kind=ssl pre-trains on audio alone: give 1D bins (seconds), as "
            "asr-estimate-bins writes them without --tokenizer, not [seconds, tokens] bins"
        )
    return [Bucket(b.max_duration, 0) for b in buckets]


def sampler_keys(results: Sequence[BucketResult], is_2d: bool) -> dict[str, list]:
    """`data.sampler` keys: `bucket_duration_bins`, `bucket_batch_size` and, when the
    buckets carry per-bucket limits, `max_tps`."""
    bins = [
        [r.bucket.max_duration, r.bucket.max_tokens] if is_2d else r.bucket.max_duration
        for r in results
    ]
    keys = {"bucket_duration_bins": bins, "bucket_batch_size": [r.batch_size for r in results]}
    if all(r.bucket.max_tps is not None for r in results):
        keys["max_tps"] = [r.bucket.max_tps for r in results]
    return keys


def plan_differences(found: Mapping[str, Any], shipped: Mapping[str, Any]) -> list[str]:
    """Where the sampler keys `found` by a search differ from those a config `shipped`
    (`bucket_duration_bins`, `bucket_batch_size`): one line per difference, none when they
    agree."""
    found_bins, shipped_bins = found["bucket_duration_bins"], shipped.get("bucket_duration_bins")
    if shipped_bins is None or shipped.get("bucket_batch_size") is None:
        return ["the config has no batch sizes to compare with"]
    as_lists = [[list(b) if isinstance(b, Sequence) else b for b in bins]
                for bins in (found_bins, shipped_bins)]  # fmt: skip
    if as_lists[0] != as_lists[1]:
        return [f"other buckets: {as_lists[0]} against the config's {as_lists[1]}"]
    return [
        f"bucket {edge}: batch size {new} (the config's {old})"
        for edge, new, old in zip(
            as_lists[0], found["bucket_batch_size"], shipped["bucket_batch_size"], strict=True
        )
        if new != old
    ]


# --- memory sizes ------------------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_UNITS |= {f"{u}ib": f for u, f in _UNITS.items() if u not in ("", "b")}
_UNITS |= {f"{u}b": 1000 ** (i + 1) for i, u in enumerate("kmgt")}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*", re.IGNORECASE)


def parse_memory_size(text: str) -> int:
    """'6GiB', '512MiB', '4G' (binary: K, M, G, T and KiB ... TiB), '8GB' (decimal:
    KB ... TB) or plain bytes -> bytes."""
    match = _SIZE.fullmatch(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS or float(match.group(1)) <= 0:
        raise ValueError(
            f"invalid memory size {text!r}: expected a positive number of bytes or a number "
            "with a unit K, M, G, T (= KiB, MiB, GiB, TiB, powers of 1024) or KB, MB, GB, TB "
            "(powers of 1000), e.g. 6GiB, 512MiB, 4G"
        )
    return int(float(match.group(1)) * _UNITS[unit])


# --- the worst-case training step ---------------------------------------------------------


def compose_config(overrides: Sequence[str]) -> DictConfig:
    """asr/configs/train.yaml composed with Hydra overrides (`key=value`)."""
    with hydra.initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return hydra.compose("train", overrides=list(overrides))


def lattice_in_use(cfg: DictConfig, device: str) -> str | None:
    """The transducer lattice the probes ran (None for other models and losses)."""
    model = OmegaConf.to_container(cfg.model, resolve=True)
    objective = build_objective(model_kind(model), model.get("loss"))
    if not isinstance(objective, TransducerObjective) or objective.config.kind != "samplewise":
        return None
    return active_lattice(objective.config.lattice, torch.device(device))


def summary_table(results: Sequence[BucketResult]) -> Table:
    table = Table(title="batch size per bucket")
    for name in ("max duration", "max tokens", "batch size", "audio / batch", "peak", "probes"):
        table.add_column(name, justify="right")
    for r in results:
        table.add_row(
            f"{r.bucket.max_duration:.2f} s",
            str(r.bucket.max_tokens),
            str(r.batch_size),
            f"{r.audio_seconds:.0f} s",
            format_bytes(r.peak_bytes),
            str(r.probes),
        )
    return table


def _memory_arg(text: str) -> int:
    try:
        return parse_memory_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="asr-oomptimizer",
        description="Largest batch size per bucket that survives a worst-case training step.",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=demo")
    bins = parser.add_mutually_exclusive_group(required=True)
    bins.add_argument("--buckets", type=yaml.safe_load, help="'[2, 4, 8]' or '[[2, 30], ...]'")
    bins.add_argument("--bins-file", help="YAML with bucket_duration_bins (asr-estimate-bins)")
    parser.add_argument("--memory-budget", type=_memory_arg, required=True, help="e.g. 6GiB")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default=None, help="default: cuda if any"
    )
    parser.add_argument("--start", type=int, default=16, help="first batch size tried")
    parser.add_argument("--rel-tolerance", type=float, default=0.05)
    parser.add_argument("--max-size", type=int, default=None, help="never try larger batches")
    parser.add_argument(
        "--max-tps",
        type=float,
        default=None,
        help="1D: most tokens per second (default: the bins file's per-bucket max_tps, else 12)",
    )
    parser.add_argument("--vocab-size", type=int, default=None, help="without a tokenizer file")
    parser.add_argument("--ddp-grad-copy", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--threads", type=int, default=None, help="CPU probes: torch threads")
    parser.add_argument("-o", "--output", default="batch_sizes.yaml")
    return parser.parse_intermixed_args(argv)


def _search_with_progress(
    buckets: list[Bucket], probing: Any, args: argparse.Namespace, console: Console
) -> list[BucketResult]:
    """search_buckets under a progress bar naming the bucket and batch being probed."""
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed} probes"))
    progress = Progress(*columns, TimeElapsedColumn(), console=console, transient=True)
    with probing as probe, progress:
        task = progress.add_task("probing", total=None)

        def advance(bucket: Bucket, size: int, outcome: ProbeResult) -> None:
            label = f"{bucket.max_duration:g} s / {bucket.max_tokens} tokens: last batch {size}"
            progress.update(task, advance=1, description=label)

        return search_buckets(
            buckets,
            probe,
            start=args.start,
            rel_tolerance=args.rel_tolerance,
            max_size=args.max_size,
            on_probe=advance,
        )


def _print_differences_from_config(keys: dict[str, Any], cfg: DictConfig) -> None:
    """Print where the searched plan differs from the config's data.sampler (shipped batches)."""
    shipped = OmegaConf.to_container(cfg.data.sampler, resolve=True)
    if shipped.get("bucket_batch_size") is None:
        return
    differences = plan_differences(keys, shipped)
    print("against the config's data.sampler (its preset's shipped batches):")
    for line in differences or ["the same buckets and batch sizes"]:
        print(f"  {line}")


@command
def main(argv: list[str] | None = None) -> None:
    """asr-oomptimizer: per-bucket batch sizes from worst-case probes of the real model."""
    use_expandable_segments()  # as asr-train runs: before anything touches CUDA
    args = _parse_args(argv)
    console = Console(stderr=True)
    logging.basicConfig(
        level=logging.INFO, format="%(message)s", handlers=[RichHandler(console=console)]
    )
    from_file = read_bins(args.bins_file) if args.bins_file else {}
    bins = from_file["bucket_duration_bins"] if from_file else args.buckets
    max_tps = next(
        tps for tps in (args.max_tps, from_file.get("max_tps"), PROBE_TPS) if tps is not None
    )
    buckets, is_2d = buckets_from_bins(bins, max_tps)
    cfg = compose_config(args.overrides)
    pretraining = model_kind(cfg.model) == "ssl"
    if pretraining:
        buckets = audio_only_buckets(buckets, is_2d)
    setup = ModelSetup.from_config(cfg, args.vocab_size, args.ddp_grad_copy)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("asr-oomptimizer: --device cuda, but torch sees no CUDA device")
    setup = replace(setup, precision=resolve_precision(cfg.trainer.precision, device))
    if device == "cuda":
        probing = cuda_probe(setup, args.memory_budget)
    else:
        probing = cpu_probe(setup, args.memory_budget, args.threads)

    results = _search_with_progress(buckets, probing, args, console)
    final = results if is_2d else merge_equal_sizes(results)
    command = "asr-oomptimizer " + " ".join(argv if argv is not None else sys.argv[1:])
    comment = (
        f"{command.strip()}\nworst-case batches within {format_bytes(args.memory_budget)} on "
        f"{device}; {len(results)} buckets searched, {len(final)} after merging equal sizes"
    )
    if pretraining:
        comment += "\npre-training: audio alone, batches by duration"
    elif not is_2d and not isinstance(max_tps, Sequence):
        comment += f"\nassumes at most {max_tps:g} tokens/s (data.sampler.max_tps)"
    lattice = lattice_in_use(cfg, device)
    if lattice is not None:
        comment += f"\ntransducer lattice: {lattice}"
        log.info("transducer lattice: %s", lattice)
    keys = sampler_keys(final, is_2d)
    write_bins(args.output, keys, comment)
    console.print(summary_table(final))
    print(f"{len(final)} buckets -> {args.output}")
    _print_differences_from_config(keys, cfg)


if __name__ == "__main__":
    # Through the package module, so that the probe server unpickles its classes by name.
    from asr.training.oomptimizer import main as package_main

    package_main()
