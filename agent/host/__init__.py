"""The host domain: CPU and memory (observer, types), the host's own rules, and the
operator's drain commands."""
