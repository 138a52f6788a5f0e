"""Small helpers with one job each, used across the core (layer L1; see docs/architecture.md, "Layers"):
``files`` (atomic file and folder writes), ``dist`` (rank 0 and the distributed environment), ``cache`` (the cache
folder), ``progress`` (a terminal progress line). Importing them imports neither torch nor megatron-core."""
