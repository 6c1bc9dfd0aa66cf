"""Horizontal fusion (Li et al. 2022, HFuse): kernels with no path between them side by side
in one block, generated with generated, generated with user, user with user; parts of
different block shapes and grids, with barriers and dynamic shared memory; the refusals,
the model's choices and the planner's explanation."""

from __future__ import annotations

import numpy as np
import pytest

import kfuse as kf
from kfuse.apps.pairs import HASH_SOURCE, HISTOGRAM_SOURCE, PAIRS, get_pair, hash_reference
from kfuse.errors import CompileError, FusionError
from kfuse.fusion.plan import unfused_plan
from kfuse.model.device import h200_like_profile
from kfuse.schedule.forms import MAX_PARTS, GroupSchedule, HorizontalSchedule
from kfuse.search.hfuse import best_side_by_side, side_by_side_plan


def _errors(got, want) -> dict[str, float]:
    return {name: float(np.max(np.abs(np.asarray(got[name], np.float64) - want[name])
                               / (1.0 + np.abs(want[name])))) for name in want}


def _three_kinds() -> kf.Pipeline:
    """A stencil, a sum (block reductions: barriers), a user hash and a user histogram
    (shared-memory atomics, barriers, a fixed grid), all independent."""
    p = kf.Pipeline("four")
    img = p.input("img", 2)
    keys = p.input("keys", 1, dtype="int32")
    blur = kf.local((img.at(0, -1) + img.at(0, 1) + img.at(-1, 0) + img.at(1, 0)) * 0.25,
                    boundary="mirror", name="blur")
    total = kf.reduce_sum(img * img, name="total")
    hashed = kf.user_kernel(HASH_SOURCE, "hash_keys", [keys, kf.written("hashed", like=keys),
                                                       kf.size(keys), 5],
                            any_block=True, grid=[(kf.size(keys), 256)],
                            numpy=lambda k: hash_reference(k, 5), name="hash")
    counts = kf.user_kernel(
        HISTOGRAM_SOURCE, "histogram",
        [keys, kf.written("counts", shape=(256,), dtype="int32", elementwise=False,
                          initial=0), kf.size(keys)],
        block=(128,), grid=[3], any_block=True,
        numpy=lambda k: np.bincount(k & 255, minlength=256).astype(np.int32), name="histogram")
    p.output(blur, total, hashed, counts)
    return p


@pytest.fixture(scope="module")
def four():
    p = _three_kinds()
    rng = np.random.default_rng(7)
    inputs = {"img": rng.uniform(0, 1, (45, 77)).astype(np.float32),
              "keys": rng.integers(-2**31, 2**31, 1001, dtype=np.int64).astype(np.int32)}
    return p, inputs, p.run(backend="numpy", **inputs)


@pytest.mark.parametrize("operators, threads", [
    (("blur", "total"), ()),                      # generated beside generated (barriers)
    (("blur", "hash"), (512, 256)),               # a resized tiled part beside a user kernel
    (("hash", "histogram"), (384, 256)),          # user beside user: barriers, other grids
    (("histogram", "total", "blur"), ()),         # three parts
], ids=["generated", "generated-user", "user-user", "three"])
def test_kernels_side_by_side_compute_what_they_compute_apart(four, configure, operators,
                                                              threads):
    p, inputs, want = four
    plan = p.fuse([]).run_side_by_side(*operators, threads=threads)
    configure(check_writes=True)
    got = p.run(backend="cpu", plan=plan, **inputs)
    assert max(_errors(got, want).values()) < 1e-5
    text = plan.explain()
    assert "side by side [" in text and f"{len(p.graph().kernels) - len(operators) + 1} " \
        "kernels" in text


def test_a_capped_split_still_computes_the_same(four):
    p, inputs, want = four
    plan = p.fuse([]).run_side_by_side("blur", "hash", least_blocks=2)
    assert max(_errors(p.run(backend="cpu", plan=plan, **inputs), want).values()) < 1e-5


