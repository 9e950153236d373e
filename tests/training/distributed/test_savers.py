"""The communication savers through `asr-train` with 2 real processes over gloo: Deep
Gradient Compression and AdaScale register, train, and log what they did."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf


@pytest.mark.slow
def test_dgc_trains_and_logs_its_traffic(train_two_ranks, tmp_path: Path) -> None:
    rows = train_two_ranks(
        tmp_path / "exp",
        "trainer.max_epochs=1",
        "distributed/compression=dgc",
        "distributed.compression.variance_freeze_step=1",  # one dense AdamW step
        "distributed.compression.variance_refresh_steps=0",
        "distributed.compression.sparsity=0.999",
        "distributed.compression.dense_vectors=true",
        "distributed.compression.warmup_steps=1",
    )
    dense_step, *steps = [r for r in rows if r.get("comm/sent_bytes")]
    assert len(steps) >= 5
    # each bucket sends the top-k of its matrices' entries as (int32 index, fp32 value);
    # vectors (biases, norms) go whole as fp32 values, every step
    vectors, matrices = _parameter_sizes(tmp_path / "exp" / "checkpoints" / "last.ckpt")
    entries = sum(vectors) + sum(matrices)
    assert (
        float(dense_step["comm/sent_bytes"]) == float(dense_step["comm/dense_bytes"]) == 4 * entries
    )
    stages = [0.75, 0.9375, 0.984375, 0.996] + [0.999] * (len(steps) - 4)
    for row, sparsity in zip(steps, stages, strict=True):
        top_k = (1 - sparsity) * sum(matrices)  # up to a rounding per bucket
        assert float(row["comm/dense_bytes"]) == 4 * entries
        sent = float(row["comm/sent_bytes"]) - 4 * sum(vectors)
        assert sent == pytest.approx(8 * top_k, abs=8 * 8)
        sent_share = (sum(vectors) + top_k) / entries
        assert float(row["comm/sparsity"]) == pytest.approx(1 - sent_share, abs=1e-5)
        ratio = 4 * entries / (4 * sum(vectors) + 8 * top_k)
        assert float(row["comm/compression"]) == pytest.approx(ratio, rel=1e-3)
        # two ranks: a rank's payload goes out once and the other's comes in
        same = {row[f"comm/{name}_bytes"] for name in ("payload", "sent", "received")}
        assert len(same) == 1 and row["comm/compression_sent"] == row["comm/compression"]
    losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    assert losses and all(loss == loss for loss in losses)  # no NaN
    assert {"lr-SGD/pg1", "lr-SGD/pg2"} <= rows[0].keys()  # AdamW's moments are in the hook
    # every rank wrote its hook state beside last.ckpt (only)
    checkpoints = tmp_path / "exp" / "checkpoints"
    assert sorted(p.name for p in (checkpoints / "last.dgc").iterdir()) == ["rank0.pt", "rank1.pt"]
    assert not list(checkpoints.glob("epoch=*.dgc")) and not (checkpoints / "best.dgc").exists()
    saved = torch.load(checkpoints / "last.dgc" / "rank1.pt", weights_only=True)
    assert saved["global_step"] == 1 + len(steps) and saved["rank"] == 1
    residual = sum(float(t["residual"].abs().sum()) for t in saved["parameters"].values())
    assert residual > 0  # what waits to be sent
    # the config saved is the one given; what its null and auto keys became lies beside it
    hydra = tmp_path / "exp" / "hydra" / ".hydra"
    config, resolved = (OmegaConf.load(hydra / name) for name in ("config.yaml", "resolved.yaml"))
    assert config.trainer.gradient_clip_val == 5.0  # clips each rank's gradient in the hook
    assert config.distributed.compression.clip_norm is None
    assert resolved.distributed.compression.clip_norm == 5.0
    assert resolved.distributed.world_size == 2 and resolved.distributed.cpu_threads == 1
    assert resolved.distributed.strategy == "HookedDDPStrategy"
    assert resolved.distributed.find_unused_parameters is False
    assert resolved.trainer.precision in ("32-true", "bf16-mixed")
    assert resolved.model.loss.lattice == "torch"  # auto, on a CPU


FROZEN_VARIANCE = (  # the defaults (99.6 %, every parameter sparse), but for their lengths
    "distributed/compression=dgc",
    "distributed.compression.variance_freeze_step=2",
    "distributed.compression.variance_refresh_steps=2",
    "distributed.compression.warmup_steps=1",
)


@pytest.mark.slow
@pytest.mark.long
def test_frozen_variance_trains_refreshes_and_resumes_where_it_was(
    train_two_ranks, tmp_path: Path
) -> None:
    rows = train_two_ranks(tmp_path / "exp", "trainer.max_epochs=1", *FROZEN_VARIANCE)
    steps = [r for r in rows if r.get("comm/sent_bytes")]
    assert len(steps) >= 6
    entries = sum(
        sum(sizes) for sizes in _parameter_sizes(tmp_path / "exp" / "checkpoints" / "last.ckpt")
    )
    # two dense AdamW steps, then the warm-up stages; every second sparse step first
    # all-reduces a new second moment in bf16 (2 bytes per entry)
    stages = [0.0, 0.0, 0.75, 0.9375, 0.984375] + [0.996] * (len(steps) - 5)
    for step, (row, sparsity) in enumerate(zip(steps, stages, strict=True)):
        assert float(row["comm/dense_bytes"]) == 4 * entries
        if sparsity == 0.0:
            assert float(row["comm/sent_bytes"]) == 4 * entries
            assert float(row["comm/sparsity"]) == 0.0
            continue
        sparse_step = step - 2
        refresh = 2 * entries if sparse_step > 0 and sparse_step % 2 == 0 else 0
        top_k = (1 - sparsity) * entries  # up to a rounding per bucket
        sent = float(row["comm/sent_bytes"]) - refresh
        assert sent == pytest.approx(8 * top_k, abs=8 * 8), step
        assert float(row["comm/sparsity"]) == pytest.approx(sparsity, abs=1e-5)
    losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    assert losses and all(loss == loss for loss in losses)  # no NaN
    assert {"lr-SGD/pg1", "lr-SGD/pg2"} <= rows[0].keys()  # AdamW is in the hook
    # each rank keeps its frozen second moment and its own moments, the same second
    # moment on both (the ranks' shared refresh), the first moments their own
    checkpoints = tmp_path / "exp" / "checkpoints"
    saved = [
        torch.load(checkpoints / "last.dgc" / f"rank{r}.pt", weights_only=True) for r in (0, 1)
    ]
    kinds = {"residual", "velocity", "second_moment", "local_first", "local_second"}
    for name, state in saved[0]["parameters"].items():
        assert set(state) == kinds, name
        other = saved[1]["parameters"][name]
        assert torch.equal(state["second_moment"], other["second_moment"]), name
    assert any(
        not torch.equal(state["local_first"], saved[1]["parameters"][name]["local_first"])
        for name, state in saved[0]["parameters"].items()
    )
    # a resumed run reads the state and goes on sparse: without it the dense steps would
    # begin again (sparsity 0)
    more = train_two_ranks(
        tmp_path / "exp", "trainer.max_epochs=2", *FROZEN_VARIANCE, "resume=auto"
    )
    logs = "".join(p.read_text() for p in (tmp_path / "exp" / "hydra").glob("*.log"))
    for rank in (0, 1):
        assert f"rank {rank}: restored the DGC state of" in logs
    resumed = [r for r in more if r.get("comm/sent_bytes")][len(steps) :]
    assert resumed and all(
        float(r["comm/sparsity"]) == pytest.approx(0.996, abs=1e-5) for r in resumed
    )
    assert all(
        float(r["train/loss"]) == float(r["train/loss"]) for r in more if r.get("train/loss")
    )


def _parameter_sizes(checkpoint: Path) -> tuple[list[int], list[int]]:
    """Sizes of the model's 1-D parameters and of its others, from a checkpoint (without
    BatchNorm's running statistics, which are buffers)."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]
    params = [t for name, t in state.items() if t.is_floating_point() and ".running_" not in name]
    return [t.numel() for t in params if t.dim() <= 1], [t.numel() for t in params if t.dim() > 1]


@pytest.mark.slow
def test_adascale_sets_the_rate_from_its_gain(train_two_ranks, tmp_path: Path) -> None:
    rows = train_two_ranks(
        tmp_path / "exp",
        "trainer.max_epochs=1",
        "optim=sgd_cosine",
        "optim.lr=0.05",
        "optim.scheduler.warmup_steps=5",
        "distributed/adascale=enabled",
    )
    gains = [float(r["adascale/gain"]) for r in rows if r.get("adascale/gain")]
    progress = [float(r["adascale/progress"]) for r in rows if r.get("adascale/progress")]
    assert len(gains) >= 5 and all(1.0 <= g <= 2.0 for g in gains)
    assert progress == pytest.approx([sum(gains[: i + 1]) for i in range(len(gains))], rel=1e-4)
    rates = [float(r["lr-SGD/pg1"]) for r in rows if r.get("lr-SGD/pg1")]
    assert len(set(rates)) > 1  # the rate follows gain x schedule(progress)
