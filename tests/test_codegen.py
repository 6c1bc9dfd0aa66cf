"""Generated source: readable, one kernel per operator, valid CUDA for nvcc."""

from __future__ import annotations

import math
import shutil

import pytest

import kfuse as kf
from kfuse.apps import list_apps
from kfuse.apps.check import relative_error
from kfuse.codegen import generate_unfused
from kfuse.codegen.prelude import PRELUDE
from kfuse.codegen.resources import kernel_resources, parse_ptxas
from kfuse.fusion.legality import SPILL_TOLERANCE_BYTES
from kfuse.runtime.binding import to_numpy


def test_one_named_kernel_per_operator():
    p = kf.Pipeline("demo")
    img = p.input("img", ndim=2)
    blur = kf.convolve(img, [[1, 1, 1]] * 3, scale=1 / 9)
    total = kf.reduce_sum(blur)
    p.output(kf.point(blur / total, name="normalised"))
    program = generate_unfused(p.graph())
    assert [spec.symbol for spec in program.launches] == ["demo_blur", "demo_total",
                                                          "demo_normalised"]
    assert program.source.count(PRELUDE) == 1
    for spec in program.launches:
        assert f"void __launch_bounds__({spec.block[0] * spec.block[1]}) {spec.symbol}(" \
            in program.source
    assert "written at test_codegen.py" in program.source
    (total_spec,) = [s for s in program.launches if s.symbol == "demo_total"]
    assert total_spec.initial_values == (("total", 0),)


def test_buffer_names_that_clash_with_generated_names_are_renamed():
    p = kf.Pipeline("clash")
    x = p.input("ix", ndim=2)
    v = kf.point(x * 2, name="v1")
    p.output(v)
    source = generate_unfused(p.graph()).source
    assert "const float* __restrict__ ix_buf" in source
    assert "float* __restrict__ v1_buf" in source


def test_names_that_c_headers_or_kernels_take_compute_the_reference():
    """Valid Python names that are macros (NAN, M_PI), vector types (float4), functions the
    kernel calls (sqrtf), the kernels' own locals (e, lane, warp_ix_last, vec_x_1) or a
    renamed name (x_buf beside x) get a suffix in the generated C, and the programs, fused
    and not (element-wise, stencil and reduction kernels), compute what NumPy does."""
    import numpy as np
    names = ["float4", "NAN", "M_PI", "sqrtf", "e", "warp_ix_last", "vec_x_1", "x", "x_buf"]
    p = kf.Pipeline("reserved")
    first, *rest = [p.input(name, ndim=2) for name in names]
    total = first
    for array in rest:
        total = total + array
    total = kf.point(total, name="total")
    lane = kf.local(kf.sqrt(total.at(0, 1)) + kf.exp(first * 0.5), boundary="clamp",
                    name="lane")
    infinity = kf.point(lane * 3.0 - rest[-1], name="INFINITY")
    column_sums = kf.reduce(infinity * rest[3], "sum", axis=0, name="KF_KERNEL")
    p.output(infinity, column_sums)
    rng = np.random.default_rng(9)
    given = {name: rng.uniform(0.5, 1.5, (19, 37)).astype(np.float32) for name in names}
    expected = p.run(backend="numpy", **given)
    source = generate_unfused(p.graph()).source
    assert "NAN_buf" in source and "float4_buf" in source and "x_buf_buf" in source
    for plan in ("unfused", "auto"):
        ours = p.run(backend="cpu", plan=plan, **given)
        for key, value in expected.items():
            assert relative_error(ours[key], value) < 1e-5, (plan, key)


def test_wide_index_uses_64_bit_offsets():
    p = kf.Pipeline("wide")
    x = p.input("x", ndim=2)
    p.output(kf.local(x.at(1, 0) + x, name="y"))
    assert "typedef long long kf_index_t;" in generate_unfused(p.graph(), wide_index=True).source
    assert "typedef int kf_index_t;" in generate_unfused(p.graph()).source


