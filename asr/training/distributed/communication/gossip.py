"""Decentralized averaging of model replicas: asynchronous decentralized parallel SGD
(AD-PSGD, Lian et al., 2018), as Zhang et al. used it for acoustic models (arXiv 1907.05701,
2110.11199).

Each process trains its own replica; instead of all-reducing gradients, after each local
optimizer step it averages its weights with one peer. Ranks are split in two sides, as in
AD-PSGD's bipartite schedule: members at even positions are *active*, at odd positions
*passive*. After each local step an active member sends its weights to one passive
neighbour and receives the neighbour's; both then hold their average. A passive member
never waits for it: a service thread answers each request when it comes, even in the middle
of the member's own step. It cannot write weights that a forward or backward is using, so it
answers with the passive's weights plus the corrections not yet applied, and adds half the
difference to those corrections; the passive applies them after its optimizer step, as if
each average had come at that point (a lock keeps the service thread and the optimizer's
update apart). Only actives wait, and only for passives, so there is no cycle of waits and
no deadlock, for any number of processes; a slow process delays only the peers that ask it,
and only by one exchange.

- `ring: fixed`: the members in a ring; an active alternates between its left and right
  passive neighbours (with an odd number of members the ring has one active-active edge,
  which is skipped).
- `ring: random`: a fresh random bipartite ring for each of an active's steps, drawn from
  a seed every rank shares (actives and passives each shuffled, then interleaved).
- `delay_by_one`: the active sends a snapshot of step t's weights from a background
  thread while step t+1 computes, and after step t+1 adds the correction
  (peer_t - w_t) / 2: the average of step t applied one step late, its communication
  hidden behind a step of computation.
- `synchronous`: no service thread; after its own step t a passive waits for the actives
  that average with it at step t (known from the ring) and answers them in rank order, so
  every average is of the weights after the same step on both sides (no staleness, no
  race: the run is deterministic). Two replicas then follow DDP's trajectory; it gives up
  the tolerance of stragglers, and is there to tell what asynchrony costs.

Weights are exchanged and averaged in fp32 (optimizer state stays local). `average()`
measures how far the replicas are apart and, as the consensus, sets every rank's weights to
their mean (a collective) so that validation, checkpoints and export hold one model. It
first waits for every rank (a barrier, taken without the lock, so a passive still answers the last
requests of the others). The exchanges and the averages run on their own gloo process
groups, over CPU copies of the weights (on GPUs a device-to-host copy per exchange).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from asr.config_keys import ConfigError, check_choice

AVERAGE, STOP = 1, 0  # the header of a request: [kind, the active's step]


@dataclass(frozen=True)
class GossipConfig:
    """Keys of `distributed.gossip`.

    - `ring`: `fixed` or `random` (a fresh bipartite ring per step from `seed`).
    - `delay_by_one`: overlap each average with the next step's computation.
    - `seed`: of the random rings (the same on every rank).
    - `synchronous`: passives wait for their averages after each step (no staleness, no
      straggler tolerance).
    """

    ring: str = "fixed"
    delay_by_one: bool = False
    seed: int = 0
    synchronous: bool = False

    def __post_init__(self) -> None:
        check_choice("distributed.gossip.ring", self.ring, ["fixed", "random"])
        if self.synchronous and self.delay_by_one:
            raise ConfigError(
                "distributed.gossip.synchronous and delay_by_one exclude each other: one "
                "waits for each average, the other applies it a step late"
            )


def is_active(position: int) -> bool:
    """Whether the member at `position` of the ring starts the exchanges."""
    return position % 2 == 0


def random_ring(members: Sequence[int], step: int, seed: int) -> list[int]:
    """A bipartite ring of `members` for `step`: actives and passives each shuffled with a
    generator seeded by (`seed`, `step`), then interleaved (leftover actives at the end)."""
    rng = random.Random(seed * 1_000_003 + step)
    actives = [m for i, m in enumerate(members) if is_active(i)]
    passives = [m for i, m in enumerate(members) if not is_active(i)]
    rng.shuffle(actives)
    rng.shuffle(passives)
    ring = []
    for i, active in enumerate(actives):
        ring.append(active)
        if i < len(passives):
            ring.append(passives[i])
    return ring


def peer_of(members: Sequence[int], me: int, step: int, config: GossipConfig) -> int | None:
    """The passive member the active `me` averages with after its step `step` (None when
    `me` is passive or alone)."""
    if len(members) < 2 or not is_active(list(members).index(me)):
        return None
    passives = {m for i, m in enumerate(members) if not is_active(i)}
    ring = list(members) if config.ring == "fixed" else random_ring(members, step, config.seed)
    at = ring.index(me)
    around = [ring[(at - 1) % len(ring)], ring[(at + 1) % len(ring)]]
    candidates = [m for m in dict.fromkeys(around) if m in passives]
    if not candidates:
        return None
    return candidates[step % len(candidates)]


def askers_of(members: Sequence[int], me: int, step: int, config: GossipConfig) -> list[int]:
    """The active members that average with the passive `me` after their step `step`, in
    rank order."""
    actives = [m for i, m in enumerate(members) if is_active(i)]
    return sorted(a for a in actives if peer_of(members, a, step, config) == me)


def flatten(params: Sequence[Tensor], device: torch.device | str = "cpu") -> Tensor:
    """The parameters as one fp32 vector on `device` (a copy; the exchanges run on CPU
    tensors over gloo, whatever the training's device)."""
    return torch.cat([p.detach().reshape(-1).to(device, torch.float32) for p in params])


def assign(params: Sequence[Tensor], flat: Tensor) -> None:
    """Write the fp32 vector `flat` back into `params`, in place."""
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(flat[offset : offset + n].view_as(p))
            offset += n


class Gossip:
    """One member's side of the averaging: call `after_step()` after each local optimizer
    step, `average(write=True)` (the consensus) before validation and at the end, `close()`
    when training ends.

    `members`: the global ranks that gossip, in ring order (every rank, or the node
    leaders of H-ADPSGD); `group`: a gloo process group over every rank used for the
    exchanges only; `average_group`: another one for `consensus` and `spread` (a
    passive's service thread waits on `group` meanwhile).
    """

    def __init__(
        self,
        params: Sequence[Tensor],
        config: GossipConfig,
        members: Sequence[int],
        group: dist.ProcessGroup,
        average_group: dist.ProcessGroup,
    ) -> None:
        self.params = list(params)
        self.config = config
        self.members = list(members)
        self.me = dist.get_rank()
        if self.me not in self.members:
            raise ConfigError(f"rank {self.me} is not among the gossip members {self.members}")
        self.group = group
        self.average_group = average_group
        self.lock = threading.Lock()  # the service thread vs the optimizer's update
        self.pending: Tensor | None = None  # passive: corrections to add after the step
        self.position = self.members.index(self.me)
        self.numel = sum(p.numel() for p in self.params)
        self.active = is_active(self.position)
        self.step = 0
        self.exchanges = 0  # averages this member took part in
        # seconds: an active's training thread blocked on its exchanges; a passive's
        # service spent answering (from a request's weights received to the reply sent),
        # and of that waiting for the lock (the optimizer's update)
        self.timings = {"active_wait": 0.0, "answer": 0.0, "answer_lock": 0.0}
        self._in_flight: tuple[threading.Thread, Tensor, dict[str, Tensor]] | None = None
        self._server: threading.Thread | None = None
        self._server_error: BaseException | None = None
        actives = sum(is_active(i) for i in range(len(self.members)))
        if not self.active and len(self.members) > 1 and not config.synchronous:
            self._server = threading.Thread(
                target=self._serve, args=(actives,), name=f"gossip-passive-{self.me}", daemon=True
            )
            self._server.start()

    # -- the active side ---------------------------------------------------------------

    def after_step(self) -> None:
        """Actives: average with this step's peer (with `delay_by_one`: apply the previous
        step's average and start this one). Passives: add the corrections of the averages
        answered during the step."""
        self._check_server()
        step, self.step = self.step, self.step + 1
        if not self.active:
            if self.config.synchronous:
                self._answer(step)
            with self.lock:
                self.fold()
            return
        self._apply_in_flight()
        peer = peer_of(self.members, self.me, step, self.config)
        if peer is None:
            return
        with self.lock:
            mine = flatten(self.params)
        if self.config.delay_by_one:
            box: dict[str, Tensor] = {}
            thread = threading.Thread(
                target=self._ask, args=(peer, step, mine, box), name="gossip-active", daemon=True
            )
            thread.start()
            self._in_flight = (thread, mine, box)
            return
        box = {}
        start = time.perf_counter()
        self._ask(peer, step, mine, box)
        self.timings["active_wait"] += time.perf_counter() - start
        with self.lock:
            assign(self.params, (mine + box["peer"]) / 2)
        self.exchanges += 1

    def _ask(self, peer: int, step: int, mine: Tensor, box: dict[str, Tensor]) -> None:
        dist.send(torch.tensor([AVERAGE, step], dtype=torch.int64), peer, group=self.group)
        dist.send(mine, peer, group=self.group)
        theirs = torch.empty_like(mine)
        dist.recv(theirs, peer, group=self.group)
        box["peer"] = theirs

    def _apply_in_flight(self) -> None:
        """`delay_by_one`: add the correction of the previous step's average."""
        if self._in_flight is None:
            return
        thread, sent, box = self._in_flight
        start = time.perf_counter()
        thread.join()
        self.timings["active_wait"] += time.perf_counter() - start
        self._in_flight = None
        if "peer" not in box:
            raise RuntimeError(f"rank {self.me}: the delayed weight exchange failed")
        with self.lock:
            now = flatten(self.params)
            assign(self.params, now + (box["peer"] - sent) / 2)
        self.exchanges += 1

    # -- the passive side --------------------------------------------------------------

    def _serve(self, actives: int) -> None:
        stops = 0
        header = torch.empty(2, dtype=torch.int64)
        try:
            while stops < actives:
                src = dist.recv(header, group=self.group)
                if int(header[0]) == STOP:
                    stops += 1
                    continue
                theirs = torch.empty(self.numel, dtype=torch.float32)
                dist.recv(theirs, src, group=self.group)
                start = time.perf_counter()
                with self.lock:  # not while the optimizer updates the weights
                    self.timings["answer_lock"] += time.perf_counter() - start
                    self._reply(theirs, src)
                self.timings["answer"] += time.perf_counter() - start
        except BaseException as err:  # noqa: BLE001 - re-raised in the training thread
            self._server_error = err

    def _answer(self, step: int) -> None:
        """`synchronous`: receive and answer this step's requests, in rank order."""
        header = torch.empty(2, dtype=torch.int64)
        for active in askers_of(self.members, self.me, step, self.config):
            dist.recv(header, active, group=self.group)
            if header.tolist() != [AVERAGE, step]:
                raise RuntimeError(
                    f"rank {self.me}: expected rank {active}'s average of step {step}, got "
                    f"the request {header.tolist()} (the ranks' step counts differ)"
                )
            theirs = torch.empty(self.numel, dtype=torch.float32)
            dist.recv(theirs, active, group=self.group)
            self._reply(theirs, active)

    def _reply(self, theirs: Tensor, active: int) -> None:
        """Send `active` this passive's weights with the corrections not yet applied, and
        add half the difference to those corrections (`theirs`: the active's weights)."""
        mine = flatten(self.params)
        if self.pending is not None:
            mine += self.pending
        dist.send(mine, active, group=self.group)
        correction = (theirs - mine) / 2
        self.pending = correction if self.pending is None else self.pending + correction
        self.exchanges += 1

    def fold(self) -> None:
        """Add the corrections of the averages answered so far to the weights (the caller
        holds the lock, between steps)."""
        if self.pending is not None:
            assign(self.params, flatten(self.params) + self.pending)
            self.pending = None

    def _check_server(self) -> None:
        if self._server_error is not None:
            raise RuntimeError(
                f"rank {self.me}: the gossip service thread failed"
            ) from self._server_error

    # -- all members -------------------------------------------------------------------

    def _quiesce(self, group: dist.ProcessGroup | None) -> None:
        """Finish this member's own exchanges, then wait for every member of `group`: once
        all are here no request is in flight."""
        self._apply_in_flight()
        dist.barrier(group=group)

    def average(self, write: bool) -> float:
        """The spread of the replicas of every rank (max over ranks of the L2 distance of a
        replica to their mean); with `write` (the consensus) every replica is then set to
        the mean. Every rank calls this at the same point (ranks that do not gossip call
        `average_replicas` after the same barrier)."""
        self._quiesce(self.average_group)
        self._check_server()
        with self.lock:
            self.fold()
        return average_replicas(self.params, self.average_group, self.lock, write=write)

    def close(self) -> None:
        """End the exchanges: actives tell every passive to stop; passives wait for that."""
        self._apply_in_flight()
        if self.active and not self.config.synchronous:  # stop the passives' service threads
            stop = torch.tensor([STOP, self.step], dtype=torch.int64)
            for position, member in enumerate(self.members):
                if not is_active(position):
                    dist.send(stop, member, group=self.group)
        if self._server is not None:
            self._server.join()
            self._server = None
        self._check_server()
        with self.lock:
            self.fold()


def average_replicas(
    params: Sequence[Tensor],
    group: dist.ProcessGroup,
    lock: threading.Lock | None = None,
    write: bool = True,
) -> float:
    """The spread of the replicas of `group` (max over ranks of the L2 distance of a
    replica to their mean); with `write`, every replica is then set to the mean. A
    collective: every rank of `group` calls it, after a barrier when exchanges may be in
    flight."""
    lock = lock or threading.Lock()
    with lock:
        mine = flatten(params)
        mean = mine.clone()
        dist.all_reduce(mean, group=group)
        mean /= dist.get_world_size(group)
        distance = torch.linalg.vector_norm(mine - mean).reshape(1).double()
        dist.all_reduce(distance, op=dist.ReduceOp.MAX, group=group)
        if write:
            assign(params, mean)
    return float(distance)
