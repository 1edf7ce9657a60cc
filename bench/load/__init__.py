"""Load generators the benchmarks share: simulated agents, subscribers, the bus."""
