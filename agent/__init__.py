"""The HarmonAIze host agent: observers, micro-level loops, operator socket, uplink."""
