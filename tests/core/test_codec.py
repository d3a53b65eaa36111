"""The codec: every message record survives the wire, payloads come back as values (or as
Undecodable), and malformed frames are refused with a clear ValueError."""

from __future__ import annotations

import pickle
import re
import struct
import types
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regency.core import _codec
from regency.core import _messages as M
from regency.supervision import FailureCause

names = st.text(min_size=0, max_size=12)
ports = st.none() | st.tuples(names, st.integers(0, 2**63 - 1))
owners = st.tuples(names, names, names)
labels = st.lists(names, max_size=3)
sizes = st.lists(st.integers(1, 64), max_size=3)
values = st.none() | st.integers() | st.text(max_size=20) | st.lists(st.integers(), max_size=5)

records = st.one_of(
    st.builds(M.Call, names, names, ports, st.integers(0, 10**6), labels, sizes, values),
    st.builds(
        M.Reply, st.integers(0, 2**63 - 1), st.integers(0, 2**31), st.sampled_from([0, 1, 2]),
        values,
    ),
    st.builds(M.Spawn, names, names, st.integers(0, 10**6), labels, sizes, ports, owners, values),
    st.builds(M.StopActor, names, ports),
    st.builds(M.StopProc, ports),
    st.builds(M.Hello, names, names, st.none() | st.tuples(names, names, names)),
    st.builds(M.Failed, names, st.integers(0, 10**6), values),
    st.builds(M.Heartbeat, names),
    st.builds(M.Session, names, st.integers(0, 2**63 - 1)),
    st.builds(M.Ack, st.integers(0, 2**63 - 1)),
    st.builds(M.Attach, names, st.floats(0.1, 100), st.tuples(names, st.integers(0, 2**40))),
    st.builds(M.Reserve, names, st.integers(0, 100), st.tuples(names, st.integers(0, 2**40))),
    st.builds(M.Launch, names, values),
    st.builds(M.Exited, names, st.integers(-64, 255)),
    st.builds(M.Kill, names, names),
    st.builds(M.Lease, names),
    st.builds(M.Detach, names, st.booleans()),
)


def _wire(frame: _codec.Frame) -> memoryview:
    return memoryview(frame if isinstance(frame, bytes) else b"".join(frame))


def _same(a: Any, b: Any) -> None:
    """Equal records, comparing sequences by content (a tuple may come back as a list)."""
    assert type(a) is type(b)
    for field in type(a).__attrs_attrs__:
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
            assert list(x) == list(y), field.name
        else:
            assert x == y, field.name


@given(records)
def test_every_record_survives_the_wire(msg: M.Wire) -> None:
    got = _codec.decode(_wire(_codec.encode(msg)))
    if isinstance(got, M.Spawn):
        # A SPAWN's payload arrives still pickled: the proc unpickles it off its loop.
        assert isinstance(got.payload, M.Unpickled)
        got = attrs.evolve(got, payload=_codec.load_pickled(got.payload))
    _same(got, msg)


def test_a_hello_carries_a_boot_failure_and_is_unchanged_without_one() -> None:
    """A proc whose bootstrap callable raised says so in its HELLO; a HELLO without an
    error is the frame it was before HELLOs carried errors (older peers read it)."""
    error = ("builtins.RuntimeError", "no checkpoint", "Traceback (most recent call last):\n")
    failed = M.Hello("c1.p3", "unix:///run/regency/p3.sock", error)
    assert _codec.decode(_wire(_codec.encode(failed))) == failed
    plain = M.Hello("c1.p3", "unix:///run/regency/p3.sock")
    assert _codec.encode(plain) == _codec._pack((_codec._HELLO, plain.proc_id, plain.address))
    assert _codec.decode(_wire(_codec.encode(plain))) == plain


