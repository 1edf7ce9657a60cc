"""The controller's side of the provider's scheduler: hosts' holds drained, resumed,
rebooted and reserved there (Slurm today; the backend is a Protocol).

types.py: what goes in and out; reasons.py: the drain reasons we write; table.py: the
state machine, one table; engine.py: the sans-I/O ``step``; slurm.py: the scontrol
backend; service.py: the shell in the controller; marks.py: what survives a restart.
"""
