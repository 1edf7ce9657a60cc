"""The region-failover benchmark's parts (bench/region_failover.py runs them): the
agents' load, the leader candidates, and what the bus says happened."""
