"""Pure decision code: plain data in, decisions out; time is always an argument."""
