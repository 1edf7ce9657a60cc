"""Micro-level tuning: the loop that picks each communicator's policy inside the
tenant's declared ranges, the service that publishes it to the tuner plugin
(agent.plugin) and reads the plugin's counters back, and traffic shaping."""
