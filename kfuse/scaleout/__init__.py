"""Beyond one array on one device: kfuse pipelines over chunked Dask arrays
(:mod:`kfuse.scaleout.dask_arrays`)."""

from kfuse.scaleout.dask_arrays import ChunkingError, halo_depths, iterate, run_on_dask_arrays

__all__ = ["ChunkingError", "halo_depths", "iterate", "run_on_dask_arrays"]
