"""Elastic training: jobs that grow into idle GPUs and give them back, resized by checkpoint-restart.

- :mod:`~coordinator.elastic.rules` — the pure rules (sizes, learned speed-up curves, sizing before
  commit, shrink, give-back and grow), shared by the leader and the simulator.
- :mod:`~coordinator.elastic.allocator` — the leader's :class:`ElasticAllocator`: learns each running
  elastic task's speed-up and carries out the resizes the rules decide.
- :mod:`~coordinator.elastic.spec` — the task spec's size range (``TaskSpec.elastic``): validation and
  reading it back.

The scheduling cycle (:mod:`coordinator.scheduler.cycle`) calls the rules; the simulator's executor
(:mod:`coordinator.simulator.elastic`) runs the same rules in a replay.
"""
