"""Hand-written row-streaming Harris kernel against kfuse's generated fused kernel (GPU).

An experiment for issue 3 (Harris within 1.3x of the DRAM floor), not part of kfuse: each
warp owns 128 columns (a float4 per lane) and walks a strip of rows; the horizontal
neighbours of a lane's columns come from the next lanes by warp shuffles (lanes 0 and 31
only feed their neighbours: a warp writes 120 columns), the vertical ones from values
carried in registers from the previous rows; input rows are loaded DEPTH rows ahead.
Every intermediate point is evaluated once per warp (2 extra rows per strip, 8 extra
columns per 120), against the register tiles' 60 points per 32 outputs. The constant scales
(1/6 of the derivatives, 1/16 of the Gaussian) are folded into one factor of the response.
Clamp borders, widths that are a multiple of 4 (it checks its result against kfuse's).

Usage on the device machine: PYTHONPATH=. python3 experiments/stream_experiment.py
(CONFIGS=rows:depth:warps:min_blocks:columns,... picks the configurations; default a small sweep)
"""

from __future__ import annotations

import os

import numpy as np
from patched_kernels import hand_kernel_target

SOURCE = r"""
#define OUT_COLS (30 * COLS)  // columns a warp writes (lanes 1..30)
#if COLS == 4
typedef float4 vec_t;
#else
typedef float2 vec_t;
#endif
__device__ __forceinline__ int clampi(int i, int n) { return min(max(i, 0), n - 1); }

struct Row { float a[COLS]; };

__device__ __forceinline__ Row load_row(const float* __restrict__ img, int row, int c,
                                        int W, bool vec) {
  const float* p = img + (long long)row * W;
  Row r;
  if (vec) {
    const vec_t v = __ldg(reinterpret_cast<const vec_t*>(p + c));
    r.a[0] = v.x; r.a[1] = v.y;
#if COLS == 4
    r.a[2] = v.z; r.a[3] = v.w;
#endif
  } else {
#pragma unroll
    for (int j = 0; j < COLS; ++j) r.a[j] = __ldg(p + clampi(c + j, W));
  }
  return r;
}

// horizontal difference (x) and sum (y) of one input row at a lane's columns
__device__ __forceinline__ void row_terms(const Row& v, Row& hd, Row& hs) {
  const float left = __shfl_up_sync(0xffffffffu, v.a[COLS - 1], 1);
  const float right = __shfl_down_sync(0xffffffffu, v.a[0], 1);
#pragma unroll
  for (int j = 0; j < COLS; ++j) {
    const float l = j == 0 ? left : v.a[j - 1];
    const float r = j == COLS - 1 ? right : v.a[j + 1];
    hd.a[j] = r - l;
    hs.a[j] = l + v.a[j] + r;
  }
}

__device__ __forceinline__ void hsum(const Row& p, int c, int W, Row& h) {
  float l = __shfl_up_sync(0xffffffffu, p.a[COLS - 1], 1);
  float r = __shfl_down_sync(0xffffffffu, p.a[0], 1);
  if (c == 0) l = p.a[0];
  if (c + COLS == W) r = p.a[COLS - 1];
#pragma unroll
  for (int j = 0; j < COLS; ++j)
    h.a[j] = fmaf(2.f, p.a[j], (j == 0 ? l : p.a[j - 1]) + (j == COLS - 1 ? r : p.a[j + 1]));
}

// products of one row -> horizontal Gaussian sums (three channels), clamp at image edges
__device__ __forceinline__ void gauss_row(const Row& dx, const Row& dy, int c, int W,
                                          Row& hx, Row& hy, Row& hxy) {
  Row px, py, pxy;
#pragma unroll
  for (int j = 0; j < COLS; ++j) { px.a[j] = dx.a[j] * dx.a[j]; py.a[j] = dy.a[j] * dy.a[j];
                                   pxy.a[j] = dx.a[j] * dy.a[j]; }
  hsum(px, c, W, hx); hsum(py, c, W, hy); hsum(pxy, c, W, hxy);
}

__device__ __forceinline__ void store_response(
    float* __restrict__ out, const Row& x0, const Row& x1, const Row& x2, const Row& y0,
    const Row& y1, const Row& y2, const Row& xy0, const Row& xy1, const Row& xy2, float k) {
  // horizontal sums of product rows r-1, r, r+1; scales (1/6)^2 / 16 folded into one factor
  const float s = 1.0f / (36.0f * 16.0f);
  float o[COLS];
#pragma unroll
  for (int j = 0; j < COLS; ++j) {
    const float gx = (fmaf(2.f, x1.a[j], x0.a[j] + x2.a[j])) * s;
    const float gy = (fmaf(2.f, y1.a[j], y0.a[j] + y2.a[j])) * s;
    const float gxy = (fmaf(2.f, xy1.a[j], xy0.a[j] + xy2.a[j])) * s;
    const float tr = gx + gy;
    o[j] = (gx * gy - gxy * gxy) - k * tr * tr;
  }
#if COLS == 4
  *reinterpret_cast<float4*>(out) = make_float4(o[0], o[1], o[2], o[3]);
#else
  *reinterpret_cast<float2*>(out) = make_float2(o[0], o[1]);
#endif
}

extern "C" __global__ void __launch_bounds__(WARPS * 32, MINB)
harris_stream(const float* __restrict__ img, float* __restrict__ hc, int H, int W, float k) {
  const int lane = threadIdx.x & 31;
  const int warps_total = gridDim.x * WARPS;
  const int column_warps = (W + OUT_COLS - 1) / OUT_COLS;
  const int strips = (H + ROWS - 1) / ROWS;
  for (int job = blockIdx.x * WARPS + (threadIdx.x >> 5); job < column_warps * strips;
       job += warps_total) {
    const int c = (job % column_warps) * OUT_COLS - COLS + lane * COLS;
    const int y0 = (job / column_warps) * ROWS;
    const bool vec = c >= 0 && c + COLS <= W;
    const bool writes = lane >= 1 && lane <= 30 && c < W;
    if (y0 >= 2 && y0 + ROWS + 2 <= H) {
      // interior strip: input rows y0-2 .. y0+ROWS+1, each loaded once, DEPTH rows ahead.
      // Rows live in 3-slot rings indexed by row number mod 3; DEPTH is a multiple of 3, so
      // every index is a compile-time constant and the rings cost no register moves.
      Row hd[3], hs[3], hx[3], hy[3], hxy[3], dx, dy;
#pragma unroll
      for (int j = 0; j < 3; ++j) row_terms(load_row(img, y0 - 2 + j, c, W, vec), hd[j], hs[j]);
#pragma unroll
      for (int j = 0; j < COLS; ++j) { dx.a[j] = hd[0].a[j] + hd[1].a[j] + hd[2].a[j];
                                    dy.a[j] = hs[2].a[j] - hs[0].a[j]; }
      gauss_row(dx, dy, c, W, hx[0], hy[0], hxy[0]);          // products row y0-1: slot 0
      row_terms(load_row(img, y0 + 1, c, W, vec), hd[0], hs[0]);
#pragma unroll
      for (int j = 0; j < COLS; ++j) { dx.a[j] = hd[1].a[j] + hd[2].a[j] + hd[0].a[j];
                                    dy.a[j] = hs[0].a[j] - hs[1].a[j]; }
      gauss_row(dx, dy, c, W, hx[1], hy[1], hxy[1]);          // products row y0: slot 1
      Row ahead[DEPTH];
#pragma unroll
      for (int d = 0; d < DEPTH; ++d) ahead[d] = load_row(img, y0 + 2 + d, c, W, vec);
      for (int t = 0; t < ROWS; t += DEPTH) {
#pragma unroll
        for (int d = 0; d < DEPTH; ++d) {
          // step s = t + d: input row y0+s+2 (slot (s+1)%3), products row y0+s+1 (slot
          // (s+2)%3), output row y0+s (products slots s%3, (s+1)%3, (s+2)%3)
          const int in0 = d % 3, in1 = (d + 1) % 3, in2 = (d + 2) % 3;
          const Row v = ahead[d];
          ahead[d] = load_row(img, min(y0 + 2 + t + d + DEPTH, H - 1), c, W, vec);
          row_terms(v, hd[in1], hs[in1]);                      // rows y0+s, +1, +2: in2, in0, in1
#pragma unroll
          for (int j = 0; j < COLS; ++j) { dx.a[j] = hd[in2].a[j] + hd[in0].a[j] + hd[in1].a[j];
                                        dy.a[j] = hs[in1].a[j] - hs[in2].a[j]; }
          gauss_row(dx, dy, c, W, hx[in2], hy[in2], hxy[in2]);
          if (writes)
            store_response(hc + (long long)(y0 + t + d) * W + c,
                           hx[in0], hx[in1], hx[in2], hy[in0], hy[in1], hy[in2],
                           hxy[in0], hxy[in1], hxy[in2], k);
        }
      }
    } else {
      // a strip at the top or bottom: each products row from its three clamped input rows
      Row hx[3], hy[3], hxy[3];
      for (int r = y0 - 1; r <= y0 + ROWS && r <= H; ++r) {
        const int rr = clampi(r, H);
        Row hd0, hs0, hd1, hs1, hd2, hs2, dx, dy;
        row_terms(load_row(img, clampi(rr - 1, H), c, W, vec), hd0, hs0);
        row_terms(load_row(img, rr, c, W, vec), hd1, hs1);
        row_terms(load_row(img, clampi(rr + 1, H), c, W, vec), hd2, hs2);
#pragma unroll
        for (int j = 0; j < COLS; ++j) { dx.a[j] = hd0.a[j] + hd1.a[j] + hd2.a[j];
                                      dy.a[j] = hs2.a[j] - hs0.a[j]; }
        hx[0] = hx[1]; hy[0] = hy[1]; hxy[0] = hxy[1];
        hx[1] = hx[2]; hy[1] = hy[2]; hxy[1] = hxy[2];
        gauss_row(dx, dy, c, W, hx[2], hy[2], hxy[2]);
        if (r >= y0 + 1 && writes)                             // output row r-1
          store_response(hc + (long long)(r - 1) * W + c, hx[0], hx[1], hx[2], hy[0], hy[1],
                         hy[2], hxy[0], hxy[1], hxy[2], k);
      }
    }
  }
}
"""


