"""Attention kernels that were built and measured but are not wired into a backend: each is
correct on an H200 and no faster than `triton_flash` (docs/BENCHMARKS.md says by how much
and why). Kept for the next attempt on the cache attention; imported only by the device
scripts (Triton's Gluon dialect, sm90)."""
