"""Fault injection: stragglers and jitter against closed forms, seeded draws, failing devices, link faults."""
import math

import numpy as np
import pytest

from simulator.costs import IdealCostModel, SimpleCostModel
from simulator.engine import run
from simulator.errors import ConfigError, DeviceFailureError, TopologyError
from simulator.program import Programs, collective, compute
from clustersim.faults import parse_fault_options
from topologies.faults import (FaultSpec, FaultyCostModel, apply_faults, breaks_symmetry, faulted_cluster,
                               faults_from_dict, normal_draws, uniform_draws)
from tests.simulator.toy import toy_dp_pipeline, toy_gpipe


def dp_step(n: int, size: float = 2e9) -> Programs:
    """n data-parallel ranks: 1 s forward+backward (1e12 FLOPs), all-reduce, 0.1 s optimizer."""
    progs = Programs(world_size=n, ops={})
    g = progs.add_group(range(n), "dp")
    for r in range(n):
        progs.ops[r] = [compute("fb", 1e12), collective("ar", "all_reduce", g, size, deps=(0,)),
                        compute("opt", 1e11, deps=(1,))]
    return progs


# ---------------------------------------------------------------------------------------------- stragglers
def test_straggler_on_a_dp_rank_delays_everyone_by_its_extra_compute():
    n, k = 8, 1.2
    cm = SimpleCostModel(flops_per_s=1e12, link_bytes_per_s=1e10)
    base = run(dp_step(n), cm).step_time_s
    cost, failures = apply_faults(cm, None, FaultSpec(stragglers={5: k}), n)
    assert failures == {}
    res = run(dp_step(n), cost)
    ar = 2 * (n - 1) / n * 2e9 / 1e10
    # everyone waits for rank 5 at the all-reduce: 1.2 s + all-reduce + rank's own optimizer
    assert base == pytest.approx(1.0 + ar + 0.1)
    assert res.step_time_s == pytest.approx(k * 1.0 + ar + k * 0.1)
    assert res.end_s[0][2] == pytest.approx(k + ar + 0.1)        # a healthy rank waited, then ran its optimizer
    assert res.start_s[0][1] == pytest.approx(k)


@pytest.mark.parametrize("p,m,stage,k", [(4, 8, 0, 1.5), (4, 8, 2, 1.2), (3, 5, 2, 2.0), (8, 8, 7, 1.2)])
def test_straggler_stage_in_gpipe_matches_flow_shop_closed_form(p, m, stage, k):
    # identical micro-batches through a flow shop: makespan = sum of one pass + (m-1) x bottleneck stage,
    # forwards (1 s per stage) then backwards (2 s per stage); the slow stage takes k times longer.
    cost, _ = apply_faults(IdealCostModel(flops_per_s=1e12), None, FaultSpec(stragglers={stage: k}), p)
    res = run(toy_gpipe(p, m), cost)
    expected = 3.0 * (p - 1 + k) + 3.0 * (m - 1) * k
    assert res.step_time_s == pytest.approx(expected, rel=1e-12)


def test_straggler_distribution_is_a_pure_function_of_seed_and_rank():
    spec = FaultSpec(straggler_distribution=("lognormal", 0.05), seed=7)
    small, big = spec.compute_factors(64), spec.compute_factors(4096)
    assert all(big[r] == small[r] for r in small)                  # independent of the world size
    assert spec.compute_factors(64) == small                       # reproducible
    assert FaultSpec(straggler_distribution=("lognormal", 0.05), seed=8).compute_factors(64) != small
    logs = np.log([big[r] for r in range(4096)])
    assert abs(logs.mean()) < 4 * 0.05 / math.sqrt(4096) and logs.std() == pytest.approx(0.05, rel=0.05)
    frac = FaultSpec(straggler_distribution=("fraction", 0.1, 1.3), stragglers={3: 2.0}, seed=1)
    f = frac.compute_factors(20000)
    assert f[3] == 2.0                                             # explicit stragglers win
    assert set(f.values()) <= {1.3, 2.0}
    assert len(f) == pytest.approx(2000, abs=4 * math.sqrt(20000 * 0.1 * 0.9))


def test_drawing_for_absurd_world_sizes_is_refused():
    from simulator.errors import ResourceLimitError
    with pytest.raises(ResourceLimitError, match="list the stragglers explicitly"):
        FaultSpec(straggler_distribution=("lognormal", 0.1)).compute_factors(10**9)


