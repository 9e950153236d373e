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

The output YAML holds `data.sampler` keys: `bucket_duration_bins` and `bucket_batch_size`.

How memory is measured:

- **CUDA**: in this process. The caching allocator is capped at the budget
  (`torch.cuda.set_per_process_memory_fraction`); a probe fits unless it raises
  `torch.cuda.OutOfMemoryError`; the peak is `torch.cuda.max_memory_allocated()`.
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
  default, adaptive threshold the peak of one step jumped between neighbouring sizes
  (batch 9: 108 MiB, batch 10: 86 MiB); a training process under that default may hold
  more than measured here, so leave headroom (or train with the same setting).

Both modes keep one extra copy of the parameters by default, like the gradient buckets
of DistributedDataParallel (`--no-ddp-grad-copy` for single-device training).
"""

from __future__ import annotations

import argparse
import copy
import gc
import logging
import math
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from subprocess import PIPE
from typing import Any, NoReturn

import hydra
import torch
import yaml
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from asr.data.batch import Batch
from asr.data.bins import read_bins, write_bins
from asr.data.tokenizer import Tokenizer
from asr.models.build import build_model
from asr.training.module import AsrLitModule
from asr.training.objective import TransducerLossConfig, TransducerObjective
from asr.training.train import CONFIG_DIR

log = logging.getLogger(__name__)

FRAMES_PER_SECOND = 100  # 10 ms feature hop
DEFAULT_MEL_BINS = 80
WATCHDOG_EXIT_CODE = 86  # a CPU probe process stopped by its watchdog
WATCHDOG_INTERVAL = 0.005  # seconds between the watchdog's looks at resident memory
MMAP_THRESHOLD = 128 * 1024  # CPU probes: glibc maps every allocation from this size alone


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
    """A bucket's worst case: its upper duration edge (seconds) and the most tokens."""

    max_duration: float
    max_tokens: int


@dataclass(frozen=True)
class ProbeResult:
    """Outcome of one worst-case training step; `peak_bytes` is None when unmeasured."""

    fits: bool
    peak_bytes: int | None
    reason: str = ""
    seconds: float = 0.0


# probe(max_duration, max_tokens, batch_size) -> ProbeResult
Probe = Callable[[float, int, int], ProbeResult]


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


