"""Beyond one array on one device: kfuse pipelines over chunked Dask arrays
(:mod:`kfuse.scaleout.dask_arrays`) and over host arrays larger than the GPU, streamed
through it in slabs (:mod:`kfuse.scaleout.host_slabs`)."""

from kfuse.scaleout.dask_arrays import (
    ChunkingError,
    halo_depths,
    iterate,
    persist_in_bands,
    run_on_dask_arrays,
)
from kfuse.scaleout.host_slabs import plan_slabs, run_in_slabs

__all__ = ["ChunkingError", "halo_depths", "iterate", "persist_in_bands", "plan_slabs",
           "run_in_slabs", "run_on_dask_arrays"]
