"""One rank of the communication hook tests (DGC, AdaScale): DDP over gloo on vector
parameters whose gradient is a known random vector per rank and step
(`loss = sum(p * c)`), with a hook or DDP's own all-reduce. Writes what each rank saw to
`out_dir/rank{R}.pt`.

`resume-adam` (AdamW: 2 dense steps, then a frozen second moment), `resume-momentum`:
the DGC state written to a file mid-run and read back by a new model and hook, against
the same run uninterrupted (records both).

AdaScale modes: `adascale-same` (both ranks get the same gradient: no noise),
`adascale-noise` (independent zero-mean gradients: pure noise), `adascale-mixed` (a
shared mean plus independent noise of the same squared norm)."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from asr.training.distributed.savers.dgc import dgc_hook
from asr.training.distributed.savers.dgc_state import AdamMoments, DGCConfig, DGCState

# adascale and dgc_resume import Lightning (~2 s a process): only the modes that use them


class Vectors(nn.Module):
    def __init__(self, shapes: list[tuple[int, ...]]) -> None:
        super().__init__()
        self.parts = nn.ParameterList(
            nn.Parameter(torch.zeros(shape, dtype=torch.float64)) for shape in shapes
        )

    def forward(self, coefficients: list[torch.Tensor]) -> torch.Tensor:
        return sum((p * c).sum() for p, c in zip(self.parts, coefficients, strict=True))


def finish() -> None:
    """Wait for the other rank, then leave without interpreter teardown: under load, gloo's
    teardown after the hooks' chained futures hung now and then in destroy_process_group."""
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def _resumed(rank: int, world: int, out_dir: str, mode: str, steps: int) -> dict[str, list]:
    """Exchanged gradients of `steps` steps of a DGC run on three buckets (DDP rebuilds
    them after the first step), uninterrupted and with the hook state saved after half the
    steps and restored into a new model and hook. Each tensor takes its own top-k
    (`selection: tensor`): DDP's first step puts all three in one bucket (its 1 MB first
    bucket) and its rebuilt buckets one in each, so a bucket-wide top-k in the resumed
    run's first step would choose among other entries than the uninterrupted run's (then
    the runs differ in what is sent when, though nothing is lost)."""
    from asr.training.distributed.savers.dgc_resume import load_rank_state, save_rank_state

    sizes = [700, 300, 1500]

    def hooked() -> tuple[DistributedDataParallel, DGCState]:
        model = DistributedDataParallel(Vectors([(n,) for n in sizes]), bucket_cap_mb=0.005)
        state = DGCState(
            DGCConfig(
                sparsity=0.9, sample_fraction=0.1, selection="tensor", variance_freeze_step=2
            ),
            momentum=0.9 if mode == "resume-momentum" else 0.0,
            adam=AdamMoments() if mode == "resume-adam" else None,
            total_entries=sum(sizes),
        )
        state.learning_rate = lambda: 0.1 * (state.step + 1)
        model.register_comm_hook(state, dgc_hook)
        return model, state

    def run(model: DistributedDataParallel, first: int, last: int) -> list[torch.Tensor]:
        out = []
        for step in range(first, last):
            generator = torch.Generator().manual_seed(1000 * step + rank)
            coefficients = [torch.randn(n, dtype=torch.float64, generator=generator) for n in sizes]
            model.zero_grad(set_to_none=True)
            model(coefficients).backward()
            out.append(torch.cat([p.grad.flatten() for p in model.module.parts]))
        return out

    half = steps // 2
    uninterrupted = run(hooked()[0], 0, steps)
    model, state = hooked()
    before = run(model, 0, half)
    names = {p.data_ptr(): n for n, p in model.module.named_parameters()}
    checkpoint = Path(out_dir) / "last.ckpt"
    save_rank_state(state, names, checkpoint, half, rank, world)
    model, state = hooked()
    addresses = {n: p.data_ptr() for n, p in model.module.named_parameters()}
    restored = load_rank_state(state, addresses, checkpoint, half, rank, world)
    after = run(model, half, steps)
    refused = [  # another step, another number of processes, no file: start at zero
        load_rank_state(hooked()[1], addresses, checkpoint, half + 1, rank, world),
        load_rank_state(hooked()[1], addresses, checkpoint, half, rank, world + 1),
        load_rank_state(hooked()[1], addresses, Path(out_dir) / "best.ckpt", half, rank, world),
    ]
    return {
        "uninterrupted": uninterrupted,
        "resumed": before + after,
        "restored": [restored],
        "refused": refused,
    }


