"""Limits of the CUDA programming model that planning, code generation and launches all
respect (the same on every GPU kfuse targets, compute capability 7.0 and later)."""

# Registers one thread may use (ptxas never assigns more).
MAX_REGISTERS_PER_THREAD = 255

# Shared memory a block may declare statically, and may use dynamically without opting in
# (cudaFuncAttributeMaxDynamicSharedMemorySize raises the dynamic limit on newer GPUs).
STATIC_SHARED_LIMIT = 48 * 1024
# ... and dynamically, opted in, on Hopper (sm_90; sm_80 allows 163 KiB)
DYNAMIC_SHARED_LIMIT = 227 * 1024

# Threads of a warp, and of a block at most.
WARP = 32
MAX_BLOCK_THREADS = 1024
