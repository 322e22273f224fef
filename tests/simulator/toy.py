"""Hand-built programs whose answers are known (shared by the simulator tests)."""
from simulator.program import Programs, collective, compute, recv, send


def toy_gpipe(p: int, m: int, f_flops: float = 1e12, b_flops: float = 2e12, act_bytes: float = 1e6,
              symmetric_groups: bool = True) -> Programs:
    """p-stage GPipe: every stage runs m forwards then m backwards; activations/gradients by send/recv
    on their own streams. With free communication the bubble fraction is (p-1)/(m+p-1)."""
    progs = Programs(world_size=p, ops={})
    pp = progs.add_group(range(p), "pp")
    for s in range(p):
        ops = []
        fwd_idx = []
        for mb in range(m):
            deps = ()
            if s > 0:
                ops.append(recv(f"recv_act{mb}", s - 1, act_bytes, stream="pp_recv", group=pp, microbatch=mb))
                deps = (len(ops) - 1,)
            ops.append(compute(f"F{mb}", f_flops, deps=deps, phase="forward", microbatch=mb))
            fwd_idx.append(len(ops) - 1)
            if s < p - 1:
                ops.append(send(f"send_act{mb}", s + 1, act_bytes, stream="pp_send", deps=(len(ops) - 1,),
                                group=pp, microbatch=mb))
        for mb in range(m):
            deps = (fwd_idx[-1],)
            if s < p - 1:
                ops.append(recv(f"recv_grad{mb}", s + 1, act_bytes, stream="pp_recv", group=pp, microbatch=mb))
                deps = (len(ops) - 1, fwd_idx[-1])
            ops.append(compute(f"B{mb}", b_flops, deps=deps, phase="backward", microbatch=mb))
            if s > 0:
                ops.append(send(f"send_grad{mb}", s - 1, act_bytes, stream="pp_send", deps=(len(ops) - 1,),
                                group=pp, microbatch=mb))
        progs.ops[s] = ops
    return progs


def toy_dp_pipeline(p: int, d: int, m: int, grad_bytes: float = 4e8, symmetric: bool = False,
                    f_flops: float = 1e12, act_bytes: float = 1e6) -> Programs:
    """p stages x d data-parallel replicas (rank = stage*d + replica): GPipe per replica, then an
    all-reduce of the gradients over each stage's DP group on a separate stream. ``symmetric`` emits
    only replica 0 of every stage and sets the classes."""
    world = p * d
    progs = Programs(world_size=world, ops={})
    pp_groups = [progs.add_group([s * d + j for s in range(p)], "pp") for j in range(d)]
    dp_groups = [progs.add_group([s * d + j for j in range(d)], "dp") for s in range(p)]
    base = toy_gpipe(p, m, f_flops=f_flops, act_bytes=act_bytes)
    replicas = [0] if symmetric else range(d)
    for s in range(p):
        for j in replicas:
            rank = s * d + j
            ops = []
            for op in base.ops[s]:
                kw = dict(stream=op.stream, deps=op.deps, microbatch=op.microbatch, phase=op.phase)
                if op.kind == "compute":
                    ops.append(compute(op.name, op.flops, **kw))
                elif op.kind == "send":
                    ops.append(send(op.name, op.peer * d + j, op.size_bytes, group=pp_groups[j], **kw))
                else:
                    ops.append(recv(op.name, op.peer * d + j, op.size_bytes, group=pp_groups[j], **kw))
            ops.append(collective("grad_allreduce", "all_reduce", dp_groups[s], grad_bytes, stream="dp_comm",
                                  deps=(len(ops) - 1,), phase="backward", strategy="dp"))
            ops.append(compute("optimizer", 1e10, deps=(len(ops) - 1,), phase="optimizer"))
            progs.ops[rank] = ops
    if symmetric:
        progs.classes = {s * d: tuple(s * d + j for j in range(d)) for s in range(p)}
    progs.tokens_per_step = 1000.0 * m * d
    progs.model_flops_per_step = 3 * f_flops * m * p * d
    return progs
