"""Remediation that acts: resets of quarantined GPUs, then reboot and RMA holds."""
