"""Resource Allocator (paper §3): a node the policy chose becomes concrete GPU indices, and the one
reservation model (what an allocation takes from a node) that placement, the leader's node table and
etcd all use.
"""

from __future__ import annotations

from coordinator.allocator.gpus import choose_gpu_indices

__all__ = ["choose_gpu_indices"]
