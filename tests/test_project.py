"""Codeless projection: metadata format and loader, problem definition, synth, fidelity, CLI."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from kfuse.errors import KfuseError, MetadataError
from kfuse.project import load_app, parse_app, project_app, schema
from kfuse.project.metadata import dump_app, schema_path
from kfuse.project.problem import AppProblem, classify_arrays, order_graph
from kfuse.project.synth import SynthSpec, synthesize

ROOT = Path(__file__).resolve().parents[1]
RK_STEP = ROOT / "examples" / "rk-step.yaml"


def small_app(**changes) -> dict:
    """A five-kernel application as a mapping (tests edit it to break it)."""
    data = {
        "name": "small",
        "device": "k20x",
        "launch": {"threads_per_block": 128, "blocks": 64},
        "arrays": [{"name": n, "elements": 1 << 20} for n in ("u", "v", "w", "q", "r")],
        "kernels": [
            {"name": "a", "runtime_us": 100, "flops": 2e6,
             "accesses": [{"array": "u", "access": "read"}, {"array": "v", "access": "write"}]},
            {"name": "b", "runtime_us": 100, "flops": 2e6,
             "accesses": [{"array": "v", "access": "read", "radius": 1},
                          {"array": "w", "access": "write"}]},
            {"name": "c", "runtime_us": 100, "flops": 2e6,
             "accesses": [{"array": "u", "access": "read"}, {"array": "q", "access": "write"}]},
            {"name": "d", "runtime_us": 100, "flops": 2e6,
             "accesses": [{"array": "w", "access": "read"}, {"array": "q", "access": "read"},
                          {"array": "r", "access": "write"}]},
            {"name": "e", "runtime_us": 100, "flops": 2e6,
             "accesses": [{"array": "r", "access": "readwrite"}]},
        ],
    }
    data.update(changes)
    return data


def broken(mutate) -> str:
    """The loader's message for a copy of small_app() changed by ``mutate``."""
    data = copy.deepcopy(small_app())
    mutate(data)
    with pytest.raises(MetadataError) as info:
        parse_app(data, source="app.yaml")
    return str(info.value)


# ------------------------------------------------------------------------------------------------
# the format and its errors
# ------------------------------------------------------------------------------------------------

def test_schema_is_published_and_valid():
    jsonschema.Draft202012Validator.check_schema(schema())
    assert schema_path().exists() and schema_path().name == "schema.json"
    for path in sorted((ROOT / "examples").glob("*.yaml")) + \
            sorted((ROOT / "examples").glob("*.json")):
        data = yaml.safe_load(path.read_text()) if path.suffix == ".yaml" else \
            json.loads(path.read_text())
        # the file also passes the schema itself (1e6-style numbers are written 1.0e+6 there)
        jsonschema.validate(load_app(path).to_dict(), schema())
        assert data["name"]


def test_example_loads():
    app = load_app(RK_STEP)
    assert app.name == "rk-step" and len(app.kernels) == 8
    assert app.device.name == "Tesla K20X" and app.precision == "double"
    k8 = app.kernel_by_name["k8_qflx_dens"]
    assert k8.registers == 40 and k8.threads_per_block == 128 and k8.flops == 1.33e7
    assert k8.access("DENS").thread_load == 7  # radius 1 on a 3-D array: 7-point star


def test_missing_field():
    message = broken(lambda d: d["kernels"][1].pop("accesses"))
    assert "app.yaml" in message and "kernel 'b'" in message
    assert "missing required field 'accesses'" in message
    message = broken(lambda d: d["kernels"][2].pop("runtime_us"))
    assert "kernel 'c'" in message and "runtime_s, runtime_ms or runtime_us" in message
    message = broken(lambda d: d.pop("launch"))
    assert "missing field 'threads_per_block'" in message and "kernel 'a'" in message


