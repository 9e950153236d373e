"""Probes for `asr-oomptimizer`: run the worst-case training step of a bucket and say
whether it fits a memory budget (CUDA in process, CPU in forked processes); see the
docstring of `asr.training.oomptimizer` for how memory is measured."""

from __future__ import annotations

import copy
import gc
import logging
import math
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from subprocess import PIPE
from typing import Any, NoReturn

import torch
from omegaconf import DictConfig, OmegaConf

from asr.data.batch import Batch
from asr.data.tokenizer import Tokenizer
from asr.errors import first_line
from asr.frames import FRAMES_PER_SECOND
from asr.models.build import build_model, model_kind
from asr.tokens import PAD_ID
from asr.training.objective import Objective, build_objective, first_full_loss_step
from asr.training.optimizer import build_optimizer

log = logging.getLogger(__name__)

DEFAULT_MEL_BINS = 80
WATCHDOG_EXIT_CODE = 86  # a CPU probe process stopped by its watchdog
WATCHDOG_INTERVAL = 0.005  # seconds between the watchdog's looks at resident memory
MMAP_THRESHOLD = 128 * 1024  # CPU probes: glibc maps every allocation from this size alone


@dataclass(frozen=True)
class ProbeResult:
    """Outcome of one worst-case training step; `peak_bytes` is None when unmeasured."""

    fits: bool
    peak_bytes: int | None
    reason: str = ""
    seconds: float = 0.0


# probe(max_duration, max_tokens, batch_size) -> ProbeResult
Probe = Callable[[float, int, int], ProbeResult]


def format_bytes(num: int | None) -> str:
    if num is None:
        return "?"
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(num) >= factor:
            return f"{num / factor:.1f} {unit}"
    return f"{num} B"


@dataclass(frozen=True)
class ModelSetup:
    """What a probe builds: the resolved `model` (with `loss`) and `optim` configs."""

    model: dict[str, Any]
    optim: dict[str, Any]
    vocab_size: int | None  # None: a pre-training model, whose batches carry no tokens
    num_mel_bins: int = DEFAULT_MEL_BINS
    ddp_grad_copy: bool = True  # one extra copy of the parameters, like DDP's buckets
    precision: str = "32-true"  # as Lightning takes it; "bf16..." probes under bf16 autocast

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


def resolve_vocab_size(cfg: DictConfig, vocab_size: int | None) -> int | None:
    """The vocabulary of `data.tokenizer` when the file exists, else `vocab_size`; None for
    a pre-training model (`model.kind: ssl`), which has no vocabulary."""
    if OmegaConf.select(cfg, "model.kind") == "ssl":
        return None
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
) -> tuple[torch.nn.Module, Objective, torch.optim.Optimizer, int]:
    """Model (on `device`, training mode), objective and optimizer as `asr-train` builds
    them, and a training step at which the transducer loss runs."""
    model_cfg = copy.deepcopy(setup.model)
    objective = build_objective(model_kind(model_cfg), model_cfg.pop("loss", None))
    model = build_model(model_cfg, setup.vocab_size).to(device).train()
    optimizer = build_optimizer(model, setup.optim)
    return model, objective, optimizer, first_full_loss_step(objective)


def random_batch(
    durations: Sequence[float],
    tokens: Sequence[int],
    num_mel_bins: int,
    vocab_size: int | None,
    device: str | torch.device = "cpu",
) -> Batch:
    """Random features and tokens of the given lengths (seconds, token counts), padded as a
    real batch is (features zero and tokens `PAD_ID` beyond each length), built on `device`;
    audio alone (no tokens) without a vocabulary, for pre-training."""
    frames = [math.ceil(round(d * FRAMES_PER_SECOND, 6)) for d in durations]
    if vocab_size is None:
        tokens, vocab_size = [0] * len(frames), 2
    b, t, u = len(frames), max(frames), max(tokens)
    feature_lens = torch.tensor(frames, dtype=torch.int64, device=device)
    token_lens = torch.tensor(list(tokens), dtype=torch.int64, device=device)
    features = torch.randn(b, t, num_mel_bins, device=device)
    ids = torch.randint(1, vocab_size, (b, u), device=device)
    if min(frames) < t:
        features.masked_fill_(
            torch.arange(t, device=device)[None, :, None] >= feature_lens[:, None, None], 0.0
        )
    if min(tokens) < u:
        ids.masked_fill_(torch.arange(u, device=device)[None] >= token_lens[:, None], PAD_ID)
    return Batch(
        features=features,
        feature_lens=feature_lens,
        tokens=ids,
        token_lens=token_lens,
        cut_ids=[f"random-{i}" for i in range(b)],
        texts=[""] * b,
    )


def worst_case_batch(
    batch_size: int,
    max_duration: float,
    max_tokens: int,
    num_mel_bins: int,
    vocab_size: int | None,
) -> Batch:
    """B utterances of `max_duration` seconds, each with `max_tokens` random tokens (none
    without a vocabulary: audio alone, for pre-training)."""
    return random_batch(
        [max_duration] * batch_size, [max_tokens] * batch_size, num_mel_bins, vocab_size
    )


def prime_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Make the optimizer's state with one step on zero gradients, then drop the gradients:
    a run's first step makes the state after its activations are freed, but every later
    step holds it through forward and backward, so a probe that skips this measures short
    (by 0.8 GB for the 102 M-parameter preset with Adam)."""
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def worst_case_step(
    setup: ModelSetup, max_duration: float, max_tokens: int, batch_size: int, device: str
) -> None:
    """Build everything on `device`, then forward, backward and one optimizer step, with
    the optimizer's state (Adam's two moments: 8 bytes per parameter) already made, as it
    is in every step after a run's first."""
    torch.manual_seed(0)
    model, objective, optimizer, step = build_training(setup, device)
    prime_optimizer_state(model, optimizer)
    ddp_buckets = [torch.zeros_like(p) for p in model.parameters()] if setup.ddp_grad_copy else []
    batch = worst_case_batch(
        batch_size, max_duration, max_tokens, setup.num_mel_bins, setup.vocab_size
    ).to(device)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=setup.precision.startswith("bf16")):
        loss = objective(model, batch, step=step)["loss"]
    loss.backward()
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
            reason = f"CUDA out of memory: {first_line(err, with_type=False)}"
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
        return {"memory_error": first_line(err, with_type=False)}
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
    command = "from asr.training.probes import serve_cpu_probes; serve_cpu_probes()"
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
