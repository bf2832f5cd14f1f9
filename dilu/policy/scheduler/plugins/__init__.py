"""Filter and score plugins, one per file; ``registry.REGISTRY`` builds them by name."""