def test_the_hot_path_encoders_match_encode() -> None:
    payload = _codec.dumps(((1, "two"), {"three": 3}))
    call = M.Call("c1.p.0", "ping", ("unix:///x.sock", 9), 2, ["gpus"], [4], M.Pickled(payload))
    fast = _codec.encode_call("c1.p.0", "ping", ("unix:///x.sock", 9), 2, ["gpus"], [4], payload)
    assert _codec.encode(call) == fast
    decoded = _codec.decode(_wire(fast))
    assert isinstance(decoded, M.Call) and decoded.payload == ((1, "two"), {"three": 3})
    reply = _codec.encode_reply(9, 1, M.OK, {"x": 1})
    assert reply == _codec.encode(M.Reply(9, 1, M.OK, {"x": 1}))
    assert isinstance(reply, bytes) and reply[:4] == b"\xff\xff\xff\xff"  # the binary layout


def test_a_call_with_one_payload_part_has_the_compact_layout() -> None:
    payload = _codec.dumps(((1,), {}))
    port = ("unix:///x.sock", (1 << 63) | 2)  # reserved port ids use the top bit
    frame = _codec.encode_call("c1.p.0", "ping", port, 3, ("gpus",), (4,), payload)
    assert isinstance(frame, bytes) and frame[:4] == b"\xfc\xff\xff\xff"
    for _ in range(2):  # the second decode finds the route cached: the same record
        got = _codec.decode(_wire(frame))
        assert got == M.Call("c1.p.0", "ping", port, 3, ("gpus",), (4,), ((1,), {}))
    # No reply port, and labels in lists (not cached, still lists on arrival).
    got = _codec.decode(_wire(_codec.encode_call("k", "m", None, 0, ["a", "b"], [1, 2], payload)))
    assert got == M.Call("k", "m", None, 0, ["a", "b"], [1, 2], ((1,), {}))
    # A rank beyond the fixed field, and out-of-band parts, go in an envelope instead.
    big = _codec.encode_call("k", "m", None, 1 << 40, ("a",), (1,), payload)
    assert isinstance(big, bytes) and big[:4] != b"\xfc\xff\xff\xff"
    assert _codec.decode(_wire(big)).rank == 1 << 40
    parts = _codec.dumps(((_codec.out_of_band(bytes(1 << 17)),), {}))
    assert len(parts) == 2
    frame_parts = _codec.encode_call("k", "m", None, 0, ("a",), (1,), parts)
    assert isinstance(frame_parts, list) and bytes(frame_parts[0][:4]) != b"\xfc\xff\xff\xff"
    assert _codec.decode(_wire(frame_parts)).payload == ((bytes(1 << 17),), {})


def _joined(frame: Any) -> bytes:
    return b"".join(bytes(p) for p in frame) if isinstance(frame, list) else bytes(frame)


def _same_frame(a: Any, b: Any) -> bool:
    return _joined(a) == _joined(b)


@pytest.mark.parametrize(
    "port, ranks, labels, sizes, payload",
    [
        (("unix:///x.sock", 9), range(4), ("gpus",), (4,), _codec.dumps(((1, "two"), {}))),
        (None, [3, 1, 2], ["a", "b"], [2, 2], _codec.dumps(((), {}))),  # lists: not cached
        (None, [0, 1 << 40], ("a",), (1 << 41,), _codec.dumps(((), {}))),  # beyond the field
        (None, range(2), ("a",), (2,), _codec.dumps(((list(range(40000)),), {}))),  # big
        (None, range(2), ("a",), (2,), _codec.dumps(((_codec.out_of_band(bytes(1 << 17)),), {}))),
    ],
)
def test_a_call_to_several_ranks_encodes_as_one_call_per_rank(
    port: Any, ranks: Any, labels: Any, sizes: Any, payload: Any
) -> None:
    frames = _codec.encode_calls("k", "m", port, ranks, labels, sizes, payload)
    one_by_one = [_codec.encode_call("k", "m", port, r, labels, sizes, payload) for r in ranks]
    assert len(frames) == len(one_by_one)
    assert all(_same_frame(a, b) for a, b in zip(frames, one_by_one, strict=True))
    for rank, frame in zip(ranks, frames, strict=True):
        got = _codec.decode(_wire(frame))
        assert isinstance(got, M.Call) and (got.rank, got.port) == (rank, port)