def buckets_from_bins(bins: Sequence[Any], max_tps: float = 12.0) -> tuple[list[Bucket], bool]:
    """Upper edges -> (buckets, is_2d). 1D `[d, ...]`: max tokens ceil(d * max_tps);
    2D `[[d, t], ...]`: the given token edges. Edges must be increasing."""
    if not isinstance(bins, Sequence) or isinstance(bins, str) or not bins:
        raise ValueError(f"bucket bins must be a non-empty list, got {bins!r}")
    is_2d = [isinstance(b, Sequence) and not isinstance(b, str) for b in bins]
    if any(is_2d) and not all(is_2d):
        raise ValueError(f"bucket bins mix 1D (seconds) and 2D ([seconds, tokens]) edges: {bins}")
    if all(is_2d):
        if any(len(b) != 2 for b in bins):
            raise ValueError(f"a 2D bucket edge is [seconds, tokens], got {bins}")
        buckets = [Bucket(float(d), int(t)) for d, t in bins]
    else:
        if max_tps <= 0:
            raise ValueError(f"max_tps must be positive, got {max_tps}")
        # Rounded first, so that 2.0 x 12 is 24 tokens, not 25.
        buckets = [Bucket(float(d), max(1, math.ceil(round(d * max_tps, 6)))) for d in bins]
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
    its batch size fits every shorter utterance too. Probes are summed."""
    merged: list[BucketResult] = []
    for result in results:
        if merged and merged[-1].batch_size == result.batch_size:
            result = replace(result, probes=result.probes + merged.pop().probes)
        merged.append(result)
    return merged


def sampler_keys(results: Sequence[BucketResult], is_2d: bool) -> dict[str, list]:
    """`data.sampler` keys: `bucket_duration_bins` and `bucket_batch_size`."""
    bins = [
        [r.bucket.max_duration, r.bucket.max_tokens] if is_2d else r.bucket.max_duration
        for r in results
    ]
    return {"bucket_duration_bins": bins, "bucket_batch_size": [r.batch_size for r in results]}


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


def format_bytes(num: int | None) -> str:
    if num is None:
        return "?"
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(num) >= factor:
            return f"{num / factor:.1f} {unit}"
    return f"{num} B"


# --- the worst-case training step ---------------------------------------------------------


@dataclass(frozen=True)
class ModelSetup:
    """What a probe builds: the resolved `model` (with `loss`) and `optim` configs."""

    model: dict[str, Any]
    optim: dict[str, Any]
    vocab_size: int
    num_mel_bins: int = DEFAULT_MEL_BINS
    ddp_grad_copy: bool = True  # one extra copy of the parameters, like DDP's buckets

    @classmethod
    def from_config(
        cls, cfg: DictConfig, vocab_size: int | None = None, ddp_grad_copy: bool = True
    ) -> ModelSetup:
        """From a composed train config; the model is built once on the meta device
        (no memory), so that config errors show here and not as failed probes."""
        setup = cls(
            model=OmegaConf.to_container(cfg.model, resolve=True),
            optim=OmegaConf.to_container(cfg.optim, resolve=True),
            vocab_size=resolve_vocab_size(cfg, vocab_size),
            num_mel_bins=int(
                OmegaConf.select(cfg, "data.features.num_mel_bins") or DEFAULT_MEL_BINS
            ),
            ddp_grad_copy=ddp_grad_copy,
        )
        with torch.device("meta"):
            build_training(setup, "meta")
        return setup


def resolve_vocab_size(cfg: DictConfig, vocab_size: int | None) -> int:
    """The vocabulary of `data.tokenizer` when the file exists, else `vocab_size`."""
    path = OmegaConf.select(cfg, "data.tokenizer")
    if path and Path(path).is_file():
        found = Tokenizer.load(path).vocab_size
        if vocab_size is not None and vocab_size != found:
            raise ValueError(
                f"--vocab-size {vocab_size} differs from data.tokenizer={path} ({found} pieces)"
            )
        return found
    if vocab_size is None:
        raise ValueError(
            f"data.tokenizer={path} does not exist: train it first or give --vocab-size"
        )
    if vocab_size < 2:
        raise ValueError(f"--vocab-size must be >= 2 (blank and one token), got {vocab_size}")
    return vocab_size


def build_training(
    setup: ModelSetup, device: str
) -> tuple[torch.nn.Module, TransducerObjective, torch.optim.Optimizer, int]:
    """Model (on `device`, training mode), objective and optimizer as `asr-train` builds
    them, and a training step at which the transducer loss runs."""
    model_cfg = copy.deepcopy(setup.model)
    loss_cfg = TransducerLossConfig.from_mapping(model_cfg.pop("loss", None))
    model = build_model(model_cfg, setup.vocab_size).to(device).train()
    objective = TransducerObjective(loss_cfg)
    module = AsrLitModule(
        model,
        objective,
        tokenizer=None,  # only the optimizer is wanted: no decoding,
        optim=setup.optim,
        bundle_meta={},
        total_steps=1,  # and any schedule length will do
    )
    optimizer = module.configure_optimizers()["optimizer"]
    return model, objective, optimizer, loss_cfg.transducer_start_step


def worst_case_batch(
    batch_size: int, max_duration: float, max_tokens: int, num_mel_bins: int, vocab_size: int
) -> Batch:
    """B utterances of `max_duration` seconds, each with `max_tokens` random tokens."""
    frames = math.ceil(round(max_duration * FRAMES_PER_SECOND, 6))
    return Batch(
        features=torch.randn(batch_size, frames, num_mel_bins),
        feature_lens=torch.full((batch_size,), frames, dtype=torch.int64),
        tokens=torch.randint(1, vocab_size, (batch_size, max_tokens)),
        token_lens=torch.full((batch_size,), max_tokens, dtype=torch.int64),
        cut_ids=[f"worst-case-{i}" for i in range(batch_size)],
        texts=[""] * batch_size,
    )


def worst_case_step(
    setup: ModelSetup, max_duration: float, max_tokens: int, batch_size: int, device: str
) -> None:
    """Build everything on `device`, then forward, backward and one optimizer step."""
    torch.manual_seed(0)
    model, objective, optimizer, step = build_training(setup, device)
    ddp_buckets = [torch.zeros_like(p) for p in model.parameters()] if setup.ddp_grad_copy else []
    batch = worst_case_batch(
        batch_size, max_duration, max_tokens, setup.num_mel_bins, setup.vocab_size
    ).to(device)
    objective(model, batch, step=step)["loss"].backward()
    optimizer.step()
    del ddp_buckets  # held until here, like DDP's


# --- probes: CUDA in this process, CPU in a fresh process each ---------------------------


@contextmanager
def cuda_probe(setup: ModelSetup, budget: int) -> Iterator[Probe]:
    """Probes on the current CUDA device, its allocator capped at `budget` bytes."""
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    if budget > total:
        raise ValueError(
            f"--memory-budget {format_bytes(budget)} exceeds the GPU's {format_bytes(total)}"
        )

    def probe(max_duration: float, max_tokens: int, batch_size: int) -> ProbeResult:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before, began, reason = torch.cuda.memory_allocated(), time.perf_counter(), ""
        try:
            worst_case_step(setup, max_duration, max_tokens, batch_size, "cuda")
            torch.cuda.synchronize()
        except torch.cuda.OutOfMemoryError as err:
            reason = f"CUDA out of memory: {str(err).splitlines()[0]}"
        peak = torch.cuda.max_memory_allocated() - before
        gc.collect()  # the exception's frames held tensors until here
        torch.cuda.empty_cache()
        return ProbeResult(not reason, peak, reason, time.perf_counter() - began)

    torch.cuda.set_per_process_memory_fraction(budget / total)
    try:
        yield probe
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)


def _status_bytes(key: str) -> int:
    """`VmRSS`, `VmHWM`, ... of this process from /proc/self/status, in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(f"{key} not in /proc/self/status")


