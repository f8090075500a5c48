"""Shared test helpers: one fake clock, one node/request builder, the fake pynvml module, the literal
reference transcriptions of the paper's algorithms and metrics. Imported as ``tests.helpers.<module>``."""