def test_wrong_type():
    message = broken(lambda d: d["kernels"][0].update(runtime_us="fast"))
    assert "kernel 'a' (kernels[0]), field 'runtime_us': expected a number, got 'fast'" \
        in message
    message = broken(lambda d: d["kernels"][1]["accesses"][0].update(radius=1.5))
    assert "kernel 'b'" in message and "access to 'v'" in message and "radius" in message
    message = broken(lambda d: d["kernels"][1]["accesses"][0].update(access="modify"))
    assert "'modify' is not one of" in message and "field 'access'" in message
    message = broken(lambda d: d["kernels"][0].update(runtime_us=-3))
    assert "must be more than 0" in message


def test_unknown_array_and_kernel():
    message = broken(lambda d: d["kernels"][3]["accesses"][0].update(array="ww"))
    assert "kernel 'd'" in message and "unknown array 'ww'" in message
    assert "did you mean 'w'" in message
    message = broken(lambda d: d.update(copies=[{"array": "u", "after": "zz"}]))
    assert "copy #1" in message and "unknown kernel 'zz'" in message
    message = broken(lambda d: d["kernels"][0].update(after=["nope"]))
    assert "field 'after'" in message and "unknown kernel 'nope'" in message


def test_unknown_field_suggests():
    message = broken(lambda d: d["kernels"][0].update(runtim_us=3))
    assert "unknown field 'runtim_us' (did you mean 'runtime_us'?)" in message


def test_cyclic_dependencies():
    # 'a' must follow 'd' (stream order), but d reads what a's chain writes
    message = broken(lambda d: d["kernels"][0].update(after=["d"]))
    assert "cyclic dependencies" in message
    assert "a -> b" in message or "d -> a" in message
    assert "RAW" in message and "after" in message


def test_other_meaning_errors():
    message = broken(lambda d: d["kernels"].append(copy.deepcopy(d["kernels"][0])))
    assert "kernel 'a'" in message and "same name" in message
    message = broken(lambda d: d["kernels"][1]["accesses"].append(
        {"array": "v", "access": "write"}))
    assert "listed twice" in message
    message = broken(lambda d: d["kernels"][1]["accesses"][0].update(thread_load=5))
    assert "thread_load or radius, not both" in message
    message = broken(lambda d: d["arrays"].append({"name": "u#2"}))
    assert "without '#'" in message
    several = broken(lambda d: (d["kernels"][0].update(runtime_us="x"),
                                d["kernels"][1].update(flops="y")))
    assert "2 problems" in several and "kernel 'a'" in several and "kernel 'b'" in several


