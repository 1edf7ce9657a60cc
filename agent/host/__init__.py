"""The host domain: CPU and memory (observer, types), the host's own rules, the
engine that steps the GPU and link engines and tracks conditions, and the
operator's drain commands."""
