"""GPU health on the leader: fenced GPUs and the work moved off them (``moves``)."""