def test_counter_based_draws_are_uniform_and_normal():
    u = uniform_draws(3, 9, 5, np.arange(200_000))
    assert 0 < u.min() and u.max() < 1
    assert np.histogram(u, bins=10, range=(0, 1))[0] == pytest.approx([20000] * 10, abs=600)
    z = normal_draws(3, 9, np.arange(100_000), 0)
    assert abs(z.mean()) < 0.015 and z.std() == pytest.approx(1.0, abs=0.015)
    assert np.mean(np.abs(z) < 1.96) == pytest.approx(0.95, abs=0.005)


# ---------------------------------------------------------------------------------------------- jitter
def test_jitter_is_seeded_mean_one_with_the_requested_cv():
    n_ops = 4000
    progs = Programs(world_size=1, ops={0: [compute(f"c{i}", 1e9) for i in range(n_ops)]})

    def durations(seed, bind=True):
        cost = FaultyCostModel(IdealCostModel(flops_per_s=1e12), jitter=0.1, seed=seed)
        if bind:
            cost.bind(progs)
        res = run(progs, cost)
        return np.array(res.end_s[0]) - np.array(res.start_s[0])

    a, b, c = durations(1), durations(1), durations(2)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    f = a / 1e-3
    assert f.mean() == pytest.approx(1.0, abs=4 * 0.1 / math.sqrt(n_ops))
    assert f.std() / f.mean() == pytest.approx(0.1, rel=0.1)
    unbound = durations(1, bind=False)        # keyed by the op's identity instead of its index
    assert np.array_equal(unbound, durations(1, bind=False)) and not np.array_equal(unbound, a)
    assert unbound.std() / unbound.mean() == pytest.approx(0.1, rel=0.1)
    # one model object run twice gives the same answer (no hidden call counter)
    cost = FaultyCostModel(IdealCostModel(flops_per_s=1e12), jitter=0.1, seed=1)
    assert run(progs, cost).end_s == run(progs, cost).end_s


def test_jitter_is_keyed_by_rank_and_op_index():
    progs = dp_step(4)
    cost, _ = apply_faults(IdealCostModel(flops_per_s=1e12), None, FaultSpec(jitter=0.05, seed=3), 4,
                           programs=progs)
    res = run(progs, cost)
    for r in range(4):
        fb = res.end_s[r][0] - res.start_s[r][0]
        assert fb == pytest.approx(1.0 * cost.jitter_factor(r, 0), rel=1e-12)
    assert len({round(res.end_s[r][0], 12) for r in range(4)}) == 4
    # the all-reduce starts when the slowest rank arrives
    assert res.start_s[0][1] == pytest.approx(max(res.end_s[r][0] for r in range(4)))


# ---------------------------------------------------------------------------------------------- device failure
def test_device_failure_reports_the_ranks_blocked_in_the_collective():
    progs = dp_step(4)
    cost, failures = apply_faults(SimpleCostModel(flops_per_s=1e12), None, FaultSpec(device_failures={2: 0.5}), 4)
    assert failures == {2: 0.5}
    with pytest.raises(DeviceFailureError) as e:
        run(progs, cost, failures=failures)
    msg = str(e.value)
    assert "rank(s) [2] failed" in msg and "all_reduce" in msg
    hung = {b["rank"] for b in e.value.blocked if b["state"] == "collective"}
    assert hung == {0, 1, 3}
    assert all(b["waits_for"] == [2] for b in e.value.blocked if b["state"] == "collective")


def test_device_failure_after_the_step_is_harmless():
    progs = dp_step(2)
    res = run(progs, SimpleCostModel(flops_per_s=1e12), failures={1: 100.0})
    assert res.step_time_s < 100


# ---------------------------------------------------------------------------------------------- parsing
def test_cli_strings_and_yaml_give_the_same_spec():
    cli = parse_fault_options(stragglers=["5:1.2", "7:1.5"], straggler_dist="fraction:0.01:1.3", jitter="0.02",
                              fail_links=["leaf.0:spine.0.1"], degrade_links=["leaf.1:spine.0.0:0.5"],
                              fail_devices=["17@0.25"], seed="4")
    yml = faults_from_dict({"stragglers": {5: 1.2, 7: 1.5}, "straggler-distribution": ["fraction", 0.01, 1.3],
                            "jitter": 0.02, "link_failures": [["leaf.0", "spine.0.1"]],
                            "link_degradation": {"leaf.1:spine.0.0": 0.5}, "device_failures": {17: 0.25},
                            "seed": 4})
    assert cli == yml
    assert faults_from_dict(cli.to_dict()) == cli
    assert cli.link_failures == ((("leaf", 0), ("spine", 0, 1)),)


