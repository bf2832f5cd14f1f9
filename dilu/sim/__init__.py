"""Trace-driven cluster simulation on Dilu's own policy modules (``dilu simulate``).

Two levels: ``placement`` replays an instance workload (starts and deletes) through the live
schedulers on N nodes x G GPUs; ``serving`` drives request arrivals through instances whose
shares, scaling and keep-alive come from the live vertical, horizontal and keep-alive policies.
Time is simulated: every policy takes ``now`` as an argument.
"""