def _start_watchdog(budget: int) -> None:
    """Exit this process as soon as its anonymous resident memory grows more than `budget`."""
    baseline = _status_bytes("RssAnon")

    def watch() -> None:
        while _status_bytes("RssAnon") - baseline <= budget:
            time.sleep(WATCHDOG_INTERVAL)
        os._exit(WATCHDOG_EXIT_CODE)

    threading.Thread(target=watch, daemon=True).start()


def _measure_cpu_step(
    setup: ModelSetup, shape: tuple[float, int, int], budget: int, num_threads: int | None
) -> dict[str, Any]:
    """In a fresh probe process: {"peak": bytes} or {"memory_error": text}; other errors
    propagate. The peak is the growth of the resident high-water mark above the resident
    size before the model, less file pages read in meanwhile (library code the warm-up
    did not run: shared between processes; the CUDA count leaves out kernels too)."""
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # resets VmHWM to the current resident size
    rss, file_pages = _status_bytes("VmRSS"), _status_bytes("RssFile")
    _start_watchdog(budget)
    try:
        worst_case_step(setup, *shape, device="cpu")
    except MemoryError as err:
        return {"memory_error": f"MemoryError {err}"}
    except RuntimeError as err:
        if "can't allocate memory" not in str(err):
            raise
        return {"memory_error": str(err).splitlines()[0]}
    code_pages = max(0, _status_bytes("RssFile") - file_pages)
    return {"peak": _status_bytes("VmHWM") - rss - code_pages}


def _run_probe_child(request: tuple, fd: int) -> NoReturn:
    """The forked probe process: measure, write the pickled answer to `fd`, exit."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        answer = _measure_cpu_step(*request)
    except BaseException:
        answer = {"error": traceback.format_exc()}
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(pickle.dumps(answer))
    finally:
        os._exit(0)  # never back into the server's loop


def _warm_up(setup: ModelSetup) -> None:
    """One tiny step on one thread (no thread pool to break a fork): the code and one-off
    caches the probes share are then loaded before they fork, and not counted in them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    worst_case_step(setup, 1.0, 1, 1, "cpu")
    torch.set_num_threads(threads)
    gc.collect()


def serve_cpu_probes() -> None:
    """The CPU probe server (a subprocess of `cpu_probe`): for every pickled request on
    stdin, fork a child that runs it, and pickle (answer or None, exit code) to stdout."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever the probes print goes to stderr, not into the replies
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the caller closes stdin
    warm = False
    while True:
        try:
            request = pickle.load(sys.stdin.buffer)
        except EOFError:
            return
        if not warm:
            _warm_up(request[0])
            warm = True
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            _run_probe_child(request, write_fd)
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as answers:
            data = answers.read()
        exitcode = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        try:
            answer = pickle.loads(data)
        except Exception:  # killed while writing, or nothing written
            answer = None
        pickle.dump((answer, exitcode), replies)
        replies.flush()


def _cpu_result(answer: dict | None, exitcode: int, budget: int, seconds: float) -> ProbeResult:
    """A probe process's answer and exit code -> ProbeResult; an error if it crashed."""
    if answer is not None and "error" in answer:
        raise RuntimeError(f"a probe process failed:\n{answer['error']}")
    if answer is not None and "peak" in answer:
        fits = answer["peak"] <= budget
        reason = "" if fits else f"peak above the budget {format_bytes(budget)}"
        return ProbeResult(fits, answer["peak"], reason, seconds)
    if answer is not None:
        return ProbeResult(False, None, answer["memory_error"], seconds)
    if exitcode == WATCHDOG_EXIT_CODE:
        reason = f"resident memory grew past the budget {format_bytes(budget)} (stopped)"
    elif exitcode < 0:
        reason = f"probe process killed by {signal.Signals(-exitcode).name}"
    else:
        raise RuntimeError(f"a probe process exited with code {exitcode} (its stderr is above)")
    return ProbeResult(False, None, reason, seconds)


