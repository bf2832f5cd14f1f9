"""Workflows: a DAG of deployed functions (``spec``), run node by node (``run``), loaded ahead of
need (``plan``, ``loading``), kept loaded between requests (``keep``), from what recent requests
said (``history``), told to the controller as one hint per function (``hints``)."""
