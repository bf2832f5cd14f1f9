"""The `dilu` command line."""
