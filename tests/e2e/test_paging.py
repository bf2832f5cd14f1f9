"""The function list in pages: the cursor headers a client follows, and the CLI following them."""

from __future__ import annotations

from tests.conftest import FIXTURE_FUNCTIONS
from tests.waiting import eventually

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


def test_workflows_events_and_instances_page_and_the_cli_follows(start_platform) -> None:
    platform = start_platform()
    echo = REPO / "examples" / "echo" / "model.yaml"
    assert platform.deploy_file(echo, echo.read_text()).status_code == 201
    names = ["flow-a", "flow-b", "flow-c"]
    for name in names:
        spec = f"name: {name}\nnodes:\n  - {{name: only, function: echo}}\n"
        assert platform.http.post("/v1/workflows", json={"yaml": spec}).status_code == 201
    first = platform.http.get("/v1/workflows", params={"limit": 2})
    assert [w["name"] for w in first.json()] == ["flow-a", "flow-b"] and first.headers["x-next-cursor"] == "flow-b"
    after = platform.http.get(first.headers["link"].split(">")[0].lstrip("<"))     # the Link, followed as given
    assert [w["name"] for w in after.json()] == ["flow-c"] and "x-next-cursor" not in after.headers
    listed = platform.cli("workflow", "ls")
    assert listed.returncode == 0 and all(name in listed.stdout for name in names)

    # Events: the newest page first, each oldest first, the cursor leading back in time. The
    # deployment's last event first: events the controller still writes would shift the pages.
    def deployed() -> list | None:
        events = platform.http.get("/v1/functions/echo/events", params={"limit": 1000}).json()
        return events if any(e["action"] == "deployed" for e in events) else None

    everything = eventually(deployed, timeout=60, what="the deployment's last event")
    assert len(everything) >= 2, everything
    pages, params = [], {"limit": 1}
    while True:
        reply = platform.http.get("/v1/functions/echo/events", params=params)
        pages.insert(0, reply.json())
        if "x-next-cursor" not in reply.headers:
            break
        params = {"limit": 1, "cursor": reply.headers["x-next-cursor"]}
    assert [e for page in pages for e in page] == everything

    assert platform.http.post("/v1/functions/echo/invoke", json={"hello": 1}).status_code == 200
    instances = platform.http.get("/v1/functions/echo/instances", params={"all": "true"}).json()
    paged, params = [], {"all": "true", "limit": 1}
    while True:
        reply = platform.http.get("/v1/functions/echo/instances", params=params)
        paged += reply.json()
        if "x-next-cursor" not in reply.headers:
            break
        params = {**params, "cursor": reply.headers["x-next-cursor"]}
    assert [i["id"] for i in paged] == [i["id"] for i in instances] and instances
    for path, bad in (("/v1/functions/echo/instances", {"cursor": "soon"}), ("/v1/functions/echo/events",
                                                                              {"cursor": "-1"}),
                      ("/v1/functions/echo/events", {"cursor": str(2**40)}), ("/v1/workflows", {"limit": 0})):
        refused = platform.http.get(path, params=bad)
        assert refused.status_code == 422 and "error" in refused.json(), (path, bad, refused.text)
