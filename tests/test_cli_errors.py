"""Bad command lines get a one-line error and a non-zero exit, never a traceback.

Each test reproduces a reported (or found) crash of the ``kfuse`` command. Errors kfuse
raises print as ``kfuse: error: ...`` with exit code 2; argparse refuses malformed options
itself (``SystemExit(2)`` and a usage line). Everything here runs on the cpu/numpy backends
at small sizes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kfuse.cli.main import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of ``kfuse argv...``."""
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def refused_by_argparse(capsys, *argv: str) -> str:
    """stderr of a command line argparse refuses (exit code 2)."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def assert_clean_error(code: int, err: str, *fragments: str) -> None:
    """One ``kfuse: error:`` line naming every fragment, exit code 2, no traceback."""
    assert code == 2
    assert err.startswith("kfuse: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert not re.search(r"\bat [\w<>]+\.py:\d+", err), err  # no line of kfuse's own code
    for fragment in fragments:
        assert fragment in err, (fragment, err)


# --size ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("command", "app", "size", "form"), [
    ("run", "atax", "75", "a matrix sequence takes a size M x N, got 75"),
    ("plan", "atax", "75", "a matrix sequence takes a size M x N, got 75"),
    ("run", "axpydot", "3x1", "a vector sequence takes a size n, got 3x1"),
    ("plan", "sscal", "3x1", "a vector sequence takes a size n, got 3x1"),
    ("plan", "vadd", "3x1", "a vector sequence takes a size n, got 3x1"),
    ("plan", "waxpby", "3x1", "a vector sequence takes a size n, got 3x1"),
    ("run", "gesummv", "31", "a matrix sequence takes a size M x N, got 31"),
    ("plan", "madd", "31", "a matrix sequence takes a size M x N, got 31"),
    ("run", "sobel", "5", "sobel takes a 2-D size like 37x53, got 5"),
    ("plan", "diffusion3d", "8x8", "diffusion3d takes a 3-D size like 13x11x9, got 8x8"),
])
def test_a_size_of_the_wrong_rank_names_what_fits(capsys, command, app, size, form):
    extra = ["--backend", "numpy"] if command == "run" else []
    code, _, err = run_cli(capsys, command, app, "--size", size, *extra)
    assert_clean_error(code, err, form)


def test_model_check_checks_the_size_too(capsys):
    code, _, err = run_cli(capsys, "model-check", "atax", "--no-measure", "--size", "7")
    assert_clean_error(code, err, "a matrix sequence takes a size M x N")


@pytest.mark.parametrize("size", ["x", "", ",", "3x-4", "0x5"])
def test_a_size_without_positive_numbers_is_refused(capsys, size):
    """``--size x`` used to fall back to the default size silently; ``-3``/``0`` reached
    the binding or NumPy."""
    code, _, err = run_cli(capsys, "run", "sobel", "--backend", "numpy", f"--size={size}")
    assert_clean_error(code, err, "size")


def test_a_size_too_big_to_allocate_is_reported(capsys):
    code, _, err = run_cli(capsys, "run", "sobel", "--backend", "numpy",
                           "--size", "99999999999x99999999999")
    assert_clean_error(code, err, "cannot make sobel's inputs at size 99999999999x99999999999")


# numbers: seeds, counts, tolerances --------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ("run", "sobel", "--backend", "cpu", "--seed", "-1"),
    ("plan", "sobel", "--strategy", "gga", "--seed", "-1"),
    ("project", "app.yaml", "--seed", "-1"),
    ("synth", "--seed", "-1"),
    ("fidelity", "--seed", "-1"),
])
def test_negative_seeds_are_refused(capsys, argv):
    """NumPy's generators take no negative seed (``kfuse run --seed -1`` was a traceback);
    every ``--seed`` takes the same range."""
    err = refused_by_argparse(capsys, *argv)
    assert "argument --seed: expected a non-negative integer, got '-1'" in err


@pytest.mark.parametrize(("argv", "message"), [
    (("fidelity", "--instances", "0"), "--instances: expected a positive integer, got '0'"),
    (("fidelity", "--instances", "-2"), "--instances: expected a positive integer"),
    (("fidelity", "--tolerance", "-0.1"), "--tolerance: expected a non-negative number"),
    (("fidelity", "--tolerance", "nan"), "--tolerance: expected a non-negative number"),
    (("run", "sobel", "--autotune", "-1"), "--autotune: expected a non-negative integer"),
    (("bench", "sobel", "--autotune", "-3"), "--autotune: expected a non-negative integer"),
    (("run", "sobel", "--seed", "1.5"), "--seed: expected a non-negative integer, got '1.5'"),
])
def test_counts_out_of_range_are_refused(capsys, argv, message):
    """``fidelity --instances 0`` printed an empty table."""
    assert message in refused_by_argparse(capsys, *argv)


# files -------------------------------------------------------------------------------------

@pytest.fixture
def no_gpu(monkeypatch):
    """A machine without CuPy, even where there is one (``import cupy`` fails)."""
    monkeypatch.setitem(sys.modules, "cupy", None)


@pytest.mark.parametrize("argv", [
    ("plan", "harris", "--dot", "{file}"),
    ("plan", "harris", "--json", "--dot", "{file}"),
    ("synth", "--output", "{file}"),
    ("bench", "sobel", "--json", "{file}"),
    ("bench", "sobel", "--plot", "{file}"),
])
@pytest.mark.parametrize(("where", "problem"), [
    ("missing/out.txt", "directory '{tmp}/missing' does not exist"),
    (".", "is a directory"),
])
def test_output_files_are_checked_before_any_work(capsys, tmp_path, no_gpu, argv, where,
                                                  problem):
    """``plan --dot /nonexistent/dir/h.dot`` was a FileNotFoundError after the search;
    ``bench`` checks its files before it asks for the GPU, so a run cannot be lost at the
    end."""
    target = str(tmp_path / where)
    option = argv[-2]
    code, out, err = run_cli(capsys, *(part.format(file=target) for part in argv))
    assert_clean_error(code, err, f"{option} {target!r}: {problem.format(tmp=tmp_path)}")
    assert out == ""


def test_project_refuses_a_directory_as_its_app_file(capsys, tmp_path):
    code, _, err = run_cli(capsys, "project", str(tmp_path))
    assert_clean_error(code, err, f"{tmp_path}: not a file")


# GPU commands on a machine without one -----------------------------------------------------

def test_calibrate_without_cupy_reports_the_backend(capsys, no_gpu):
    """Was ``ModuleNotFoundError: No module named 'cupy'``; now as ``bench`` says it."""
    code, _, err = run_cli(capsys, "calibrate")
    assert_clean_error(code, err, "backend 'cuda' cannot run")


def test_calibrate_from_python_without_cupy_raises_backend_unavailable(no_gpu):
    from kfuse.errors import BackendUnavailable
    from kfuse.tune import calibrate
    with pytest.raises(BackendUnavailable, match="CuPy"):
        calibrate(progress=False)


@pytest.mark.parametrize("argv", [
    ("bench", "sobel", "nosuch"),
    ("model-check", "nosuch"),
    ("run", "nosuch"),
    ("plan", "nosuch"),
])
def test_app_names_are_checked_before_the_gpu(capsys, no_gpu, argv):
    """``bench nosuch`` said the CUDA backend was unavailable, not that the app is unknown."""
    code, _, err = run_cli(capsys, *argv)
    assert_clean_error(code, err, "unknown app 'nosuch'", "harris")


def test_bench_checks_the_size_before_the_gpu(capsys, no_gpu):
    code, _, err = run_cli(capsys, "bench", "sobel", "atax", "--size", "4099")
    assert_clean_error(code, err, "sobel takes a 2-D size")


# --autotune --------------------------------------------------------------------------------

def test_autotune_is_refused_on_a_backend_that_runs_no_kernels(capsys):
    """Was ``AttributeError: 'NumpyBackend' object has no attribute 'prepare'``."""
    code, _, err = run_cli(capsys, "run", "atax", "--backend", "numpy", "--autotune", "3")
    assert_clean_error(code, err, "the numpy backend does not run")


def test_autotune_does_not_combine_with_unfused(capsys):
    """``--unfused`` ignored ``--autotune`` without a word."""
    code, _, err = run_cli(capsys, "run", "atax", "--backend", "cpu", "--autotune", "2",
                           "--unfused")
    assert_clean_error(code, err, "--autotune", "--unfused")


def test_autotune_on_cpu_says_what_it_timed_and_reports_the_timings(capsys, monkeypatch):
    """On cpu the autotuner times the host shim: a note on stderr says so, and ``--json``
    carries the timings (stdout stays one JSON object)."""
    from kfuse.apps import get_app
    from kfuse.tune import autotune

    calls = []

    class Timed:
        def __init__(self, graph, sizes):
            self.plan = get_app("atax").planner(graph, sizes)

        def table(self) -> list[dict]:
            return [{"rank": 1, "predicted_ms": 0.01, "measured_ms": 0.02,
                     "implementation": "fake"}]

    def fake_autotune(graph, given, k, *, backend, sizes):
        calls.append((k, backend))
        return Timed(graph, sizes)

    monkeypatch.setattr(autotune, "autotune", fake_autotune)
    code, out, err = run_cli(capsys, "run", "atax", "--backend", "cpu", "--autotune", "2",
                             "--size", "9x11", "--json")
    assert code == 0 and calls == [(2, "cpu")]
    assert "--autotune on the cpu backend times the host shim" in err
    result = json.loads(out)
    assert result["autotune"] == Timed.table(None) and result["verified"] is True


# the exact strategy and JSON ---------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent


def kfuse_in_a_fresh_process(*argv: str) -> str:
    """stdout of ``python -m kfuse argv...`` in a new process (HiGHS prints its banner once
    per process, so only a fresh one shows whether it reaches stdout)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "kfuse", *argv], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=120, check=True)
    return done.stdout


