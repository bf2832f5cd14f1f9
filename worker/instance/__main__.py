"""Entry point of an instance process: ``python -m worker.instance`` (see ``dilu.instance_protocol``).

With ``--spare`` the process imports the instance server, then waits for its assignment: one JSON
line on stdin with the config file, the environment to add and the working directory. The worker
keeps such spares ready so that a cold start skips the interpreter's start-up and these imports.
"""

import json
import os
import sys
import time

from dilu.instance_protocol import InstanceConfig, InstanceEnvironment
from worker.instance.server import preload, serve


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
    if not environment.config_path or environment.listen_fd is None:
        sys.exit("worker.instance: DILU_INSTANCE_CONFIG and DILU_LISTEN_FD must be set by the worker")
    serve(InstanceConfig.from_file(environment.config_path), environment.listen_fd, assigned_at)


if __name__ == "__main__":
    main()