def test_the_route_tables_stay_bounded_and_every_call_decodes() -> None:
    payload = _codec.dumps(((), {}))
    frames = [
        _codec.encode_call(f"k{i}", "m", ("unix:///x.sock", i), 0, ("a",), (1,), payload)
        for i in range(_codec._ROUTES_MAX + 100)
    ]
    assert len(_codec._routes_out) <= _codec._ROUTES_MAX
    for i, frame in enumerate(frames):
        got = _codec.decode(_wire(frame))
        assert isinstance(got, M.Call) and got.actor == f"k{i}" and got.port == ("unix:///x.sock", i)
    assert len(_codec._routes_in) <= _codec._ROUTES_MAX


def test_a_big_compact_call_is_sent_as_parts() -> None:
    payload = _codec.dumps(((list(range(40000)),), {}))  # one part, over 64 KiB
    frame = _codec.encode_call("k", "m", None, 0, ("a",), (1,), payload)
    assert isinstance(frame, list) and frame[1] is payload[0]  # not joined
    assert _codec.decode(_wire(frame)).payload == ((list(range(40000)),), {})


def _compact(route: bytes, rest: bytes = b"", length: int | None = None) -> bytes:
    head = struct.pack("<IIQI", 0xFFFFFFFC, len(route) if length is None else length, 0, 0)
    return head + route + rest


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (b"\xfc\xff\xff\xff\x01", "call frame of 5 bytes is too short"),
        (_compact(b"xyz", length=99), "call route length 99 exceeds the frame (23 bytes)"),
        (_compact(b"junk"), "call route does not unpickle"),
        (_compact(pickle.dumps(("k", "m"))), "call route is not (actor, method, address, labels"),
        (_compact(pickle.dumps((1, "m", None, (), ()))), "call route is not"),
    ],
)
def test_malformed_compact_calls_are_refused(frame: bytes, message: str) -> None:
    for decode in (_codec.decode, lambda f: _codec.decode_call_to(f, lambda actor: True)):
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            decode(memoryview(frame))


_LOADS: list[int] = []


def _counted(value: int) -> int:
    _LOADS.append(value)
    return value


class _CountsLoads:
    """Unpickles to an int, and counts each time it is unpickled."""

    def __reduce__(self) -> Any:
        return (_counted, (7,))


def test_decode_call_to_reads_only_calls_to_wanted_actors() -> None:
    payload = _codec.dumps(((_CountsLoads(),), {}))
    call = _wire(_codec.encode_call("k", "ping", None, 0, ["gpus"], [1], payload))
    _LOADS.clear()
    assert _codec.decode_call_to(call, lambda actor: False) is None
    assert _LOADS == []  # its payload was not unpickled
    got = _codec.decode_call_to(call, lambda actor: actor == "k")
    assert isinstance(got, M.Call) and got.method == "ping" and got.payload == ((7,), {})
    assert _LOADS == [7]
    reply = _wire(_codec.encode_reply(9, 1, M.OK, "x"))
    spawn = _wire(_codec.encode(M.Spawn("k", "n", 0, [], [], None, ("a", "k", "n"), M.Pickled([b"x"]))))
    assert _codec.decode_call_to(reply, lambda actor: True) is None
    assert _codec.decode_call_to(spawn, lambda actor: True) is None
    with pytest.raises(ValueError, match="too short for a header"):
        _codec.decode_call_to(memoryview(b"\x01"), lambda actor: True)
    with pytest.raises(ValueError, match="envelope length"):
        _codec.decode_call_to(memoryview(b"\x00\x00\x10\x00" + b"\x00" * 8), lambda actor: True)
    # An envelope call whose actor key is not a str is malformed (ValueError, which a reading
    # thread declines, leaving the loop to close the connection), not a TypeError out of the
    # actor table that would reach the reading thread's caller.
    bad = _codec._pack((_codec._CALL, ["x"], "m", None, 0, (), ()), _codec.dumps(((), {})))
    with pytest.raises(ValueError, match=re.escape("actor key ['x'] is not a str")):
        _codec.decode_call_to(memoryview(bytes(bad)), {}.get)  # type: ignore[arg-type]


