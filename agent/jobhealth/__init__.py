"""The job-health domain: where each local rank of a job's communicators stands, and
which ranks hold a communicator up (the judge is :mod:`harmonaize.progress`)."""
