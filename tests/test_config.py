"""kfuse.config: one scoped configuration object for the switches of code generation."""

from __future__ import annotations

import threading

import pytest

import kfuse
from kfuse.apps import get_app
from kfuse.codegen import generate
from kfuse.codegen.generate import generation_switches
from kfuse.config import Config, configured, current


def test_a_scope_changes_a_switch_and_puts_it_back():
    assert current() == Config()
    with configured(window_sums=False) as inside:
        assert current().window_sums is False and inside is current()
        with configured(march=True):
            assert current().march is True and current().window_sums is False
        assert current().march is None
    assert current() == Config()


def test_a_scope_reaches_only_its_own_thread():
    seen = []
    with configured(serpentine_blocks=False):
        thread = threading.Thread(target=lambda: seen.append(current().serpentine_blocks))
        thread.start()
        thread.join()
        assert current().serpentine_blocks is False
    assert seen == [True]


@pytest.mark.parametrize(("changes", "message"), [
    ({"window_sum": False}, "no switch 'window_sum'"),
    ({"window_sums": 0}, "'window_sums' takes bool, got 0"),
    ({"march": "yes"}, "'march' takes bool | None"),
    ({"march_planes": 0}, "'march_planes' takes a positive int, got 0"),
    ({"march_planes": True}, "'march_planes' takes a positive int, got True"),
    ({"register_tile": (8,)}, "'register_tile' takes None or a tuple of 2 or 3 positive ints"),
    ({"register_tile": [8, 4]}, "'register_tile' takes None or a tuple of 2 or 3"),
    ({"tile_block": (64, 0, 0)}, "'tile_block' takes None or (threads x, threads y, blocks"),
    ({"tile_block": (64, 4)}, "'tile_block' takes None or (threads x, threads y, blocks"),
])
def test_bad_switches_are_named(changes, message):
    with pytest.raises(kfuse.ConfigError, match=message.replace("|", r"\|").replace(
            "(", r"\(").replace(")", r"\)")):
        with configured(**changes):
            pass
    assert current() == Config()


def test_every_switch_is_part_of_the_stored_program_key():
    default = generation_switches()
    for name, value in (("march", True), ("march_newest_planes_only", False),
                        ("march_planes", 8), ("march_least_planes", 2),
                        ("march_shared_bytes", 1024), ("march_block_rows", 2),
                        ("march_prefetch", 3), ("serpentine_blocks", False),
                        ("window_sums", False), ("unconditional_border_loads", False),
                        ("register_tile", (6, 4)), ("tile_block", (32, 8, 2)),
                        ("items_per_thread_special", 8)):
        with configured(**{name: value}):
            assert generation_switches() != default, name


def test_a_switch_changes_the_generated_code():
    graph = get_app("diffusion3d").build().graph()
    groups = [(tuple(k.name for k in graph.kernels), graph.outputs, "recompute")]
    assert "threads march" not in generate(graph, groups).source
    with configured(march=True):
        assert "threads march" in generate(graph, groups).source


def test_tiles_and_blocks_of_every_kernel_change_for_a_scope():
    """What the tile sweep does: every tiled kernel without a tile of its own gets the
    scope's register tile and block (a recomputing chain and an operator alone)."""
    graph = get_app("harris").build().graph()
    fused = generate(graph, [(tuple(k.name for k in graph.kernels), graph.outputs,
                              "recompute")])
    unfused = generate(graph)
    with configured(register_tile=(6, 2), tile_block=(32, 8, 2)):
        for program in (generate(graph, [(tuple(k.name for k in graph.kernels),
                                          graph.outputs, "recompute")]), generate(graph)):
            tiled = [launch for launch in program.launches if launch.block[1] > 1]
            assert tiled and all(launch.block[:2] == (32, 8) for launch in tiled)
            assert "__launch_bounds__(256, 2)" in program.source
            assert "a 6 x 2 register tile" in program.source
    assert generate(graph).source == unfused.source  # and back after the scope
    assert "a 6 x 2 register tile" not in fused.source
