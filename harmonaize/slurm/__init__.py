"""Slurm as the source of placements: the controller-side prolog and epilog
(``harmonaize-slurm``), their spool and its replay.

Everything here runs in Slurm's job-start path, so its modules import only what the
standard library loads quickly (no asyncio, no logging, no schema machinery).
"""
