"""Running the roles: all in one process (`dilu up`, ``all_in_one``) or each alone (``gateway``,
``controller``, ``worker``), on the serving loop of ``serving``. Import the module of the role
you run: each imports only its own role's package."""
