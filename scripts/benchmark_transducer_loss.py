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
memory printed as `batched_would_need_mb` and is not run); (d) case a at T=1000, U=100;
tdt_a, tdt_b, tdt_c: cases a, b, c for a token-and-duration transducer (durations 0..4,
sigma 0.05, omega 0), where "batched" is `batched_transducer_loss` with durations: the
whole B x T x U x (V + 5) logits and the TDT lattice under autograd (the peers have no TDT).
The last line carries the formula-predicted memory of the sample-wise loss at the paper's
full size. Each line also counts the launching aten ops (`torch.profiler`; views and
metadata excluded) of one forward + backward at B=4 and B=16 of the case's shape, and
their slope per sample: on a GPU every one of them is a kernel launch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path

import torch

# Kept, unlike the other scripts: the workers run this file again under `--python` or, for
# the source-built peers, .venv-peers/bin/python (PyPI's CPU torch), a venv without `asr`
# installed; the checkout on the path is how they import it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the peers' venv lacks `asr`


from asr.losses.samplewise import predicted_peak_bytes, samplewise_transducer_loss  # noqa: E402
from asr.models.transducer import Joiner  # noqa: E402
from asr.profiling import PeakMemory, count_launching_ops  # noqa: E402

MB = 2**20


TDT_DURATIONS = (0, 1, 2, 3, 4)  # NeMo's
TDT_SIGMA = 0.05  # NeMo's; omega = 0: the TDT lattice alone (omega adds the plain one's cost)


@dataclass(frozen=True)
class Case:
    B: int
    T: int
    U: int
    V: int
    D: int
    varied: bool = False
    group_size: int = 1
    durations: tuple[int, ...] | None = None  # a token-and-duration transducer's


CASES = {
    "a": Case(32, 250, 50, 500, 256),
    "b": Case(32, 250, 50, 500, 256, varied=True),
    "c": Case(1024, 1000, 100, 128, 128, group_size=4),
    "d": Case(32, 1000, 100, 500, 256),
    "tdt_a": Case(32, 250, 50, 500, 256, durations=TDT_DURATIONS),
    "tdt_b": Case(32, 250, 50, 500, 256, varied=True, durations=TDT_DURATIONS),
    "tdt_c": Case(1024, 1000, 100, 128, 128, group_size=4, durations=TDT_DURATIONS),
}
OPS_BATCHES = (4, 16)  # launching ops are counted at these batch sizes; the slope is per sample
IMPLS = ("samplewise", "batched", "warprnnt_numba")
# k2-fsa's C++ losses, built from source by scripts/install_bench_peers.sh; on a machine
# without a CUDA toolkit they live in a side venv with PyPI's CPU torch (--peer-python).
SOURCE_PEERS = ("optimized_transducer", "fast_rnnt", "fast_rnnt_pruned")
NOT_HERE = {"warp_rnnt": "CUDA only: no CPU implementation"}
# These materialize logits for every (t, u) node of the padded (or packed) batch.
FULL_LATTICE = ("batched", "warprnnt_numba", "optimized_transducer", "fast_rnnt")
PRUNE_RANGE = 5  # icefall's default for the pruned loss
PEER_VENV = Path(__file__).resolve().parents[1] / ".venv-peers" / "bin" / "python"


def build_inputs(case: Case, device: str, seed: int = 0) -> tuple:
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    joiner = Joiner(
        encoder_dim=case.D,
        predictor_dim=case.D,
        joint_dim=case.D,
        vocab_size=case.V,
        durations=case.durations,
    )
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
    tdt = {}
    if case.durations is not None:
        tdt = {"durations": case.durations, "sigma": TDT_SIGMA}
    if impl == "samplewise":
        return lambda *a: samplewise_transducer_loss(*a, group_size=case.group_size, **tdt)
    if impl == "batched":
        from asr.losses.transducer import batched_transducer_loss  # imports torchaudio

        return lambda *a: batched_transducer_loss(*a, **tdt)
    peers = {
        "warprnnt_numba": warprnnt_numba_loss,
        "optimized_transducer": optimized_transducer_loss,
        "fast_rnnt": fast_rnnt_loss,
        "fast_rnnt_pruned": fast_rnnt_pruned_loss,
    }
    if impl not in peers:
        raise ValueError(f"unknown implementation {impl!r}; known: {IMPLS + SOURCE_PEERS}")
    return peers[impl]


def _padded_logits(joiner: Joiner, enc, pred, enc_lens, target_lens) -> tuple:
    max_t, max_u = int(enc_lens.max()), int(target_lens.max())
    return joiner(enc[:, :max_t, None], pred[:, None, : max_u + 1]), max_u