def test_file_errors(tmp_path):
    with pytest.raises(MetadataError, match="no such file"):
        load_app(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nkernels: [\n  - a: 1\n")
    with pytest.raises(MetadataError, match=r"bad\.yaml: not valid YAML \(line"):
        load_app(bad)
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"name": "x",}')
    with pytest.raises(MetadataError, match=r"not valid JSON \(line 1"):
        load_app(bad_json)
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(MetadataError, match="must hold a mapping"):
        load_app(listed)


def test_round_trip_yaml_and_json(tmp_path):
    app = load_app(RK_STEP)
    for suffix in (".yaml", ".json"):
        path = dump_app(app, tmp_path / f"rk{suffix}")
        again = load_app(path)
        assert again.to_dict() == app.to_dict()
        assert again.kernels == app.kernels


# ------------------------------------------------------------------------------------------------
# the problem definition
# ------------------------------------------------------------------------------------------------

def test_array_categories_and_renaming():
    app = load_app(RK_STEP)
    arrays = classify_arrays(app)
    assert arrays["DENS"].category == "read-only"
    assert arrays["VELX"].category == "strict read-write"
    assert arrays["QFLX"].category == "expandable read-write"
    assert arrays["DENS_t"].category == "write-only"
    assert arrays["QFLX"].renamed and arrays["QFLX"].versions == ("QFLX", "QFLX#1", "QFLX#2")
    dag = order_graph(app)
    # renamed: k12 no longer waits for k10 (WAR) nor k8 (WAW)
    assert dag.edges["k8_qflx_dens", "k10_dens_t"]["buffers"] == ["QFLX#1"]
    assert dag.edges["k12_qflx_rhot", "k14_rhot_t"]["buffers"] == ["QFLX#2"]
    assert not dag.has_edge("k10_dens_t", "k12_qflx_rhot")
    assert not dag.has_edge("k8_qflx_dens", "k12_qflx_rhot")
    strict = load_app(RK_STEP)
    from dataclasses import replace
    strict = replace(strict, rename=False)
    dag = order_graph(strict)
    assert dag.edges["k10_dens_t", "k12_qflx_rhot"]["why"] == {"WAR QFLX"}
    assert "WAW QFLX" in dag.edges["k8_qflx_dens", "k12_qflx_rhot"]["why"]


def test_order_dag_copies_and_after():
    data = small_app(copies=[{"array": "u", "after": "b"}])
    data["kernels"][2]["after"] = ["b"]
    dag = order_graph(parse_app(data))
    assert "copy u" in dag.edges["a", "c"]["why"]  # a touched u before the copy, c after
    assert "after" in dag.edges["b", "c"]["why"]
    assert dag.edges["a", "b"]["why"] == {"RAW v"}


def test_sharing_kinship_and_thread_load():
    problem = AppProblem(parse_app(small_app()))
    sharing = problem.sharing
    assert sharing.has_edge("a", "c")  # both read u
    assert not sharing.has_edge("a", "d")
    assert problem.degree_of_kinship("a", "b") == 1
    assert problem.degree_of_kinship("a", "d") == 2  # a-b (v) then b-d (w), or a-c-d
    assert problem.degree_of_kinship("a", "d", within=["a", "d"]) == 0
    assert problem.degree_of_kinship("b", "e") == 2
    assert problem.thread_load("b", "v") == 5  # radius 1, 2-D star
    assert problem.thread_load("a", "v") == 0
    assert problem.sharing_sets()["u"] == ("a", "c")
    assert problem.sharing_sets()["r"] == ("d", "e")  # call order, not writers first
    assert set(problem.shared_arrays()) == {"u", "v", "w", "q", "r"}


def rules(problem, members):
    return [v.rule for v in problem.violations(members)]


def test_constraints_each_say_why():
    problem = AppProblem(parse_app(small_app()))
    # (1.3): b lies on the path a -> b -> d
    reason = problem.group_reason(("a", "d"))
    assert reason.startswith("(1.3)") and "'b' lies on a path from 'a' to 'd'" in reason
    # (1.5): b and c share nothing, and nothing inside links them
    reason = problem.group_reason(("b", "c"))
    assert reason.startswith("(1.5)") and "degree of kinship" in reason
    # header: one launch shape per fused kernel
    data = small_app()
    data["kernels"][1]["threads_per_block"] = 256
    reason = AppProblem(parse_app(data)).group_reason(("a", "b"))
    assert reason.startswith("header:") and "256" in reason
    # (1.1): the projection of a legal group must beat the original sum
    data = small_app()
    for kernel in data["kernels"]:
        kernel["runtime_us"] = 1.0
    reason = AppProblem(parse_app(data)).group_reason(("a", "b"))
    assert reason.startswith("(1.1)") and "original sum 2.0 us" in reason
    # (1.7): a 300-point stencil needs more than 255 registers per thread
    data = small_app()
    data["kernels"][1]["accesses"][0] = {"array": "v", "access": "read", "thread_load": 300}
    reason = AppProblem(parse_app(data)).group_reason(("a", "b"))
    assert reason.startswith("(1.7)") and "255" in reason
    # (1.6): 1024-thread blocks staging many double arrays overflow 48 KB
    data = small_app(launch={"threads_per_block": 1024, "blocks": 8})
    for kernel in data["kernels"]:
        for access in kernel["accesses"]:
            if access["access"] == "read":
                access.pop("radius", None)
                access["thread_load"] = 9
    data["kernels"][4]["accesses"] = [{"array": "r", "access": "readwrite"}]
    reason = AppProblem(parse_app(data)).group_reason(("a", "b", "c", "d"))
    assert reason.startswith("(1.6)") and "shared memory" in reason
    # a legal group
    assert problem.group_reason(("a", "b")) is None
    assert problem.variant(("a", "b")) == "complex" and problem.variant(("a", "c")) == "simple"


def test_plan_constraints():
    problem = AppProblem(parse_app(small_app()))
    assert [v.rule for v in problem.plan_violations([("a",), ("b",)])] == ["1.2"]
    assert "'a' is in two groups" in str(problem.plan_violations(
        [("a", "b"), ("a",), ("c",), ("d",), ("e",)])[0])
    assert problem.plan_violations([("a", "zz"), ("b",), ("c",), ("d",), ("e",)])[0].rule \
        == "1.4"
    assert problem.plan_violations([("a", "b"), ("c", "d"), ("e",)]) == []
    # the notes' counter-example: {a,d} and {b,c} with a -> b and c -> d are each convex,
    # yet depend on each other in a cycle
    data = {
        "name": "cycle", "device": "k20x", "launch": {"threads_per_block": 128, "blocks": 64},
        "arrays": [{"name": n} for n in ("x", "y", "s", "t")],
        "kernels": [
            {"name": "a", "runtime_us": 10, "accesses": [{"array": "x", "access": "write"},
                                                         {"array": "s", "access": "read"}]},
            {"name": "c", "runtime_us": 10, "accesses": [{"array": "y", "access": "write"},
                                                         {"array": "t", "access": "read"}]},
            {"name": "b", "runtime_us": 10, "accesses": [{"array": "x", "access": "read"},
                                                         {"array": "t", "access": "read"}]},
            {"name": "d", "runtime_us": 10, "accesses": [{"array": "y", "access": "read"},
                                                         {"array": "s", "access": "read"}]},
        ],
    }
    problem = AppProblem(parse_app(data))
    found = problem.plan_violations([("a", "d"), ("c", "b")])
    assert [v.rule for v in found if v.rule == "acyclic"] == ["acyclic"]


def test_seed002_rules_come_with_the_qiao_model():
    app = load_app(RK_STEP)
    problem = AppProblem(app, "qiao")
    assert problem.seed002_rules and not AppProblem(app, "wahib").seed002_rules
    # L1: both velocities are needed outside; a Hipacc kernel keeps one output
    assert rules(problem, ("k1_velx", "k2_vely"))[0] == "L1"
    # L2: k15 reads VELX, which the group's source k3 does not read
    reason = problem.group_reason(("k3_pres", "k15_momx_t"))
    assert reason.startswith("L2:") and "'VELX'" in reason
    # L6: recomputing QFLX at every stencil tap costs more than keeping it on chip saves
    assert "L6" in rules(problem, ("k8_qflx_dens", "k10_dens_t"))
    relaxed = AppProblem(app, "qiao", seed002_rules=False)
    assert rules(relaxed, ("k3_pres", "k15_momx_t")) == []


@pytest.mark.parametrize("model", ["wahib", "wahib-norm", "qiao", "roofline"])
def test_models_on_metadata(model):
    problem = AppProblem(load_app(RK_STEP), model)
    single = problem.group_time(("k1_velx",))
    assert single == pytest.approx(172e-6)  # a kernel alone: its measured runtime
    fused = problem.group_time(("k1_velx", "k2_vely"))
    assert fused > 0
    assert problem.unfused_time() == pytest.approx(1.509e-3)


# ------------------------------------------------------------------------------------------------
# projection
# ------------------------------------------------------------------------------------------------

def test_project_json_has_the_plan_keys():
    from kfuse.apps import get_app
    from kfuse.fusion.plan import unfused_plan

    plan_keys = set(unfused_plan(get_app("sobel").build().graph()).to_dict())
    result = project_app(load_app(RK_STEP), "exhaustive", "wahib")
    data = result.to_dict()
    assert set(data) == plan_keys | {"projected_speedup"}
    assert data["strategy"] == "exhaustive" and data["model"] == "wahib"
    assert sorted(k for g in data["groups"] for k in g) == sorted(
        k.name for k in load_app(RK_STEP).kernels)
    assert result.problem.plan_violations(result.groups) == []
    assert data["projected_speedup"] == pytest.approx(
        data["unfused_predicted_time_s"] / data["predicted_time_s"])
    assert data["projected_speedup"] >= 1.0
    for entry in data["rejected"] + data["fused"]:
        assert set(entry) == {"producer", "consumer", "buffer", "reason"}


def test_gga_finds_the_exhaustive_optimum_on_small_instances():
    for seed in range(3):
        app = synthesize(SynthSpec(kernels=8, arrays=12, sharing=3, kinship=2, seed=seed))
        best = project_app(app, "exhaustive", "wahib")
        found = project_app(app, "gga", "wahib", seed=seed)
        assert found.predicted_time_s == pytest.approx(best.predicted_time_s, rel=1e-9)


# ------------------------------------------------------------------------------------------------
# hereditary (monotone) rules: exact enumeration prunes with them
# ------------------------------------------------------------------------------------------------

def _varied(app, seed: int):
    """``app`` with per-kernel metadata the synthetic suite keeps uniform varied: active
    threads per block, registers, address registers, some single-precision arrays, two
    launch shapes and no declared precision (so every branch of the bounds is used)."""
    import random
    from dataclasses import replace

    rng = random.Random(seed)
    arrays = tuple(replace(a, dtype="float32") if rng.random() < 0.3 else a
                   for a in app.arrays)
    kernels = []
    for index, kernel in enumerate(app.kernels):
        kernels.append(replace(
            kernel, active_threads_per_block=rng.choice((None, 64, 96, 128)),
            registers=rng.choice((24, 40, 64, 128)), address_registers=rng.choice((2, 4, 12)),
            threads_per_block=256 if index % 7 == 6 else kernel.threads_per_block))
    return replace(app, arrays=arrays, kernels=tuple(kernels), precision=None)


@pytest.mark.parametrize("model", ["wahib", "qiao", "wahib-norm"])
def test_hereditary_pruning_keeps_every_legal_group(model):
    """Enumeration with ``hereditary_reason`` finds exactly the legal groups it finds
    without (so the rules prune only sets no superset of which is legal), and prunes."""
    from dataclasses import replace

    from kfuse.search.problem import enumerate_groups

    pruned_somewhere = False
    specs = [SynthSpec(kernels=12, arrays=a, sharing=s, thread_load=t, kinship=2, seed=seed)
             for seed, (a, s, t) in enumerate([(12, 2, 4), (24, 4, 8), (18, 3, 12),
                                                (10, 6, 4)])]
    for index, spec in enumerate(specs):
        for app in (synthesize(spec), _varied(synthesize(spec), index)):
            problem = AppProblem(app, model).fusion_problem()
            plain = replace(problem, hereditary_reason=None)
            found, stats = enumerate_groups(problem)
            every, all_stats = enumerate_groups(plain)
            assert sorted(found) == sorted(every), (spec.name, model)
            pruned_somewhere |= stats["visited_sets"] < all_stats["visited_sets"]
    assert pruned_somewhere


def test_hereditary_reasons_name_their_rule():
    app = synthesize(SynthSpec(kernels=12, arrays=24, sharing=4, thread_load=8, kinship=2,
                               seed=1))
    problem = AppProblem(app, "wahib")
    assert problem.hereditary_reason(["k0"]) is None
    reasons = set()
    names = list(problem.kernels)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            reason = problem.hereditary_reason([a, b])
            if reason:
                assert "every larger group" in reason or "no group holding" in reason
                reasons.add(reason[:5])
    assert reasons and reasons <= {"(1.1)", "(1.6)", "(1.7)", "heade"}
    shapes = _varied(app, 0)
    problem = AppProblem(shapes, "wahib")
    assert problem.hereditary_reason(["k0", "k6"]).startswith("header:")
    # the profit bound belongs to the literal model only
    assert not any((AppProblem(app, "roofline").hereditary_reason([a, b]) or "").startswith(
        "(1.1)") for a in names for b in names if a < b)


def test_exact_finishes_on_a_50_kernel_suite_instance():
    from dataclasses import replace

    from kfuse.search.problem import TooManyCandidates, enumerate_groups, solve

    app = synthesize(SynthSpec(kernels=50, arrays=40, copies=8, sharing=4, thread_load=4,
                               kinship=3, seed=1))
    problem = AppProblem(app, "wahib").fusion_problem()
    result = solve(problem, "exact", max_visits=1_500)
    assert result.stats["optimal"] and result.stats["visited_sets"] <= 1_500
    assert problem.plan_reason(result.groups) is None
    with pytest.raises(TooManyCandidates):  # without the monotone rules, not in that budget
        enumerate_groups(replace(problem, hereditary_reason=None), max_visits=1_500)


# ------------------------------------------------------------------------------------------------
# synthetic suite and fidelity
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", [
    SynthSpec(kernels=10, arrays=20, copies=2, sharing=2, thread_load=4, kinship=2, seed=1),
    SynthSpec(kernels=20, arrays=40, copies=4, sharing=4, thread_load=8, kinship=3, seed=2),
    SynthSpec(kernels=30, arrays=60, copies=6, sharing=6, thread_load=12, kinship=5, seed=3),
])
def test_synth_round_trips_and_meets_its_attributes(spec, tmp_path):
    app = synthesize(spec)
    assert len(app.kernels) == spec.kernels and len(app.arrays) == spec.arrays
    achieved = app.synth["achieved"]
    assert achieved["kinship"] == spec.kinship
    assert achieved["mean_thread_load"] == pytest.approx(spec.thread_load, abs=0.1)
    assert achieved["copies"] == spec.copies
    assert abs(achieved["mean_sharing_set"] - spec.sharing) <= 1.0
    jsonschema.validate(json.loads(json.dumps(app.to_dict())), schema())
    for suffix in (".yaml", ".json"):
        again = load_app(dump_app(app, tmp_path / f"app{suffix}"))
        assert again.to_dict() == app.to_dict()
    problem = AppProblem(app)
    assert all(k.runtime_s > 0 and k.flops > 0 for k in app.kernels)
    categories = {info.category for info in problem.arrays.values()}
    assert {"read-only", "strict read-write"} <= categories
    assert synthesize(spec).to_dict() == app.to_dict()  # deterministic by seed
    assert synthesize(SynthSpec(**{**spec.__dict__, "seed": spec.seed + 1})).to_dict() != \
        app.to_dict()


