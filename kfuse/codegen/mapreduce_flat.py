"""The flat map-reduce form: a vector (or a matrix read only elementwise) in chunks.

Each thread takes ``V`` consecutive elements (one 16-byte access where the pointers are
aligned, ``V`` scalar accesses otherwise and at the end), ``iters`` chunks per block
(serial iterations), ``threads`` apart; a variant may cap the grid at what the device holds
at once (a persistent grid, whose blocks loop). Full reductions are combined over the block
and added with one atomic per block. Part of the map-reduce generator
(:mod:`kfuse.codegen.mapreduce`).
"""

from __future__ import annotations

from kfuse.codegen.cexpr import indent, size_var
from kfuse.codegen.mapreduce_skeleton import Accumulation, Grid, MapReduceKernel
from kfuse.codegen.program import GridAxis


class FlatKernel(MapReduceKernel):
    """Chunks of ``threads x V`` elements, ``iters`` per block."""

    @property
    def accumulation(self) -> dict[str, Accumulation]:
        return {"all": Accumulation("kf_acc_{var}", "guard", first_inside=True)}

    def mapping_text(self) -> str:
        group, variant = self.group, self.variant
        shape = "vector" if group.ndim == 1 else "matrix"
        return (f"{shape} of {' x '.join(group.domain)}: {self.v} elements per thread, "
                f"{variant.iters} chunk(s) per block of {variant.threads[0]} threads")

    def body(self) -> tuple[list[str], Grid]:
        group, variant, v = self.group, self.variant, self.v
        bx, iters = variant.threads[0], variant.iters
        count = " * ".join(["(kf_index_t)" + size_var(group.domain[0])]
                           + [size_var(s) for s in group.domain[1:]])
        coords = tuple((name, 0) for name in ("iy", "ix")[-group.ndim:])

        def coords_of(element: int) -> tuple:
            return coords[:-1] + (("i", element),)

        code, values = self.evaluate(coords_of)
        reductions = group.all_reductions()

        def chunk_lines(full: bool) -> list[str]:
            """One chunk of the thread: loads, every member, stores and partial results.
            ``full``: every element inside and aligned (straight accesses, no masks)."""
            count, vec = (str(v), "true") if full else ("kf_count", "kf_vec")
            return ["// load", *self.load_lines(count, vec),
                    *self.element_work(code, values, reductions, count, vec, full)]

        vec = self.aligned_flag(group.tile_inputs + group.stores, None, known=True)
        body = [
            "// thread-to-data mapping shared by every member (Filipovič et al. 2015 F1): "
            "thread t of a",
            f"// block takes {v} consecutive element(s) of each of {iters} chunk(s) of "
            f"{bx * v}",
            f"const kf_index_t kf_n = {count};",
            f"const bool kf_vec = {vec};  // {variant.vector_bytes}-byte loads and stores where "
            "aligned",
            f"const kf_index_t kf_chunk = (kf_index_t){bx * v};",
        ]
        if variant.blocks:  # a persistent grid: each block loops over the chunk groups
            body += [f"const kf_index_t kf_blocks = (kf_n + kf_chunk * {iters} - 1) / "
                     f"(kf_chunk * {iters});",
                     "for (kf_index_t kf_b = blockIdx.x; kf_b < kf_blocks; kf_b += gridDim.x) {"]
        else:
            body.append("{  const kf_index_t kf_b = blockIdx.x;  // the grid has one block per "
                        "chunk group")
        inner = self.accumulator_lines(reductions)
        aligned = "kf_vec && " if v > 1 else ""
        inner += [  # (a size compiled in that is a whole number of blocks folds the test)
            f"const bool kf_full = {aligned}(kf_n % {bx * v * iters} == 0 || "
            f"(kf_b + 1) * kf_chunk * {iters} <= kf_n);  // the same for the whole block",
            f"for (int kf_it = 0; kf_it < {iters}; ++kf_it) {{",
            f"  const kf_index_t i = (kf_b * {iters} + kf_it) * kf_chunk + "
            f"(kf_index_t)threadIdx.x * {v};",
            "  if (kf_full) {  // the block's chunks inside and aligned: straight accesses, no "
            "masks",
            *indent(chunk_lines(True), 2),
            "  } else {",
            f"    const int kf_count = i < kf_n ? (int)(kf_n - i < {v} ? kf_n - i : {v}) : 0;",
            "    if (kf_count > 0) {",
            *indent(chunk_lines(False), 3),
            "    }",
            "  }",
            "}",
        ]
        for reduce in reductions:
            inner += self.block_atomic_lines(reduce)
        body += [*indent(inner, 1), "}"]
        # a persistent grid loops over the chunks; else one block per chunk group, no loop
        grid = (GridAxis(group.domain, bx * v * iters, variant.blocks) if variant.blocks
                else GridAxis(group.domain, bx * v * iters, covering=True),
                GridAxis(), GridAxis())
        return body, grid
