"""The `dilu` command: the one place the parts are assembled into running roles.

It sits above the core (``dilu``) and the roles (``gateway``, ``worker``); nothing below imports
it. ``cli.roles`` starts each role, importing only that role's package: a gateway process loads
nothing of the worker.
"""