PTXAS_LOG = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k_a' for 'sm_90'
ptxas info    : Function properties for k_a
    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 256 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'k_b' for 'sm_90'
ptxas info    : Function properties for k_b
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 0 barriers, 380 bytes cmem[0]
"""


def test_parse_ptxas():
    figures = parse_ptxas(PTXAS_LOG)
    assert figures["k_a"].registers == 40 and figures["k_a"].shared_bytes == 256
    assert figures["k_a"].spill_store_bytes == 8 and figures["k_a"].barriers == 1
    assert figures["k_b"].registers == 12 and figures["k_b"].shared_bytes == 0


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("app", [a.name for a in list_apps()])
def test_every_app_compiles_with_nvcc(app, nvcc_figures):
    from kfuse.apps import get_app
    graph = get_app(app).build().graph()
    program = generate_unfused(graph)
    figures = kernel_resources(program.source)
    assert {spec.symbol for spec in program.launches} <= set(figures)
    for spec in program.launches:  # a few bytes may spill (see SPILL_TOLERANCE_BYTES)
        assert figures[spec.symbol].spill_store_bytes <= SPILL_TOLERANCE_BYTES


def _backends_with_cuda() -> list:
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("backend", _backends_with_cuda())
def test_float32_exp_is_accurate_over_its_range_and_exact_at_special_values(backend):
    """float32 exp (CUDA's expf on the GPU, the host's expf): infinities, NaN, overflow and
    underflow exact; normal results within 3 ulp, subnormal ones within 3 ulp of the
    smallest normal's spacing."""
    import numpy as np

    p = kf.Pipeline("exponentials")
    x = p.input("x", ndim=1)
    p.output(kf.point(kf.exp(x), name="exponential"))
    rng = np.random.default_rng(2)
    special = np.array([-np.inf, np.inf, np.nan, 0.0, -0.0, 89.0, -110.0], dtype=np.float32)
    values = np.concatenate([special, rng.uniform(-100.0, 88.5, 997)]).astype(np.float32)
    result = to_numpy(p.run(backend=backend, plan="unfused", x=values)["exponential"])
    exact = np.exp(values.astype(np.float64))
    with np.errstate(over="ignore"):  # exp(89) is +inf in float32
        exact32 = exact.astype(np.float32)
    np.testing.assert_array_equal(result[:len(special)], exact32[:len(special)])
    spacing = np.maximum(np.spacing(exact32), np.spacing(np.float32(2**-126)))
    error = np.abs(result[len(special):] - exact[len(special):]) / spacing[len(special):]
    assert error.max() <= 3.0


@pytest.mark.parametrize("backend", _backends_with_cuda())
@pytest.mark.parametrize("exponent", [3.0, -3.0, 0.5, -2.0, 0.0, 37.5, math.inf, -math.inf,
                                      math.nan])
def test_float32_pow_follows_c99_pow_on_every_kind_of_base(exponent, backend):
    """kf_powf is exp2(y lg2|x|) (lg2.approx on the GPU) with the special cases of C99
    pow as selects: zero, infinite and NaN results and the exponents 0, +-inf and NaN
    exactly as powf; finite results (negative bases with integer exponents too) within a
    few ulp."""
    import numpy as np

    p = kf.Pipeline("powers")
    x = p.input("x", ndim=1)
    y = p.param("y")
    p.output(kf.point(kf.pow(x, y), name="powered"))
    rng = np.random.default_rng(1)
    base = np.concatenate([rng.uniform(0.05, 3.0, 61), -rng.uniform(0.05, 3.0, 7),
                           [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0]]).astype(np.float32)
    result = to_numpy(p.run(backend=backend, plan="unfused", x=base, y=exponent)["powered"])

    def c_pow(b: float) -> float:  # C99 pow, which powf follows (NumPy differs at -inf)
        odd = exponent == int(exponent) and int(exponent) % 2 == 1 \
            if math.isfinite(exponent) else False
        if b == 0.0 and exponent < 0:
            return math.copysign(math.inf, b) if odd else math.inf  # Python raises
        try:
            return math.pow(b, exponent)
        except ValueError:
            return math.nan
        except (OverflowError, ZeroDivisionError):
            return math.inf

    expected = np.array([c_pow(float(b)) for b in base])
    special = ~np.isfinite(expected) | (expected == 0) | ~np.isfinite(base) \
        | np.isin(base, [0.0, 1.0, -1.0]) | (not math.isfinite(exponent)) | (exponent == 0)
    np.testing.assert_array_equal(result[special], expected[special].astype(np.float32))
    assert np.array_equal(np.signbit(result[special]), np.signbit(expected[special]))
    # the stated bound: (2 + |y log2 x| + |y|) float32 ulp at 1, relative (the |y| term:
    # lg2.approx's absolute error, which matters where log2 x is near 0)
    finite = ~special
    log2_base = np.log2(np.abs(base[finite].astype(np.float64)))
    bound = 2.0**-23 * (2 + np.abs(exponent * log2_base) + abs(exponent))
    error = np.abs(result[finite] - expected[finite]) / np.abs(expected[finite])
    assert np.all(error <= bound)


