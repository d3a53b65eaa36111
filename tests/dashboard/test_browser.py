"""The dashboard in a real browser (headless chromium under selenium): the page lists a 4-proc
mesh and its actors, shows a failed actor's error, and a stalled endpoint's stack after a
click; the timeline and stacks tabs draw. Screenshots go where ``screenshots`` says
(docs/images/ when REGENCY_DASHBOARD_SCREENSHOTS=docs/images)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from regency.actor import ProcMesh

from ..conftest import SpawnProcs
from ..introspection.actors import Stuck

T = 30
R = TypeVar("R")


def wait_for(what: Callable[[], R], message: Callable[[], str], timeout: float = T) -> R:
    """``what()`` once it is truthy (the page polls every 1.5 s)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = what()
        except Exception:  # an element replaced by the next poll meanwhile
            value = None  # type: ignore[assignment]
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"the page did not show it within {timeout} s: {message()}")
        time.sleep(0.1)


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


def test_the_page_shows_the_mesh_a_failed_actor_and_a_stalled_stack(
    procs: ProcMesh,
    dashboard_url: str,
    browser: Any,
    roots: Any,
    release: str,
    screenshots: Path,
) -> None:
    from selenium.webdriver.common.by import By

    def css(selector: str) -> list[Any]:
        return list(browser.find_elements(By.CSS_SELECTOR, selector))

    def body() -> str:
        return str(browser.find_element(By.TAG_NAME, "body").text)

    trainers = procs.spawn("trainers", Stuck)
    for _ in range(20):
        trainers.ping.call().get(T)
    loaders = procs.spawn("loaders", Stuck)
    loaders.ping.call().get(T)
    loaders.slice(gpus=1).fail.broadcast()  # no caller waiting: the actor dies of it
    roots.wait_for("loaders")
    stalled = trainers.hang.call(release, 2)

    browser.get(dashboard_url)
    assert browser.title == "Regency dashboard"

    # The 4-proc mesh and its actors.
    rows = wait_for(lambda: len(css('tr.actor[data-mesh="trainers"]')) == 4 and
                    css('tr.actor[data-mesh="trainers"]'), body)  # fmt: skip
    assert [r.get_attribute("data-rank") for r in rows] == ["0", "1", "2", "3"]
    assert all(r.get_attribute("data-state") == "running" for r in rows)
    mesh = wait_for(lambda: [
        m for m in css(".pmesh") if m.find_elements(By.CSS_SELECTOR, '[data-actor-mesh="trainers"]')
    ], body)[0]  # fmt: skip
    head = mesh.find_element(By.CSS_SELECTOR, ".head").text
    assert "proc mesh p" in head and "{gpus: 4}" in head and "4 proc(s)" in head
    assert len(mesh.find_elements(By.CSS_SELECTOR, ".procs .chip.running")) == 4
    assert "Stuck 'trainers'" in mesh.text

    # The failed actor: its row, and its error at the top.
    failed = wait_for(lambda: css('tr.actor[data-mesh="loaders"][data-state="failed"]'), body)
    assert [r.get_attribute("data-rank") for r in failed] == ["1"]
    assert "bad value 42" in failed[0].text
    failure = css('#failures details.failure[data-mesh="loaders"]')[0]
    assert "Stuck 'loaders' rank 1" in failure.text and "ValueError: bad value 42" in failure.text

    # The stalled rank: its row says so; a click shows its stack.
    def stalled_row() -> Any:
        found = css('tr.actor[data-mesh="trainers"][data-rank="2"]')
        return found[0] if found and "hang for" in found[0].text else None

    wait_for(stalled_row, body).click()
    frames = wait_for(lambda: css("#detail-frames"), lambda: css("#detail")[0].text)[0]
    wait_for(lambda: "the stuck line" in css("#detail-frames")[0].text, lambda: frames.text)
    detail = css("#detail")[0].text
    assert "Stuck 'trainers' rank 2" in detail and "in endpoint hang for" in detail
    assert "ping" in css("#detail-recent")[0].text  # its last calls
    time.sleep(0.5)
    browser.save_screenshot(str(screenshots / "dashboard-meshes.png"))

    # The timeline: calls handled while the page is open, and the call still running.
    browser.find_element(By.CSS_SELECTOR, 'nav button[data-tab="timeline"]').click()
    browser.find_element(By.CSS_SELECTOR, '#window option[value="30"]').click()
    for i in range(60):  # bursts of calls over three seconds
        trainers.slice(gpus=slice(0, 2)).ping.call().get(T)
        if i % 3 == 0:
            trainers.slice(gpus=3).ping.call_one().get(T)
        loaders.slice(gpus=0).ping.call_one().get(T)
        time.sleep(0.05 if i % 10 else 0.3)
    wait_for(lambda: css('g.lane[data-track="Stuck trainers[0]"] rect.span'),
             lambda: css("#timeline")[0].get_attribute("innerHTML")[:2000])  # fmt: skip
    wait_for(lambda: css('g.lane[data-track="Stuck trainers[2]"] rect.running'),
             lambda: css("#timeline")[0].get_attribute("innerHTML")[:2000])  # fmt: skip
    time.sleep(1.6)  # one more poll: the lanes settle for the picture
    browser.save_screenshot(str(screenshots / "dashboard-timeline.png"))

    # The stacks tab: the job's dump.
    browser.find_element(By.CSS_SELECTOR, 'nav button[data-tab="stacks"]').click()
    wait_for(lambda: "Stuck 'trainers' rank 2: in endpoint hang" in css("#stacks-text")[0].text,
             lambda: css("#stacks-text")[0].text[:2000])  # fmt: skip
    assert "the stuck line" in css("#stacks-text")[0].text

    Path(release).touch()
    assert stalled.get(T).values() == [0, 1, 2, 3]
    assert "not answering" not in css("#status")[0].text
