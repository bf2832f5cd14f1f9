"""A no-op Ray Serve application, the peer of Dilu's no-op function (``bench/ray_serve.py``).

One replica that answers each POST with its body. Tuned as a user chasing throughput would:
``max_ongoing_requests`` high enough that 32 clients never queue at the router, access logs
off, Ray's dashboard off, warnings only.

    python ray_noop.py --port PORT     (prints READY once it answers)
"""

from __future__ import annotations

import argparse
import time

import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import Response


@serve.deployment(num_replicas=1, max_ongoing_requests=1000)
class NoOp:
    async def __call__(self, request: Request) -> Response:
        return Response(await request.body(), media_type="application/json")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    ray.init(include_dashboard=False, logging_level="warning", configure_logging=True)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port},
                logging_config={"log_level": "WARNING", "enable_access_log": False})
    serve.run(NoOp.bind(), route_prefix="/")
    print("READY", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