@pytest.mark.parametrize("kwargs,match", [
    (dict(stragglers=["5"]), "RANK:FACTOR"),
    (dict(stragglers=["x:1.2"]), "rank must be an integer"),
    # named by the option given (they said faults.stragglers[5], the YAML field)
    (dict(stragglers=["5:0"]), r"^--straggler\[5\]"),
    (dict(stragglers=["5:nan"]), r"^--straggler\[5\]"),
    (dict(stragglers=["5:1.1", "5:1.2"]), "given twice"),
    (dict(straggler_dist="gamma:2"), "unknown distribution"),
    (dict(straggler_dist="fraction:1.5:2"), "p"),
    (dict(straggler_dist="lognormal"), "one parameter"),
    (dict(jitter="-0.1"), "jitter"),
    (dict(jitter="inf"), "jitter"),
    (dict(fail_links=["leaf.0"]), "NODE_A:NODE_B"),
    (dict(fail_links=["leaf.0:leaf.0"]), "itself"),
    (dict(degrade_links=["a.0:b.0:1.5"]), r"^--degrade-link"),
    (dict(degrade_links=["a.0:b.0"]), "FACTOR"),
    # one link named twice: one of the two had silently won (the last --degrade-link, or the failure)
    (dict(degrade_links=["0:leaf.0:0.1", "0:leaf.0:0.5"]), r"link 0:leaf.0 is given twice \(factors 0.1 and 0.5\)"),
    (dict(degrade_links=["0:leaf.0:0.1", "leaf.0:0:0.5"]), "named twice in --degrade-link"),
    (dict(fail_links=["0:leaf.0", "0:leaf.0"]), "named twice in --fail-link"),
    (dict(fail_links=["0:leaf.0"], degrade_links=["leaf.0:0:0.5"]), "in both --fail-link and --degrade-link"),
    (dict(fail_devices=["3"]), "RANK@TIME_S"),
    (dict(fail_devices=["3@-1"]), r"^--fail-device\[3\]"),
    (dict(seed="abc"), "--seed"),
])
def test_bad_cli_fault_options_are_config_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        parse_fault_options(**kwargs)


@pytest.mark.parametrize("d,match", [
    ([1, 2], "mapping"), ({"stragglers": [5]}, "stragglers"), ({"bogus": 1}, "unknown key"),
    ({"seed": 1.5}, "seed"), ({"seed": True}, "seed"), ({"device_failures": {"a": 1}}, "rank"),
    ({"link_failures": "leaf.0:spine.0.0"}, "list"), ({"stragglers": {-1: 1.2}}, "rank"),
    ({"straggler_distribution": 5}, "straggler_distribution"), ({"jitter": "lots"}, "jitter"),
])
def test_bad_yaml_faults_are_config_errors(d, match):
    with pytest.raises(ConfigError, match=match):
        faults_from_dict(d)


def test_ranks_outside_the_world_are_rejected():
    with pytest.raises(ConfigError, match=r"stragglers \(--straggler\): rank\(s\) \[9\] do not exist"):
        apply_faults(SimpleCostModel(), None, FaultSpec(stragglers={9: 1.2}), 8)
    with pytest.raises(ConfigError, match="device_failures"):
        apply_faults(SimpleCostModel(), None, FaultSpec(device_failures={8: 1.0}), 8)


def test_breaks_symmetry():
    assert not breaks_symmetry(FaultSpec())
    assert not breaks_symmetry(FaultSpec(seed=3))
    # stragglers and failure times are per-rank device keys: class refinement handles them
    # (tests/simulator/test_symmetry.py; failure reports below)
    for spec in (FaultSpec(stragglers={1: 1.1}), FaultSpec(straggler_distribution=("lognormal", 0.02)),
                 FaultSpec(straggler_distribution=("fraction", 0.1, 1.3)), FaultSpec(device_failures={0: 1.0})):
        assert not breaks_symmetry(spec)
    for spec in (FaultSpec(jitter=0.01), FaultSpec(link_failures=(("a", "b"),)),
                 FaultSpec(link_degradation={("a", "b"): 0.5}), FaultSpec(stragglers={1: 1.1}, jitter=0.01)):
        assert breaks_symmetry(spec)