def test_a_log_feeding_only_an_exp_takes_the_absolute_error_form():
    """exp(sum c_i log x_i) takes kf_logf_in_exp (an absolute error in a log is a relative
    error of the exp); a log that reaches a product, a division by a variable or an output
    keeps logf, also where the same log feeds an exp elsewhere in the kernel."""
    import numpy as np

    p = kf.Pipeline("logs")
    a = p.input("a", ndim=1)
    b = p.input("b", ndim=1)
    mean = kf.point(kf.exp((kf.log(a) - 2.0 * kf.log(b) + -kf.log(a)) / 3.0), name="mean")
    mixed = kf.point(kf.log(b) * kf.exp(0.5 * kf.log(b)), name="mixed")
    scaled = kf.point(kf.exp(kf.log(a) * b), name="scaled")
    plain = kf.point(kf.log(a) + kf.exp(a), name="plain")
    for array in (mean, mixed, scaled, plain):
        p.output(array)
    program = generate_unfused(p.graph())

    def log_forms(name: str) -> set[str]:
        kernel = program.source.split(f" logs_{name}(")[1].split("\nKF_KERNEL")[0]
        return ({"in exp"} if "kf_logf_in_exp(" in kernel else set()) | (
            {"logf"} if "logf(" in kernel.replace("kf_logf_in_exp(", "") else set())

    assert log_forms("mean") == {"in exp"}
    assert log_forms("mixed") == {"in exp", "logf"}  # log(b) also multiplies: logf there
    assert log_forms("scaled") == {"logf"}  # a variable factor: no bound on the exp's error
    assert log_forms("plain") == {"logf"}
    rng = np.random.default_rng(3)
    values = {n: rng.uniform(0.05, 4.0, 999).astype(np.float32) for n in ("a", "b")}
    result = p.run(backend="cpu", plan="unfused", **values)
    exact = p.run(backend="numpy", plan="unfused", **values)
    for name in ("mean", "mixed", "scaled", "plain"):
        assert relative_error(result[name], exact[name]) <= 1e-6, name


@pytest.mark.parametrize("backend", _backends_with_cuda())
def test_a_geometric_mean_is_within_the_stated_bound(backend):
    """exp(mean of log x_i) over 9 values: relative error at most the accurate path's
    (exp 2 ulp, the sum's rounding) plus sum |c_i| (2^-21.41 + 3 ulp of log x_i)."""
    import numpy as np

    p = kf.Pipeline("geomean")
    xs = [p.input(f"x{k}", ndim=1) for k in range(9)]
    total = kf.log(xs[0])
    for x in xs[1:]:
        total = total + kf.log(x)
    p.output(kf.point(kf.exp(total * (1.0 / 9.0)), name="mean"))
    rng = np.random.default_rng(5)
    values = {f"x{k}": np.exp2(rng.uniform(-30, 30, 4099)).astype(np.float32)
              for k in range(9)}
    result = to_numpy(p.run(backend=backend, plan="unfused", **values)["mean"])
    logs = np.log(np.stack([v.astype(np.float64) for v in values.values()]))
    exact = np.exp(logs.mean(axis=0))
    ulp = 2.0**-23
    log_error = (2.0**-21.41 + 3 * ulp * np.abs(logs)).mean(axis=0)
    rounding = (9 + np.abs(logs).sum(axis=0) / 9) * ulp  # the sum and exp's argument
    bound = log_error + rounding + 2.5 * ulp
    error = np.abs(result - exact) / exact
    assert np.all(error <= bound)


