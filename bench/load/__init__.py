"""Load generators the benchmarks share: simulated agents and subscribers."""
