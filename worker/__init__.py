"""The worker agent, its runtime backends and the function runtime server."""
