"""The instance server: the HTTP server inside every instance (load once, batch, serve)."""