def test_replies_of_none_and_calls_without_arguments_are_told_by_their_bytes() -> None:
    # A reply of None and a call without arguments are recognised by their bytes, not
    # unpickled: other values of the same length decode as themselves, and each call gets a
    # kwargs dict of its own (an endpoint may change it).
    for value in (None, True, False, (), 7, "x"):
        frame = _wire(_codec.encode_reply(3, 1, M.OK, value))
        assert _codec.decode_reply(frame) == (3, 1, M.OK, value)
        assert _codec.decode(frame) == M.Reply(3, 1, M.OK, value)
    # A reply whose 4 payload bytes are not None's pickle but a 4-byte pickle of another
    # value (True, as another sender might write it).
    head = _wire(_codec.encode_reply(3, 1, M.OK, None))[: -len(pickle.dumps(None, protocol=5))]
    assert _codec.reply_value(memoryview(bytes(head) + b"\x80\x05\x88.")) is True
    frame = _wire(_codec.encode_call("k", "m", None, 0, ["gpus"], [1], _codec.dumps(((), {}))))
    first, second = _codec.decode(frame), _codec.decode(frame)
    assert isinstance(first, M.Call) and isinstance(second, M.Call)
    assert first.payload == second.payload == ((), {})
    first.payload[1]["changed"] = True
    assert second.payload == ((), {})  # not the same dict
    assert _codec.decode_call_to(frame, lambda actor: True) == second
    # A payload that pickles to as many bytes is unpickled as itself.
    same_length = _codec.dumps((None, {}))
    assert len(same_length[0]) == len(_codec.dumps(((), {}))[0])
    frame = _wire(_codec.encode_call("k", "m", None, 0, ["gpus"], [1], same_length))
    got = _codec.decode(frame)
    assert isinstance(got, M.Call) and got.payload == (None, {})


def test_a_payload_that_cannot_be_unpickled_arrives_as_undecodable() -> None:
    frame = _codec.encode(M.Call("k", "m", None, 0, [], [], M.Pickled([b"not a pickle"])))
    msg = _codec.decode(_wire(frame))
    assert isinstance(msg, M.Call) and isinstance(msg.payload, M.Undecodable)
    assert isinstance(msg.payload.error, pickle.UnpicklingError)
    reply = _codec.decode(_wire(_codec.encode(M.Reply(3, 0, M.OK, M.Pickled([b"\x80\x05junk"])))))
    assert isinstance(reply, M.Reply) and isinstance(reply.payload, M.Undecodable)


def test_an_exception_value_is_not_mistaken_for_an_undecodable_one() -> None:
    reply = _codec.decode(_wire(_codec.encode_reply(3, 0, M.OK, ValueError("a value"))))
    assert isinstance(reply, M.Reply) and isinstance(reply.payload, ValueError)


def test_large_payloads_travel_as_parts_and_bytes_out_of_band() -> None:
    big = bytes(range(256)) * 1024  # 256 KiB
    frame = _codec.encode(M.Failed("mesh", 3, big))
    assert isinstance(frame, list)  # not joined: sent with sendmsg
    assert any(len(part) == len(big) for part in frame)  # the bytes went out of band
    msg = _codec.decode(_wire(frame))
    assert isinstance(msg, M.Failed) and msg.payload == big
    reply = _codec.encode_reply(1, 0, M.OK, big)
    assert isinstance(reply, list)  # out-of-band parts: the envelope layout
    decoded = _codec.decode(_wire(reply))
    assert isinstance(decoded, M.Reply) and decoded.payload == big


