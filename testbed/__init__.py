"""Network-namespace hosts and the scripted demo."""
