"""`make gpu-check` / `scripts/gpu_check.py` and `make gpu-bench` / `scripts/gpu_bench.py`:
run a suite's sections, each in its own process with its own time limit, and stream their
JSON lines to stdout and to a file.

    python scripts/gpu_check.py                     # every section on the first GPU
    python scripts/gpu_check.py --only lattice      # one section again (comma-separated list)
    python scripts/gpu_check.py --rehearse          # every section at toy sizes on the CPU
    python scripts/gpu_bench.py --only batching     # the same for the bench's sections

Two suites share this runner: the GPU check (`GPU_CHECK`: the code paths only a GPU
executes, at toy sizes, in at most 7 minutes) and the GPU bench (`GPU_BENCH`: the papers'
headline claims measured at their own scale, in at most 9.5 minutes).

Why a process per section: a kernel that faults the GPU leaves its CUDA context unusable,
and a hung collective cannot be interrupted from Python; a fresh process per section
keeps one failure from hiding the others' results, starts each section's peak-memory
count from zero, and can be killed (with its subprocesses) at its time limit. Every line
is written as soon as the section reports it, so a section cut off still reports what it
measured.

Each line is a JSON object with `section` and `record`; each section ends with a `status`
record (pass, fail, error, timeout) and the run with a `summary` of all of them (its
`section` is the suite's name). The exit code is 0 when every section that ran passed.
Without a CUDA device (and without `--rehearse`) a suite prints one line saying so and ends.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from asr.gpu_check.report import Report, SectionOptions
from asr.training.cuda_allocator import use_expandable_segments

DEFAULT_BUDGET = "20GiB"
STDERR_TAIL_LINES = 30


@dataclass(frozen=True)
class Section:
    """A section: its module (with `run(report, options)`), its time limits in seconds on
    a GPU and in a CPU rehearsal, and what it checks."""

    name: str
    module: str
    limit_s: float
    rehearsal_limit_s: float
    checks: str


@dataclass(frozen=True)
class Suite:
    """Sections run together: `name` (the summary's `section`, the output file's stem),
    `noun` and `participle` for the one line without CUDA ("nothing was checked ... to
    test the check"), what the suite leaves out (`not_executed`, listed in the summary)
    and where its output goes by default."""

    name: str
    description: str
    noun: str
    participle: str
    sections: tuple[Section, ...]
    not_executed: tuple[str, ...]
    output_dir: Path

    @property
    def section_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.sections)


SECTIONS = (
    Section("env", "asr.gpu_check.environment", 20, 60, "the stack's versions and the device"),
    Section(
        "lattice", "asr.gpu_check.lattice", 60, 120,
        "Triton lattice vs PyTorch lattice vs torchaudio's rnnt_loss at LibriSpeech sizes",
    ),
    Section(
        "training", "asr.gpu_check.training", 110, 240,
        "asr-oomptimizer's search, then 30 bf16 steps of the 102 M transducer: no OOM",
    ),
    Section(
        "aed", "asr.gpu_check.aed", 45, 120,
        "greedy-decoding RTFx of the flash AED preset against the deep one",
    ),
    Section(
        "ddp", "asr.gpu_check.ddp", 65, 240,
        "asr-train under 1-process DDP (NCCL), with and without the DGC hook",
    ),
    Section(
        "ssl", "asr.gpu_check.ssl", 60, 240,
        "BEST-RQ and w2v-BERT pre-training through asr-train under bf16 autocast",
    ),
    Section(
        "streaming", "asr.gpu_check.streaming", 50, 240,
        "a streaming transducer trained (a chunk size drawn per step) and decoded as "
        "8 concurrent streams, bf16, and fp32 equal to whole utterances",
    ),
)  # fmt: skip
SECTION_NAMES = tuple(s.name for s in SECTIONS)
NOT_EXECUTED = (
    "AD-PSGD and H-ADPSGD (trainer.strategy=adpsgd): they need two processes",
    "collectives between several GPUs or nodes (the check has one GPU)",
)
GPU_CHECK = Suite(
    "gpu_check", "Run the code paths only a GPU executes, in minutes.", "check", "checked",
    SECTIONS, NOT_EXECUTED, Path("exp/gpu_check"),
)  # fmt: skip

BENCH_SECTIONS = (
    # The limits add up to 570 s, 9.5 minutes. loss-headline had 140 s until tdt-loss came
    # and 110 s until lm-fusion came, batching 180 s: both fit their work to their limits
    # (loss-headline cuts its lattices' time budgets to what its limit leaves, a whole
    # batch that would overrun its budget timed from its probe instead; batching's runs
    # share what its searches leave, at least one timed step each). From the GPU check's
    # H100/H200 runs (Triton 65 ms, PyTorch lattice 180 ms a batch of 8 at these sizes),
    # 85 s still hold both lattices' whole headline batches.
    Section(
        "loss-headline", "asr.gpu_check.bench_loss", 85, 120,
        "the sample-wise transducer loss at Braun et al.'s 1024 x 40 s (target 6 GB), "
        "Triton and PyTorch lattices, beside torchaudio's rnnt_loss at its largest batch",
    ),
    Section(
        "tdt-loss", "asr.gpu_check.bench_tdt_loss", 60, 120,
        "the sample-wise TDT loss (durations 0-4) at 1024 x 40 s (target 6 GB), and "
        "against the batched TDT loss at 32 x 20 s (target 1/10 of its memory, no slower)",
    ),
    Section(
        "batching", "asr.gpu_check.bench_batching", 155, 240,
        "the 102 M transducer in bf16: 1D duration buckets at one max_duration against "
        "2D buckets, TPS filter and the OOM-probing search, each with both losses",
    ),
    Section(
        "decode", "asr.gpu_check.bench_decode", 150, 240,
        "RTFx of transducer greedy and beam search and of the flash / deep AED pair",
    ),
    Section(
        "lm-fusion", "asr.gpu_check.bench_lm_fusion", 50, 120,
        "what fusing token n-grams (orders 3 and 6, LODR) costs label-looping greedy search "
        "with CUDA graphs and beam search: speed with an LM over without (targets 0.8, 0.75)",
    ),
    Section(
        "streaming", "asr.gpu_check.bench_streaming", 70, 180,
        "a streaming transducer's training step per chunk size and its decoding RTFx "
        "with 1, 16 and 64 concurrent streams",
    ),
)  # fmt: skip
BENCH_NOT_EXECUTED = (
    "several GPUs: the batching claim's '4x fewer GPUs in the same wall time' is read from "
    "one GPU's audio seconds per second",
    "the recipe's 30 x 2 buckets: the batching section searches 3 x 2 to fit its limit",
)
GPU_BENCH = Suite(
    "gpu_bench", "Measure the papers' headline claims on one GPU, in minutes.", "bench",
    "measured", BENCH_SECTIONS, BENCH_NOT_EXECUTED, Path("exp/gpu_bench"),
)  # fmt: skip


class Lines:
    """JSON lines to stdout and to a file, each flushed at once."""

    def __init__(self, path: Path | None, stdout: TextIO = sys.stdout) -> None:
        self.stdout = stdout
        self.file = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.file = path.open("a", buffering=1)

    def write(self, line: dict[str, Any]) -> None:
        text = json.dumps(line)
        for stream in (self.stdout, self.file):
            if stream is not None:
                stream.write(text + "\n")
                stream.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def _pump(stream: TextIO, tag: str, lines: queue.Queue, echo: TextIO | None, tail: deque) -> None:
    """Move `stream`'s lines into `lines` (stdout) or to `echo` and `tail` (stderr)."""
    for line in stream:
        if echo is None:
            lines.put((tag, line))
        else:
            tail.append(line.rstrip("\n"))
            echo.write(line)
            echo.flush()
    lines.put((tag, None))


def _stop(process: subprocess.Popen) -> None:
    """Stop a section's process group: SIGTERM, then SIGKILL after 5 s."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_section(section: Section, options: SectionOptions, out: Lines) -> str:
    """Run one section in a fresh process; relay its lines; return its status."""
    limit = section.rehearsal_limit_s if options.rehearsal else section.limit_s
    command = [
        sys.executable, "-m", "asr.gpu_check.runner", "--section", section.name,
        "--module", section.module, "--device", options.device, "--work-dir", str(options.work_dir),
        "--memory-budget", str(options.memory_budget), "--limit-s", str(limit),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    began = time.monotonic()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    lines: queue.Queue = queue.Queue()
    tail: deque = deque(maxlen=STDERR_TAIL_LINES)
    pumps = [
        threading.Thread(target=_pump, args=(process.stdout, "out", lines, None, tail)),
        threading.Thread(target=_pump, args=(process.stderr, "err", lines, sys.stderr, tail)),
    ]
    for pump in pumps:
        pump.daemon = True
        pump.start()
    relayed = _relay(section.name, process, lines, out, began + limit)
    line = {
        "section": section.name, "record": "status", "status": relayed.status,
        "seconds": round(time.monotonic() - began, 1), "limit_s": limit,
        "exit_code": process.returncode,
    }  # fmt: skip
    if relayed.status == "timeout" or (relayed.status == "error" and not relayed.error):
        line["stderr_tail"] = list(tail)  # what it printed last (no traceback was reported)
    out.write(line)
    return relayed.status


@dataclass
class Relayed:
    """How a section's process ended: `status` (pass, fail, error, timeout) and whether it
    reported an error record itself."""

    status: str
    error: bool


def _relay(
    name: str, process: subprocess.Popen, lines: queue.Queue, out: Lines, deadline: float
) -> Relayed:
    """Write the section's JSON lines (stray prints as `stray_output`) until both streams
    close or `deadline` passes (then the process group is stopped)."""
    summary, error, open_streams, timed_out = None, False, 2, False
    while open_streams:
        try:
            tag, line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            timed_out = True
            _stop(process)
            break
        if line is None:
            open_streams -= 1
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = {"record": "stray_output", "text": line.rstrip("\n")}
        if record.get("record") == "summary":
            summary = record
        error = error or record.get("record") == "error"
        out.write({"section": name, **record})
    if not timed_out:
        try:
            process.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop(process)
    if timed_out:
        return Relayed("timeout", error)
    if process.returncode != 0 or summary is None:
        return Relayed("error", error)
    return Relayed("fail" if summary["failures"] else "pass", error)


def _parse_args(argv: list[str] | None, suite: Suite) -> argparse.Namespace:
    names = suite.section_names
    parser = argparse.ArgumentParser(prog=suite.name, description=suite.description)
    parser.add_argument(
        "--only", default=",".join(names),
        help=f"comma-separated sections to run (default: all of {', '.join(names)})",
    )  # fmt: skip
    parser.add_argument(
        "--rehearse", action="store_true",
        help="every section at toy sizes on the CPU (Triton interpreted, gloo for NCCL): "
        f"tests the {suite.noun} itself on a machine without a GPU",
    )  # fmt: skip
    parser.add_argument(
        "-o", "--output", type=Path, help=f"JSON lines file (default under {suite.output_dir}/)"
    )
    parser.add_argument("--work-dir", type=Path, default=suite.output_dir / "work")
    parser.add_argument(
        "--memory-budget", default=DEFAULT_BUDGET,
        help=f"the batch-size searches' memory budget (default {DEFAULT_BUDGET})",
    )  # fmt: skip
    parser.add_argument("--section", help=argparse.SUPPRESS)  # in a section's own process
    parser.add_argument("--module", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    parser.add_argument("--limit-s", type=float, default=math.inf, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    only = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(only) - set(names))
    if args.section is None and (unknown or not only):
        parser.error(f"--only {args.only!r}: unknown sections {unknown}; valid: {names}")
    args.only = only
    return args


def _section_main(args: argparse.Namespace) -> int:
    """Inside a section's process: run it, its JSON lines on the original stdout."""
    report_stream = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever else prints goes to stderr, not into the JSON lines
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s"
    )
    use_expandable_segments()  # as asr-train and asr-oomptimizer run
    options = SectionOptions(
        args.device, args.work_dir / args.section, int(args.memory_budget), args.limit_s
    )
    options.work_dir.mkdir(parents=True, exist_ok=True)
    report = Report(report_stream)
    try:
        importlib.import_module(args.module).run(report, options)
    except Exception:
        traceback.print_exc()
        report.record("error", traceback=traceback.format_exc()[-4000:])
        report.finish()
        return 1
    report.finish()
    return 0