def test_synth_rejects_impossible_attributes():
    from kfuse.errors import KfuseError
    with pytest.raises(KfuseError, match="kinship 5 needs at least 6 kernels"):
        synthesize(SynthSpec(kernels=4, kinship=5))
    with pytest.raises(KfuseError, match="thread-load"):
        synthesize(SynthSpec(thread_load=20))


def test_fidelity_varies_table_v_attributes_per_instance():
    from kfuse.project.fidelity import TABLE_V, format_table, run_fidelity, total_row, vary_spec
    from kfuse.project.synth import suite

    specs = [vary_spec(spec, TABLE_V) for spec in suite([6], [10], 6)]
    again = [vary_spec(spec, TABLE_V) for spec in suite([6], [10], 6)]
    assert specs == again  # drawn from the seed: the same suite every time
    assert len({(s.copies, s.sharing, s.thread_load, s.kinship) for s in specs}) > 1
    for spec in specs:
        assert spec.copies in TABLE_V["copies"] and spec.sharing in TABLE_V["sharing"]
        assert spec.thread_load in TABLE_V["thread_load"] and spec.kinship <= 5
    with pytest.raises(KfuseError, match="can vary only"):
        vary_spec(specs[0], {"kernels": (3,)})
    rows = run_fidelity([6], [8, 10], 2, SynthSpec(sharing=3, kinship=2), strategy="greedy",
                        reference="exhaustive", vary={"thread_load": (4.0, 12.0)})
    for row in rows:
        assert len(row.cpu_times_s) == len(row.times_s) == row.instances == 2
        assert all(t >= 0 for t in row.cpu_times_s) and row.max_cpu_time_s is not None
    total = total_row(rows)
    assert (total.instances, total.compared) == (4, 4)
    assert total.optimal == sum(r.optimal for r in rows)
    assert total.worst_gap == max(r.worst_gap for r in rows)
    assert format_table(rows, "greedy", "exhaustive", total=True).row_count == 3