def test_symmetric_programs_see_straggler_as_different_hardware():
    from simulator.symmetry import symmetry_problem
    progs = toy_dp_pipeline(2, 4, 2, symmetric=True)
    cost, _ = apply_faults(SimpleCostModel(), None, FaultSpec(stragglers={5: 1.2}), 8)
    assert symmetry_problem(progs, SimpleCostModel()) is None
    assert "rank 5" in symmetry_problem(progs, cost)


# ---------------------------------------------------------------------------------------------- link faults
@pytest.fixture(scope="module")
def cluster():
    topologies = pytest.importorskip("topologies")
    return topologies.load_cluster("dgx-h100", 1024)


def test_failed_spine_link_shrinks_the_leaf_trunk_by_one_uplink(cluster):
    fc = faulted_cluster(cluster, parse_fault_options(fail_links=["leaf.0:spine.0.3"]))
    up, down = cluster.link_id[("up", 0)], cluster.link_id[("down", 0)]
    bw = cluster.fat_tree.bandwidth
    n_up = cluster.fat_tree.uplinks
    assert fc.link_capacity[up] == pytest.approx((n_up - 1) * bw)
    assert fc.link_capacity[down] == pytest.approx((n_up - 1) * bw)
    assert cluster.link_capacity[up] == pytest.approx(n_up * bw)          # the original is untouched
    assert not fc.graph.has_edge(("leaf", 0), ("spine", 0, 3)) and cluster.graph.has_edge(("leaf", 0), ("spine", 0, 3))
    assert fc.route_ranks(0, 1000) == cluster.route_ranks(0, 1000)        # ECMP: same trunk, less capacity
    assert fc.bottleneck_bytes_per_s(0, 1000) == pytest.approx(bw)


def test_degraded_link_scales_bandwidth(cluster):
    fc = faulted_cluster(cluster, parse_fault_options(degrade_links=["0:leaf.0:0.25", "leaf.1:spine.0.0:0.5"]))
    bw = cluster.fat_tree.bandwidth
    assert fc.link_capacity[cluster.link_id[(0, ("leaf", 0))]] == pytest.approx(0.25 * bw)
    assert fc.link_capacity[cluster.link_id[(("leaf", 0), 0)]] == pytest.approx(0.25 * bw)
    assert fc.bottleneck_bytes_per_s(0, 1000) == pytest.approx(0.25 * bw)
    assert fc.link_capacity[cluster.link_id[("up", 1)]] == pytest.approx((cluster.fat_tree.uplinks - 0.5) * bw)


def test_a_degradation_below_any_link_bandwidth_is_refused(cluster):
    """A factor of 1e-300 had left 5e-290 B/s: a step of 1e296 s printed in full, 0 tokens/s."""
    with pytest.raises(ConfigError, match=r"link 0:leaf.0 degraded by 1e-300 keeps 5e-290 B/s, below the 1e\+06 B/s"):
        faulted_cluster(cluster, parse_fault_options(degrade_links=["0:leaf.0:1e-300"]))


def test_failed_nic_link_reroutes_through_a_peer_gpu(cluster):
    fc = faulted_cluster(cluster, parse_fault_options(fail_links=["0:leaf.0"]))
    route = [fc.link_name[i] for i in fc.route_ranks(0, 1000)]
    assert (0, ("leaf", 0)) not in route
    assert route[0] == (0, ("nvswitch", 0))                     # over NVLink to a peer's NIC (NCCL PXN)
    assert route[-1] == (("leaf", 3), 1000)
    assert all(fc.link_capacity[i] > 0 for i in fc.route_ranks(0, 1000))
    assert fc.route_ranks(0, 1) == cluster.route_ranks(0, 1)      # NVLink routes do not change


def test_cut_graph_is_a_topology_error_naming_the_cut(cluster):
    with pytest.raises(TopologyError, match=r"cut the network.*0:leaf.0.*GPU\(s\) \[0\]"):
        faulted_cluster(cluster, parse_fault_options(fail_links=["0:leaf.0", "0:nvswitch.0"]))


