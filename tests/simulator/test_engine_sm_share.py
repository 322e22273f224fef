"""Communication kernels holding SMs slow the compute they overlap: closed forms on hand-built programs."""
import pytest

from simulator.costs import SimpleCostModel
from simulator.engine import run
from simulator.program import Programs, collective, compute


class HoldsSMs(SimpleCostModel):
    """SimpleCostModel whose communications hold ``share`` of the SMs."""

    def __init__(self, share: float, **kw):
        super().__init__(**kw)
        self.share = share

    def comm_sm_fraction(self, request) -> float:
        return self.share


def _programs(comm_first: bool):
    """2 ranks: c0 (1 s), then a 2 s all-reduce on the comm stream and c1 (1 s) on the compute stream.
    comm_first: c1 waits 0.5 s (a 0.5 s op c_wait) so it starts inside the all-reduce; else c1 starts with
    it (the all-reduce starts while c1 runs)."""
    progs = Programs(world_size=2, ops={})
    g = progs.add_group([0, 1], "dp")
    for r in range(2):
        ops = [compute("c0", 1e12), collective("ar", "all_reduce", g, 2e9, stream="comm", deps=(0,))]
        if comm_first:
            ops += [compute("c_wait", 0.5e12, deps=(0,), stream="aux"), compute("c1", 1e12, deps=(2,))]
        else:
            ops += [compute("c1", 1e12, deps=(0,))]
        ops.append(compute("step", 0.5e12, deps=tuple(range(1, len(ops)))))
        progs.ops[r] = ops
    return progs


@pytest.mark.parametrize("share", [0.0, 0.1, 0.25])
def test_compute_inside_a_communication_takes_share_of_the_overlap_longer(share):
    # c_wait [1, 1.5] was running when the all-reduce [1, 3] started: it owes share·0.5, paid by the next
    # compute op c1, which starts at 1.5 inside the all-reduce (overlap 1 s): c1 ends at 2.5 + share·(0.5 + 1)
    res = run(_programs(comm_first=True), HoldsSMs(share, flops_per_s=1e12, link_bytes_per_s=1e9))
    c1 = 3
    assert res.end_s[0][2] == pytest.approx(1.5)
    assert res.start_s[0][c1] == pytest.approx(1.5)
    assert res.end_s[0][c1] == pytest.approx(2.5 + 1.5 * share)
    assert res.end_s[0][1] == pytest.approx(3.0)             # the communication itself is unchanged


def test_a_communication_starting_under_running_compute_charges_the_next_compute_op():
    # the all-reduce [1, 3] starts with c1 [1, 2]: c1's overlap (1 s) is owed by the next compute op "step",
    # which starts at 3 (after the all-reduce) and lasts 0.5 + share·1
    share = 0.2
    res = run(_programs(comm_first=False), HoldsSMs(share, flops_per_s=1e12, link_bytes_per_s=1e9))
    assert res.end_s[0][2] == pytest.approx(2.0)
    assert res.start_s[0][3] == pytest.approx(3.0)
    assert res.end_s[0][3] == pytest.approx(3.5 + share)


def test_models_without_the_notion_are_unchanged():
    plain = run(_programs(comm_first=True), SimpleCostModel(flops_per_s=1e12, link_bytes_per_s=1e9))
    zero = run(_programs(comm_first=True), HoldsSMs(0.0, flops_per_s=1e12, link_bytes_per_s=1e9))
    assert plain.end_s == zero.end_s


def test_a_communication_on_the_only_compute_stream_slows_nothing():
    """A stream waits for each op to end, so a collective on the one stream a rank computes on never runs beside
    its compute: however many SMs it holds, the rank's compute times are those of a model without the notion
    (the engine does not even register its hold), whichever engine path times it (rendezvous of two ranks, a
    rank alone in its group)."""
    for world in (1, 2):
        progs = Programs(world_size=world, ops={})
        g = progs.add_group(list(range(world)), "tp")
        for r in range(world):
            progs.ops[r] = [compute("c0", 1e12), collective("ar", "all_reduce", g, 2e9, deps=(0,)),
                            compute("c1", 1e12, deps=(1,)), collective("ar2", "all_reduce", g, 1e9, deps=(2,)),
                            compute("c2", 0.5e12, deps=(3,))]
        plain = run(progs, SimpleCostModel(flops_per_s=1e12, link_bytes_per_s=1e9))
        held = run(progs, HoldsSMs(0.3, flops_per_s=1e12, link_bytes_per_s=1e9))
        assert held.end_s == plain.end_s and held.start_s == plain.start_s
    # the same collective on its own stream, beside compute: slowed as before
    progs = Programs(world_size=2, ops={})
    g = progs.add_group([0, 1], "tp")
    for r in range(2):
        progs.ops[r] = [collective("ar", "all_reduce", g, 2e9, stream="comm"), compute("c1", 1e12),
                        compute("c2", 1e12, deps=(1,))]
    held = run(progs, HoldsSMs(0.3, flops_per_s=1e12, link_bytes_per_s=1e9))
    # the all-reduce [0, 2] starts under c1 [0, 1]: c2 owes c1's overlap and takes its own, 0.3 s each
    assert held.end_s[0][2] == pytest.approx(2.6)


def test_a_communication_on_a_compute_stream_holds_against_the_ranks_other_compute_streams():
    """Compute on two streams: a collective on one of them still runs beside the other's compute and slows
    it (only a rank's sole compute stream is exempt)."""
    progs = Programs(world_size=2, ops={})
    g = progs.add_group([0, 1], "tp")
    for r in range(2):
        progs.ops[r] = [collective("ar", "all_reduce", g, 2e9), compute("side", 1e12, stream="aux"),
                        compute("side2", 1e12, deps=(1,), stream="aux")]
    held = run(progs, HoldsSMs(0.3, flops_per_s=1e12, link_bytes_per_s=1e9))
    plain = run(progs, SimpleCostModel(flops_per_s=1e12, link_bytes_per_s=1e9))
    assert held.end_s[0][2] == pytest.approx(plain.end_s[0][2] + 0.6)
