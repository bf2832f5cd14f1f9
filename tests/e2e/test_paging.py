"""The function list in pages: the cursor headers a client follows, and the CLI following them."""

from __future__ import annotations

from tests.conftest import FIXTURE_FUNCTIONS

REPO = FIXTURE_FUNCTIONS.parents[2]


def test_the_function_list_pages_and_the_cli_follows(start_platform) -> None:
    platform = start_platform()
    echo = REPO / "examples" / "echo" / "model.yaml"
    names = ["echo-a", "echo-b", "echo-c"]
    for name in names:
        assert platform.deploy_file(echo, echo.read_text().replace("name: echo", f"name: {name}")).status_code == 201
    first = platform.http.get("/v1/functions", params={"limit": 2})
    assert first.status_code == 200 and [f["name"] for f in first.json()] == ["echo-a", "echo-b"]
    assert first.headers["x-next-cursor"] == "echo-b" and 'rel="next"' in first.headers["link"]
    last = platform.http.get("/v1/functions", params={"limit": 2, "cursor": first.headers["x-next-cursor"]})
    assert [f["name"] for f in last.json()] == ["echo-c"] and "x-next-cursor" not in last.headers
    assert [f["name"] for f in platform.http.get("/v1/functions").json()] == names   # no limit: all of them
    for bad in ({"limit": 0}, {"limit": 100_000}, {"cursor": "../x"}):
        refused = platform.http.get("/v1/functions", params=bad)
        assert refused.status_code == 422, bad
    listed = platform.cli("ls")
    assert listed.returncode == 0 and all(name in listed.stdout for name in names)
