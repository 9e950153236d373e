"""One rank of a multi-process test: joins a gloo group of WORLD processes, runs a named
scenario function from a test module and saves the record it returns to
`OUT_DIR/rank{R}.pt`. The `run_ranks` fixture (conftest.py) starts one per rank.

    rank_runner.py RANK WORLD INIT_FILE OUT_DIR TEST_FILE SCENARIO STEPS [PARAMS_JSON]

A scenario is `scenario(rank, world, out_dir, steps, **params) -> dict` next to the tests
that assert on its record. It runs here, in the rank's own process, where this folder is
on `sys.path`: scenarios import their shared helpers (`exchange.py`) inside the function.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def load_scenario(test_file: str, name: str):
    """The function `name` of the test module at `test_file`, imported under its own name."""
    spec = importlib.util.spec_from_file_location(f"scenarios_{Path(test_file).stem}", test_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def finish() -> None:
    """Wait for the other ranks, then leave without interpreter teardown: under load,
    gloo's teardown after DDP hooks' chained futures hung now and then in
    destroy_process_group."""
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def main(argv: list[str]) -> None:
    rank, world, init_file, out_dir, test_file, name, steps = argv[:7]
    params = json.loads(argv[7]) if len(argv) > 7 else {}
    scenario = load_scenario(test_file, name)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=int(rank), world_size=int(world)
    )
    torch.set_num_threads(1)
    record = scenario(int(rank), int(world), Path(out_dir), int(steps), **params)
    torch.save(record, Path(out_dir) / f"rank{rank}.pt")
    finish()


if __name__ == "__main__":
    main(sys.argv[1:])