def test_the_model_counts_a_log_inside_an_exp_as_the_cheap_form():
    """The roofline model's operation count follows the generated code: a log feeding only
    an exp is one simple operation, any other log a special function."""
    from kfuse.analysis.operations import SFU_WEIGHT, operations_per_point

    p = kf.Pipeline("counts")
    a = p.input("a", ndim=1)
    p.output(kf.point(kf.exp(kf.log(a) * 0.5), name="inside"))
    p.output(kf.point(kf.exp(a) + kf.log(a) * 0.5, name="outside"))
    kernels = p.graph().kernel_by_name
    # exp (special) + mul + log: one simple operation inside an exp, a special one outside
    assert operations_per_point(kernels["inside"]) == SFU_WEIGHT + 1 + 1
    assert operations_per_point(kernels["outside"]) == 2 * SFU_WEIGHT + 2


@pytest.mark.parametrize(("block_x", "first", "last"),
                         [(32, "threadIdx.x & 31u", 31 * 4), (64, "threadIdx.x & 31u", 31 * 4),
                          (8, "threadIdx.x", 7 * 4), (48, "threadIdx.x", 47 * 4)])
def test_the_interior_test_of_register_tiles_is_a_warps_or_its_blocks(block_x, first, last):
    """A warp's first column from ``ix`` less its lane's columns where a warp is 32 threads of
    one row (blocks a multiple of 32 wide), else from the block's first thread; the last
    column 31 (or the block's width less one) threads of 4 columns on."""
    from kfuse.codegen.kernels import _warp_edge_test

    lines, conditions = _warp_edge_test(block_x, 4, 4, 4, "n_img_1")
    assert f"const int warp_ix = ix - (int)({first}) * 4;" in lines
    assert f"const int warp_ix_last = warp_ix + {last};" in lines
    assert conditions == ["warp_ix >= 4", "warp_ix_last + 8 <= n_img_1"]
    assert _warp_edge_test(block_x, 4, 0, 0, "n_img_1") == ([], [])
    assert _warp_edge_test(block_x, 4, 0, 4, "n")[1] == ["warp_ix_last + 8 <= n"]


def test_statement_keys_name_their_operands_so_they_stay_flat():
    """A chain of 3000 additions emits 3000 statements whose keys name the statement before
    by its name: each key is a few levels deep, however long the chain (keys holding their
    operands' keys whole made generation quadratic), and equal keys mean equal text."""
    from kfuse.codegen.cexpr import ExprEmitter

    p = kf.Pipeline("chain_keys")
    v = p.input("v", ndim=1)
    total = v
    for index in range(1, 3000):
        total = total + v.at(index % 7 - 3) * float(index % 5 + 1)
    p.output(kf.local(total, boundary="mirror", name="s"))
    graph = p.graph()
    emitter = ExprEmitter(graph, (("i", 0),), graph.kernels[0].domain)
    emitter.emit(graph.kernels[0].body)

    def depth(key: object) -> int:
        return 1 + max((depth(part) for part in key if isinstance(part, tuple)), default=0) \
            if isinstance(key, tuple) else 0

    statements = emitter.state.statements
    assert len(statements) > 3000
    assert max(depth(statement.key) for statement in statements) <= 3
    texts: dict[tuple, str] = {}
    for statement in statements:  # one text per key
        assert texts.setdefault(statement.key, statement.text) == statement.text