def test_unknown_link_or_node_is_a_topology_error(cluster):
    with pytest.raises(TopologyError, match="no link 0:leaf.7.*links to"):
        faulted_cluster(cluster, parse_fault_options(fail_links=["0:leaf.7"]))
    with pytest.raises(TopologyError, match="no node 'spine.9.9'"):
        faulted_cluster(cluster, parse_fault_options(fail_links=["spine.9.9:leaf.0"]))


def test_link_faults_need_a_cluster():
    with pytest.raises(ConfigError, match="cluster"):
        apply_faults(SimpleCostModel(), None, parse_fault_options(fail_links=["a.0:b.0"]), 8)


def test_link_faults_rebuild_the_cost_model_on_the_faulted_cluster():
    topologies = pytest.importorskip("topologies")
    from simulator.costs import CommRequest
    from topologies.cost import ClusterCostModel
    small = topologies.load_cluster("dgx-h100", 16)
    cm = ClusterCostModel(small, network="flow", comm_model="links")     # closed forms of the route model
    size = 1e9
    req = CommRequest("p2p", (0, 8), size)
    base = cm.comm_time_s(req)
    deg, _ = apply_faults(cm, small, parse_fault_options(degrade_links=["0:leaf.0:0.5"]), 16)
    assert isinstance(deg, ClusterCostModel) and deg.network_mode == "flow" and deg.cluster is not small
    # halving the NIC link's bandwidth adds exactly one more NIC-transfer time: S / (efficiency x 50 GB/s)
    nic = small.fat_tree.bandwidth * cm.efficiency["ib"]
    assert deg.comm_time_s(req) - base == pytest.approx(size / nic, rel=1e-9)
    failed, _ = apply_faults(cm, small, parse_fault_options(fail_links=["0:leaf.0"]), 16)
    t = failed.comm_time_s(req)
    assert math.isfinite(t) and t > base          # re-routed over NVLink and a peer's NIC: more hops
    assert failed.comm_time_s(CommRequest("p2p", (1, 9), size)) == pytest.approx(cm.comm_time_s(
        CommRequest("p2p", (1, 9), size)))
    # stragglers and link faults compose
    both, _ = apply_faults(cm, small, parse_fault_options(stragglers=["3:1.5"], fail_links=["0:leaf.0"]), 16)
    assert both.comm_time_s(req) == pytest.approx(t)
    assert both.network_mode == "flow" and both.contention_aware


def test_click_fault_options_merge_over_yaml():
    import click
    from click.testing import CliRunner
    from clustersim.faults import fault_options, faults_from_options

    seen = {}

    @click.command()
    @fault_options
    def cmd(**options):
        seen.update(faults_from_options({"stragglers": {1: 1.1}, "jitter": 0.01, "seed": 3}, **options))

    r = CliRunner().invoke(cmd, ["--straggler", "5:1.2", "--straggler", "1:1.3", "--fail-link", "leaf.0:spine.0.1",
                                 "--fail-device", "7@0.5", "--jitter", "0.02"])
    assert r.exit_code == 0, r.output
    assert seen == {"stragglers": {1: 1.3, 5: 1.2}, "jitter": 0.02, "link_failures": ["leaf.0:spine.0.1"],
                    "device_failures": {7: 0.5}, "seed": 3}
    seen.clear()
    r = CliRunner().invoke(cmd, [])
    assert seen == {"stragglers": {1: 1.1}, "jitter": 0.01, "seed": 3}
    r = CliRunner().invoke(cmd, ["--straggler", "x"])
    assert isinstance(r.exception, ConfigError) and "RANK:FACTOR" in str(r.exception)


# ---------------------------------------------------------------------------------------------- end to end
def _experiment(faults, network="flow", **kw):
    pytest.importorskip("schedules")
    from clustersim.experiment import experiment_from_dict, run_experiment
    d = {"cluster": "dgx-h100", "gpus": 16, "model": "llama3-8b", "tp": 8, "dp": 2, "global_batch": 4,
         "network": network, "faults": faults, **kw}
    return run_experiment(experiment_from_dict(d))


def test_simulate_with_link_faults_end_to_end():
    base = _experiment({}).metrics.step_time_s
    degraded = _experiment({"link_degradation": {"0:leaf.0": 0.1}}).metrics.step_time_s
    rerouted = _experiment({"link_failures": ["0:leaf.0"]}).metrics.step_time_s
    assert degraded > base and rerouted > base
    with pytest.raises(TopologyError, match="cut the network"):
        _experiment({"link_failures": ["0:leaf.0", "0:nvswitch.0"]})