def test_the_generated_kernel_names_its_parts_and_their_barriers(four):
    from kfuse.codegen import generate

    p, _, _ = four
    plan = p.fuse([]).run_side_by_side("blur", "histogram")
    source = generate(p.graph(), plan.kernel_groups).source
    assert "#define __syncthreads() KF_BAR_SYNC(2, 128)" in source  # the histogram's part
    assert "Kernels side by side in one block" in source
    assert "#pragma push_macro(" not in source  # NVRTC ignores it


@pytest.mark.parametrize("operators, threads, error, message", [
    (("blur", "hash"), (100, None), FusionError, "whole warps"),
    (("total", "hash"), (512, None), CompileError, "keeps its blocks"),
    (("blur", "blur"), (), FusionError, "two operators of one group"),
])
def test_impossible_side_by_side_kernels_are_refused_by_name(four, operators, threads, error,
                                                             message):
    p, inputs, _ = four
    with pytest.raises(error, match=message):
        plan = p.fuse([]).run_side_by_side(*operators, threads=threads)
        p.run(backend="cpu", plan=plan, **inputs)


def test_kernels_with_a_path_between_them_are_not_side_by_side():
    p = kf.Pipeline("chain")
    x = p.input("x", 1)
    a = kf.point(x + 1.0, name="a")
    p.output(kf.point(a * 2.0, name="b"))
    with pytest.raises(FusionError, match="depend on each other: a -> b"):
        p.fuse([]).run_side_by_side("a", "b")
    parts = tuple(GroupSchedule((f"k{i}",), (f"k{i}",)) for i in range(MAX_PARTS + 1))
    assert "2 to 15 kernels" in HorizontalSchedule(parts).why_not(p.graph())


def test_a_part_twice_side_by_side_is_refused(four):
    p, _, _ = four
    plan = p.fuse([]).run_side_by_side("blur", "hash")
    with pytest.raises(FusionError, match="already runs side by side"):
        plan.run_side_by_side("hash", "total")


def test_the_order_keeps_side_by_side_parts_together_and_producers_first():
    p = kf.Pipeline("order")
    x, y = p.input("x", 1), p.input("y", 1)
    a = kf.point(x + 1.0, name="a")
    b = kf.point(a * 2.0, name="b")   # after a
    c = kf.point(y * 3.0, name="c")   # independent of a and b
    p.output(b, c)
    plan = p.fuse([]).run_side_by_side("b", "c")
    order = [g.members[0] for g in plan.groups]
    assert order.index("a") < order.index("b") and abs(order.index("b") - order.index("c")) == 1
    values = np.random.default_rng(8).uniform(0, 1, 333).astype(np.float32)
    got = p.run(backend="cpu", plan=plan, x=values, y=values)
    np.testing.assert_allclose(got["b"], (values + 1) * 2, rtol=1e-6)
    np.testing.assert_allclose(got["c"], values * 3, rtol=1e-6)


@pytest.mark.parametrize("pair", [p.name for p in PAIRS])
def test_every_benchmark_pair_side_by_side_matches_its_reference(pair):
    chosen = get_pair(pair)
    pipeline = chosen.build()
    inputs = chosen.make_inputs(np.random.default_rng(9), True)
    names = [k.name for k in pipeline.graph().kernels]
    plan = pipeline.fuse([["dx", "dy", "mag"]] if "mag" in names else [])  # (Sobel: one kernel)
    plan = plan.run_side_by_side(*(group.members[-1] for group in plan.groups))
    got = pipeline.run(backend="cpu", plan=plan, **inputs)
    assert max(_errors(got, chosen.reference(inputs)).values()) < 1e-5


def _bench_sizes(pair: str):
    chosen = get_pair(pair)
    graph = chosen.build().graph()
    shapes = {"blur_hash": {"img": (8192, 8192), "keys": (1 << 21,)},
              "small_pair": {"img": (512, 512), "x": (1 << 16,)}}[pair]
    return graph, graph.bind_shapes(shapes)


