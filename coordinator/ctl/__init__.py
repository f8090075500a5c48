"""gptrmctl: the coordinator's admin API on the command line (talks gRPC only)."""
