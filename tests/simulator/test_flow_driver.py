"""The engine's flow-network driver against a one-link fair-share network whose answers are closed-form."""
import pytest

from simulator.costs import CommRequest, SimpleCostModel
from simulator.engine import run
from simulator.program import Programs, collective, compute


class SharedBus:
    """Every communication crosses one link of ``capacity`` bytes/s shared equally (processor sharing).
    A request's work is its size (plus its images' sizes: they load the same link)."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.active = {}       # key -> remaining bytes
        self.t = 0.0

    def _advance(self, now):
        if self.active and now > self.t:
            rate = self.capacity / len(self.active)
            for k in self.active:
                self.active[k] -= rate * (now - self.t)
        self.t = now

    def start(self, now, key, req: CommRequest):
        self._advance(now)
        self.active[key] = req.size_bytes * (1 + len(req.images))

    def next_completion(self):
        if not self.active:
            return None
        k = min(self.active, key=lambda k: (self.active[k], k))
        return self.t + max(self.active[k], 0.0) * len(self.active) / self.capacity, k

    def finish(self, now, key):
        self._advance(now)
        del self.active[key]


class BusCost(SimpleCostModel):
    contention_aware = True

    def network(self):
        return SharedBus(self.link_bytes_per_s)


def two_groups(delay_flops=0.0):
    progs = Programs(world_size=4, ops={})
    a = progs.add_group([0, 1], "dp")
    b = progs.add_group([2, 3], "dp")
    for r in range(4):
        g = a if r < 2 else b
        ops = []
        if r >= 2 and delay_flops:
            ops.append(compute("late", delay_flops))
        ops.append(collective("ar", "all_reduce", g, 1e9, stream="comm", deps=(0,) if ops else ()))
        progs.ops[r] = ops
    return progs


def test_two_concurrent_collectives_share_the_link():
    res = run(two_groups(), BusCost(link_bytes_per_s=1e9))
    # each needs 1 s alone; together they progress at half rate and both end at 2 s
    assert res.end_s[0][0] == pytest.approx(2.0)
    assert res.end_s[2][0] == pytest.approx(2.0)
    assert res.start_s[0][0] == 0.0          # start is when the communication began, not when it ended


def test_a_later_collective_slows_the_first_only_while_both_run():
    res = run(two_groups(delay_flops=0.5e12), BusCost(flops_per_s=1e12, link_bytes_per_s=1e9))
    # A alone for 0.5 s (0.5 GB done), then both share: A's remaining 0.5 GB at 0.5 GB/s -> ends at 1.5 s;
    # B did 0.5 GB by then, its last 0.5 GB alone -> ends at 2.0 s.
    assert res.end_s[0][0] == pytest.approx(1.5)
    assert res.start_s[2][1] == pytest.approx(0.5)
    assert res.end_s[2][1] == pytest.approx(2.0)


def test_symmetric_images_load_the_link_like_the_full_run():
    full = run(two_groups(), BusCost(link_bytes_per_s=1e9))
    sym = two_groups()
    sym.ops = {0: sym.ops[0]}
    sym.classes = {0: (0, 1, 2, 3)}
    res = run(sym, BusCost(link_bytes_per_s=1e9))
    assert res.step_time_s == pytest.approx(full.step_time_s, rel=1e-12)