def warprnnt_numba_loss(joiner: Joiner, enc, pred, targets, enc_lens, target_lens):
    """NeMo's numba RNN-T loss (pip: warprnnt-numba) on the joiner's padded-batch logits."""
    from warprnnt_numba import RNNTLossNumba

    logits, max_u = _padded_logits(joiner, enc, pred, enc_lens, target_lens)
    loss = RNNTLossNumba(blank=0, reduction="mean")
    int32 = torch.int32
    return loss(logits, targets[:, :max_u].to(int32), enc_lens.to(int32), target_lens.to(int32))


def optimized_transducer_loss(joiner: Joiner, enc, pred, targets, enc_lens, target_lens):
    """optimized_transducer: logits packed sample after sample (no padding), built from the
    projections as its README asks; the loss overwrites the logits with their gradient."""
    import optimized_transducer

    enc_p, pred_p = joiner.project_encoder(enc), joiner.project_predictor(pred)
    lengths = zip(enc_lens.tolist(), target_lens.tolist(), strict=True)
    hidden = [
        (enc_p[b, :t, None] + pred_p[b, None, : u + 1]).flatten(0, 1)
        for b, (t, u) in enumerate(lengths)
    ]
    logits = joiner.output(torch.tanh(torch.cat(hidden)))
    max_u, int32 = int(target_lens.max()), torch.int32
    return optimized_transducer.transducer_loss(
        logits,
        targets[:, :max_u].to(int32).contiguous(),
        enc_lens.to(int32),
        target_lens.to(int32),
        blank=0,
        from_log_softmax=False,
        reduction="mean",
    )


def _boundary(enc_lens, target_lens):
    """fast_rnnt's (B, 4) [begin_symbol, begin_frame, end_symbol, end_frame]."""
    zeros = torch.zeros_like(enc_lens)
    return torch.stack([zeros, zeros, target_lens, enc_lens], dim=1).long()


def fast_rnnt_loss(joiner: Joiner, enc, pred, targets, enc_lens, target_lens):
    """fast_rnnt's full RNN-T loss on the joiner's padded-batch logits."""
    import fast_rnnt

    logits, max_u = _padded_logits(joiner, enc, pred, enc_lens, target_lens)
    symbols, boundary = targets[:, :max_u].long(), _boundary(enc_lens, target_lens)
    return fast_rnnt.rnnt_loss(logits, symbols, termination_symbol=0, boundary=boundary)


@cache
def _simple_projections(enc_dim: int, pred_dim: int, vocab: int, device: str) -> tuple:
    """The two extra D -> V layers (icefall's simple_am_proj/simple_lm_proj), seeded."""
    torch.manual_seed(1)
    return torch.nn.Linear(enc_dim, vocab).to(device), torch.nn.Linear(pred_dim, vocab).to(device)


def fast_rnnt_pruned_loss(joiner: Joiner, enc, pred, targets, enc_lens, target_lens):
    """fast_rnnt's pruned RNN-T as icefall trains it: a smoothed "simple" loss (joiner =
    addition, over extra D -> V projections) picks PRUNE_RANGE symbols per frame, the real
    joiner runs on those (B, T, PRUNE_RANGE) nodes only; loss = 0.5 * simple + pruned.
    An approximation of the transducer loss (a different objective), not the exact one."""
    import fast_rnnt

    max_t, max_u = int(enc_lens.max()), int(target_lens.max())
    enc, pred = enc[:, :max_t], pred[:, : max_u + 1]
    am_proj, lm_proj = _simple_projections(
        enc.size(-1), pred.size(-1), joiner.vocab_size, str(enc.device)
    )
    symbols, boundary = targets[:, :max_u].long(), _boundary(enc_lens, target_lens)
    simple, (px_grad, py_grad) = fast_rnnt.rnnt_loss_smoothed(
        lm=lm_proj(pred),
        am=am_proj(enc),
        symbols=symbols,
        termination_symbol=0,
        lm_only_scale=0.25,
        am_only_scale=0.0,
        boundary=boundary,
        return_grad=True,
    )
    ranges = fast_rnnt.get_rnnt_prune_ranges(px_grad, py_grad, boundary, s_range=PRUNE_RANGE)
    am, lm = fast_rnnt.do_rnnt_pruning(
        am=joiner.project_encoder(enc), lm=joiner.project_predictor(pred), ranges=ranges
    )
    logits = joiner.joint(am, lm)
    pruned = fast_rnnt.rnnt_loss_pruned(logits, symbols, ranges, 0, boundary)
    return 0.5 * simple + pruned


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
    small = Case(2, 8, 6, case.V, case.D, durations=case.durations)
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
    out |= {
        "time_s": round(statistics.median(times), 3),
        "peak_mb": round(memory.extra_bytes / MB, 1),
    }
    out |= {"loss": round(loss, 4), "torch": torch.__version__}
    if impl == "samplewise":
        out["formula_mb"] = round(formula_bytes(case) / MB, 1)
    return out | launching_ops_per_sample(fn, case, device)


