"""``python -m worker.tokens``: one GPU's token manager in a process of its own (see
``worker.tokens.process``). Ends when the worker closes the control socket on its stdin."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import resource
import socket
from pathlib import Path

from dilu.policy.isolation import IsolationParams
from worker.tokens.manager import TokenManager
from worker.tokens.nvml import open_device_time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu", required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--capacity", type=float, required=True)
    parser.add_argument("--measure", action="store_true", help="close the loop with NVML's per-process device time")
    parser.add_argument("--no-isolation", action="store_true", help="token-rate control alone (no release rules)")
    parser.add_argument("--window-us", type=float, default=IsolationParams().window_s * 1e6,
                        help="device time a batch instance may have queued beside latency work")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = parser.parse_args()
    logging.basicConfig(level=getattr(logging, args.log_level),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        os.nice(-10)       # ahead of ordinary work on the host, when allowed (root)
    except OSError:
        pass
    # Up to 64 instances of 32 processes each hold a connection: more than the usual soft limit.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    device_time = open_device_time(args.gpu) if args.measure else None
    manager = TokenManager(gpu_uuid=args.gpu, socket_path=Path(args.socket), capacity_per_s=args.capacity,
                           device_time=device_time,
                           isolation=None if args.no_isolation else IsolationParams(window_s=args.window_us / 1e6))
    manager.realtime = True
    gc.collect()
    gc.freeze()            # what is imported stays out of every later collection: they stay short
    manager.start()
    control = socket.socket(fileno=0)
    control.sendall(b"READY\n")
    try:
        for line in control.makefile("rb"):
            message = json.loads(line)
            op = message.get("op")
            if op == "slice":
                manager.set_slice(message["instance"], message["cls"], float(message["request"]),
                                  float(message["limit"]), bool(message.get("llm", False)))
            elif op == "remove":
                manager.remove_slice(message["instance"])
            elif op == "admit":
                try:
                    uid, cgroup = message.get("uid"), message.get("cgroup")
                    answer = {"socket": manager.admit(str(message["instance"]), uid if isinstance(uid, int) else None,
                                                      cgroup if isinstance(cgroup, str) else None)}
                except OSError as exc:
                    answer = {"error": str(exc)}
                control.sendall((json.dumps(answer) + "\n").encode())
            elif op in ("telemetry", "stats", "events"):
                answer = (manager.telemetry() if op == "telemetry" else manager.period_stats() if op == "stats"
                          else list(manager.events))
                control.sendall((json.dumps(answer) + "\n").encode())
    finally:
        manager.stop()


if __name__ == "__main__":
    main()
