"""Proactive validation: checks, the baseline rule, planning, running, history."""
