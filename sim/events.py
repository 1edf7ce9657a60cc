"""The simulation's event kinds and the causes it charges pauses and rollbacks to."""

from __future__ import annotations

# Event kinds (heap entries are (time, seq, kind, arg, version)).
FINISH, FAULT_START, FAULT_END, PRECURSOR, CONG_START, CONG_END, FLUSH, RELEASE, SAMPLE = (
    range(9))
# The negotiation regime's (sim/negotiating.py): a gang job's tenant proposes, a hold's
# grace runs out, a maintenance window opens.
NEGOTIATE, HOLD_DUE, MAINTAIN = range(9, 12)
# Causes of pauses and rollbacks, for the GPU-hour breakdown.
CAUSES = ("fault", "preempt", "advisory-ckpt", "rescale", "replace")