def test_fidelity_rows():
    from kfuse.project.fidelity import format_table, run_fidelity

    rows = run_fidelity([6, 8], [10], 2, SynthSpec(sharing=3, kinship=2),
                        strategy="greedy", reference="exhaustive")
    assert [(r.kernels, r.arrays, r.instances) for r in rows] == [(6, 10, 2), (8, 10, 2)]
    for row in rows:
        assert row.feasible == 2 and row.compared == 2
        assert 0 <= row.optimal <= 2 and row.worst_gap >= 0
        assert (row.optimal == 2) == (row.worst_gap <= 0.01)
    assert format_table(rows, "greedy", "exhaustive").row_count == 2


# ------------------------------------------------------------------------------------------------
# command line
# ------------------------------------------------------------------------------------------------

def run_cli(capsys, *argv):
    from kfuse.cli.main import main
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_synth_then_project(capsys, tmp_path):
    target = tmp_path / "app.yaml"
    code, out, _ = run_cli(capsys, "synth", "--kernels", 8, "--arrays", 12, "--copies", 2,
                           "--sharing", 3, "--thread-load", 8, "--kinship", 2, "--seed", 4,
                           "-o", target)
    assert code == 0 and "wrote" in out and "kinship 2" in out
    assert load_app(target).synth["kernels"] == 8
    code, out, _ = run_cli(capsys, "project", target, "--strategy", "exhaustive", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["strategy"] == "exhaustive" and data["projected_speedup"] >= 1.0
    code, out, _ = run_cli(capsys, "project", RK_STEP, "--strategy", "greedy",
                           "--model", "qiao")
    assert code == 0 and "projection of 'rk-step'" in out and "speedup" in out


def test_cli_project_reports_bad_files(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    data = small_app()
    data["kernels"][0]["runtime_us"] = "fast"
    bad.write_text(yaml.safe_dump(data))
    code, _, err = run_cli(capsys, "project", bad)
    assert code == 2 and "bad.yaml" in err and "kernel 'a'" in err and "runtime_us" in err


def test_cli_fidelity(capsys):
    code, out, _ = run_cli(capsys, "fidelity", "--kernels", "6", "--arrays", "8",
                           "--instances", 2, "--sharing", 3, "--kinship", 2,
                           "--strategy", "greedy", "--reference", "exhaustive", "--json")
    assert code == 0
    (row,) = json.loads(out)
    assert row["instances"] == 2 and row["feasible_pct"] == 100.0
    code, out, _ = run_cli(capsys, "fidelity", "--kernels", "6", "--arrays", "8",
                           "--instances", 1, "--sharing", 3, "--kinship", 2,
                           "--strategy", "gga", "--reference", "exhaustive")
    assert code == 0 and "(6,8)" in out and "100.0" in out


def test_cli_fidelity_lists_and_table_v(capsys):
    code, out, _ = run_cli(capsys, "fidelity", "--kernels", "6,7", "--arrays", "8",
                           "--instances", 1, "--thread-load", "4,12", "--sharing", "3",
                           "--kinship", 2, "--strategy", "greedy", "--reference",
                           "exhaustive", "--json")
    assert code == 0
    rows = json.loads(out)
    assert [r.get("total", False) for r in rows] == [False, False, True]
    assert rows[-1]["instances"] == 2 and rows[-1]["mean_cpu_time_s"] is not None
    code, out, _ = run_cli(capsys, "fidelity", "--kernels", "6", "--arrays", "8",
                           "--instances", 1, "--table-v", "--strategy", "greedy",
                           "--reference", "exhaustive")
    assert code == 0 and "varied per instance" in out and "cpu" in out
    code, _, err = run_cli(capsys, "fidelity", "--thread-load", "four")
    assert code == 2 and "--thread-load" in err