def launching_ops_per_sample(fn, case: Case, device: str) -> dict:  # noqa: ANN001
    """Launching aten ops of one forward + backward at two batch sizes of the case's shape,
    and the slope: what each additional sample adds (a GPU launches a kernel for each)."""
    small, large = OPS_BATCHES
    counts = []
    for b in OPS_BATCHES:
        inputs = build_inputs(replace(case, B=b), device)
        counts.append(count_launching_ops(lambda inputs=inputs: run_once(fn, *inputs)))
    slope = (counts[1] - counts[0]) / (large - small)
    return {f"launching_ops_b{small}": counts[0], f"launching_ops_b{large}": counts[1]} | {
        "launching_ops_per_sample": round(slope, 1)
    }


def formula_bytes(case: Case) -> int:
    return predicted_peak_bytes(
        batch_size=case.B,
        max_frames=case.T,
        max_tokens=case.U,
        vocab_size=case.V,
        num_durations=len(case.durations or ()),
        encoder_dim=case.D,
        predictor_dim=case.D,
        joint_dim=case.D,
        group_size=case.group_size,
    )


def batched_bytes(case: Case) -> int:
    """Logits, their gradient and torchaudio's gradient buffer, plus the joiner's hidden
    activations and their gradient, for the padded batch."""
    nodes = case.B * case.T * (case.U + 1)
    return 4 * nodes * (3 * (case.V + len(case.durations or ())) + 2 * case.D)


def spawn(case: str, impl: str, args: argparse.Namespace) -> dict:
    python = args.python or sys.executable
    if impl in SOURCE_PEERS and not args.python and PEER_VENV.exists():
        python = str(PEER_VENV)
    repeats = 1 if CASES[case].group_size > 1 else args.repeats
    cmd = [python, __file__, "--worker", case, impl, f"--repeats={repeats}"]
    cmd.append(f"--device={args.device}")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"case": case, "impl": impl, "status": "error", "reason": f"over {args.timeout} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        if impl not in IMPLS and any("ModuleNotFoundError" in line for line in tail):
            hint = "not installed: run scripts/install_bench_peers.sh"
            return {"case": case, "impl": impl, "status": "skipped", "reason": hint}
        return {"case": case, "impl": impl, "status": "error", "reason": " | ".join(tail)}
    return json.loads(lines[-1])


def paper_case() -> Case:
    """Braun et al.'s headline (arXiv 2211.16270: batch 1024 of 40 s in 6 GB) as the GPU
    bench sets it, with its assumptions (`asr.gpu_check.bench_loss`; imported here, not at
    the top, as it imports torchaudio, which the peers' workers need not have)."""
    from asr.gpu_check.bench_loss import PAPER

    widths = {PAPER.encoder_dim, PAPER.predictor_dim, PAPER.joint_dim}
    if len(widths) != 1:
        raise ValueError(f"Case has one width D; the bench's PAPER has {sorted(widths)}")
    return Case(PAPER.batch, PAPER.frames, PAPER.tokens, PAPER.vocab, widths.pop())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--cases", default="a,b", help="comma-separated: a, b, c, d, tdt_a, tdt_b, tdt_c"
    )
    parser.add_argument("--impls", default=",".join((*IMPLS, *SOURCE_PEERS, *NOT_HERE)))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument(
        "--python",
        help="interpreter for every worker (default: this one; the source-built peers use "
        ".venv-peers/bin/python when it exists)",
    )
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
            if CASES[case].durations is not None and impl not in IMPLS[:2]:
                line = {"case": case, "impl": impl, "status": "skipped", "reason": "no TDT loss"}
                print(json.dumps(line), flush=True)
                continue
            if CASES[case].group_size > 1 and impl in FULL_LATTICE:
                need = round(batched_bytes(CASES[case]) / MB)
                line = {"case": case, "impl": impl, **asdict(CASES[case]), "status": "skipped"}
                print(json.dumps(line | {"full_lattice_would_need_mb": need}), flush=True)
                continue
            print(json.dumps(spawn(case, impl, args)), flush=True)
    case = paper_case()
    paper = {"case": "paper", **asdict(case), "formula_mb": round(formula_bytes(case) / MB)}
    paper["batched_would_need_mb"] = round(batched_bytes(case) / MB)
    print(json.dumps(paper), flush=True)


if __name__ == "__main__":
    main()
