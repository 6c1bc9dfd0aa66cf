"""Compiled pipelines (``Pipeline.compile``, ``Pipeline.run``, ``@kfuse.jit``) on the cpu
backend: what a call builds and what it reuses, signatures, threads, ``out=``, the disk
caches. Results are checked against the float64 NumPy reference on random data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import kfuse as kf
from kfuse.apps.check import relative_error
from kfuse.runtime.numpy_backend import NumpyBackend


def cpu_or_skip() -> None:
    if not _cpu_available():
        pytest.skip("no host C++ compiler")


def _cpu_available() -> bool:
    from kfuse.runtime.cpu_backend import CpuBackend
    return CpuBackend.available()


@pytest.fixture
def cache(monkeypatch, tmp_path) -> Path:
    """An empty cache folder of this test's own (nothing stored by other tests)."""
    monkeypatch.setenv("KFUSE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def blur_pipeline(name: str = "blur_scaled") -> kf.Pipeline:
    """A stencil, a point operator and a parameter: two operators the plan fuses."""
    p = kf.Pipeline(name)
    x = p.input("x", ndim=2)
    s = p.param("s")
    blur = kf.convolve(x, np.ones((3, 3)) / 9.0, boundary="mirror", name="blur")
    p.output(kf.point(blur * s + x, name="sharp"))
    return p


def reference(pipeline: kf.Pipeline, given: dict) -> dict:
    return NumpyBackend(precision="float64").run(pipeline.graph(), given)


def assert_matches(out: dict, want: dict, tolerance: float = 1e-5) -> None:
    assert set(out) == set(want)
    for name in want:
        assert relative_error(np.asarray(out[name]), want[name]) <= tolerance, name


def test_a_second_call_plans_generates_and_compiles_nothing(cache, rng):
    cpu_or_skip()
    p = blur_pipeline()
    compiled = p.compile(backend="cpu")
    x = rng.random((23, 31), dtype=np.float32)
    first = compiled(x=x, s=0.5)
    after_first = compiled.stats.as_dict()
    assert after_first["misses"] == 1 and after_first["plans"] == 1
    assert after_first["generated"] == 1 and after_first["compiles"] >= 1
    second = compiled(x=x, s=2.0)
    after_second = compiled.stats.as_dict()
    assert after_second["hits"] == 1 and after_second["misses"] == 1
    for counter in ("plans", "generated", "stored", "compiles"):
        assert after_second[counter] == after_first[counter], counter
    assert_matches(first, reference(p, {"x": x, "s": 0.5}))
    assert_matches(second, reference(p, {"x": x, "s": 2.0}))


def test_pipeline_run_goes_through_one_compiled_pipeline(cache, rng):
    cpu_or_skip()
    p = blur_pipeline()
    x = rng.random((17, 12), dtype=np.float32)
    for scale in (0.25, 4.0):
        assert_matches(p.run(backend="cpu", x=x, s=scale), reference(p, {"x": x, "s": scale}))
    stats = p.compiled_run("cpu", "auto").stats
    assert (stats.calls, stats.hits, stats.misses, stats.plans) == (2, 1, 1, 1)


def test_a_call_holds_buffers_only_for_what_crosses_kernels(cache, rng):
    """An operator fused into a kernel has no buffer in the call's workspace (a fused
    Harris held eight unused images a stream); one that two kernels pass has."""
    cpu_or_skip()
    p = blur_pipeline()
    x = rng.random((19, 27), dtype=np.float32)
    held = {}
    for plan in ("auto", "unfused"):
        compiled = p.compile(backend="cpu", plan=plan)
        assert_matches(compiled(x=x, s=0.5), reference(p, {"x": x, "s": 0.5}))
        (signature,) = compiled._signatures.values()
        held[plan] = [name for name, _, _ in signature.intermediates]
    assert held == {"auto": [], "unfused": ["blur"]}


@pytest.mark.parametrize("change", ["shape", "dtype", "strides", "alignment", "param type"])
def test_a_new_signature_compiles_again(change, cache, rng):
    """Each part of the signature, changed alone, is a miss, and the result stays right."""
    cpu_or_skip()
    p = kf.Pipeline(f"sig_{change.replace(' ', '_')}")
    x = p.input("x", ndim=1, dtype="float64" if change == "dtype" else "float32")
    s = p.param("s", "float64" if change == "param type" else "float32")
    p.output(kf.local(x.at(-1) + x.at(1) * s, boundary="clamp", name="y"))
    compiled = p.compile(backend="cpu")
    dtype = np.float64 if change == "dtype" else np.float32
    base = rng.random(64, dtype=np.float64).astype(dtype)
    others = {"shape": (base[:40], 0.5), "dtype": (base, 0.5),
              "strides": (base[::2], 0.5), "alignment": (base[1:], 0.5),
              "param type": (base, np.float64(0.5))}
    compiled(x=base, s=0.5)
    compiled(x=base, s=0.5)
    assert compiled.stats.misses == 1
    if change == "dtype":  # an int32 array for a float64 input: refused by name
        with pytest.raises(kf.BindError, match="'x' is declared float64"):
            compiled(x=base.astype(np.int32), s=0.5)
        return
    array, scale = others[change]
    out = compiled(x=array, s=scale)
    assert compiled.stats.misses == 2
    assert_matches(out, reference(p, {"x": np.ascontiguousarray(array), "s": scale}))


def test_two_threads_calling_one_compiled_pipeline_get_their_own_results(cache, rng):
    cpu_or_skip()
    p = blur_pipeline()
    compiled = p.compile(backend="cpu")
    inputs = [rng.random((29, 33), dtype=np.float32) for _ in range(4)]
    compiled(x=inputs[0], s=1.0)  # compiled before the threads start,
    compiled(x=inputs[0], s=1.0)  # and known to the C call path where it is built
    results: dict[int, list] = {index: [] for index in range(len(inputs))}
    barrier = threading.Barrier(len(inputs))

    def work(index: int) -> None:
        barrier.wait()
        for _ in range(5):
            results[index].append(compiled(x=inputs[index], s=float(index)))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for index, outs in results.items():
        want = reference(p, {"x": inputs[index], "s": float(index)})
        assert len(outs) == 5
        for out in outs:
            assert_matches(out, want)
    from kfuse.runtime import native
    if native.module() is not None:  # threads took the C path (and, when it was busy,
        assert compiled.stats.native > 1  # launched on workspaces of their own)


def test_out_writes_into_the_callers_arrays(cache, rng):
    cpu_or_skip()
    p = blur_pipeline()
    compiled = p.compile(backend="cpu")
    x = rng.random((21, 19), dtype=np.float32)
    target = np.full((21, 19), np.nan, np.float32)
    out = compiled(x=x, s=0.5, out={"sharp": target})
    assert out["sharp"] is target
    assert_matches({"sharp": target}, reference(p, {"x": x, "s": 0.5}))
    single = np.zeros_like(target)
    assert p.run(backend="cpu", x=x, s=0.5, out=single)["sharp"] is single
    assert_matches({"sharp": single}, reference(p, {"x": x, "s": 0.5}))


@pytest.mark.parametrize(("bad", "error", "message"), [
    (lambda t: {"sharp": t[:, :5]}, kf.ShapeError, "has shape"),
    (lambda t: {"sharp": t.astype(np.float64)}, kf.DtypeError, "is float64"),
    (lambda t: {"sharp": np.asfortranarray(t)}, kf.BindError, "C-contiguous"),
    (lambda t: {"blur": t}, kf.BindError, "not an output"),
    (lambda t: {"sharp": [[0.0]]}, kf.BindError, "expected an array"),
])
def test_bad_out_arrays_get_named_errors(bad, error, message, cache, rng):
    cpu_or_skip()
    p = blur_pipeline()
    x = rng.random((21, 19), dtype=np.float32)
    target = np.zeros((21, 19), np.float32)
    with pytest.raises(error, match=message):
        p.run(backend="cpu", x=x, s=0.5, out=bad(target))


def test_least_recently_used_signatures_are_let_go(cache, rng):
    cpu_or_skip()
    p = blur_pipeline()
    compiled = p.compile(backend="cpu", max_signatures=2)
    for rows in (8, 9, 10, 8):
        compiled(x=rng.random((rows, 7), dtype=np.float32), s=1.0)
    assert compiled.cache_info()["signatures"] == 2
    assert compiled.stats.evicted == 2 and compiled.stats.misses == 4
    with pytest.raises(kf.BindError, match="max_signatures"):
        p.compile(backend="cpu", max_signatures=0)


def test_a_pipeline_built_again_reads_its_program_from_disk(cache, rng):
    """A second pipeline of the same definition (as in a new process) plans and generates
    nothing: the program is stored under the graph's structural fingerprint."""
    cpu_or_skip()
    x = rng.random((15, 26), dtype=np.float32)
    first = blur_pipeline().compile(backend="cpu")
    first(x=x, s=1.5)
    again = blur_pipeline().compile(backend="cpu")
    out = again(x=x, s=1.5)
    assert (again.stats.stored, again.stats.plans, again.stats.generated) == (1, 0, 0)
    assert_matches(out, reference(blur_pipeline(), {"x": x, "s": 1.5}))
    other = kf.Pipeline("blur_scaled")  # the same names, another constant: another program
    y = other.input("x", ndim=2)
    s = other.param("s")
    blur = kf.convolve(y, np.ones((3, 3)) / 8.0, boundary="mirror", name="blur")
    other.output(kf.point(blur * s + y, name="sharp"))
    assert other.graph().fingerprint != blur_pipeline().graph().fingerprint
    changed = other.compile(backend="cpu")
    changed(x=x, s=1.5)
    assert changed.stats.generated == 1


def test_a_fresh_process_with_a_warm_cache_plans_and_compiles_nothing(cache, tmp_path):
    cpu_or_skip()
    script = tmp_path / "user.py"
    script.write_text(
        "import json, numpy as np, kfuse as kf\n"
        "from kfuse.apps import get_app\n"
        "app = get_app('harris')\n"
        "inputs, params = app.make_inputs((40, 50), np.random.default_rng(3), 'float32')\n"
        "compiled = app.build().compile(backend='cpu')\n"
        "out = compiled(**inputs, **params)['hc']\n"
        "print(json.dumps({**compiled.stats.as_dict(), 'sum': float(np.sum(out))}))\n")
    environment = {**os.environ, "KFUSE_CACHE_DIR": str(cache)}
    runs = [json.loads(subprocess.run([sys.executable, str(script)], env=environment,
                                      capture_output=True, text=True, check=True,
                                      timeout=600).stdout) for _ in range(2)]
    assert runs[0]["generated"] == 1 and runs[0]["compiles"] == 1
    assert runs[1]["stored"] == 1
    assert (runs[1]["plans"], runs[1]["generated"], runs[1]["compiles"]) == (0, 0, 0)
    assert runs[0]["sum"] == runs[1]["sum"]


def test_corrupt_cache_entries_are_rebuilt(cache, rng, tmp_path):
    """A stored program truncated and its library emptied: a new process generates and
    compiles them again, and computes the right values. (The library is replaced by an empty
    file rather than truncated in place: this process has it loaded, and a mapped library
    truncated under it faults.)"""
    cpu_or_skip()
    x = rng.random((11, 13), dtype=np.float32)
    blur_pipeline().compile(backend="cpu")(x=x, s=1.0)
    for path in (cache / "programs").glob("*.json"):
        path.write_text("{ truncated")
    for path in (cache / "cpu").glob("blur_scaled*.so"):
        empty = path.with_suffix(".empty")
        empty.write_bytes(b"")
        os.replace(empty, path)
    np.save(tmp_path / "x.npy", x)
    script = tmp_path / "again.py"
    script.write_text(
        "import json, sys, numpy as np\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_compiled import blur_pipeline\n"
        f"x = np.load({str(tmp_path / 'x.npy')!r})\n"
        "again = blur_pipeline().compile(backend='cpu')\n"
        "out = again(x=x, s=1.0)['sharp']\n"
        f"np.save({str(tmp_path / 'out.npy')!r}, out)\n"
        "print(json.dumps(again.stats.as_dict()))\n")
    environment = {**os.environ, "KFUSE_CACHE_DIR": str(cache)}
    stats = json.loads(subprocess.run([sys.executable, str(script)], env=environment,
                                      capture_output=True, text=True, check=True,
                                      timeout=600).stdout)
    assert stats["generated"] == 1 and stats["compiles"] == 1, stats
    assert_matches({"sharp": np.load(tmp_path / "out.npy")},
                   reference(blur_pipeline(), {"x": x, "s": 1.0}))


def test_the_cache_folder_is_bounded_least_recently_used_first(cache, monkeypatch):
    from kfuse.cache import cache_root, evict

    folder = cache / "programs"
    folder.mkdir(parents=True)
    for index in range(5):
        path = folder / f"{index}.json"
        path.write_bytes(b"x" * 1000)
        os.utime(path, (1000 + index, 1000 + index))
    os.utime(folder / "0.json")  # used just now: kept
    assert cache_root() == cache
    assert evict(2500) == 3
    assert sorted(p.name for p in folder.iterdir()) == ["0.json", "4.json"]
    monkeypatch.setenv("KFUSE_CACHE_MAX_BYTES", "lots")
    with pytest.raises(kf.CacheError, match="KFUSE_CACHE_MAX_BYTES"):
        evict()


def test_the_cache_follows_xdg_cache_home(monkeypatch, tmp_path):
    from kfuse.cache import cache_dir

    monkeypatch.delenv("KFUSE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir("cuda") == tmp_path / "kfuse" / "cuda"


def test_jit_equals_the_builder_and_numpy(cache, rng):
    cpu_or_skip()

    @kf.jit(backend="cpu")
    def sharpen(x, s):
        blur = kf.convolve(x, np.ones((3, 3)) / 9.0, boundary="mirror")
        return kf.point(blur * s + x)

    @kf.jit(backend="cpu")
    def gradients(img):
        dx = kf.local(img.at(0, 1) - img.at(0, -1), boundary=kf.constant(0.0))
        dy = kf.local(img.at(1, 0) - img.at(-1, 0), boundary="repeat")
        return {"magnitude": kf.point(kf.sqrt(dx * dx + dy * dy)), "dx": dx}

    x = rng.random((27, 35), dtype=np.float32)
    builder = blur_pipeline().run(backend="cpu", x=x, s=0.75)["sharp"]
    traced = sharpen(x, 0.75)
    assert relative_error(traced, builder) <= 1e-6
    assert_matches({"sharp": traced}, reference(blur_pipeline(), {"x": x, "s": 0.75}))
    both = gradients(x)
    padded = np.pad(x.astype(np.float64), 1, mode="constant")
    dx = padded[1:-1, 2:] - padded[1:-1, :-2]
    wrapped = np.pad(x.astype(np.float64), 1, mode="wrap")
    dy = wrapped[2:, 1:-1] - wrapped[:-2, 1:-1]
    assert set(both) == {"magnitude", "dx"}
    assert relative_error(both["dx"], dx) <= 1e-6
    assert relative_error(both["magnitude"], np.sqrt(dx * dx + dy * dy)) <= 1e-5
    sharpen(x, 0.75)
    assert sharpen.stats.hits == 1 and sharpen.stats.misses == 1
    sharpen(x.astype(np.float64), 0.75)  # another dtype: traced again
    assert len(sharpen.traces) == 2


def test_jit_returns_tuples_and_names_operators_without_the_source(cache, rng):
    cpu_or_skip()
    source = ("import kfuse as kf\n"
              "def pair(a, b):\n"
              "    total = kf.point(a + b)\n"
              "    return total, kf.point(total * a)\n")
    namespace: dict = {}
    exec(compile(source, "<generated>", "exec"), namespace)
    pair = kf.jit(backend="cpu")(namespace["pair"])
    a, b = rng.random(50, dtype=np.float32), rng.random(50, dtype=np.float32)
    total, product = pair(a, b)
    assert relative_error(total, a.astype(np.float64) + b) <= 1e-6
    assert relative_error(product, (a.astype(np.float64) + b) * a) <= 1e-6
    ((compiled, _),) = pair.traces.values()
    assert [k.name for k in compiled.graph.kernels] == ["point", "point_2"]


def test_jit_refuses_what_it_cannot_trace(cache):
    with pytest.raises(kf.DslError, match=r"\*args"):
        kf.jit(lambda *args: args[0])

    @kf.jit(backend="cpu")
    def nothing(x):
        return 3.0

    with pytest.raises(kf.DslError, match="must return arrays"):
        nothing(np.ones(4, np.float32))
    with pytest.raises(kf.BindError, match="must be an array or a number"):
        nothing("text")
    with pytest.raises(kf.BindError, match="needs 'x'"):
        nothing()