def test_a_failure_cause_and_a_class_from_main_go_by_value() -> None:
    cause = FailureCause("it broke", exit_code=3)
    msg = _codec.decode(_wire(_codec.encode(M.Failed("m", 0, cause))))
    assert isinstance(msg, M.Failed) and msg.payload == cause
    cls = types.new_class("Local", (), {})
    cls.__module__ = "__main__"  # as in a script or notebook: not importable elsewhere
    parts = _codec.dumps(cls)
    assert b"cloudpickle" in bytes(parts[0])
    assert _codec.loads(parts).__name__ == "Local"


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (b"\x01", "too short for a header"),
        (b"\xff\x00\x00\x00abc", "envelope length 255 exceeds the frame"),
        (b"\xff\xff\xff\xff\x01", "reply frame of 5 bytes is too short"),
        (b"\xfd\xff\xff\xff\x01", "acknowledgement frame of 5 bytes"),
        (b"\xfe\xff\xff\xff\x01", "session frame of 5 bytes is too short"),
        (_codec._pack(("not a tuple",)) + b"extra", "trailing bytes"),
        (_codec._pack((99, "x")), "unknown frame kind 99"),
        (_codec._pack((0, "only", "three")), "malformed frame envelope (0,)"),
    ],
)
def test_malformed_frames_are_refused(frame: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _codec.decode(memoryview(frame))


def test_an_envelope_that_is_not_a_regency_envelope_is_refused() -> None:
    env = pickle.dumps("just a string", protocol=5)
    frame = len(env).to_bytes(4, "little") + env
    with pytest.raises(ValueError, match="not a Regency envelope"):
        _codec.decode(memoryview(frame))


# -- bulk values out of band: NumPy arrays, CPU tensors, bytes -------------------------------

numpy = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

class _Subclass(numpy.ndarray):  # type: ignore[type-arg]
    pass


_DTYPES = ["float32", "float64", "int8", "int64", "uint16", "bool", "complex64"]


def _through(value: Any) -> tuple[Any, list[bytes | memoryview], bytearray]:
    """``value`` as a reply frame, decoded out of a receive buffer that is then scribbled
    over (as the transport's reused buffer would be)."""
    frame = _codec.encode_reply(1, 0, M.OK, value)
    parts = [frame] if isinstance(frame, bytes) else frame
    buffer = bytearray(b"".join(bytes(p) for p in parts))
    msg = _codec.decode(memoryview(buffer))
    assert isinstance(msg, M.Reply)
    buffer[:] = b"\xa5" * len(buffer)
    return msg.payload, parts, buffer


@settings(deadline=None)  # a loaded machine may pause any one example
@given(
    dtype=st.sampled_from(_DTYPES),
    shape=st.lists(st.integers(0, 40), min_size=0, max_size=3),
    order=st.sampled_from("CF"),
    nested=st.booleans(),
)
def test_numpy_arrays_go_out_of_band_and_arrive_owned(
    dtype: str, shape: list[int], order: str, nested: bool
) -> None:
    n = int(numpy.prod(shape)) if shape else 1
    array = (numpy.arange(n) % 7).astype(dtype).reshape(shape, order=order)
    value = {"a": [array, array]} if nested else array
    got, _, _ = _through(value)
    back = got["a"] if nested else [got]
    for item in back:
        assert item.dtype == array.dtype and item.shape == array.shape
        assert numpy.array_equal(item, array)  # unchanged by the scribbled receive buffer
        assert item.flags.owndata or (item.base is not None and item.base.flags.owndata)
    if nested:
        assert back[0] is back[1]  # one object stays one object
    pickled = _codec.dumps(value)
    assert [len(p) for p in pickled[1:]] == [array.nbytes]  # out of band, once


@settings(deadline=None)  # a loaded machine may pause any one example
@given(
    dtype=st.sampled_from([torch.float32, torch.float64, torch.int64, torch.bfloat16, torch.bool]),
    shape=st.lists(st.integers(1, 20), min_size=1, max_size=3),
    transpose=st.booleans(),
)
def test_cpu_tensors_go_out_of_band_keep_their_views_and_arrive_owned(
    dtype: Any, shape: list[int], transpose: bool
) -> None:
    base = (torch.arange(int(numpy.prod(shape))) % 5).to(dtype).reshape(shape)
    view = base.t() if transpose and base.dim() == 2 else base[..., :1]
    got, _, _ = _through((base, view))
    got_base, got_view = got
    assert torch.equal(got_base, base) and torch.equal(got_view, view)
    assert got_base.dtype == dtype and got_view.stride() == view.stride()
    assert got_base.untyped_storage().data_ptr() == got_view.untyped_storage().data_ptr()
    nbytes = base.untyped_storage().nbytes()
    assert [len(p) for p in _codec.dumps((base, view))[1:]] == [nbytes]  # shared, sent once


def test_tensors_torch_must_pickle_itself_still_round_trip() -> None:
    grad = torch.ones(3, requires_grad=True)
    param = torch.nn.Parameter(torch.zeros(2))
    tagged = torch.ones(2)
    tagged.tag = "kept"  # type: ignore[attr-defined]
    got, _, _ = _through([grad, param, tagged])
    assert got[0].requires_grad and torch.equal(got[0].detach(), grad.detach())
    assert type(got[1]) is torch.nn.Parameter and torch.equal(got[1].detach(), param.detach())
    assert got[2].tag == "kept" and torch.equal(got[2], tagged)


def test_buffers_other_picklers_make_stay_in_band() -> None:
    # numpy's own reducer hands its buffer out of band, and its rebuilder keeps whatever
    # buffer it gets: out of band, a received array would alias the reused receive buffer.
    array = numpy.arange(50_000, dtype="int64")
    parts = _codec.dumps(array.__reduce_ex__(5))
    assert len(parts) == 1
    got, _, _ = _through(numpy.ones((300, 300)).view(_Subclass))  # numpy's own reducer
    assert type(got) is _Subclass and float(got.sum()) == 90_000.0  # not the scribbles


@settings(deadline=None)  # a loaded machine may pause any one example
@given(
    cut=st.integers(0, 400),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=4),
)
def test_a_damaged_bulk_frame_is_refused_or_fails_its_payload_only(
    cut: int, flips: list[tuple[int, int]]
) -> None:
    frame = _codec.encode_reply(1, 0, M.OK, [numpy.arange(40_000), torch.ones(20_000)])
    wire = bytearray(b"".join(bytes(p) for p in frame))
    for at, bits in flips:
        wire[at % len(wire)] ^= bits
    wire = wire[: max(0, len(wire) - cut)]
    try:
        msg = _codec.decode(memoryview(wire))
    except ValueError:
        return  # refused: the transport closes this connection, saying why
    assert isinstance(msg, M.Reply)  # else the payload alone failed (an Undecodable)


def test_bulk_reply_port_reads_the_envelope_of_a_reply_with_out_of_band_parts() -> None:
    big = _codec.encode_reply(77, 3, 0, b"x" * (1 << 20))
    assert isinstance(big, list)
    assert _codec.bulk_reply_port(memoryview(b"".join(big))) == 77
    compact = _codec.encode_reply(77, 3, 0, "small")
    assert _codec.bulk_reply_port(memoryview(bytes(compact))) is None  # type: ignore[arg-type]
    call = _codec.encode_call("a", "m", None, 0, (), (), _codec.dumps(b"y" * (1 << 20)))
    assert _codec.bulk_reply_port(memoryview(b"".join(call))) is None  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="too short for a header"):
        _codec.bulk_reply_port(memoryview(b"ab"))
