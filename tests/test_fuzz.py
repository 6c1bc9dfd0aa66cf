"""The fuzzer (kfuse.fuzz): a fixed slice of its seeds in every CI run, its shrinking, and
the command. ``kfuse fuzz --seeds A:B --jobs N`` runs thousands (docs/guide.md)."""

from __future__ import annotations

import json

import pytest

from kfuse import fuzz
from kfuse.cli.main import main as cli

# cases of each family: BLAS-1/2 (2), stencils (9, 36), integer selects and casts (18),
# reductions (34), row and column normalisations fused under map-reduce variants (109), a
# float round trip over a register tile (4029: GCC's SLP vectorizer dropped conversions);
# the pyramid family (seeds 3 mod 4) by `kfuse fuzz` (tests/test_pyramid.py in CI)
CI_SEEDS = (2, 9, 18, 34, 36, 109, 4029)


@pytest.mark.integration
@pytest.mark.parametrize("seed", CI_SEEDS)
def test_a_fixed_slice_of_fuzzed_cases_computes_the_reference(seed, default_optimisation):
    outcome = fuzz.check_seed(seed)
    assert outcome is not None and outcome.status == "ok", outcome and (
        outcome.case.describe(), outcome.message, outcome.errors)


def test_cases_are_drawn_the_same_way_every_time_and_cover_every_family():
    drawn = [fuzz.draw_case(seed) for seed in range(30)]
    assert drawn == [fuzz.draw_case(seed) for seed in range(30)]
    assert {case.family for case in drawn} == set(fuzz.FAMILIES)
    assert {case.dtype for case in drawn} >= {"float32", "float64", "int32"}
    folded = {(case.dtype, op.detail[0]) for case in fuzz.cases(range(400))
              for op in case.ops if op.kind == "reduce"}
    assert {dtype for dtype, _ in folded} & {"float16", "bfloat16"}  # reductions of halves
    assert {("int8", "min"), ("uint8", "max")} & folded  # extremes of small integers
    assert {len(case.shape) for case in drawn if case.family != "blas"} == {1, 2, 3}
    modes = {mode for case in drawn for op in case.ops if op.kind == "local"
             for _, mode in op.detail[0]}
    assert modes == set(fuzz.MODES)
    planned = [case for case in fuzz.cases(range(60)) if case.groups]
    assert any(form == "recompute" for case in planned for form in case.forms)
    assert any(form and form.startswith("mapreduce") for case in planned for form in case.forms)


def test_a_failing_case_is_shrunk_to_the_smallest_that_still_fails():
    case = next(c for c in fuzz.cases(range(100)) if len(c.ops) >= 4 and
                any(op.kind == "local" for op in c.ops))

    def fails(candidate: fuzz.Case) -> bool:  # stands for a wrong result
        return any(op.kind == "local" for op in candidate.ops)

    smallest = fuzz.shrink(case, fails)
    assert fails(smallest) and len(smallest.ops) == 1 and not smallest.groups
    fuzz.build(smallest)[0].graph()  # still a valid pipeline


@pytest.mark.integration
def test_the_command_reports_each_case_and_a_summary(capsys):
    assert cli(["fuzz", "--seeds", "15:16", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["seed"] == 15 and lines[0]["status"] == "ok"
    assert lines[-1]["cases"] == 1 and lines[-1]["mismatch"] == lines[-1]["error"] == 0


def test_the_command_refuses_a_bad_seed_range(capsys):
    assert cli(["fuzz", "--seeds", "9:3"]) == 2
    assert "--seeds takes a range" in capsys.readouterr().err
