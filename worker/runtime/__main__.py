"""Entry point of an instance process: ``python -m worker.runtime``.

Reads DILU_INSTANCE_CONFIG (a JSON file) and DILU_LISTEN_FD (an inherited, bound socket).
"""

import sys

from dilu.config import InstanceSettings
from worker.runtime.server import InstanceConfig, serve


def main() -> None:
    settings = InstanceSettings()
    if not settings.instance_config or settings.listen_fd is None:
        sys.exit("worker.runtime: DILU_INSTANCE_CONFIG and DILU_LISTEN_FD must be set by the worker")
    serve(InstanceConfig.from_file(settings.instance_config), settings.listen_fd)


if __name__ == "__main__":
    main()