@contextmanager
def cpu_probe(setup: ModelSetup, budget: int, num_threads: int | None = None) -> Iterator[Probe]:
    """Probes in fresh processes, forked from a server process that has imported this
    module (a few seconds, once); each probe then costs only its own work."""
    command = "from asr.training.oomptimizer import serve_cpu_probes; serve_cpu_probes()"
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
    server = subprocess.Popen([sys.executable, "-c", command], stdin=PIPE, stdout=PIPE, env=env)

    def probe(max_duration: float, max_tokens: int, batch_size: int) -> ProbeResult:
        began = time.perf_counter()
        request = (setup, (max_duration, max_tokens, batch_size), budget, num_threads)
        pickle.dump(request, server.stdin)
        server.stdin.flush()
        try:
            answer, exitcode = pickle.load(server.stdout)
        except EOFError:
            raise RuntimeError(f"the CPU probe server exited with code {server.wait()}") from None
        return _cpu_result(answer, exitcode, budget, time.perf_counter() - began)

    try:
        yield probe
    finally:
        server.stdin.close()
        server.wait()


# --- command line ------------------------------------------------------------------------


def compose_config(overrides: Sequence[str]) -> DictConfig:
    """configs/train.yaml composed with Hydra overrides (`key=value`)."""
    with hydra.initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return hydra.compose("train", overrides=list(overrides))


def summary_table(results: Sequence[BucketResult]) -> Table:
    table = Table(title="batch size per bucket")
    for name in ("max duration", "max tokens", "batch size", "audio / batch", "peak", "probes"):
        table.add_column(name, justify="right")
    for r in results:
        table.add_row(
            f"{r.bucket.max_duration:g} s",
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
    parser.add_argument("--max-tps", type=float, default=12.0, help="1D: tokens per second")
    parser.add_argument("--vocab-size", type=int, default=None, help="without a tokenizer file")
    parser.add_argument("--ddp-grad-copy", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--threads", type=int, default=None, help="CPU probes: torch threads")
    parser.add_argument("-o", "--output", default="batch_sizes.yaml")
    return parser.parse_intermixed_args(argv)


def main(argv: list[str] | None = None) -> None:
    """asr-oomptimizer: per-bucket batch sizes from worst-case probes of the real model."""
    args = _parse_args(argv)
    console = Console(stderr=True)
    logging.basicConfig(
        level=logging.INFO, format="%(message)s", handlers=[RichHandler(console=console)]
    )
    bins = read_bins(args.bins_file)["bucket_duration_bins"] if args.bins_file else args.buckets
    buckets, is_2d = buckets_from_bins(bins, args.max_tps)
    cfg = compose_config(args.overrides)
    setup = ModelSetup.from_config(cfg, args.vocab_size, args.ddp_grad_copy)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("asr-oomptimizer: --device cuda, but torch sees no CUDA device")
    if device == "cuda":
        probing = cuda_probe(setup, args.memory_budget)
    else:
        probing = cpu_probe(setup, args.memory_budget, args.threads)

    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed} probes"))
    progress = Progress(*columns, TimeElapsedColumn(), console=console, transient=True)
    with probing as probe, progress:
        task = progress.add_task("probing", total=None)

        def advance(bucket: Bucket, size: int, outcome: ProbeResult) -> None:
            label = f"{bucket.max_duration:g} s / {bucket.max_tokens} tokens: last batch {size}"
            progress.update(task, advance=1, description=label)

        results = search_buckets(
            buckets,
            probe,
            start=args.start,
            rel_tolerance=args.rel_tolerance,
            max_size=args.max_size,
            on_probe=advance,
        )
    final = results if is_2d else merge_equal_sizes(results)
    command = "asr-oomptimizer " + " ".join(argv if argv is not None else sys.argv[1:])
    comment = (
        f"{command.strip()}\nworst-case batches within {format_bytes(args.memory_budget)} on "
        f"{device}; {len(results)} buckets searched, {len(final)} after merging equal sizes"
    )
    if not is_2d:
        comment += f"\nassumes at most {args.max_tps:g} tokens/s (data.sampler.max_tps)"
    write_bins(args.output, sampler_keys(final, is_2d), comment)
    console.print(summary_table(final))
    print(f"{len(final)} buckets -> {args.output}")


if __name__ == "__main__":
    # Through the package module, so that the probe server unpickles its classes by name.
    from asr.training.oomptimizer import main as package_main

    package_main()
