"""Code shared by the agent, the controller and the tenant client."""

__version__ = "0.1.0"