def test_the_model_fuses_memory_beside_arithmetic_and_not_kernels_a_call_outlasts():
    profile = h200_like_profile()
    graph, sizes = _bench_sizes("blur_hash")
    parts = [g.schedule for g in unfused_plan(graph).groups]
    candidate, prediction = best_side_by_side(graph, parts, sizes, profile)
    assert prediction.pays and sum(prediction.threads) == 1024
    assert "memory-bound" in prediction.reason and "arithmetic-bound" in prediction.reason
    plan = side_by_side_plan(unfused_plan(graph), sizes, profile)
    assert len(plan.side_by_side) == 1 and "side by side [blur] | [hash]" in plan.explain()
    graph, sizes = _bench_sizes("small_pair")
    plan = side_by_side_plan(unfused_plan(graph), sizes, profile)
    assert not plan.side_by_side and "not side by side [box], [poly]" in plan.explain()


def test_autotuning_measures_the_candidates_and_keeps_a_plan_that_computes_the_same():
    from kfuse.tune.side_by_side import autotune_side_by_side

    pipeline = kf.Pipeline("tuned")
    x = pipeline.input("x", 1)
    keys = pipeline.input("keys", 1, dtype="int32")
    pipeline.output(kf.reduce_sum(x * x, name="total"), kf.user_kernel(
        HASH_SOURCE, "hash_keys", [keys, kf.written("hashed", like=keys), kf.size(keys), 3],
        grid=[(kf.size(keys), 256)], name="hash"))
    graph = pipeline.graph()
    rng = np.random.default_rng(10)
    inputs = {"x": rng.uniform(0, 1, 999).astype(np.float32),
              "keys": rng.integers(0, 2**31, 1001, dtype=np.int64).astype(np.int32)}
    plan, measured = autotune_side_by_side(graph, inputs, unfused_plan(graph), backend="cpu",
                                           rounds=1, repeat=1, warmup=0)
    (pair,) = measured  # (neither part takes another block: their own split, capped or not)
    assert {"one after another", "two streams", "256/256"} <= set(pair.milliseconds)
    assert pair.kept == min(pair.milliseconds, key=pair.milliseconds.__getitem__)
    got = pipeline.run(backend="cpu", plan=plan, **inputs)
    np.testing.assert_array_equal(got["hashed"], hash_reference(inputs["keys"], 3))
    np.testing.assert_allclose(got["total"], np.sum(inputs["x"].astype(np.float64) ** 2),
                               rtol=1e-5)


def test_a_side_by_side_program_survives_the_program_store(four):
    from kfuse.codegen import generate
    from kfuse.runtime.program_store import program_from_dict, program_to_dict

    p, _, _ = four
    plan = p.fuse([]).run_side_by_side("blur", "histogram")
    program = generate(p.graph(), plan.kernel_groups)
    assert program_from_dict(program_to_dict(program)) == program
    (fused,) = [launch for launch in program.launches if launch.part_grids]
    sizes = p.graph().bind_shapes({"img": (45, 77), "keys": (1001,)})
    assert fused.grid_size(sizes) == (max(blocks[0] * blocks[1] * blocks[2] for blocks in
                                          fused.part_blocks(sizes)), 1, 1)
    assert fused.part_blocks(sizes)[1] == (3, 1, 1)  # the histogram's fixed grid


