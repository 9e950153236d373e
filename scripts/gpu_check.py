"""The GPU check: run, in at most 7 minutes on one GPU, the code paths that only a GPU executes.

    make gpu-check                                    # in make test's environment
    python scripts/gpu_check.py --only lattice        # rerun one section
    bash scripts/gpu_check.sh --system-python .gpu-wheels   # a GPU machine without a registry
    python scripts/gpu_check.py --rehearse            # toy sizes on the CPU: tests the check

JSON lines go to stdout and to exp/gpu_check/gpu_check-<time>.jsonl as each section
reports them (`-o` to choose); each section runs in its own process with its own time
limit (`asr.gpu_check.runner`). Without a CUDA device it prints one line and ends.
docs/gpu.md says how to read the lines; recipes/librispeech/RESULTS.md holds the runs.

Sections: env (versions, device), lattice, training, aed, ddp, ssl, streaming.

Code paths that only a GPU executes, and the section that executes each:

- asr/losses/triton_lattice.py: `_node_scores_kernel`, `_lattice_kernel` (its
  `tl.debug_barrier()` is a real CTA barrier only when compiled), `_logit_grad_kernel`,
  compiled by Triton's CUDA backend (CPU tests run them interpreted) -> lattice (against the
  PyTorch lattice and torchaudio at T = 1,000, U = 150, V = 1,024), training, ddp; and
  `_tdt_lattice_kernel`, the token-and-duration transducer's lattice -> lattice (against
  the PyTorch `tdt_lattice`, in fp32 and float64, at T = 1,000, U = 150, durations 0-4).
- asr/losses/lattice_choice.py: `AUTO_ON_CUDA`, `lattice=auto`'s fallback, and its
  first-use check on a GPU -> lattice (`auto` record), training (`lattice` fields).
- asr/losses/transducer.py: `batched_transducer_loss` through torchaudio's CUDA RNN-T
  kernel -> lattice.
- asr/models/conformer.py: `RelPositionMultiHeadAttention.forward`, the fused
  `F.scaled_dot_product_attention` branch with a float bias (CPUs take
  `_attention_on_cpu`) -> training, aed, ddp.
- asr/models/aed.py: `DecoderLayer`'s attention through CUDA's SDPA kernels with the KV
  cache, and asr/decoding/aed.py: `greedy_search` on CUDA tensors -> aed.
- asr/training/probes.py: `cuda_probe` (allocator capped with
  `set_per_process_memory_fraction`, `torch.cuda.OutOfMemoryError` caught, peaks from
  `max_memory_allocated`) and `worst_case_step` under CUDA bf16 autocast -> training.
- asr/training/precision.py: `native_bf16("cuda")` (trainer.precision=auto on a GPU) -> ddp.
- asr/training/distributed/communication/hooked_ddp.py: `HookedDDPStrategy` over NCCL
  (`_register_ddp_hooks`, `save_checkpoint` with DGC's per-rank state), and
  asr/training/distributed/communication/dgc/hook.py,
  dgc/adam.py: the DGC hook's all-gathers and its bf16 all-reduce of the refreshed second
  moment on CUDA tensors -> ddp (1 process: the collectives run, with one participant).
- asr/data/batch.py: `Batch.to(device, non_blocking=True)` to a CUDA device, and
  Lightning's bf16-mixed precision plugin on CUDA -> ddp, ssl.
- asr/models/quantizers.py: `GumbelQuantizer` (logits and Gumbel noise in fp32 inside CUDA
  bf16 autocast), `RandomProjectionQuantizer` (buffers on the device); asr/models/ssl.py,
  asr/losses/ssl.py and asr/training/ssl_objective.py on CUDA tensors -> ssl.

Not executed here: asr/training/distributed/communication/adpsgd.py and gossip.py under NCCL
(AD-PSGD needs two processes); the greedy searches asr-decode and asr-transcribe run on CUDA,
asr/decoding/label_looping.py and `StaticGreedySearch` in asr/decoding/aed.py replayed from
CUDA graphs (asr/decoding/cuda_graphs.py): `make gpu-bench`'s decode section runs them and
checks their tokens against the eager searches' (the commands' file handling is
device-independent); the
`--device cuda` branch of asr-oomptimizer's `main` (it calls the same `cuda_probe`).
"""

from __future__ import annotations

import sys

from asr.gpu_check.runner import main

if __name__ == "__main__":
    sys.exit(main())
