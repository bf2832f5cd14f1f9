"""Entry point of an instance process: ``python -m worker.instance`` (see ``dilu.instance_protocol``)."""

import sys

from dilu.instance_protocol import InstanceConfig, InstanceEnvironment
from worker.instance.server import serve


def main() -> None:
    environment = InstanceEnvironment.from_environ()
    if not environment.config_path or environment.listen_fd is None:
        sys.exit("worker.instance: DILU_INSTANCE_CONFIG and DILU_LISTEN_FD must be set by the worker")
    serve(InstanceConfig.from_file(environment.config_path), environment.listen_fd)


if __name__ == "__main__":
    main()