def test_a_link_fault_that_changes_nothing_leaves_the_step_unchanged():
    """Regression: the cost model rebuilt on the faulted cluster priced compute with the flat what-if roofline
    (and without the slowest-GPU factor) instead of the kernel model, so a failed link made a step faster."""
    from topologies import load_cluster
    from topologies.cost import ClusterCostModel
    base = _experiment({}).metrics.step_time_s
    same = _experiment({"link_degradation": {"leaf.0:spine.0.0": 1.0}}).metrics.step_time_s
    spare = _experiment({"link_failures": ["leaf.0:spine.0.0"]}).metrics.step_time_s   # 1 of 32 idle uplinks
    assert same == base and spare == pytest.approx(base, rel=1e-12)
    cost = ClusterCostModel(load_cluster("dgx-h100", 16), network="flow")
    again = cost.with_cluster(cost.cluster)
    assert again.kernels is not None and again.slowest_gpu_factor == cost.slowest_gpu_factor
    flat = ClusterCostModel(load_cluster("dgx-h100", 16), compute_efficiency=0.5).with_cluster(cost.cluster)
    assert flat.kernels is None and flat.compute_efficiency == 0.5


def test_simulate_with_a_failing_device_reports_the_hung_collective():
    with pytest.raises(DeviceFailureError, match=r"rank\(s\) \[3\] failed.*hang") as e:
        _experiment({"device_failures": {3: 0.01}}, network="analytical")
    waits = {b["rank"]: b["waits_for"] for b in e.value.blocked if b["state"] == "collective"}
    # its TP peers wait for it in a TP all-reduce; the other replica waits in the DP gradient all-reduce
    # for its DP peers (rank r + 8 for rank r), which are themselves stuck behind rank 3
    assert {r: waits[r] for r in (0, 1, 2, 4, 5, 6, 7)} == {r: [3] for r in (0, 1, 2, 4, 5, 6, 7)}
    assert {r: waits[r] for r in range(8, 16)} == {r: [r - 8] for r in range(8, 16)}
    assert "tp all_reduce" in str(e.value) and "dp grad all_reduce" in str(e.value)


def test_simulate_straggler_class_mode_matches_full_mode():
    sym = _experiment({}, network="analytical").metrics
    nothing = _experiment({"stragglers": {3: 1.0}}, network="analytical").metrics      # factor 1: no effect
    assert nothing.mode == "symmetric" and nothing.step_time_s == pytest.approx(sym.step_time_s, rel=1e-12)
    for network in ("analytical", "flow"):
        slow = _experiment({"stragglers": {3: 1.5}}, network=network)
        full = _experiment({"stragglers": {3: 1.5}}, network=network, mode="full")
        assert slow.metrics.mode == "symmetric" and full.metrics.mode == "full"
        assert slow.metrics.step_time_s > sym.step_time_s
        assert slow.metrics.step_time_s == pytest.approx(full.metrics.step_time_s, rel=1e-9)
        assert any("rank 3 is a straggler (compute x1.5" in n for n in slow.notes)
        assert any("share one rate" in n for n in slow.notes) == (network == "flow")


def test_faults_that_need_full_mode_refuse_symmetric_mode():
    for faults in ({"jitter": 0.02}, {"link_degradation": {"0:leaf.0": 0.5}}):
        with pytest.raises(ConfigError, match="use --mode full"):
            _experiment(faults, network="analytical", mode="symmetric")
    assert _experiment({"stragglers": {3: 1.2}}, network="analytical", mode="symmetric").metrics.mode == "symmetric"
    late = _experiment({"device_failures": {3: 100.0}}, network="analytical", mode="symmetric")   # after the step
    assert late.metrics.mode == "symmetric"
    assert any("faults make ranks differ" in n and "rank 3's device fails at t=100s" in n for n in late.notes)
    assert late.metrics.step_time_s == _experiment({}, network="analytical").metrics.step_time_s


def _failure_report(faults, **kw):
    with pytest.raises(DeviceFailureError) as e:
        _experiment(faults, **kw)
    return str(e.value), e.value.blocked


