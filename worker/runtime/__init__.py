"""The HTTP runtime server that runs inside every instance."""
