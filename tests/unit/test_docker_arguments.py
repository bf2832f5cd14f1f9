"""What the docker runtime asks the engine for: isolation, mounts, the shim's injection, the GPU."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from dilu.config import WorkerSettings
from dilu.instance_protocol import InstanceEnvironment
from dilu.messages import DeviceInfo
from tests.builders import make_start
from worker.backends.bounds import PIDS, RUNTIME_MEMORY
from worker.backends.docker import DockerBackend, signal_exit_code, translate_injection
from worker.backends.heap import TUNABLES

GPU = DeviceInfo(kind="gpu", uuid="GPU-1234", name="H200", memory_bytes=2**37, index=0)
FAKE = DeviceInfo(kind="gpu", uuid="FAKE-1", name="fake", memory_bytes=2**34, index=0, fake=True)
CPU = DeviceInfo(kind="cpu", uuid=None, name="cpu", memory_bytes=2**34)
SHIM_ENV = {"LD_PRELOAD": "/var/lib/dilu/shim/libdilu_shim.so", "DILU_TOKEN_SOCKET": "/var/lib/dilu/run/GPU-1234.sock",
            "DILU_MEMORY_LIMIT": "1024"}


def backend() -> DockerBackend:
    return DockerBackend(client=None, cpu_image="dilu/runtime-cpu", gpu_image="dilu/runtime-cuda",
                         user="10001:10001", host="0.0.0.0", advertise_host="node-7", cores=8)


def mounts(kwargs: dict) -> dict[str, dict]:
    return {m["Target"]: m for m in kwargs["mounts"]}


def test_cpu_instance_is_isolated_and_gets_its_code_read_only() -> None:
    start = make_start("fn-1", "/var/lib/dilu/bundles/abc", env={"MODE": "fast"})
    kwargs = backend().run_arguments(start, CPU, 40001, {})
    assert kwargs["image"] == "dilu/runtime-cpu" and kwargs["network_mode"] == "host"
    assert kwargs["user"] == "10001:10001" and kwargs["read_only"] is True and "/tmp" in kwargs["tmpfs"]
    assert kwargs["cap_drop"] == ["ALL"] and "no-new-privileges" in kwargs["security_opt"]
    limit = start.memory_bytes + RUNTIME_MEMORY               # the function's memory and the runtime's
    assert kwargs["mem_limit"] == kwargs["memswap_limit"] == limit and "device_requests" not in kwargs
    assert kwargs["pids_limit"] == PIDS and kwargs["shm_size"] == limit and f"size={limit}" in kwargs["tmpfs"]["/tmp"]
    code = mounts(kwargs)["/opt/dilu/function"]
    assert code["Source"] == "/var/lib/dilu/bundles/abc" and code["ReadOnly"] is True
    env = kwargs["environment"]
    assert env["MODE"] == "fast" and env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["GLIBC_TUNABLES"] == TUNABLES, "containers keep freed memory in their heap too"
    seen = InstanceEnvironment.from_environ(env)
    assert seen.listen == ("0.0.0.0", 40001) and seen.device == "cpu"
    assert seen.config().source_dir == "/opt/dilu/function" and seen.config().instance_id == "fn-1"


def test_gpu_instance_gets_its_gpu_by_uuid_and_the_shim_mounted_read_only() -> None:
    kwargs = backend().run_arguments(make_start("fn-2", "/code"), GPU, 40002, SHIM_ENV)
    assert kwargs["image"] == "dilu/runtime-cuda"
    (request,) = kwargs["device_requests"]
    assert request["DeviceIDs"] == ["GPU-1234"] and request["Capabilities"] == [["gpu"]]
    found = mounts(kwargs)
    assert found["/opt/dilu/shim"]["Source"] == "/var/lib/dilu/shim" and found["/opt/dilu/shim"]["ReadOnly"]
    assert found["/run/dilu"]["Source"] == "/var/lib/dilu/run" and found["/run/dilu"]["ReadOnly"]
    env = kwargs["environment"]
    assert env["LD_PRELOAD"] == "/opt/dilu/shim/libdilu_shim.so"
    assert env["DILU_TOKEN_SOCKET"] == "/run/dilu/GPU-1234.sock" and env["DILU_MEMORY_LIMIT"] == "1024"
    assert env["DILU_DEVICE"] == "cuda"


def test_simulated_gpu_mounts_the_fake_driver_and_a_writable_clock() -> None:
    injected = {**SHIM_ENV, "LD_LIBRARY_PATH": "/h/shim/fake", "DILU_FAKE_CLOCK": "/h/run/FAKE-1.clock"}
    env, found = translate_injection(injected)
    by_target = {m["target"]: m for m in found}
    assert by_target["/opt/dilu/fake-driver"]["read_only"] and not by_target["/opt/dilu/fake-clock"]["read_only"]
    assert env["LD_LIBRARY_PATH"] == "/opt/dilu/fake-driver" and env["DILU_FAKE_CLOCK"] == "/opt/dilu/fake-clock"
    kwargs = backend().run_arguments(make_start("fn-3", "/code"), FAKE, 1, injected)
    assert kwargs["image"] == "dilu/runtime-cpu" and "device_requests" not in kwargs


def test_image_function_runs_from_its_image_without_mounted_code() -> None:
    start = make_start("fn-4", "", image="registry.example/team/model:1.2")
    kwargs = backend().run_arguments(start, CPU, 40004, {})
    assert kwargs["image"] == "registry.example/team/model:1.2"
    assert "/opt/dilu/function" not in mounts(kwargs) and "working_dir" not in kwargs
    assert json.loads(kwargs["environment"]["DILU_INSTANCE_CONFIG_JSON"])["source_dir"] == ""


@pytest.mark.parametrize(("code", "expected"), [(137, -9), (143, -15), (0, 0), (3, 3)])
def test_exit_codes_follow_the_agents_convention(code: int, expected: int) -> None:
    assert signal_exit_code(code) == expected


@pytest.mark.parametrize("user", ["0", "0:0", "root", ":1000"])
def test_instances_never_run_as_root(user: str) -> None:
    with pytest.raises(ValidationError, match="never run as root"):
        WorkerSettings(docker_user=user)


@pytest.mark.parametrize(("host", "advertise", "expected"), [
    ("127.0.0.1", None, "127.0.0.1"), ("10.1.2.3", None, "10.1.2.3"), ("0.0.0.0", "gpu-7.internal", "gpu-7.internal"),
])
def test_advertised_address(host: str, advertise: str | None, expected: str) -> None:
    assert WorkerSettings(host=host, advertise_host=advertise).effective_advertise_host == expected


def test_a_wildcard_listen_address_is_never_advertised() -> None:
    assert WorkerSettings(host="0.0.0.0").effective_advertise_host not in ("0.0.0.0", "", "127.0.0.1")


def test_each_function_gets_its_own_uid_in_containers(tmp_path) -> None:
    from worker.uids import UidRegistry

    users = UidRegistry(tmp_path / "uids.json", (400000, 400009), tmp_path)
    docker = DockerBackend(client=None, cpu_image="dilu/runtime-cpu", gpu_image="dilu/runtime-cuda",
                           user="auto", host="0.0.0.0", advertise_host="node-7", cores=8, users=users)
    first = docker.run_arguments(make_start("a-1", "/b/abc", function="a"), CPU, 40001, {})["user"]
    again = docker.run_arguments(make_start("a-2", "/b/abc", function="a"), CPU, 40002, {})["user"]
    other = docker.run_arguments(make_start("b-1", "/b/abc", function="b"), CPU, 40003, {})["user"]
    assert first == again != other and first.startswith("4000") and first.split(":")[0] == first.split(":")[1]