@pytest.mark.parametrize("argv", [
    ("plan", "sobel", "--strategy", "exact", "--json"),
    ("project", "examples/rk-step.yaml", "--strategy", "exact", "--json"),
])
def test_exact_strategy_json_is_only_json(argv):
    """The HiGHS banner ("Running HiGHS 1.16.0 ...") went to stdout before the JSON."""
    out = kfuse_in_a_fresh_process(*argv)
    assert json.loads(out)["strategy"] == "exact"


def test_exact_plan_from_python_prints_nothing():
    code = ("import kfuse.apps as apps; plan = apps.get_app('sobel').build().plan('exact'); "
            "assert plan.strategy == 'exact'")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120, check=True)
    assert done.stdout == ""


@pytest.mark.parametrize("argv", [
    ("--json", "--show-source"),
    ("--json", "--resources"),
    ("--show-source", "--resources"),
])
def test_run_prints_one_kind_of_output(capsys, argv):
    """``--json --show-source`` printed the source, not JSON, and ``--show-source
    --resources`` dropped the second silently: each is its own output and they exclude
    one another."""
    err = refused_by_argparse(capsys, "run", "sobel", "--backend", "cpu", *argv)
    assert f"argument {argv[1]}: not allowed with argument {argv[0]}" in err


# strategy names ----------------------------------------------------------------------------

