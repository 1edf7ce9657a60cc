"""Energy: GPU power limits inside a job's declared slack. The sans-I/O engine
(engine.py), the power-limit I/O on a worker thread (power.py), and the service that
reads the plugin's stats and drives both (service.py)."""
