"""The command line: demo, apps, run, plan (cpu backend; GPU commands report clearly)."""

from __future__ import annotations

import json

import pytest

from kfuse.cli.main import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_demo_on_cpu_is_verified(capsys):
    code, out, _ = run_cli(capsys, "demo", "--backend", "cpu")
    assert code == 0
    assert "verified" in out and "NOT verified" not in out


def test_apps_lists_every_app(capsys):
    from kfuse.apps import list_apps
    code, out, _ = run_cli(capsys, "apps")
    assert code == 0
    for app in list_apps():
        assert app.name in out


@pytest.mark.parametrize("extra", [[], ["--unfused"], ["--boundary", "mirror"]])
def test_run_json(capsys, extra):
    code, out, _ = run_cli(capsys, "run", "sobel", "--backend", "cpu", "--json", *extra)
    assert code == 0
    result = json.loads(out)
    assert result["app"] == "sobel" and result["backend"] == "cpu"
    assert result["verified"] is True and result["max_rel_error"] <= 1e-5
    assert result["size"] == [37, 53]  # the app's test size on the cpu backend
    assert (result["groups"] is None) == ("--unfused" in extra)


def test_run_with_size_and_show_source(capsys):
    code, out, _ = run_cli(capsys, "run", "diffusion3d", "--backend", "cpu", "--size",
                           "9x10x11", "--json")
    assert code == 0 and json.loads(out)["size"] == [9, 10, 11]
    code, out, _ = run_cli(capsys, "run", "harris", "--show-source")
    assert code == 0 and "KF_KERNEL void" in out and "kfuse prelude" in out


def test_show_source_is_the_source_the_backend_compiles(capsys, monkeypatch):
    """cpu: sizes stay arguments; a backend that compiles for sizes (as cuda does) shows the
    kernels compiled for the run's size."""
    from kfuse.runtime.cpu_backend import CpuBackend

    code, out, _ = run_cli(capsys, "run", "harris", "--backend", "cpu", "--size", "23x37",
                           "--show-source")
    assert code == 0 and "const int n_img_1 = 37;" not in out
    monkeypatch.setattr(CpuBackend, "specialises_sizes", True)
    code, out, _ = run_cli(capsys, "run", "harris", "--backend", "cpu", "--size", "23x37",
                           "--show-source")
    assert code == 0 and "const int n_img_0 = 23;" in out and "const int n_img_1 = 37;" in out


def test_plan_json_has_the_documented_keys(capsys, tmp_path):
    dot = tmp_path / "harris.dot"
    code, out, _ = run_cli(capsys, "plan", "harris", "--json", "--dot", str(dot))
    assert code == 0
    plan = json.loads(out)
    for key in ("groups", "strategy", "model", "predicted_time_s", "unfused_predicted_time_s",
                "rejected"):
        assert key in plan
    names = sorted(name for group in plan["groups"] for name in group)
    assert names == sorted(["dx", "dy", "sx", "sy", "sxy", "gx", "gy", "gxy", "hc"])
    assert dot.read_text().startswith('digraph "harris"')
    assert plan["marching"] == [False] * len(plan["groups"])  # 2-D: register tiles
    code, out, _ = run_cli(capsys, "plan", "night")
    assert code == 0 and "not fused atrous0 -> atrous1" in out
    code, out, _ = run_cli(capsys, "plan", "diffusion3d", "--json")
    assert code == 0 and json.loads(out)["marching"] == [True]


def test_errors_are_reported_not_raised(capsys):
    code, _, err = run_cli(capsys, "run", "nope", "--backend", "cpu")
    assert code == 2 and "nope" in err and "harris" in err
    code, _, err = run_cli(capsys, "run", "sobel", "--backend", "cpu", "--size", "ax")
    assert code == 2 and "--size" in err


def test_apps_and_demo_print_json_when_asked(capsys):
    import json

    from kfuse.cli.main import main as cli

    assert cli(["apps", "--json"]) == 0
    apps = json.loads(capsys.readouterr().out)
    assert {"harris", "sgemv", "diffusion3d"} <= {app["name"] for app in apps}
    assert all(app["kernels"] >= 1 and app["test_size"] for app in apps)
    assert cli(["demo", "--backend", "numpy", "--json"]) == 0
    demo = json.loads(capsys.readouterr().out)
    assert demo["verified"] is True and demo["operators"] == 9
