"""The defects a hostile test of kfuse found (issue 28), each kept as a test.

Every input here once gave a wrong answer, a raw traceback from inside kfuse, or a pipeline
that did not compile; each must now give the right result or a named KfuseError. Random
data throughout, checked against NumPy.
"""

from __future__ import annotations

import runpy

import numpy as np
import pytest

import kfuse as kf
from kfuse.codegen import generate
from kfuse.codegen.cexpr import c_name, comment_text, size_var

RNG = np.random.default_rng(28)


def random(*shape: int, dtype=np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


# -- 1. nothing the user controls reaches generated code unescaped ---------------------------

@pytest.mark.integration
def test_a_file_name_with_a_newline_stays_inside_its_comment(tmp_path):
    """A script whose file name holds a newline and C code: the code stays in the comment
    (it once ran as a constructor when the cpu backend loaded the library)."""
    injected = 'int kf_injected(void) __attribute__((constructor)); int kf_tail'
    script = tmp_path / f"evil\n{injected}.py"
    script.write_text("import kfuse as kf\n"
                      "p = kf.Pipeline('evil')\n"
                      "x = p.input('x', ndim=1)\n"
                      "p.output(kf.point(x * 2.0 + 1.0, name='y'))\n")
    pipeline = runpy.run_path(str(script))["p"]
    source = generate(pipeline.graph()).source
    assert not any(line.startswith("int kf_injected") for line in source.splitlines())
    assert "evil\\n" in source  # written as an escape, inside the comment
    x = random(37)
    np.testing.assert_allclose(pipeline.run(x=x, backend="cpu")["y"], x * 2 + 1, rtol=1e-6)


@pytest.mark.integration
def test_a_line_ending_in_a_backslash_does_not_swallow_the_next_line_of_code(tmp_path):
    script = tmp_path / "continued.py"
    script.write_text("import kfuse as kf\n"
                      "p = kf.Pipeline('continued')\n"
                      "x = p.input('x', ndim=1)\n"
                      "y = kf.point(x * 3.0, \\\n"
                      "             name='y')\n"
                      "p.output(y)\n")
    pipeline = runpy.run_path(str(script))["p"]
    x = random(23)
    np.testing.assert_allclose(pipeline.run(x=x, backend="cpu")["y"], x * 3, rtol=1e-6)


def test_comment_text_escapes_what_could_end_a_comment():
    assert comment_text("a\nb\r\x00") == "a\\nb\\r\\x00"
    assert not comment_text("line \\").rstrip().endswith("\\")
    assert comment_text("plain.py:3: y = f(x)") == "plain.py:3: y = f(x)"


# -- 2. deep expressions -------------------------------------------------------------------

def test_a_25_by_25_convolution_and_a_sum_of_3000_taps_are_not_too_deep():
    """Built, generated as CUDA C and evaluated by the numpy backend without reaching
    Python's recursion limit (the C compiler is not the subject: a 625-tap kernel takes it a
    minute)."""
    p = kf.Pipeline("deep")
    x = p.input("x", ndim=2)
    mask = RNG.random((25, 25))
    p.output(kf.convolve(x, mask, boundary="mirror", name="y"))
    image = random(31, 29)
    assert "kf_mirror" in generate(p.graph()).source
    padded = np.pad(image.astype(np.float64), 12, mode="symmetric")
    expected = sum(mask[i, j] * padded[i:i + 31, j:j + 29] for i in range(25) for j in range(25))
    np.testing.assert_allclose(p.run(x=image, backend="numpy")["y"], expected, rtol=2e-4,
                               atol=2e-4)
    q = kf.Pipeline("taps")
    v = q.input("v", ndim=1)
    total = v
    for index in range(1, 3000):
        total = total + v.at(index % 7 - 3) * float(index % 5)
    q.output(kf.local(total, name="s"))
    assert generate(q.graph()).launches
    vector = random(50)
    assert np.isfinite(q.run(v=vector, backend="numpy")["s"]).all()


# -- 3. integer constants that do not fit int32 --------------------------------------------

def test_an_integer_constant_beyond_int32_is_refused_as_numpy_refuses_it():
    p = kf.Pipeline("overflow")
    x = p.input("x", ndim=1, dtype="int32")
    with pytest.raises(kf.DtypeError, match="does not fit int32"):
        kf.point(x + 2**40, name="y")
    with pytest.raises(kf.DtypeError, match="does not fit int32"):
        kf.point(x * -(2**31) - 2**31, name="z")
    kf.point(x + (2**31 - 1), name="fits")  # the largest int32 is fine


# -- 4. names that collide or that the headers take ----------------------------------------

@pytest.mark.integration
def test_kernel_symbols_that_spell_alike_stay_apart():
    p = kf.Pipeline("c")
    x = p.input("x", ndim=1)
    a = kf.point(x + 1.0, name="a")
    b = kf.point(a * 2.0, name="b")
    ab = kf.point(x * 3.0, name="a_b")
    p.output(b, ab)
    v = random(17)
    result = p.run(x=v, backend="cpu", plan=p.fuse([["a", "b"]]))
    np.testing.assert_allclose(result["b"], (v + 1) * 2, rtol=1e-6)
    np.testing.assert_allclose(result["a_b"], v * 3, rtol=1e-6)
    q = kf.Pipeline("unicode")
    y = q.input("y", ndim=1)
    q.output(kf.point(y + 1.0, name="a·b"), kf.point(y * 2.0, name="a_b"))
    result = q.run(y=v, backend="cpu")
    np.testing.assert_allclose(result["a·b"], v + 1, rtol=1e-6)
    np.testing.assert_allclose(result["a_b"], v * 2, rtol=1e-6)


def test_c_names_and_size_variables_are_one_to_one():
    names = ["a·b", "a_b", "a_b_buf", "int", "int_buf", "errno", "π", "x", "n", "M_PIf"]
    assert len({c_name(n) for n in names}) == len(names)
    symbols = ["a.b", "a_b", "x.0", "x_0", "x_0_s", "23", "π.0", "n"]
    assert len({size_var(s) for s in symbols}) == len(symbols)
    assert size_var("x.0") == "n_x_0" and size_var("23") == "n_23"


@pytest.mark.integration
@pytest.mark.parametrize("name", ["errno", "math_errhandling", "M_PIf", "SYS_read", "stdin",
                                  "assert", "offsetof"])
def test_names_the_host_headers_define_as_macros_compile(name):
    p = kf.Pipeline("macros")
    x = p.input(name, ndim=2)
    p.output(kf.local(x.at(0, 1) + x, name="out"))
    image = random(9, 11)
    expected = p.run(**{name: image}, backend="numpy")["out"]
    np.testing.assert_allclose(p.run(**{name: image}, backend="cpu")["out"], expected,
                               rtol=1e-6)


@pytest.mark.integration
def test_size_symbols_that_spell_alike_stay_apart():
    p = kf.Pipeline("sizes")
    x = p.input("x", shape=("a.b",))
    y = p.input("y", shape=("a_b",))
    p.output(kf.point(x * 2.0, name="u"), kf.point(y * 3.0, name="v"))
    u, v = random(4), random(7)
    result = p.run(x=u, y=v, backend="cpu")
    np.testing.assert_allclose(result["u"], u * 2, rtol=1e-6)
    np.testing.assert_allclose(result["v"], v * 3, rtol=1e-6)


# -- 5. a broadcast view too large to copy ---------------------------------------------------

@pytest.mark.parametrize("backend", ["cpu", "numpy"])
def test_a_broadcast_view_too_large_to_copy_is_a_named_error(backend):
    p = kf.Pipeline("view")
    x = p.input("x", ndim=2)
    p.output(kf.point(x * 2.0, name="y"))
    view = np.broadcast_to(random(10**5), (10**6, 10**5))  # 373 GiB as a whole array
    with pytest.raises(kf.OutOfMemory, match="stride of 0"):
        p.run(x=view, backend=backend)


@pytest.mark.integration
def test_a_small_broadcast_view_is_computed():
    p = kf.Pipeline("small_view")
    x = p.input("x", ndim=2)
    p.output(kf.point(x * 2.0, name="y"))
    row = random(13)
    view = np.broadcast_to(row, (5, 13))
    np.testing.assert_allclose(p.run(x=view, backend="cpu")["y"], view * 2, rtol=1e-6)


# -- 8. x ** 0.5 is NumPy's square root -------------------------------------------------------

@pytest.mark.integration
@pytest.mark.parametrize("backend", ["cpu", "numpy"])
def test_the_power_one_half_is_the_square_root_at_every_special_value(backend):
    p = kf.Pipeline("half")
    x = p.input("x", ndim=1)
    p.output(kf.point(x ** 0.5, name="y"))
    values = np.concatenate([np.array([-np.inf, -0.0, 0.0, np.inf, np.nan, -1.0], np.float32),
                             np.abs(random(11))])
    with np.errstate(invalid="ignore"):
        expected = values ** 0.5
    result = p.run(x=values, backend=backend)["y"]
    np.testing.assert_array_equal(np.signbit(result), np.signbit(expected))
    np.testing.assert_allclose(result, expected, rtol=1e-6, equal_nan=True)


# -- 9. whose code a frame is -------------------------------------------------------------------

def test_a_script_beside_the_package_in_a_folder_named_like_it_is_the_users(tmp_path):
    from kfuse import user_line

    package = user_line._PACKAGE_DIR
    beside = package + "_scripts/x.py"  # /.../kfuse_scripts/x.py next to /.../kfuse
    assert user_line._place(beside) == "user"
    assert user_line._place(package + "/fusion/plan.py") == "kfuse"


# -- 10. messages ---------------------------------------------------------------------------------

def test_an_unsupported_dtype_names_the_line_once():
    p = kf.Pipeline("dtype")
    x = p.input("x", ndim=1)
    p.output(kf.point(x * 2.0, name="y"))
    with pytest.raises(kf.BindError) as raised:
        p.run(x=np.ones(3, np.complex64), backend="cpu")
    assert str(raised.value).count(" at ") <= 1 and "complex64" in str(raised.value)


def test_an_empty_group_is_refused():
    p = kf.Pipeline("empty")
    x = p.input("x", ndim=1)
    p.output(kf.point(x * 2.0, name="y"))
    with pytest.raises(kf.FusionError, match="empty group"):
        p.fuse([[]])


@pytest.mark.integration
def test_an_input_named_with_a_greek_letter_runs():
    p = kf.Pipeline("greek")
    x = p.input("π", ndim=1)
    p.output(kf.point(x * 2.0, name="τ"))
    v = random(6)
    np.testing.assert_allclose(p.run(**{"π": v}, backend="cpu")["τ"], v * 2, rtol=1e-6)


def test_a_point_operator_without_an_array_read_as_it_is_says_what_to_do():
    p = kf.Pipeline("dims")
    v = p.input("v", ndim=1)
    with pytest.raises(kf.DslError, match="read one array as it is") as raised:
        kf.point(v.at(0, dims=(1,)) * 2.0, name="y")
    assert "shape=" not in str(raised.value)


# -- 6. codeless application descriptions ----------------------------------------------------

APP = """format: kfuse-app/1
name: bad
device: k20x
arrays:
  - {name: A, dtype: float64, shape: [1024]}
  - {name: B, dtype: float64, shape: [1024]}
kernels:
  - name: k1
    runtime_us: RUNTIME
    accesses:
      - {array: A, access: read, thread_load: LOAD}
      - {array: B, access: write}
"""


@pytest.mark.parametrize(("runtime", "load", "field"), [
    (".nan", "1", "runtime_us"), ("10", ".inf", "thread_load"), ("-.inf", "1", "runtime_us")])
def test_a_description_with_a_number_that_is_not_finite_is_refused(tmp_path, runtime, load,
                                                                  field):
    from kfuse.errors import MetadataError
    from kfuse.project.metadata import load_app

    path = tmp_path / "app.yaml"
    path.write_text(APP.replace("RUNTIME", runtime).replace("LOAD", load))
    with pytest.raises(MetadataError, match=f"{field}.*not a finite number"):
        load_app(path)


def test_a_description_with_aliases_is_refused_before_it_expands(tmp_path):
    from kfuse.errors import MetadataError
    from kfuse.project.metadata import load_app

    levels = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for index, name in enumerate("bcdefghi"):
        previous = "abcdefghi"[index]
        levels.append(f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join([*levels, "name: bomb", "kernels: [*i]"]) + "\n")
    with pytest.raises(MetadataError, match="alias"):
        load_app(path)


def test_a_kernel_after_itself_is_refused(tmp_path):
    from kfuse.errors import MetadataError
    from kfuse.project.metadata import load_app

    path = tmp_path / "self.yaml"
    path.write_text(APP.replace("RUNTIME", "10\n    after: [k1]").replace("LOAD", "1"))
    with pytest.raises(MetadataError, match="cannot come after itself"):
        load_app(path)


# -- 7. what the cache holds -----------------------------------------------------------------

@pytest.mark.parametrize("corrupt", ["directory", "zero bandwidth", "not json", "a list"])
def test_a_corrupt_device_profile_is_named_and_planning_goes_on(tmp_path, monkeypatch, corrupt,
                                                                caplog):
    from kfuse.model import device

    monkeypatch.setenv("KFUSE_CACHE_DIR", str(tmp_path))
    latest = tmp_path / "devices" / device.LATEST
    latest.parent.mkdir(parents=True)
    if corrupt == "directory":
        latest.mkdir()
    elif corrupt == "zero bandwidth":
        profile = device.default_profile().to_dict() | {"copy_bandwidth_bytes_per_s": 0}
        latest.write_text(__import__("json").dumps(profile))
    else:
        latest.write_text("{not json" if corrupt == "not json" else "[1, 2]")
    monkeypatch.setattr(device, "_VISIBLE_GPU_SOURCE", [])
    with pytest.raises(kf.CacheError, match="not a usable device profile"):
        device.DeviceProfile.load()
    with caplog.at_level("WARNING", logger="kfuse"):
        profile = device.current_profile()
    assert profile.copy_bandwidth_bytes_per_s > 0 and "not a usable" in caplog.text
    p = kf.Pipeline("plan_anyway")
    x = p.input("x", ndim=2)
    p.output(kf.local(x.at(0, 1) + x, name="y"))
    assert p.plan().groups


@pytest.mark.integration
def test_a_read_only_cache_serves_the_libraries_it_holds(monkeypatch):
    from kfuse.errors import CacheError
    from kfuse.runtime import host_compiler

    def build() -> kf.Pipeline:  # the same source each time (the same lines)
        p = kf.Pipeline("read_only")
        x = p.input("x", ndim=1)
        p.output(kf.point(x * 5.0 - 1.0, name="y"))
        return p

    v = random(9)
    np.testing.assert_allclose(build().run(x=v, backend="cpu")["y"], v * 5 - 1, rtol=1e-6)

    def refuse(kind):
        raise CacheError(f"the cache folder for {kind} is not writable")

    monkeypatch.setattr(host_compiler, "writable_cache_dir", refuse)
    monkeypatch.setattr(host_compiler, "_loaded", {})  # (loaded again, from the cache)
    np.testing.assert_allclose(build().run(x=v, backend="cpu")["y"], v * 5 - 1, rtol=1e-6)


# -- 12. choices are said --------------------------------------------------------------------

def test_the_backend_auto_chose_is_logged_with_the_reason(caplog, monkeypatch):
    from kfuse.runtime import get_backend
    from kfuse.runtime.cuda_backend import CudaBackend

    monkeypatch.setattr(CudaBackend, "unavailable_reason",
                        classmethod(lambda cls: "the cuda backend needs CuPy"))
    with caplog.at_level("INFO", logger="kfuse"):
        backend = get_backend("auto")
    assert backend.name == "cpu"
    assert "'cuda' cannot run (the cuda backend needs CuPy)" in caplog.text


def test_kfuse_log_prints_what_kfuse_does(tmp_path):
    import os
    import subprocess
    import sys

    script = ("import numpy as np, kfuse as kf\n"
              "p = kf.Pipeline('logged'); x = p.input('x', ndim=1)\n"
              "p.output(kf.point(x * 2.0, name='y'))\n"
              "p.run(x=np.ones(3, np.float32), backend='numpy')\n"
              "p.plan()\n")
    environment = {**os.environ, "KFUSE_LOG": "info", "KFUSE_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=environment, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "kfuse INFO: planned 'logged'" in done.stderr
    quiet = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           env={**environment, "KFUSE_LOG": ""}, timeout=300, check=False)
    assert "INFO" not in quiet.stderr


def test_the_command_line_says_its_version():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "kfuse", "--version"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip() == f"kfuse {kf.__version__}"