def main() -> None:
    import cupy

    app, image, output = hand_kernel_target("harris")
    height, width = image.shape
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    configs = os.environ.get("CONFIGS", "48:3:4:1:4,48:3:8:2:4,96:3:8:2:4,72:3:8:2:4,"
                             "24:3:8:2:4,48:6:4:1:4,96:3:4:1:4,48:3:8:3:2,96:6:8:3:2,"
                             "96:3:8:3:2")
    for config in configs.split(","):
        rows, depth, warps, min_blocks, columns = (int(v) for v in config.split(":"))
        module = cupy.RawModule(code=SOURCE, options=(
            "-std=c++17", f"-DROWS={rows}", f"-DDEPTH={depth}", f"-DWARPS={warps}",
            f"-DMINB={min_blocks}", f"-DCOLS={columns}"))
        kernel = module.get_function("harris_stream")
        registers = kernel.attributes["num_regs"]
        for label, grid in (("persistent", sms * max(1, 2048 // (warps * 32))),
                            ("one job/warp", -(-((width + 30 * columns - 1) // (30 * columns))
                                              * (-(-height // rows))
                                              // warps))):
            def launch(kernel=kernel, grid=grid, warps=warps):
                kernel((grid,), (warps * 32,), (image, output, np.int32(height),
                                                np.int32(width), np.float32(app.given["k"])))
            app.time_launch(f"stream rows {rows:3d} depth {depth} warps {warps:2d} min blocks "
                            f"{min_blocks} columns {columns} {label:12s} regs {registers}",
                            launch)


if __name__ == "__main__":
    main()
