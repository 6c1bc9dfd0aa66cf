"""Hand-written probe: elementwise through the bulk copy engine (GPU experiment, timing and
checks).

``x = w + y + z`` (VADD) where each block of a persistent grid streams chunks of the four
vectors through shared memory: one thread asks the copy engine for the next chunks of
``w``, ``y``, ``z`` (``cp.async.bulk`` completing on an ``mbarrier``, ``STAGES`` chunks
ahead), the block adds them in shared memory, and the copy engine writes the sum back
(``cp.async.bulk`` from shared memory, a bulk group per chunk). Do bulk copies move the
bytes faster than the loads and stores of torch.compile's kernel? ``ORDER`` 0 deals chunks
to blocks round-robin, 1 gives each block a contiguous run of chunks.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/bulk_copy_probe.py [--rounds 5] [--runs 30]
"""

from __future__ import annotations

import argparse

import numpy as np
from scripts.held_rows_probe import compiled, vadd_setup

from kfuse.tune.timing import print_rounds, time_alternating

VADD_BULK = r"""
__device__ __forceinline__ unsigned smem(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void load_chunk(float* dst, const float* src, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1], %2, [%3];"
               :: "r"(smem(dst)), "l"(src), "r"(CHUNK * 4), "r"(bar) : "memory");
}
extern "C" __global__ void __launch_bounds__(THREADS) vadd_bulk(
    const float* __restrict__ w, const float* __restrict__ y, const float* __restrict__ z,
    float* __restrict__ x, long long chunks) {
  extern __shared__ __align__(128) float buffers[];  // [STAGES][3][CHUNK]
  __shared__ __align__(8) unsigned long long full[STAGES];
  const long long per_block = ORDER ? (chunks + gridDim.x - 1) / gridDim.x : 0;
  const long long first = ORDER ? blockIdx.x * per_block : blockIdx.x;
  const long long step = ORDER ? 1 : gridDim.x;
  const long long end = ORDER ? min(chunks, first + per_block) : chunks;
  const long long count = first < end ? (end - first + step - 1) / step : 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem(&full[s])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](long long j) {
    const int s = (int)(j % STAGES);
    const long long c = first + j * step;
    float* b = buffers + (long long)s * 3 * CHUNK;
    const unsigned bar = smem(&full[s]);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(bar), "r"(3 * CHUNK * 4) : "memory");
    load_chunk(b, w + c * CHUNK, bar);
    load_chunk(b + CHUNK, y + c * CHUNK, bar);
    load_chunk(b + 2 * CHUNK, z + c * CHUNK, bar);
  };
  if (threadIdx.x == 0)
    for (long long j = 0; j < STAGES && j < count; ++j) issue(j);
  for (long long j = 0; j < count; ++j) {
    const int s = (int)(j % STAGES);
    const unsigned parity = (unsigned)((j / STAGES) & 1);
    const unsigned bar = smem(&full[s]);
    unsigned done = 0;
    while (!done)
      asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;"
                   " selp.u32 %0, 1, 0, p; }" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    float4* b = reinterpret_cast<float4*>(buffers + (long long)s * 3 * CHUNK);
    for (int i = threadIdx.x; i < CHUNK / 4; i += THREADS) {
      const float4 a = b[i], p = b[i + CHUNK / 4], q = b[i + CHUNK / 2];
      b[i] = make_float4(a.x + p.x + q.x, a.y + p.y + q.y, a.z + p.z + q.z, a.w + p.w + q.w);
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) {
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                   :: "l"(x + (first + j * step) * CHUNK), "r"(smem(b)), "r"(CHUNK * 4)
                   : "memory");
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      // the chunk before this one has left shared memory: its stage takes the next load
      asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
      if (j >= 1 && j - 1 + STAGES < count) issue(j - 1 + STAGES);
    }
  }
  if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
"""
# (threads, floats per chunk and vector, stages, blocks per SM, order)
CONFIGS = ((256, 2048, 4, 2, 0), (256, 2048, 4, 2, 1), (256, 1024, 6, 3, 0),
           (256, 4096, 3, 1, 0), (512, 4096, 3, 1, 0), (256, 2048, 3, 3, 0),
           (128, 1024, 4, 4, 0))


def probe_vadd_bulk(rounds: int, runs: int) -> None:
    import cupy

    given, out, expected, runs_by_label = vadd_setup()
    n = given["w"].size
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    for threads, chunk, stages, per_sm, order in CONFIGS:
        label = f"bulk {threads} thr, {chunk * 4 // 1024} KB x {stages} stages, " \
                f"{per_sm}/SM, order {order}"
        if n % chunk:
            print(f"vadd {label}: size not a whole number of chunks, skipped", flush=True)
            continue
        try:
            kernel = compiled(VADD_BULK, "vadd_bulk", {
                "THREADS": threads, "CHUNK": chunk, "STAGES": stages, "ORDER": order})
        except Exception as error:  # noqa: BLE001 - a probe: report and go on
            print(f"vadd {label}: does not compile: {error}", flush=True)
            continue
        shared = stages * 3 * chunk * 4
        kernel.max_dynamic_shared_size_bytes = shared
        chunks = n // chunk

        def run(kernel=kernel, threads=threads, shared=shared, per_sm=per_sm,
                chunks=chunks):
            kernel((sms * per_sm,), (threads,),
                   (given["w"], given["y"], given["z"], out, np.int64(chunks)),
                   shared_mem=shared)

        out.fill(float("nan"))
        run()
        cupy.cuda.runtime.deviceSynchronize()
        error = float(cupy.abs(out - expected["x"]).max())
        print(f"vadd {label}: registers {kernel.num_regs}, error {error:.1e}", flush=True)
        if error < 1e-5:
            runs_by_label[label] = run
    print_rounds("vadd", time_alternating(runs_by_label, rounds, repeat=runs), "compile")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    probe_vadd_bulk(args.rounds, args.runs)


if __name__ == "__main__":
    main()
