"""CUDA tensors as plain endpoint arguments and replies (out of band, as one host copy: they
arrive on the same CUDA device, which the receiving proc must see). Skips without a GPU."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from regency.actor import this_host  # noqa: E402

from .helpers import Echo  # noqa: E402

pytestmark = pytest.mark.slow  # and skipped without a GPU (conftest.py)


@pytest.fixture(scope="module")
def echo() -> Any:
    procs = this_host().spawn_procs({"procs": 1})
    mesh = procs.spawn("echo", Echo)
    yield mesh
    procs.stop().get(30)


@pytest.mark.parametrize("n", [1, 1000, 16 << 20])
def test_cuda_tensors_as_arguments_and_replies(echo: Any, n: int) -> None:  # pragma: no cover
    t = torch.arange(n, dtype=torch.float32, device="cuda")
    device, total, grad = echo.describe.call_one(t).get(60)
    assert (device, grad) == ("cuda:0", False)
    assert total == float(t.double().sum())
    back = echo.twice.call_one(t).get(60)
    assert back.device.type == "cuda" and torch.equal(back, t * 2)
    made = echo.make.call_one(n, "cuda").get(60)
    assert made.device.type == "cuda" and torch.equal(made, t)


def test_cuda_views_and_grad(echo: Any) -> None:  # pragma: no cover - needs a GPU
    base = torch.arange(12.0, device="cuda").reshape(3, 4)
    view = base.t()[1]  # non-contiguous view into a larger storage
    device, total, _ = echo.describe.call_one(view).get(60)
    assert device == "cuda:0" and total == float(view.sum())
    leaf = torch.ones(3, device="cuda", requires_grad=True)
    assert echo.describe.call_one(leaf).get(60) == ("cuda:0", 3.0, True)


@pytest.mark.filterwarnings("error::UserWarning")  # torch warns on wrapping read-only memory
@pytest.mark.parametrize("received", [bytes, bytearray])  # read-only or writable buffers
def test_cuda_storage_travels_out_of_band_once(received: type) -> None:  # pragma: no cover
    """A CUDA tensor's bytes go after the pickle (one host copy), once per storage however
    many tensors of the payload view it; the receiver's views share one CUDA storage again."""
    from regency.core._codec import dumps, loads

    base = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    parts = dumps([base[:10], base[5:], base])
    assert len(parts) == 2 and len(parts[1]) == base.numel() * 4  # one out-of-band buffer
    assert len(parts[0]) < 1000  # the pickle itself holds no tensor bytes
    a, b, whole = loads([memoryview(received(p)) for p in parts])
    assert all(t.device == base.device for t in (a, b, whole))
    assert torch.equal(whole, base) and torch.equal(a, base[:10]) and torch.equal(b, base[5:])
    whole[7] = -1.0  # the three arrived as views of one storage, as they were sent
    assert a[7].item() == -1.0 and b[2].item() == -1.0


def test_a_cuda_tensor_sent_to_a_proc_without_cuda_says_why() -> None:  # pragma: no cover
    """A proc that sees no CUDA device (``CUDA_VISIBLE_DEVICES=""``) cannot hold a CUDA
    tensor: the call fails naming the device and the fix, and the proc goes on."""
    procs = this_host().spawn_procs({"procs": 1}, env={"CUDA_VISIBLE_DEVICES": ""})
    try:
        blind = procs.spawn("blind", Echo)
        with pytest.raises(Exception, match=r"a CUDA tensor \(of cuda:0\) arrived in a process "
                           r"that sees no CUDA device; send t.cpu\(\) instead"):
            blind.describe.call_one(torch.ones(4, device="cuda")).get(60)
        assert blind.describe.call_one(torch.ones(4)).get(60) == ("cpu", 4.0, False)
    finally:
        procs.stop().get(30)
