"""Data-dependent reads (``x.at(..., index={axis: value})``, ``kf.lookup``): an axis read at
a computed integer index through the boundary mode, against NumPy fancy indexing written
here, on the cpu backend (odd sizes, every mode, indices far outside the array)."""

from __future__ import annotations

import numpy as np
import pytest

import kfuse as kf
from kfuse.errors import DslError, DtypeError

MODES = ["clamp", "mirror", "repeat", ("constant", -3.0)]


def _mapped(index: np.ndarray, size: int, mode) -> tuple[np.ndarray, np.ndarray]:
    """(index mapped into the array as ``mode`` reads outside it, inside mask)."""
    inside = (index >= 0) & (index < size)
    if mode == "mirror":
        folded = index % (2 * size)
        return np.where(folded < size, folded, 2 * size - 1 - folded), inside
    if mode == "repeat":
        return index % size, inside
    return np.clip(index, 0, size - 1), inside


@pytest.mark.parametrize("mode", MODES, ids=str)
def test_a_lookup_table_read_at_computed_indices(mode):
    p = kf.Pipeline("remap")
    image = p.input("image", 2)
    table = p.input("table", 1)
    boundary = kf.constant(mode[1]) if isinstance(mode, tuple) else mode
    index = kf.astype(image * 40.0, "int32") - 9  # from -9 to past the table's end
    p.output(kf.point(kf.lookup(table, index, boundary=boundary) * 2.0 + image, name="out"))
    rng = np.random.default_rng(1)
    values, entries = rng.random((11, 14), dtype=np.float32), rng.random(23, dtype=np.float32)
    got = p.run(backend="cpu", image=values, table=entries)
    mapped, inside = _mapped((values * np.float32(40.0)).astype(np.int32) - 9, 23, mode)
    read = np.where(inside, entries[mapped], mode[1]) if isinstance(mode, tuple) else \
        entries[mapped]
    np.testing.assert_allclose(got["out"], read * 2.0 + values, rtol=1e-6)


def test_a_level_chosen_per_point_and_interpolated_fused_with_its_index():
    """The local Laplacian filter's read: a stack of levels (k, y, x) read at the level a
    value selects and the next one, the index computed by an operator fused into the
    kernel."""
    p = kf.Pipeline("levels_read")
    image = p.input("image", shape=("h", "w"))
    stack = p.input("stack", shape=(6, "h", "w"))
    level = kf.point(image * 5.0, name="level")
    chosen = kf.minimum(kf.maximum(kf.astype(level, "int32"), 0), 4)
    weight = level - kf.astype(chosen, "float32")
    out = kf.point((1.0 - weight) * stack.at(0, 0, 0, index={0: chosen})
                   + weight * stack.at(1, 0, 0, index={0: chosen}), name="out")
    p.output(out)
    plan = p.fuse([["level", "out"]])
    rng = np.random.default_rng(2)
    values, levels = rng.random((9, 13), dtype=np.float32), rng.random((6, 9, 13), np.float32)
    got = p.run(backend="cpu", plan=plan, image=values, stack=levels)
    raw = values.astype(np.float64) * 5.0
    chosen_ = np.clip(raw.astype(np.int32), 0, 4)
    rows, columns = np.meshgrid(np.arange(9), np.arange(13), indexing="ij")
    want = (1 - (raw - chosen_)) * levels[chosen_, rows, columns] + \
        (raw - chosen_) * levels[chosen_ + 1, rows, columns]
    np.testing.assert_allclose(got["out"], want, rtol=1e-5, atol=1e-6)


def test_a_gathered_array_fused_with_its_producer_is_evaluated_where_read():
    p = kf.Pipeline("gathered_producer")
    x = p.input("x", 1)
    doubled = kf.point(x * 2.0, name="doubled")
    p.output(kf.point(kf.lookup(doubled, kf.astype(x * 3.0, "int32")) + x, name="picked"))
    values = np.random.default_rng(3).random(17).astype(np.float32)
    index = np.clip((values * np.float32(3.0)).astype(np.int32), 0, 16)
    for plan in ("unfused", p.fuse([["doubled", "picked"]])):
        got = p.run(backend="cpu", plan=plan, x=values)
        np.testing.assert_allclose(got["picked"], values[index] * 2.0 + values, rtol=1e-6)


def test_bad_indices_get_named_errors():
    p = kf.Pipeline("bad_index")
    x = p.input("x", 2)
    with pytest.raises(DtypeError, match="must be an integer expression"):
        x.at(0, 0, index={0: x * 2.0})
    with pytest.raises(DslError, match="index= names axis 2"):
        x.at(0, 0, index={2: kf.coord(0)})
    with pytest.raises(DslError, match="not also read down= or up="):
        x.at(0, 0, index={0: kf.coord(0)}, down=2)
    with pytest.raises(DslError, match="1-D array"):
        kf.lookup(x, kf.coord(0))