def test_staged_recompute_and_reduction_parts_side_by_side_and_streamed_refused():
    import kfuse.schedule.forms as forms

    p = kf.Pipeline("forms")
    a, b, v = p.input("a", 2), p.input("b", 2), p.input("v", 2)
    s1 = kf.local((a.at(0, -1) + a.at(0, 1) + a.at(-1, 0) + a.at(1, 0)) * 0.25,
                  boundary="mirror", name="s1")
    s2 = kf.local(s1.at(-1, 0) + s1.at(1, 0) - s1, boundary="clamp", name="s2")
    t1 = kf.local(b.at(0, -1) * b.at(0, 1) + b, boundary="repeat", name="t1")
    t2 = kf.local(t1.at(-1, 0) + t1.at(1, 0), boundary="clamp", name="t2")
    p.output(s2, t2, kf.reduce_sum(v, axis=1, name="rows"))
    rng = np.random.default_rng(12)
    inputs = {"a": rng.uniform(0, 1, (37, 53)).astype(np.float32),
              "b": rng.uniform(0, 1, (41, 29)).astype(np.float32),
              "v": rng.uniform(0, 1, (29, 301)).astype(np.float32)}
    want = p.run(backend="numpy", **inputs)
    plan = p.fuse([["s1", "s2"], ["t1", "t2"]], forms=["staged", "recompute"])
    got = p.run(backend="cpu", plan=plan.run_side_by_side("s2", "t2", "rows"), **inputs)
    assert max(_errors(got, want).values()) < 1e-5
    streamed = p.fuse([["s1", "s2"], ["t1", "t2"]], forms=[forms.Streamed(), "recompute"])
    with pytest.raises(FusionError, match=r"\[s1 \+ s2\] is streamed"):
        streamed.run_side_by_side("s2", "t2")


def test_a_3d_chain_beside_another_kernel_keeps_its_register_tiles_where_it_would_march(
        configure):
    p = kf.Pipeline("volume")
    u, x = p.input("u", 3), p.input("x", 1)
    first = kf.local(u.at(0, 0, -1) + u.at(0, 0, 1) + u.at(-1, 0, 0) + u, name="first")
    second = kf.local(first.at(1, 0, 0) + first.at(-1, 0, 0) - first, name="second")
    p.output(second, kf.point(x * 2.0, name="doubled"))
    rng = np.random.default_rng(13)
    inputs = {"u": rng.uniform(0, 1, (9, 8, 12)).astype(np.float32),
              "x": rng.uniform(0, 1, 77).astype(np.float32)}
    want = p.run(backend="numpy", **inputs)
    configure(march=True)
    plan = p.fuse([["first", "second"]], forms=["recompute"]).run_side_by_side("second",
                                                                                "doubled")
    assert max(_errors(p.run(backend="cpu", plan=plan, **inputs), want).values()) < 1e-5


def test_many_independent_kernels_search_at_most_two_partners_each(monkeypatch):
    """A pyramid makes many independent kernels: every pair is screened by its bound, and
    only the best-ranked pairs of each group are searched (compiled), the rest explained."""
    import kfuse.search.hfuse as hfuse

    p = kf.Pipeline("branches")
    images = [p.input(f"img{k}", 2) for k in range(6)]
    p.output(*[kf.local((x.at(0, -1) + x.at(0, 1)) * (0.5 + k), name=f"b{k}")
               for k, x in enumerate(images)])
    graph = p.graph()
    sizes = graph.bind_shapes({f"img{k}": (8192, 8192) for k in range(6)})
    searched = []
    real = hfuse.best_side_by_side

    def counted(graph, parts, *arguments):
        searched.append(tuple(part.members for part in parts))
        return real(graph, parts, *arguments)

    monkeypatch.setattr(hfuse, "best_side_by_side", counted)
    plan = hfuse.side_by_side_plan(unfused_plan(graph), sizes, h200_like_profile())
    per_group: dict[tuple[str, ...], int] = {}
    for pair in searched:
        for members in pair:
            per_group[members] = per_group.get(members, 0) + 1
    assert searched and max(per_group.values()) <= hfuse.PARTNERS_SEARCHED
    assert len(searched) < 15  # of the 15 pairs of six kernels
    if len(searched) + len(plan.side_by_side) < 15:
        assert "not searched" in plan.explain() or "cannot pay" in plan.explain()
