"""What an instance process is given: its GPU by UUID (or none), its spec env, its identity."""

from __future__ import annotations

from pathlib import Path

import pytest

from dilu.messages import DeviceInfo
from tests.builders import make_start
from worker.backends.process import ProcessBackend

GPU = DeviceInfo(kind="gpu", uuid="GPU-1234", name="H200", memory_bytes=2**37, index=3)
CPU = DeviceInfo(kind="cpu", uuid=None, name="cpu", memory_bytes=2**34)


@pytest.mark.parametrize(("device", "visible", "kind"), [(GPU, "GPU-1234", "cuda"), (CPU, "", "cpu")])
def test_instance_env(tmp_path: Path, device: DeviceInfo, visible: str, kind: str) -> None:
    backend = ProcessBackend(state_dir=tmp_path, base_env={"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1"})
    env = backend.instance_env(make_start("i-1", "/src", env={"GREETING": "hi"}), device, tmp_path / "c.json", 7)
    assert env["CUDA_VISIBLE_DEVICES"] == visible  # never the worker's own list
    assert env["DILU_DEVICE"] == kind and env["DILU_LISTEN_FD"] == "7" and env["DILU_INSTANCE_ID"] == "i-1"
    assert env["GREETING"] == "hi" and env["PATH"] == "/bin"


def test_the_instance_key_survives_the_shims_injection(tmp_path: Path) -> None:
    backend = ProcessBackend(state_dir=tmp_path, base_env={"PATH": "/bin"})
    injected = {"LD_PRELOAD": "/shim.so", "DILU_TOKEN_SOCKET": "/run/x.sock"}
    env = backend.instance_env(make_start("i-1", "/src"), GPU, tmp_path / "c.json", 7, injected, "secret-key")
    assert env["DILU_INSTANCE_KEY"] == "secret-key" and env["LD_PRELOAD"] == "/shim.so"


def test_a_pool_is_chosen_by_what_only_takes_effect_at_exec() -> None:
    """Spares of one pool started with the same loader/interpreter variables: the shim's preload
    picks the GPU pool, what the shim reads at the first driver call does not split pools."""
    from worker.backends.spares import exec_time, pool_key

    one = {"LD_PRELOAD": "/shim.so", "LD_LIBRARY_PATH": "/fake", "DILU_TOKEN_SOCKET": "/run/a.sock",
           "DILU_MEMORY_LIMIT": "1"}
    other = {"LD_LIBRARY_PATH": "/fake", "LD_PRELOAD": "/shim.so", "DILU_TOKEN_SOCKET": "/run/b.sock"}
    assert exec_time(one) == {"LD_PRELOAD": "/shim.so", "LD_LIBRARY_PATH": "/fake"}
    assert pool_key(exec_time(one)) == pool_key(exec_time(other)) != pool_key(exec_time(None)) == ()
    assert exec_time({"PYTHONPATH": "/x", "GREETING": "hi"}) == {"PYTHONPATH": "/x"}


def test_injected_search_paths_come_before_the_workers() -> None:
    from worker.backends.process import with_injection

    env = with_injection({"LD_LIBRARY_PATH": "/usr/lib", "LD_PRELOAD": "/a.so", "PATH": "/bin"},
                         {"LD_LIBRARY_PATH": "/fake", "LD_PRELOAD": "/shim.so", "DILU_X": "1"})
    assert env == {"LD_LIBRARY_PATH": "/fake:/usr/lib", "LD_PRELOAD": "/shim.so /a.so", "PATH": "/bin", "DILU_X": "1"}


def test_instances_keep_freed_memory_unless_their_function_tunes_malloc(tmp_path: Path) -> None:
    """Every instance process starts with the heap tunables (``worker.backends.heap``); a function
    whose env says how malloc should behave gets its own setting alone, and since malloc reads it
    at start-up its instance cannot come from a spare."""
    from worker.backends.heap import TUNABLES
    from worker.backends.spares import exec_time

    backend = ProcessBackend(state_dir=tmp_path, base_env={"PATH": "/bin"}, cpu_pool=False)
    plain = backend.instance_env(make_start("i-1", "/src"), CPU, tmp_path / "c.json", 7)
    assert plain["GLIBC_TUNABLES"] == TUNABLES
    for own in ({"MALLOC_ARENA_MAX": "2"}, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}):
        env = backend.instance_env(make_start("i-2", "/src", env=own), CPU, tmp_path / "c.json", 7)
        assert {name: env.get(name) for name in ("GLIBC_TUNABLES", "MALLOC_ARENA_MAX")} == \
            {"GLIBC_TUNABLES": None, "MALLOC_ARENA_MAX": None, **own}
        assert exec_time(own) == own, "a spare started without it could not apply it"


def test_a_worker_that_tunes_malloc_itself_passes_its_own_setting_on(tmp_path: Path) -> None:
    backend = ProcessBackend(state_dir=tmp_path, base_env={"MALLOC_ARENA_MAX": "4"}, cpu_pool=False)
    env = backend.instance_env(make_start("i-1", "/src"), CPU, tmp_path / "c.json", 7)
    assert env["MALLOC_ARENA_MAX"] == "4" and "GLIBC_TUNABLES" not in env


def test_instances_inherit_an_allow_list_never_the_workers_secrets(tmp_path: Path) -> None:
    worker_env = {"PATH": "/bin", "LANG": "C.UTF-8", "LC_ALL": "C", "OPENBLAS_CORETYPE": "Haswell",
                  "DILU_FAKE_NS_PER_BLOCK": "500", "DILU_CLUSTER_KEY": "k" * 32, "DILU_ADMIN_KEY": "a" * 32,
                  "DILU_DATABASE_URL": "postgresql://dilu:hunter2@db/dilu", "AWS_SECRET_ACCESS_KEY": "x",
                  "HOME": "/root", "SSH_AUTH_SOCK": "/tmp/agent", "HF_TOKEN": "hf_x"}
    backend = ProcessBackend(state_dir=tmp_path, base_env=worker_env, cpu_pool=False, passed_env=("HF_TOKEN",))
    env = backend.instance_env(make_start("i-1", "/src", env={"MODE": "fast"}), CPU, tmp_path / "c.json", 7)
    for secret in ("DILU_CLUSTER_KEY", "DILU_ADMIN_KEY", "DILU_DATABASE_URL", "AWS_SECRET_ACCESS_KEY",
                   "SSH_AUTH_SOCK", "HOME"):
        assert secret not in env, secret
    assert {name: env[name] for name in ("PATH", "LANG", "LC_ALL", "OPENBLAS_CORETYPE", "DILU_FAKE_NS_PER_BLOCK",
                                         "HF_TOKEN", "MODE")} == {
        "PATH": "/bin", "LANG": "C.UTF-8", "LC_ALL": "C", "OPENBLAS_CORETYPE": "Haswell",
        "DILU_FAKE_NS_PER_BLOCK": "500", "HF_TOKEN": "hf_x", "MODE": "fast"}   # passed on purpose, and its spec's