def test_unknown_plan_strategy_lists_every_valid_one(capsys):
    """The list left out ``auto`` and ``variants``, which ``kfuse plan`` takes."""
    from kfuse.search import PLAN_STRATEGIES
    code, _, err = run_cli(capsys, "plan", "sobel", "--strategy", "nosuch")
    assert_clean_error(code, err, "unknown search strategy 'nosuch'; available: "
                       "auto, variants, exhaustive, exact, greedy, edges, mincut, gga")
    assert set(PLAN_STRATEGIES) >= {"auto", "variants", "gga"}


def test_unknown_strategy_of_pipeline_plan_lists_auto_and_variants():
    from kfuse.apps import get_app
    from kfuse.errors import KfuseError
    with pytest.raises(KfuseError, match="available: auto, variants, exhaustive"):
        get_app("sobel").build().plan("nosuch")


@pytest.mark.parametrize("option", ["--strategy", "--reference"])
def test_fidelity_refuses_an_unknown_strategy_before_solving(capsys, option):
    """``--strategy nosuch`` printed a table of failed instances and exited 0."""
    code, out, err = run_cli(capsys, "fidelity", option, "nosuch", "--kernels", "5",
                             "--arrays", "5", "--instances", "1", "--json")
    assert_clean_error(code, err, "unknown search strategy 'nosuch'")
    assert out == ""


# synthetic instances -----------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ("synth", "--kernels", "1000", "--arrays", "1"),
    ("fidelity", "--kernels", "4", "--arrays", "2", "--instances", "1"),
])
def test_too_few_arrays_for_the_kinship_is_refused(capsys, argv):
    """Fewer arrays than the kinship left a band of kernels touching none:
    ``ValueError: min() arg is an empty sequence``."""
    code, _, err = run_cli(capsys, *argv)
    assert_clean_error(code, err, "synth: kinship 3 needs at least 3 arrays")


def test_a_reader_gone_early_is_no_traceback():
    """``kfuse run harris --show-source | head -1`` ended in a BrokenPipeError traceback."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, "-m", "kfuse", "plan", "harris"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                               cwd=REPO)
    process.stdout.close()  # before kfuse writes anything
    err = process.stderr.read().decode()
    process.stderr.close()
    assert process.wait(timeout=120) == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


@pytest.mark.parametrize("option", ["--rounds", "--runs"])
def test_experiment_scripts_refuse_zero_rounds_and_runs(capsys, monkeypatch, option):
    """The experiment scripts' command line (``alternating_main``) took 0 rounds or runs
    (medians of nothing); they share the kfuse command's argument types."""
    from kfuse.cli.arguments import alternating_main
    monkeypatch.setattr(sys, "argv", ["experiment", "sobel", option, "0"])
    with pytest.raises(SystemExit) as exit_info:
        alternating_main("test", lambda *args: pytest.fail("ran"), ["sobel"])
    assert exit_info.value.code == 2
    assert f"argument {option}: expected a positive integer, got '0'" in capsys.readouterr().err