def main(rank: int, world: int, init_file: str, out_dir: str, mode: str, steps: int) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    if mode.startswith("resume"):
        torch.save(_resumed(rank, world, out_dir, mode, steps), Path(out_dir) / f"rank{rank}.pt")
        return finish()
    multi = mode in ("dense", "dgc0-multi") or mode.startswith("adascale")
    sizes = [700, 300, 1500] if multi else [3000]
    shapes: list[tuple[int, ...]] = [(n,) for n in sizes]
    scales = [1.0] * len(shapes)
    bucket_mb = 0.005  # ~ a bucket a part
    if mode == "dgc-mixed":  # one bucket: two matrices of gradients 1000x apart, a vector
        shapes, scales, bucket_mb = [(30, 100), (10, 100), (50,)], [1.0, 1e-3, 1.0], 1.0
        sizes = [math.prod(shape) for shape in shapes]
    model = DistributedDataParallel(Vectors(shapes), bucket_cap_mb=bucket_mb)
    state = None
    if mode.startswith("adascale"):
        from asr.training.distributed.savers.adascale import (
            AdaScaleConfig,
            AdaScaleState,
            adascale_hook,
        )

        adascale = AdaScaleState(AdaScaleConfig(smoothing=0.0))
        model.register_comm_hook(adascale, adascale_hook)
        gains = []
        for step in range(steps):
            shared = torch.Generator().manual_seed(1000 * step)
            own = torch.Generator().manual_seed(1000 * step + 1 + rank)
            mean = [torch.randn(n, dtype=torch.float64, generator=shared) for n in sizes]
            noise = [torch.randn(n, dtype=torch.float64, generator=own) for n in sizes]
            coefficients = {
                "adascale-same": mean,
                "adascale-noise": noise,
                "adascale-mixed": [m + z for m, z in zip(mean, noise, strict=True)],
            }[mode]
            model.zero_grad(set_to_none=True)
            model(coefficients).backward()
            gains.append(adascale.finish_step())
        torch.save({"gains": gains}, Path(out_dir) / f"rank{rank}.pt")
        return finish()
    if mode != "dense":
        sparsity = {"dgc0": 0.0, "dgc0-multi": 0.0, "dgc-frozen0": 0.0}.get(mode, 0.9)
        momentum = 0.9 if mode == "dgc-momentum" else 0.0
        frozen = mode.startswith("dgc-frozen")  # dense AdamW for 2 steps, then v frozen
        adam = AdamMoments(0.9, 0.98, 1e-8) if frozen else None
        state = DGCState(
            DGCConfig(
                sparsity=sparsity,
                selection="tensor" if mode == "dgc-mixed" else "bucket",
                dense_vectors=mode == "dgc-mixed",
                # unmasked: Adam exactly
                momentum_masking=not frozen or mode == "dgc-frozen-masked",
                variance_freeze_step=2,
                variance_refresh_steps=2 if mode == "dgc-frozen-refresh" else 0,
            ),
            momentum=momentum,
            adam=adam,
            total_entries=sum(sizes),
        )
        if mode == "dgc-frozen":  # a rate that changes every step, as a schedule's
            state.learning_rate = lambda: 0.1 * (state.step + 1)
        model.register_comm_hook(state, dgc_hook)
    record: dict[str, list] = {"local": [], "exchanged": [], "sent": [], "masked": []}
    for step in range(steps):
        generator = torch.Generator().manual_seed(1000 * step + rank)
        coefficients = [
            scale * torch.randn(shape, dtype=torch.float64, generator=generator)
            for shape, scale in zip(shapes, scales, strict=True)
        ]
        model.zero_grad(set_to_none=True)
        model(coefficients).backward()
        record["local"].append(torch.cat([c.flatten() for c in coefficients]))
        record["exchanged"].append(torch.cat([p.grad.flatten() for p in model.module.parts]))
        if state is not None and state.last_sent:
            sent = state.last_sent[0]
            record["sent"].append(sent.clone())
            residual = state.residual[0]
            velocity = state.velocity.get(0, torch.zeros_like(residual))
            record["masked"].append(
                (residual[sent].abs().max().item(), velocity[sent].abs().max().item())
            )
    if state is not None:
        record["residual"] = {i: r.clone() for i, r in state.residual.items()}
        record["traffic"] = vars(state.last_traffic)
        record["second_moment"] = {i: v.clone() for i, v in state.second_moment.items()}
        if 0 in state.layouts:
            layout = state.layouts[0]
            record["layout"] = {"dense": layout.dense.clone(), "segments": layout.segments}
    torch.save(record, Path(out_dir) / f"rank{rank}.pt")
    finish()


if __name__ == "__main__":
    rank, world, init_file, out_dir, mode, steps = sys.argv[1:]
    main(int(rank), int(world), init_file, out_dir, mode, int(steps))