@pytest.mark.parametrize("faults, kw", [
    ({3: 0.01}, {"network": "analytical"}),
    ({3: 0.1, 40: 0.2}, {"network": "flow", "gpus": 64, "pp": 2, "dp": 4, "global_batch": 16}),
    ({3: 0.1, 11: 0.1}, {"network": "flow", "gpus": 64, "pp": 2, "dp": 4, "global_batch": 16}),
    ({60: 0.05}, {"network": "analytical", "gpus": 64, "pp": 4, "dp": 2, "global_batch": 16, "zero": 1,
                  "schedule": "interleaved", "virtual_stages": 2}),
])
def test_a_device_failure_in_class_mode_reports_what_full_mode_reports(faults, kw):
    """The failing rank gets a class of its own (its failure time is in its device key); the watchdog view is
    fanned out member by member (own groups, peers and op copies), so it equals the full run's word for word."""
    cls = _failure_report({"device_failures": faults}, **kw)
    full = _failure_report({"device_failures": faults}, mode="full", **kw)
    assert cls[0] == full[0]
    assert cls[1] == full[1]


def test_a_class_that_does_not_fail_together_is_an_error():
    """Engine level: symmetric programs whose classes do not separate the failing rank are refused."""
    from simulator.errors import ClusterSimError
    progs = toy_dp_pipeline(2, 4, 2, symmetric=True)
    rep = next(r for r, m in progs.classes.items() if len(m) > 1)
    other = next(m for m in progs.classes[rep] if m != rep)
    with pytest.raises(ClusterSimError, match=f"rank {other} at t=0.5s, but rank"):
        run(progs, SimpleCostModel(), failures={other: 0.5})


def test_failed_spine_link_on_a_trunk_bound_pattern_matches_closed_form():
    # 256 GPUs on 4:1 tapered leaves (32 NICs, 8 uplinks each), every GPU sends 1 GB to the GPU 128 away
    # (another leaf): each leaf's 32 flows share its 8-uplink trunk, 32 x 1 GB / (8 x 50 GB/s x efficiency).
    # One failed uplink of leaf 0 leaves 7: that leaf's flows, hence the step, take 8/7 as long.
    topologies = pytest.importorskip("topologies")
    from simulator.program import recv, send
    from topologies.cost import ClusterCostModel
    n = 256
    c = topologies.load_cluster("dgx-h100", n, fabric={"tiers": 3, "leaf_down": 32, "oversubscription": 4,
                                                      "rail_optimised": False, "link": "ib"})
    cm = ClusterCostModel(c, network="flow")
    progs = Programs(world_size=n, ops={})
    for r in range(n):
        progs.ops[r] = [send("tx", (r + n // 2) % n, 1e9), recv("rx", (r + n // 2) % n, 1e9, stream="rx")]
    base = run(progs, cm).step_time_s
    trunk = 8 * c.fat_tree.bandwidth * cm.efficiency["ib"]
    assert base == pytest.approx(32 * 1e9 / trunk, rel=1e-3)
    failed, _ = apply_faults(cm, c, parse_fault_options(fail_links=["leaf.0:spine.0.0"]), n)
    assert run(progs, failed).step_time_s == pytest.approx(base * 8 / 7, rel=1e-9)


def test_a_link_the_command_line_names_replaces_the_files_either_way_round():
    """A file's degraded leaf.0:spine.0.0 and --degrade-link spine.0.0:leaf.0:0.3 had been refused as one link
    named twice (written the same way round, the command line won); a --fail-link of it had been refused too."""
    from clustersim.faults import faults_from_options
    yaml = {"link_degradation": {"leaf.0:spine.0.0": 0.5}}
    for opts, want in (({"degrade_link": ["spine.0.0:leaf.0:0.3"]}, ({"spine.0.0:leaf.0": 0.3}, None)),
                       ({"degrade_link": ["leaf.0:spine.0.0:0.3"]}, ({"leaf.0:spine.0.0": 0.3}, None)),
                       ({"fail_link": ["leaf.0:spine.0.0"]}, (None, ["leaf.0:spine.0.0"]))):
        d = faults_from_options(yaml, **opts)
        assert (d.get("link_degradation"), d.get("link_failures")) == want
    with pytest.raises(ConfigError, match="named twice in faults.link_degradation"):
        faults_from_dict({"link_degradation": {"leaf.0:spine.0.0": 0.5, "spine.0.0:leaf.0": 0.3}})
