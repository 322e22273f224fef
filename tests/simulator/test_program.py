"""The program contract: Op.copy and the static checks of validate on programs that share op objects."""
import math

import pytest

from simulator.errors import ProgramError
from simulator.kernels import Kernel, KernelList
from simulator.program import Op, Programs, collective, compute, recv, send, validate


def test_copy_keeps_every_field_but_the_changed_ones():
    kl = KernelList("layer", (Kernel("gemm", "gemm", flops=1.0, bytes=2.0),), "megatron", "bf16")
    op = Op("collective", "ar", "dp_comm", (0, 1), flops=1.0, mem_bytes=2.0, size_bytes=3.0, collective="all_reduce",
            group=4, peer=5, duration_s=6.0, alloc=(("buffers", 7.0),), free=(("buffers", 8.0),), layer=9,
            microbatch=10, phase="forward", strategy="dp", kernels=kl)
    same = op.copy()
    assert same is not op
    assert all(getattr(same, f) == getattr(op, f) for f in Op.__slots__)
    moved = op.copy(group=11, peer=12, name="ar2")
    assert (moved.group, moved.peer, moved.name) == (11, 12, "ar2")
    assert moved.kernels is kl
    assert all(getattr(moved, f) == getattr(op, f) for f in Op.__slots__ if f not in ("group", "peer", "name"))
    assert op.group == 4 and op.peer == 5          # the original is untouched
    regrouped = op.regrouped(13, 14)                 # copy(group=, peer=) without keyword handling
    assert regrouped is not op and (regrouped.group, regrouped.peer) == (13, 14)
    assert all(getattr(regrouped, f) == getattr(op, f) for f in Op.__slots__ if f not in ("group", "peer"))


def _shared_programs(n: int = 4) -> Programs:
    """n ranks sharing their compute ops (one template), each with its own collective on one group."""
    p = Programs(world_size=n, ops={})
    g = p.add_group(range(n), "dp")
    shared = [compute("c0", 1e9), compute("c1", 1e9, deps=(0,))]
    for r in range(n):
        p.ops[r] = shared + [collective("ar", "all_reduce", g, 1e6, deps=(1,))]
    return p


def test_shared_ops_validate():
    validate(_shared_programs())


def test_a_bad_op_is_found_where_another_rank_shares_the_rest():
    p = _shared_programs()
    bad = compute("c1", math.inf, deps=(0,))        # rank 2 alone holds it, at the index of a shared op
    p.ops[2] = [p.ops[2][0], bad, p.ops[2][2]]
    with pytest.raises(ProgramError, match="rank 2 op 1 .* cost inputs"):
        validate(p)


def test_messages_name_op_indices():
    p = Programs(world_size=2, ops={})
    g = p.add_group([0, 1], "dp")
    p.ops[0] = [compute("c", 1.0), collective("ar", "all_reduce", g, 1e6, deps=(0,))]
    p.ops[1] = [compute("c", 1.0), compute("d", 1.0), collective("ar", "all_reduce", g, 2e6)]
    with pytest.raises(ProgramError, match=r"rank 0 op 1 .* vs rank 1 op 2"):
        validate(p)
    p.ops[1][2] = collective("ar", "all_reduce", g, 1e6)
    p.ops[0].append(collective("ar2", "all_gather", g, 1e6))
    with pytest.raises(ProgramError, match=r"rank 1 misses collective #1 \(rank 0 op 2"):
        validate(p)


def test_p2p_messages_name_op_indices():
    p = Programs(world_size=2, ops={0: [compute("c", 1.0), send("tx", 1, 1e6, deps=(0,))],
                                    1: [compute("c", 1.0), compute("d", 1.0), recv("rx", 0, 2e6)]})
    with pytest.raises(ProgramError, match=r"rank 0 op 1 .* recv #0 \(rank 1 op 2"):
        validate(p)
    p.ops[0] = [compute("c", 1.0)]
    with pytest.raises(ProgramError, match=r"rank 1 op 2 .* waits for a message from rank 0"):
        validate(p)


def test_no_gc_pauses_and_restores_the_collector():
    import gc

    from simulator.program import no_gc
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with no_gc():
            assert not gc.isenabled()
            raise RuntimeError
    assert gc.isenabled()
    gc.disable()
    try:
        with no_gc():
            pass
        assert not gc.isenabled()           # a caller's choice stays
    finally:
        gc.enable()
