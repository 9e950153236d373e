"""Time and peak memory of transducer losses, forward + backward, one JSON line per run.

    python scripts/benchmark_transducer_loss.py                     # cases a, b; all impls
    python scripts/benchmark_transducer_loss.py --cases c --impls samplewise

Every (case, implementation) runs in a fresh subprocess, so peaks never mix. Inside it:
seeded inputs (encoder_out, predictor_out, targets, lengths) and a seeded real `Joiner`
(projections, tanh, output layer) are built, the implementation runs once on a tiny batch
(to load its code and kernels), then the baseline is taken and the case runs `--repeats`
times. Memory on CPU: resident set size polled every millisecond from /proc/self/statm,
peak minus baseline (what the allocator keeps counts); on CUDA:
`torch.cuda.max_memory_allocated` above the baseline. Time: median of the repeats.

Cases: (a) B=32, T=250, U=50, V=500, D=256, all lengths at the maximum; (b) the same with
lengths drawn from 50-100 % of the maximum; (c) the paper's batch scaled to this machine:
B=1024, T=1000 (40 s at 40 ms frames), U=100, V=D=128 (the batched loss would need the
memory printed as `batched_would_need_mb` and is not run). The last line carries the
formula-predicted memory of the sample-wise loss at the paper's full size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass

import torch

from asr.losses.samplewise import predicted_peak_bytes
from asr.losses.transducer import batched_transducer_loss, samplewise_transducer_loss
from asr.models.transducer import Joiner

MB = 2**20


@dataclass(frozen=True)
class Case:
    B: int
    T: int
    U: int
    V: int
    D: int
    varied: bool = False
    group_size: int = 1


CASES = {
    "a": Case(32, 250, 50, 500, 256),
    "b": Case(32, 250, 50, 500, 256, varied=True),
    "c": Case(1024, 1000, 100, 128, 128, group_size=4),
}
# Braun et al. (arXiv 2211.16270): batch 1024 of 40 s utterances in 6 GB. Frame rate,
# target length, vocabulary and joint width are our assumptions for a typical setup.
PAPER = Case(1024, 1000, 100, 1024, 512)
IMPLS = ("samplewise", "batched", "warprnnt_numba")
# Peers that are not installed here, and why (see the closing notes of issue 3).
NOT_HERE = {
    "optimized_transducer": "source build against PyPI's CUDA torch wants the CUDA toolkit",
    "fast_rnnt": "source build against PyPI's CUDA torch wants the CUDA toolkit",
    "warp_rnnt": "CUDA only: no CPU implementation",
}


def build_inputs(case: Case, device: str, seed: int = 0) -> tuple:
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    joiner = Joiner(encoder_dim=case.D, predictor_dim=case.D, joint_dim=case.D, vocab_size=case.V)
    enc = torch.randn(case.B, case.T, case.D, generator=g)
    pred = torch.randn(case.B, case.U + 1, case.D, generator=g)
    targets = torch.randint(1, case.V, (case.B, case.U), generator=g)
    if case.varied:
        enc_lens = torch.randint(case.T // 2, case.T + 1, (case.B,), generator=g)
        target_lens = torch.randint(case.U // 2, case.U + 1, (case.B,), generator=g)
        enc_lens[0], target_lens[0] = case.T, case.U
    else:
        enc_lens = torch.full((case.B,), case.T)
        target_lens = torch.full((case.B,), case.U)
    tensors = [t.to(device) for t in (enc, pred, targets, enc_lens, target_lens)]
    return joiner.to(device), *tensors


def loss_fn(impl: str, case: Case):
    if impl == "samplewise":
        return lambda *a: samplewise_transducer_loss(*a, group_size=case.group_size)
    if impl == "batched":
        return batched_transducer_loss
    if impl == "warprnnt_numba":
        return warprnnt_numba_loss
    raise ValueError(f"unknown implementation {impl!r}; known: {IMPLS}")


def warprnnt_numba_loss(joiner: Joiner, enc, pred, targets, enc_lens, target_lens):
    """NeMo's numba RNN-T loss (pip: warprnnt-numba) on the joiner's padded-batch logits."""
    from warprnnt_numba import RNNTLossNumba

    max_t, max_u = int(enc_lens.max()), int(target_lens.max())
    logits = joiner(enc[:, :max_t, None], pred[:, None, : max_u + 1])
    loss = RNNTLossNumba(blank=0, reduction="mean")
    int32 = torch.int32
    return loss(logits, targets[:, :max_u].to(int32), enc_lens.to(int32), target_lens.to(int32))


class PeakMemory:
    """Peak memory above a baseline: RSS polled every ms on CPU, the allocator on CUDA."""

    def __init__(self, device: str) -> None:
        self.device, self.page = device, os.sysconf("SC_PAGE_SIZE")
        self.peak, self._stop = 0, threading.Event()

    def rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def __enter__(self) -> PeakMemory:
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            return self
        self.base = self.peak = self.rss()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            time.sleep(0.001)

    def __exit__(self, *exc: object) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated()
            return
        self._stop.set()
        self.thread.join()
        self.peak = max(self.peak, self.rss())

    @property
    def extra_mb(self) -> float:
        return (self.peak - self.base) / MB


def run_once(fn, joiner: Joiner, enc, pred, *rest) -> float:
    enc, pred = enc.detach().requires_grad_(True), pred.detach().requires_grad_(True)
    joiner.zero_grad(set_to_none=True)
    loss = fn(joiner, enc, pred, *rest)
    loss.backward()
    return loss.item()


def worker(case_name: str, impl: str, repeats: int, device: str) -> dict:
    torch.set_num_threads(2)
    case = CASES[case_name]
    fn = loss_fn(impl, case)
    small = Case(2, 8, 3, case.V, case.D)
    run_once(fn, *build_inputs(small, device))  # load code and kernels before the baseline
    inputs = build_inputs(case, device)
    times, loss = [], float("nan")
    with PeakMemory(device) as memory:
        for _ in range(repeats):
            start = time.perf_counter()
            loss = run_once(fn, *inputs)
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    out = {"case": case_name, "impl": impl, **asdict(case), "status": "ok"}
    out |= {"time_s": round(statistics.median(times), 3), "peak_mb": round(memory.extra_mb, 1)}
    out["loss"] = round(loss, 4)
    if impl == "samplewise":
        out["formula_mb"] = round(formula_bytes(case) / MB, 1)
    return out


def formula_bytes(case: Case) -> int:
    return predicted_peak_bytes(
        batch_size=case.B,
        max_frames=case.T,
        max_tokens=case.U,
        vocab_size=case.V,
        encoder_dim=case.D,
        predictor_dim=case.D,
        joint_dim=case.D,
        group_size=case.group_size,
    )


def batched_bytes(case: Case) -> int:
    """Logits, their gradient and torchaudio's gradient buffer, plus the joiner's hidden
    activations and their gradient, for the padded batch."""
    nodes = case.B * case.T * (case.U + 1)
    return 4 * nodes * (3 * case.V + 2 * case.D)


def spawn(case: str, impl: str, repeats: int, device: str, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--worker", case, impl, f"--repeats={repeats}"]
    cmd.append(f"--device={device}")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"case": case, "impl": impl, "status": "error", "reason": f"over {timeout} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"case": case, "impl": impl, "status": "error", "reason": " | ".join(tail)}
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="a,b", help="comma-separated: a, b, c")
    parser.add_argument("--impls", default=",".join((*IMPLS, *NOT_HERE)))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--worker", nargs=2, metavar=("CASE", "IMPL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(*args.worker, args.repeats, args.device)), flush=True)
        return
    for case in args.cases.split(","):
        for impl in args.impls.split(","):
            if impl in NOT_HERE:
                line = {"case": case, "impl": impl, "status": "skipped", "reason": NOT_HERE[impl]}
                print(json.dumps(line), flush=True)
                continue
            if case == "c" and impl == "batched":
                need = round(batched_bytes(CASES[case]) / MB)
                line = {"case": case, "impl": impl, **asdict(CASES[case]), "status": "skipped"}
                print(json.dumps(line | {"batched_would_need_mb": need}), flush=True)
                continue
            repeats = 1 if case == "c" else args.repeats
            print(json.dumps(spawn(case, impl, repeats, args.device, args.timeout)), flush=True)
    paper = {"case": "paper", **asdict(PAPER), "formula_mb": round(formula_bytes(PAPER) / MB)}
    paper["batched_would_need_mb"] = round(batched_bytes(PAPER) / MB)
    print(json.dumps(paper), flush=True)


if __name__ == "__main__":
    main()
