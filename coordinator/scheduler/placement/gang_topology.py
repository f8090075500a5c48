"""Gangs kept under one topology label value (one rack, one leaf switch), as Slurm's topology/tree.

Nodes carry labels from their agent (``--labels rack=r12``); the coordinator's
``--gang-topology-label`` names the one that groups them. When a multi-node request is placed,
the nodes that pass the filter are grouped by that label's value; if one group alone holds the
whole gang, the choice is kept to the group with the fewest feasible nodes that does (best fit,
so larger groups stay whole for larger gangs; ties to the group with the best-ranked node). When
no group holds it the gang is placed across groups as before. Nodes without the label form no group.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from coordinator.domain import NodeSnapshot
from coordinator.scheduler.policies.base import BoolArray, FloatArray, IntArray

__all__ = ["DEFAULT_GANG_LABEL", "label_groups", "prefer_one_group"]

DEFAULT_GANG_LABEL = "rack"


def label_groups(nodes: Sequence[NodeSnapshot], label: str) -> IntArray | None:
    """Each node's group number by its value of ``label`` (-1 without it), or None when no node has it."""
    if not label:
        return None
    numbers: dict[str, int] = {}
    groups = np.array([numbers.setdefault(n.labels[label], len(numbers)) if label in n.labels else -1 for n in nodes],
                      dtype=np.int64)
    return groups if numbers else None


def prefer_one_group(mask: BoolArray, groups: IntArray, count: int, keyed: FloatArray | None) -> BoolArray:
    """``mask`` kept to the best-fitting group that holds ``count`` feasible nodes (``mask`` when none does).

    :param mask: the feasible nodes (not modified).
    :param groups: :func:`label_groups`'s numbers.
    :param count: the gang's node count.
    :param keyed: the policy's rank per node (+inf on refused nodes), or None for baselines.
    """
    member = mask & (groups >= 0)
    sizes = np.bincount(groups[member], minlength=int(groups.max()) + 1)
    fitting = np.flatnonzero(sizes >= count)
    if len(fitting) == 0:
        return mask
    if len(fitting) > 1:
        smallest = sizes[fitting].min()
        fitting = fitting[sizes[fitting] == smallest]
    if len(fitting) > 1 and keyed is not None:
        best = [float(keyed[member & (groups == g)].min()) for g in fitting.tolist()]
        fitting = fitting[[int(np.argmin(best))]]
    return member & (groups == int(fitting[0]))
