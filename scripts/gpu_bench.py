"""The GPU bench: the headline claims this framework is built on, measured at their own scale
on one GPU in at most 9.5 minutes.

    make gpu-bench                                         # in make test's environment
    python scripts/gpu_bench.py --only loss-headline       # one section (comma-separated)
    bash scripts/gpu_check.sh --system-python .gpu-wheels --bench   # a GPU without a registry
    python scripts/gpu_bench.py --rehearse                 # toy sizes on the CPU: tests the bench

JSON lines go to stdout and to exp/gpu_bench/gpu_bench-<time>.jsonl as each section reports
them (`-o` to choose); each section runs in its own process with its own time limit (the
GPU check's runner, `asr.gpu_check.runner`, suite `GPU_BENCH`). Without a CUDA device it
prints one line and ends. recipes/librispeech/RESULTS.md holds the runs beside the claims.

Sections, each with the claim it measures:

- loss-headline (`asr.gpu_check.bench_loss`): Braun, McDermott, Hsiao (arXiv 2211.16270),
  the sample-wise transducer loss and its gradients "for a batch size of 1024, and audio
  length of 40 seconds, using only 6 GB of memory": its peak memory above the inputs and
  its time per batch with the Triton and the PyTorch lattice, beside torchaudio's
  `rnnt_loss` at the largest batch it fits on the GPU.
- tdt-loss (`asr.gpu_check.bench_tdt_loss`): the same claim for a token-and-duration
  transducer (Xu et al., arXiv 2304.06795; durations 0-4): the sample-wise TDT loss at
  loss-headline's batch with the Triton and the PyTorch lattice (target 6 GB), and at
  LibriSpeech sizes (32 x 20 s) against the batched TDT loss: peak memory and time of
  each, sample-wise over batched (targets: at most 1/10 of the memory, no slower).
- batching (`asr.gpu_check.bench_batching`): Żelasko et al. (arXiv 2503.05931), 2D
  bucketing, TPS filtering and the OOM-probing batch-size search against one
  `max_duration` over 1D buckets ("more than 50 % of computation spent on padding"
  without them, "5x increase in average batch sizes"): the 102 M transducer in bf16,
  audio seconds per step and per second, padding, out-of-memory steps, with this
  project's sample-wise loss and with torchaudio's.
- decode (`asr.gpu_check.bench_decode`): the shallow-decoder AED's "3x inference speed-up
  (RTFx)" (same paper), and transducer greedy and beam search.
- lm-fusion (`asr.gpu_check.bench_lm_fusion`): issue 67's cost of language-model fusion:
  label-looping greedy search (CUDA graphs) at batch 16 and 64 and beam search (8) at batch
  16, each without and with token n-grams of orders 3 and 6 (and LODR), alternating; the
  search's speed with an LM over without, against 0.8 (greedy) and 0.75 (beam), the graph
  captured with the LM, and greedy's output with an LM equal to frame-looping's.
- streaming (`asr.gpu_check.bench_streaming`): a streaming transducer's training step at
  each trained chunk size, and its decoding RTFx with 1, 16 and 64 concurrent streams.
"""

from __future__ import annotations

import sys

from asr.gpu_check.runner import GPU_BENCH, main

if __name__ == "__main__":
    sys.exit(main(suite=GPU_BENCH))
