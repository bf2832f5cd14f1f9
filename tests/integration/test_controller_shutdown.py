"""A controller asked to stop does not wait without end on a worker call in flight."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from dilu.controller.reconciler import Reconciler
from dilu.db.engine import make_engine, make_session_factory
from dilu.default_impl import create_scheduler
from dilu.state.memory import MemoryStore
from dilu.worker_client import WorkerDirectory

pytestmark = pytest.mark.integration


async def test_shutdown_cancels_worker_calls_that_outlast_the_grace(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'dilu.db'}")
    async with httpx.AsyncClient() as http:
        reconciler = Reconciler(sessions=make_session_factory(engine), store=MemoryStore(),
                                directory=WorkerDirectory(http, None), scheduler=create_scheduler())
        finished = asyncio.Event()

        async def quick() -> None:
            finished.set()

        stuck = reconciler.ctx.spawn(asyncio.Event().wait())   # a worker that never answers
        done = reconciler.ctx.spawn(quick())
        await reconciler.shutdown(grace_s=0.2)
    engine.dispose()
    assert finished.is_set() and done.done()
    assert stuck.done()          # cancelled: shutdown returned instead of waiting for it


def test_a_stopping_role_ends_even_with_a_call_stuck_in_a_thread() -> None:
    import subprocess
    import sys

    stuck = ("import logging, threading\n"
             "logging.basicConfig(level=logging.INFO)\n"
             "from cli.roles.serving import exit_within\n"
             "threading.Thread(target=threading.Event().wait).start()   # a call nothing can cancel\n"
             "exit_within(0.2)\n")
    done = subprocess.run([sys.executable, "-c", stuck], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "still stopping" in done.stderr, done.stderr


def test_a_role_started_with_sigint_ignored_still_stops_on_it() -> None:
    """As a non-interactive shell starts background jobs: SIGINT ignored. The role still stops on it."""
    import signal
    import subprocess
    import sys

    role = ("import asyncio, sys\n"
            "from cli.main import _run\n"
            "async def serve():\n"
            "    print('serving', flush=True)\n"
            "    await asyncio.Event().wait()\n"
            "_run(serve())\n")
    child = subprocess.Popen([sys.executable, "-c", role], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert child.stdout.readline().strip() == "serving"
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=60) == -signal.SIGINT, "it ends on the interrupt, as from a terminal"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
