"""Pipeline schedule orders: closed-form bubbles and in-flight micro-batches under an ideal executor
(fixed op durations, free communication) independent of the engine."""
import pytest

from schedules.pipeline import SCHEDULES, ideal_times, peak_in_flight, stage_orders

F, B = 1.0, 2.0     # backward = 2x forward; ZB splits it into B = W = 1


def _dur(v):
    def d(s, a):
        return {"F": F, "B": B, "Bi": B / 2, "W": B / 2}[a.phase] / v
    return d


def _bubble(name, p, m, v=1):
    orders = stage_orders(name, p, m, v)
    t = ideal_times(orders, _dur(v), v)
    step = max(e for _, e in t.values())
    return step, step - m * (F + B)


GRID = [(2, 2), (2, 5), (4, 4), (4, 8), (4, 16), (8, 8), (8, 24), (3, 7)]


@pytest.mark.parametrize("p, m", GRID)
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_bubble_fraction_closed_form(name, p, m):
    step, bubble = _bubble(name, p, m)
    assert bubble / step == pytest.approx((p - 1) / (m + p - 1), rel=1e-12)


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 16), (8, 16), (4, 4)])
@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_bubble_is_one_vth(p, m, v):
    assert _bubble("interleaved", p, m, v)[1] == pytest.approx(_bubble("1f1b", p, m)[1] / v, rel=1e-12)


@pytest.mark.parametrize("p, m", GRID)
def test_zb_h1_bubble_is_a_third(p, m):
    # with T_F = T_B = T_W, ZB-H1's bubble (p-1)(T_F + T_B - T_W) is 1/3 of 1F1B's (p-1)(T_F + T_B + T_W)
    assert _bubble("zb", p, m)[1] == pytest.approx(_bubble("1f1b", p, m)[1] / 3, rel=1e-12)


@pytest.mark.parametrize("p, m", GRID)
def test_in_flight_microbatches(p, m):
    assert [peak_in_flight(o) for o in stage_orders("gpipe", p, m)] == [m] * p
    assert [peak_in_flight(o) for o in stage_orders("1f1b", p, m)] == [min(p - s, m) for s in range(p)]
    # ZB-H1 keeps 1F1B's peak on stage 0 even though W passes are deferred
    assert peak_in_flight(stage_orders("zb", p, m)[0], None, 0.5) == min(p, m)
    if m % p == 0 and m > p:
        for v in (2, 4):
            # Megatron: stage 0 holds p·(1 + (p-1)/(p·v)) micro-batches' worth of a stage's activations
            got = peak_in_flight(stage_orders("interleaved", p, m, v)[0]) / v
            assert got == pytest.approx(p * (1 + (p - 1) / (p * v)))


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_every_action_exactly_once(name):
    p, m = 4, 8
    v = 2 if name == "interleaved" else 1
    for s, order in enumerate(stage_orders(name, p, m, v)):
        fs = sorted((a.mb, a.chunk) for a in order if a.phase == "F")
        assert fs == sorted((i, c) for i in range(m) for c in range(v))
        bs = [a for a in order if a.phase in ("B", "Bi")]
        assert len(bs) == m * v
        ws = [a for a in order if a.phase == "W"]
        assert len(ws) == (m if name == "zb" else 0)
