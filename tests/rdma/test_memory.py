"""What memory RDMABuffer and its transfers accept, and the errors that name the fix."""

from __future__ import annotations

import pytest

from regency.rdma._memory import region_of


def test_memoryview_region_points_at_the_memory_without_copying() -> None:
    data = bytearray(b"abcdef")
    region = region_of(memoryview(data), "thing", writable=True)
    assert (region.nbytes, region.readonly, region.kind) == (6, False, "memoryview")
    region.view[0:1] = b"X"
    assert data == bytearray(b"Xbcdef")


def test_region_keeps_the_memory_alive_after_the_caller_releases_its_view() -> None:
    data = bytearray(b"abcdef")
    mv = memoryview(data)
    region = region_of(mv, "thing", writable=True)
    mv.release()
    del data
    assert bytes(region.view) == b"abcdef"


def test_read_only_memoryview_is_a_read_only_region() -> None:
    region = region_of(memoryview(b"abc"), "thing", writable=False)
    assert region.readonly and region.view.readonly
    with pytest.raises(TypeError, match=r"read_into destination must be writable \(got a "
                       r"read-only memoryview\)"):
        region_of(memoryview(b"abc"), "read_into destination", writable=True)


def test_memoryview_of_any_format_counts_bytes() -> None:
    import array

    region = region_of(memoryview(array.array("d", [1.0, 2.0])), "thing", writable=True)
    assert region.nbytes == 16


@pytest.mark.parametrize(
    ("obj", "error", "message"),
    [
        (memoryview(bytearray(0)), ValueError, r"thing must not be empty \(got 0 bytes\)"),
        (memoryview(bytearray(8))[::2], ValueError, r"thing must be a C-contiguous memoryview"),
        (
            memoryview(bytearray(8)).cast("B", (2, 4)),
            ValueError,
            r"thing must be a 1-D memoryview \(got 2 dims, shape \(2, 4\)\)",
        ),
        (bytearray(4), TypeError, r"thing must be a torch.Tensor or a memoryview \(got "
         r"bytearray\); wrap it as memoryview\(obj\)"),
        ([1, 2], TypeError, r"thing must be a torch.Tensor or a memoryview \(got list\)$"),
    ],
)
def test_memoryview_errors_name_what_was_expected(
    obj: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        region_of(obj, "thing", writable=True)


def test_tensor_region() -> None:
    torch = pytest.importorskip("torch")
    t = torch.arange(4, dtype=torch.float32)
    region = region_of(t.view(torch.uint8), "thing", writable=True)
    assert region.nbytes == 16 and region.addr == t.data_ptr() and region.kind == "torch.Tensor"
    # A slice starts at its own first byte.
    tail = t.view(torch.uint8)[4:]
    assert region_of(tail, "thing", writable=True).addr == t.data_ptr() + 4
    assert bytes(region.view) == bytes(t.view(torch.uint8).tolist())


def test_any_contiguous_tensor_is_its_bytes() -> None:
    """As in Monarch: float32 and other dtypes, any shape, registered without a copy."""
    torch = pytest.importorskip("torch")
    for t in (torch.arange(12, dtype=torch.float32).reshape(3, 4), torch.ones(5, dtype=torch.int64)):
        region = region_of(t, "thing", writable=True)
        assert region.addr == t.data_ptr()
        assert region.nbytes == t.numel() * t.element_size()
        assert bytes(region.view) == bytes(t.reshape(-1).view(torch.uint8).tolist())


def test_tensor_region_outlives_the_tensor() -> None:
    torch = pytest.importorskip("torch")
    t = torch.full((1 << 20,), 7, dtype=torch.uint8)
    region = region_of(t, "thing", writable=True)
    del t
    assert region.view[0] == 7 and region.view[-1] == 7


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda torch: torch.zeros(8, dtype=torch.uint8)[::2], ValueError,
         r"thing must be contiguous \(got shape \(4,\), stride \(2,\)\)"),
        (lambda torch: torch.zeros(3, 4).t(), ValueError,
         r"thing must be contiguous \(got shape \(4, 3\), stride \(1, 4\)\); copy it first"),
        (lambda torch: torch.zeros(0, dtype=torch.uint8), ValueError,
         r"thing must not be empty \(got 0 bytes\)"),
        (lambda torch: torch.zeros(4, dtype=torch.uint8, device="meta"), ValueError,
         r"thing must be a CPU or CUDA tensor \(got a tensor on meta\); move it first "
         r"with t.cpu\(\)"),
    ],
)
def test_tensor_errors_name_what_was_expected(
    make: object, error: type[Exception], message: str
) -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(error, match=message):
        region_of(make(torch), "thing", writable=True)  # type: ignore[operator]