def main(argv: list[str] | None = None, suite: Suite = GPU_CHECK) -> int:
    """Run `suite`'s sections (`argv`: its command line) -> the exit code."""
    args = _parse_args(argv, suite)
    if args.section is not None:
        return _section_main(args)
    import torch  # here, not at import: a section's process imports what it needs itself

    from asr.training.oomptimizer import parse_memory_size

    if not args.rehearse and not torch.cuda.is_available():
        print(json.dumps({
            "section": suite.name, "record": "status", "status": "no_cuda",
            "message": f"no CUDA device visible to torch {torch.__version__}: nothing was "
            f"{suite.participle} (run it on a GPU machine, or --rehearse to test the "
            f"{suite.noun} on the CPU)",
        }))  # fmt: skip
        return 0
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    output = args.output or suite.output_dir / f"{suite.name}-{stamp}.jsonl"
    device = "cpu" if args.rehearse else "cuda"
    # Absolute: the ddp section's training runs start in the section's own folder.
    work_dir = args.work_dir.resolve()
    options = SectionOptions(device, work_dir, parse_memory_size(args.memory_budget))
    print(f"{suite.name}: JSON lines -> {output}", file=sys.stderr)
    out = Lines(output)
    began = time.monotonic()
    statuses = {}
    try:
        for section in suite.sections:
            if section.name in args.only:
                statuses[section.name] = run_section(section, options, out)
        passed = all(s == "pass" for s in statuses.values())
        out.write({
            "section": suite.name, "record": "summary", "status": "pass" if passed else "fail",
            "sections": statuses, "seconds": round(time.monotonic() - began, 1),
            "rehearsal": args.rehearse, "date": stamp, "not_executed": list(suite.not_executed),
        })  # fmt: skip
    finally:
        out.close()
    print(f"{suite.name}: {statuses} -> {output}", file=sys.stderr)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
