"""Decentralized averaging (AD-PSGD's bipartite gossip) with 2-5 real processes over gloo."""

from __future__ import annotations

import itertools
import socket
import sys
from pathlib import Path

import pytest
import torch

from asr.training.distributed.communication.gossip import (
    Gossip,
    GossipConfig,
    askers_of,
    peer_of,
    random_ring,
)

STRATEGY_WORKER = Path(__file__).with_name("strategy_worker.py")
ROOT = Path(__file__).resolve().parents[3]


def gossip_replicas(rank: int, world: int, out_dir: Path, steps: int, lr: float, **keys) -> dict:
    """Scenario (run on every rank by `run_ranks`): replicas of a 16-entry weight vector,
    each rank starting from its own random weights and pulled towards its own target by
    `lr` x (w - target) per step, averaged with peers by `Gossip` of GossipConfig `keys`.
    With `delay_by_one` the passive ranks do not train, so the run is deterministic
    whatever the timing; `synchronous` is deterministic too."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    group, average_group = dist.new_group(backend="gloo"), dist.new_group(backend="gloo")
    weights = torch.randn(16, generator=torch.Generator().manual_seed(rank))
    target = torch.randn(16, generator=torch.Generator().manual_seed(100 + rank))
    config = GossipConfig(**keys)
    gossip = Gossip([weights], config, list(range(world)), group, average_group)
    trains = lr > 0 and not (config.delay_by_one and not gossip.active)
    record: dict[str, list] = {"start": [weights.clone()], "after_step": [], "spread": []}
    applied = torch.zeros_like(weights)  # the sum of this rank's own updates
    for step in range(steps):
        if trains:
            with gossip.lock:
                update = -lr * (weights - target)
                weights += update
                applied += update
        gossip.after_step()
        record["after_step"].append(weights.clone())
        if step % 10 == 9 and not config.delay_by_one:
            record["spread"].append(gossip.average(write=False))
    gossip.close()
    return {
        **record,
        "exchanges": gossip.exchanges,
        "active": gossip.active,
        "target": target,
        "applied": applied,
        "spread_before_consensus": gossip.average(write=True),
        "consensus": weights.clone(),
    }


@pytest.mark.slow  # real processes over gloo
@pytest.mark.parametrize("world", [4, 5])  # as many actives as passives, and one more
@pytest.mark.parametrize("ring", ["fixed", "random"])
def test_training_replicas_never_deadlock_and_lose_no_update(
    run_ranks, tmp_path: Path, world: int, ring: str
) -> None:
    ranks = run_ranks(
        tmp_path, gossip_replicas, 30, world, lr=0.05, ring=ring
    )  # a hang fails in 2 min
    actives = [r for r in ranks if r["active"]]
    passives = [r for r in ranks if not r["active"]]
    assert len(actives) == (world + 1) // 2
    assert sum(r["exchanges"] for r in actives) == 30 * len(actives)  # one per active step
    assert sum(r["exchanges"] for r in passives) == 30 * len(actives)  # each one answered
    for rank in ranks:
        assert all(bool(torch.isfinite(w).all()) for w in rank["after_step"])
    # every rank trains while it gossips (passives answer from their service thread in
    # the middle of their own steps): each average moves weight from one replica to the
    # other, so at the end the replicas hold their starts plus every update any of them
    # made, whatever the timing
    made = sum(r["start"][0] + r["applied"] for r in ranks)
    assert all(float(r["applied"].abs().sum()) > 0 for r in ranks)
    for rank in ranks:
        assert torch.allclose(rank["consensus"] * world, made, atol=1e-4)


@pytest.mark.slow  # real processes over gloo
@pytest.mark.parametrize("world", [2, 5])
def test_pure_gossip_converges_to_the_mean(run_ranks, tmp_path: Path, world: int) -> None:
    ranks = run_ranks(tmp_path, gossip_replicas, 60, world, lr=0.0, ring="random")
    start_mean = sum(r["start"][0] for r in ranks) / world
    spreads = ranks[0]["spread"]  # after 10, 20, ... 60 steps
    # the spread shrinks at every measurement until float32 rounding (~1e-7 here) is all
    # that is left; at that floor it may wobble by a rounding step (seen with 5 ranks)
    floor = 1e-5 * spreads[0] + 1e-6
    for before, after in itertools.pairwise(spreads):
        assert after <= before or after < floor, spreads
    assert spreads[-1] < 1e-3 * spreads[0] + 1e-6
    for rank in ranks:  # pairwise averages keep the sum: every replica ends at the mean
        assert torch.allclose(rank["after_step"][-1], start_mean, atol=1e-4)
        assert torch.allclose(rank["consensus"], start_mean, atol=1e-5)


@pytest.mark.slow  # real processes over gloo
@pytest.mark.parametrize("world", [2, 3, 4])
def test_synchronous_gossip_averages_the_weights_after_the_same_step(
    run_ranks, tmp_path: Path, world: int
) -> None:
    # every rank trains; each average is of both sides' weights after the same step, the
    # passives answering their actives in rank order: a replay is exact whatever the timing
    lr, steps = 0.1, 12
    ranks = run_ranks(tmp_path, gossip_replicas, steps, world, lr=lr, synchronous=True)
    config = GossipConfig(ring="fixed", synchronous=True)
    w = [r["start"][0].clone() for r in ranks]
    for t in range(steps):
        w = [x - lr * (x - r["target"]) for x, r in zip(w, ranks, strict=True)]
        pending = [torch.zeros_like(x) for x in w]
        for active in range(0, world, 2):
            peer = peer_of(list(range(world)), active, t, config)
            if peer is None:
                continue
            answer = w[peer] + pending[peer]
            pending[peer] += (w[active] - answer) / 2
            w[active] = (w[active] + answer) / 2
        w = [x + d for x, d in zip(w, pending, strict=True)]
        for rank, expected in zip(ranks, w, strict=True):
            assert torch.allclose(rank["after_step"][t], expected, atol=1e-6), (t, world)
    if world == 2:  # two replicas are one model after every step, as under DDP
        for t in range(steps):
            assert torch.allclose(ranks[0]["after_step"][t], ranks[1]["after_step"][t], atol=1e-6)


@pytest.mark.slow  # real processes over gloo
def test_delay_by_one_applies_each_average_one_step_late(run_ranks, tmp_path: Path) -> None:
    lr, steps = 0.1, 8
    active, passive = run_ranks(tmp_path, gossip_replicas, steps, 2, lr=lr, delay_by_one=True)
    assert active["active"] and not passive["active"]
    # the passive does not train, so it changes only by the averages: replay both sides
    a, p, target = active["start"][0], passive["start"][0], active["target"]
    pending = None  # (what the active sent, what the passive answered)
    for t in range(steps):
        a = a - lr * (a - target)
        if pending is not None:  # step t-1's average, applied after step t
            sent, answer = pending
            a = a + (answer - sent) / 2
        sent = a.clone()
        pending, p = (sent, p.clone()), (p + sent) / 2
        assert torch.allclose(active["after_step"][t], a, atol=1e-6), t
    sent, answer = pending  # close() applies the last one
    assert torch.allclose(active["consensus"], ((a + (answer - sent) / 2) + p) / 2, atol=1e-6)


def test_peer_choice() -> None:
    fixed = GossipConfig()
    # 4 members: actives 0 and 2 alternate between their passive neighbours 1 and 3
    assert [peer_of([0, 1, 2, 3], 0, t, fixed) for t in range(4)] == [3, 1, 3, 1]
    assert [peer_of([0, 1, 2, 3], 2, t, fixed) for t in range(2)] == [1, 3]
    assert peer_of([0, 1, 2, 3], 1, 0, fixed) is None  # passives never ask
    # 3 members: the active-active edge (2, 0) is skipped
    assert {peer_of([0, 1, 2], 0, t, fixed) for t in range(4)} == {1}
    assert {peer_of([0, 1, 2], 2, t, fixed) for t in range(4)} == {1}
    # H-ADPSGD's leaders: members are global ranks
    assert peer_of([0, 2], 0, 0, fixed) == 2
    ring = random_ring([0, 1, 2, 3, 4, 5], step=7, seed=3)
    assert sorted(ring) == list(range(6)) and all(r % 2 == i % 2 for i, r in enumerate(ring))
    assert ring == random_ring([0, 1, 2, 3, 4, 5], step=7, seed=3)  # the same on every rank
    assert len({tuple(random_ring(list(range(6)), s, 3)) for s in range(10)}) > 1
    with pytest.raises(ValueError, match="ring"):
        GossipConfig(ring="star")
    # a synchronous passive is asked by the actives whose peer it is at that step
    assert askers_of([0, 1, 2], 1, 0, fixed) == [0, 2]
    assert [askers_of([0, 1, 2, 3], 3, t, fixed) for t in range(2)] == [[0], [2]]
    with pytest.raises(ValueError, match="exclude each other"):
        GossipConfig(synchronous=True, delay_by_one=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_strategy(run_workers, tmp_path: Path, world: int, node_size: int, steps: int, *extra):
    out = tmp_path / f"strategy-{world}-{node_size}-{'-'.join(extra)}"
    out.mkdir()
    port = str(_free_port())
    command = [sys.executable, str(STRATEGY_WORKER)]
    run_workers(
        [
            [*command, str(r), str(world), port, str(out), str(node_size), str(steps), *extra]
            for r in range(world)
        ],
        timeout=180,
    )
    return [torch.load(out / f"rank{r}.pt") for r in range(world)]


@pytest.mark.slow  # real processes over gloo
def test_h_adpsgd_keeps_the_replicas_of_a_node_identical(run_workers, tmp_path: Path) -> None:
    steps = 6
    ranks = _run_strategy(run_workers, tmp_path, 4, 2, steps)  # 2 nodes x 2 processes
    for step in range(steps):
        assert torch.equal(ranks[0]["weights"][step], ranks[1]["weights"][step])
        assert torch.equal(ranks[2]["weights"][step], ranks[3]["weights"][step])
    # the nodes train on different data: their replicas differ between the averages ...
    assert not torch.equal(ranks[0]["weights"][-1], ranks[2]["weights"][-1])
    for rank in ranks:  # ... and the run ends at their consensus
        assert torch.allclose(rank["final"], ranks[0]["final"], atol=1e-6)
        assert bool(torch.isfinite(rank["final"]).all())


@pytest.mark.slow  # real processes over gloo
@pytest.mark.parametrize("extra", [("random",), ("fixed", "delay")])
def test_adpsgd_strategy_trains_and_ends_at_the_consensus(
    run_workers, tmp_path: Path, extra
) -> None:
    ranks = _run_strategy(run_workers, tmp_path, 3, 1, 5, *extra)
    for rank in ranks:
        assert len(rank["weights"]) == 5
        assert torch.allclose(rank["final"], ranks[0]["final"], atol=1e-6)
    assert not torch.equal(ranks[0]["weights"][0], ranks[2]["weights"][0])  # own replicas


@pytest.mark.slow  # real processes over gloo
def test_a_straggler_does_not_hold_back_the_other_replica(run_workers, tmp_path: Path) -> None:
    # rank 1 sleeps 0.1 s after each step; nothing per step may wait for it but the
    # exchanges it answers from its service thread (Lightning's per-step SIGTERM broadcast
    # held both ranks at the straggler's pace)
    steps = 20
    fast, slow = _run_strategy(run_workers, tmp_path, 2, 1, steps, "fixed", "straggle")
    fast_time = fast["times"][-1] - fast["times"][0]
    slow_time = slow["times"][-1] - slow["times"][0]
    assert slow_time > 0.1 * (steps - 1)
    assert fast_time < 0.4 * slow_time, (fast_time, slow_time)
    assert torch.allclose(fast["final"], slow["final"], atol=1e-6)


@pytest.mark.slow  # real processes over gloo
def test_two_synchronous_replicas_train_as_ddp_does(run_workers, tmp_path: Path) -> None:
    # momentum SGD through the strategy's whole path (Lightning's optimizer step, the lock,
    # the exchange): two replicas averaged after every step, each without staleness, follow
    # DDP's trajectory, since the average of the two updates is the update of the average
    # gradient (momentum is linear)
    steps = 8
    sync = _run_strategy(run_workers, tmp_path, 2, 1, steps, "fixed", "sync")
    ddp = _run_strategy(run_workers, tmp_path, 2, 1, steps, "fixed", "ddp")
    for step in range(steps):
        for rank in (0, 1):
            assert torch.allclose(sync[rank]["weights"][step], ddp[0]["weights"][step], atol=1e-5)
    assert not torch.allclose(ddp[0]["weights"][0], ddp[0]["weights"][-1], atol=1e-2)  # trained
