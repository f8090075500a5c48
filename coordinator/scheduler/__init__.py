"""GPT Task Scheduler (paper §3): queue order, the leader's cycle, the placement engine and the policies.

- :mod:`~coordinator.scheduler.queue`: a PENDING task becomes a placement request, in queue order;
- :mod:`~coordinator.scheduler.snapshot`: the cycle's consistent view of the nodes;
- :mod:`~coordinator.scheduler.placement`: the vectorised engine (filter, rank, allocator);
- :mod:`~coordinator.scheduler.policies`: the paper's Alg. 1-3 and three baselines, by name;
- :mod:`~coordinator.scheduler.policy`: the policy in force, changed under an etcd lock;
- :mod:`~coordinator.scheduler.cycle`: snapshot → place → commit → dispatch, on the leader.

Submodules are imported where used; this package imports nothing itself, so the simulator and
the policies can be used without the leader's machinery.
"""
