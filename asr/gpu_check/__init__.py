"""The GPU check (`make gpu-check`, `scripts/gpu_check.py`): the code paths that only a GPU
executes, run once on one GPU in a few minutes, each section in its own process with its
own time limit, results streamed as JSON lines. See `asr.gpu_check.runner`."""
