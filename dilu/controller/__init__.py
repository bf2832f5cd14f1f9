"""The control loops: read state, call policy, act through workers."""
