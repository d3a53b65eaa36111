"""The dashboard over plain HTTP (no browser): the token, the JSON the page polls, and
`regency dashboard` beside a running controller."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import regency
from regency.actor import ProcMesh

from ..conftest import SpawnProcs
from ..introspection.actors import Stuck

T = 30


def _split(url: str) -> tuple[str, str]:
    base, _, query = url.partition("/?")
    token = urllib.parse.parse_qs(query)["token"][0]
    return base, token


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, Any]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=T) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers


def _json(base: str, token: str, path: str, **params: Any) -> Any:
    query = urllib.parse.urlencode({**params, "token": token})
    status, body, _ = _get(f"{base}{path}?{query}")
    assert status == 200, body
    return json.loads(body)


def test_a_request_without_the_token_is_refused(dashboard_url: str) -> None:
    base, token = _split(dashboard_url)
    assert dashboard_url.startswith("http://127.0.0.1:")
    for path in ("/", "/api/state", "/api/stacks", "/api/timeline", "/api/actor?rank=0"):
        status, body, _ = _get(base + path)
        assert status == 403, (path, status)
        assert b"needs its token" in body
    wrong = _get(f"{base}/api/state?token={token[:-1]}x")
    assert wrong[0] == 403
    forged = _get(f"{base}/api/state", {"Cookie": f"regency_dashboard_{base.rsplit(':', 1)[1]}=nope"})
    assert forged[0] == 403
    # The page, with the token: it sets the cookie that later requests may carry instead.
    status, page, headers = _get(dashboard_url)
    assert status == 200 and b"<title>Regency dashboard</title>" in page
    cookie = headers["set-cookie"]
    assert token in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    name_value = cookie.split(";", 1)[0]
    status, body, _ = _get(f"{base}/api/state", {"Cookie": name_value})
    assert status == 200 and "proc_meshes" in json.loads(body)


def test_serve_dashboard_returns_the_same_dashboard_and_checks_its_port(dashboard_url: str) -> None:
    assert regency.serve_dashboard() == dashboard_url
    with pytest.raises(ValueError, match="port must be an int"):
        regency.serve_dashboard(port=-1)


def test_the_page_needs_nothing_from_elsewhere(dashboard_url: str) -> None:
    """No CDN, no build step: one page whose only requests are its own JSON endpoints."""
    status, page, _ = _get(dashboard_url)
    text = page.decode()
    assert status == 200
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in text and "<link" not in text and "src=" not in text


@pytest.fixture
def release(tmp_path: Path) -> Iterator[str]:
    path = tmp_path / "release"
    yield str(path)
    path.touch()


@pytest.fixture
def procs(spawn_procs: SpawnProcs) -> ProcMesh:
    pm = spawn_procs({"gpus": 4})
    pm.initialized.get(T)
    return pm


def test_the_state_lists_the_mesh_its_failure_and_the_stalled_rank(
    procs: ProcMesh, dashboard_url: str, roots: Any, release: str
) -> None:
    base, token = _split(dashboard_url)
    busy = procs.spawn("http_busy", Stuck)
    for _ in range(5):
        busy.ping.call().get(T)
    dying = procs.spawn("http_dying", Stuck)
    dying.ping.call().get(T)
    dying.slice(gpus=1).fail.broadcast()  # no caller waiting: the actor dies of it
    roots.wait_for("http_dying")
    fut = busy.hang.call(release, 2)
    deadline = time.monotonic() + T
    while True:
        state = _json(base, token, "/api/state")
        pmesh = next(
            (p for p in state["proc_meshes"] if any(a["name"] == "http_busy" for a in p["actor_meshes"])),
            None,
        )
        stalled = None
        if pmesh is not None:
            amesh = next(a for a in pmesh["actor_meshes"] if a["name"] == "http_busy")
            stalled = amesh["ranks"][2]
        if stalled is not None and stalled["endpoint"] == "hang":
            break
        assert time.monotonic() < deadline, state
        time.sleep(0.2)
    assert pmesh is not None
    assert pmesh["dims"] == {"gpus": 4} and pmesh["state"] == "running"
    assert [p["coords"] for p in pmesh["procs"]] == [{"gpus": i} for i in range(4)]
    assert all(p["pid"] > 0 and p["state"] == "running" for p in pmesh["procs"])
    assert [r["rank"] for r in amesh["ranks"]] == [0, 1, 2, 3]
    assert amesh["cls"] == "Stuck" and amesh["state"] == "running"
    assert all(r["numbers"]["latency_ms"] is not None for r in amesh["ranks"])
    assert stalled["running_for"] is not None
    dead = next(a for a in pmesh["actor_meshes"] if a["name"] == "http_dying")
    assert dead["state"] == "failed"
    assert [r["state"] for r in dead["ranks"]] == ["running", "failed", "running", "running"]
    failure = next(f for f in state["failures"] if f["mesh"] == "http_dying")
    assert failure["rank"] == 1 and "bad value 42" in failure["summary"]
    assert "ValueError: bad value 42" in failure["traceback"]
    # One actor: the stalled rank's stack, from its proc.
    detail = _json(
        base, token, "/api/actor", address=stalled["address"], mesh="http_busy", rank=2
    )
    assert detail["actor"]["endpoint"] == "hang"
    assert any("the stuck line" in f["source"] for f in detail["frames"]), detail["frames"]
    assert [c["endpoint"] for c in detail["recent"][:5]] == ["ping"] * 5
    # The stacks tab: the job, then one proc.
    stacks = _json(base, token, "/api/stacks")
    assert "Stuck 'http_busy' rank 2: in endpoint hang" in stacks["text"]
    one = _json(base, token, "/api/stacks", proc=stalled["address"])
    assert one["text"].startswith("stacks of 1 proc(s), 1 answered")
    assert "the stuck line" in one["text"]
    # The timeline: calls handled while the dashboard records, and the running one.
    for _ in range(3):
        busy.slice(gpus=0).ping.call_one().get(T)
    deadline = time.monotonic() + T
    while True:
        timeline = _json(base, token, "/api/timeline", window=60)
        lanes = {lane["track"]: lane for lane in timeline["lanes"]}
        zero = lanes.get("Stuck http_busy[0]")
        if zero is not None and zero["spans"] and "Stuck http_busy[2]" in lanes:
            break
        assert time.monotonic() < deadline, timeline
        time.sleep(0.3)
    assert sum(s["count"] for s in zero["spans"]) >= 1
    assert lanes["Stuck http_busy[2]"]["running"][0] > 0
    Path(release).touch()
    assert fut.get(T).values() == [0, 1, 2, 3]


CONTROLLER = textwrap.dedent(
    """
    import sys
    from regency.actor import this_host
    from tests.introspection.actors import Stuck
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("cli_dash", Stuck)
    mesh.ping.call().get(30)
    fut = mesh.hang.call(sys.argv[1], 1)
    print("ready", flush=True)
    fut.get(60)
    """
)


@pytest.mark.slow
def test_the_cli_starts_a_running_controllers_dashboard(tmp_path: Path) -> None:
    release = tmp_path / "release"
    root = Path(__file__).resolve().parents[2]
    controller = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, str(release)],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert controller.stdout is not None
        assert controller.stdout.readline().strip() == "ready"
        command = [sys.executable, "-m", "regency", "dashboard", "--pid", str(controller.pid)]
        shown = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        url = shown.stdout.strip()
        assert url.startswith("http://127.0.0.1:") and "/?token=" in url
        again = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert again.stdout.strip() == url  # one dashboard per controller
        base, token = _split(url)
        assert _get(base + "/api/state")[0] == 403
        deadline = time.monotonic() + T
        while True:
            state = _json(base, token, "/api/state")
            meshes = [a for p in state["proc_meshes"] for a in p["actor_meshes"]]
            rows = [r for a in meshes if a["name"] == "cli_dash" for r in a["ranks"]]
            if len(rows) == 2 and rows[1]["endpoint"] == "hang":
                break
            assert time.monotonic() < deadline, state
            time.sleep(0.2)
        assert state["controller"]["pid"] == controller.pid
        missing = subprocess.run(
            [sys.executable, "-m", "regency", "dashboard", "--pid", "1"],
            capture_output=True, text=True, timeout=60,
        )
        assert missing.returncode == 2 and "no running controller with pid 1" in missing.stderr
    finally:
        release.touch()
        try:
            controller.wait(T)
        finally:
            controller.kill()
    assert controller.returncode == 0
