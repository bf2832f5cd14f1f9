"""Entry point of an instance process: ``python -m worker.instance`` (see ``dilu.instance_protocol``).

With ``--spare`` the process imports the instance server, then waits for its assignment: one JSON
line on stdin with the config file, the environment to add and the working directory. The worker
keeps such spares ready so that a cold start skips the interpreter's start-up and these imports.
"""

import json
import os
import socket
import sys
import time

from dilu.instance_protocol import InstanceEnvironment
from worker.instance.server import bind_listener, preload, serve


def main() -> None:
    assigned_at = None
    if "--spare" in sys.argv[1:]:
        preload()
        line = sys.stdin.readline()
        if not line:
            return  # the worker closed the pipe: this spare is not needed
        assignment = json.loads(line)
        assigned_at = time.time()
        os.environ.update(assignment["env"])
        os.chdir(assignment["cwd"])
    environment = InstanceEnvironment.from_environ()
    config = environment.config()
    if config is None or (environment.listen_fd is None and environment.listen is None):
        sys.exit("worker.instance: DILU_INSTANCE_CONFIG(_JSON) and DILU_LISTEN_FD (or DILU_LISTEN) "
                 "must be set by the worker")
    listener = socket.socket(fileno=environment.listen_fd) if environment.listen_fd is not None \
        else bind_listener(*environment.listen)
    serve(config, listener, assigned_at, environment.key)


if __name__ == "__main__":
    main()
