"""The verbs backend's pure parts: queue-pair details, device choice, chunks, error text."""

from __future__ import annotations

import pytest

from regency.rdma._verbs_info import (
    MAX_CHUNK,
    WC_STATUS,
    PortInfo,
    QueuePairInfo,
    choose_port,
    completion_error,
    gid_bytes,
    gid_text,
    path_mtu,
    plan_chunks,
    scan_ports,
)

GID = "fe80:0000:0000:0000:0202:c9ff:fe00:0001"


def test_queue_pair_info_round_trips_and_is_small() -> None:
    info = QueuePairInfo(qp_num=0xABCDEF, lid=0x1234, gid=gid_bytes(GID), psn=0x123456, mtu=5)
    packed = info.pack()
    assert len(packed) == 31
    assert QueuePairInfo.unpack(packed) == info
    assert info.has_gid and not QueuePairInfo(1, 1, bytes(16), 1, 3).has_gid


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"qp_num": 1 << 24}, r"qp_num must be an integer in \[0, 2\*\*24\) \(got 16777216\)"),
        ({"psn": -1}, r"psn must be an integer in \[0, 2\*\*24\) \(got -1\)"),
        ({"lid": 1 << 16}, r"lid must be an integer in \[0, 2\*\*16\)"),
        ({"gid": b"short"}, r"gid must be 16 bytes \(got b'short'\)"),
        ({"mtu": 6}, r"mtu must be an ibv_mtu value, one of 1..5 \(got 6\)"),
    ],
)
def test_queue_pair_info_refuses_out_of_range_fields(
    fields: dict[str, object], message: str
) -> None:
    values: dict[str, object] = {"qp_num": 1, "lid": 1, "gid": bytes(16), "psn": 1, "mtu": 3}
    values.update(fields)
    with pytest.raises(ValueError, match=message):
        QueuePairInfo(**values)  # type: ignore[arg-type]


def test_queue_pair_info_unpack_names_what_is_wrong() -> None:
    good = QueuePairInfo(7, 1, bytes(16), 9, 4).pack()
    with pytest.raises(ValueError, match=r"queue-pair details must be 31 bytes \(got 30 bytes\)"):
        QueuePairInfo.unpack(good[:-1])
    with pytest.raises(ValueError, match=r"must start with b'RQP1' \(got b'XQP1'\)"):
        QueuePairInfo.unpack(b"X" + good[1:])
    with pytest.raises(ValueError, match=r"must be 31 bytes \(got str\)"):
        QueuePairInfo.unpack("text")  # type: ignore[arg-type]


def test_gids_convert_both_ways() -> None:
    raw = gid_bytes(GID)
    assert raw[:2] == b"\xfe\x80" and raw[-1] == 1
    assert gid_text(raw) == GID
    with pytest.raises(ValueError, match=r"a GID must look like"):
        gid_bytes("fe80::1")
    with pytest.raises(ValueError, match=r"a GID must be hexadecimal groups"):
        gid_bytes(GID.replace("fe80", "zz80"))


def test_path_mtu_is_the_smaller() -> None:
    assert path_mtu(5, 3) == 3 and path_mtu(1, 4) == 1


# -- device choice from a sysfs-shaped tree --------------------------------------------


def fake_sysfs(tree: dict[str, str]) -> tuple[object, object]:
    """listdir and read over ``tree``: path -> file content."""

    def listdir(path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        return sorted({p[len(prefix):].split("/")[0] for p in tree if p.startswith(prefix)})

    def read(path: str) -> str | None:
        return tree.get(path)

    return listdir, read


ROOT = "/sys/class/infiniband"
ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"


def port_files(device: str, port: int, state: str, link: str,
               gids: dict[int, tuple[str, str]]) -> dict[str, str]:
    base = f"{ROOT}/{device}/ports/{port}"
    files = {f"{base}/state": f"{state}\n", f"{base}/link_layer": f"{link}\n"}
    for index, (gid, kind) in gids.items():
        files[f"{base}/gids/{index}"] = gid + "\n"
        files[f"{base}/gid_attrs/types/{index}"] = kind + "\n"
    return files


def sample() -> dict[str, str]:
    return {
        **port_files("mlx5_0", 1, "1: DOWN", "InfiniBand", {0: (GID, "IB/RoCE v1")}),
        **port_files("mlx5_1", 1, "4: ACTIVE", "Ethernet", {
            0: ("fe80:0000:0000:0000:0000:00ff:fe00:0002", "IB/RoCE v1"),
            1: ("fe80:0000:0000:0000:0000:00ff:fe00:0002", "RoCE v2"),
            2: (ZERO, "IB/RoCE v1"),
            3: ("0000:0000:0000:0000:0000:ffff:0a00:0005", "RoCE v2"),
        }),
        **port_files("mlx5_2", 1, "4: ACTIVE", "InfiniBand", {0: (GID, "IB/RoCE v1")}),
        **port_files("mlx5_2", 2, "4: ACTIVE", "InfiniBand", {0: (GID, "IB/RoCE v1")}),
    }


def ports_of(tree: dict[str, str]) -> list[PortInfo]:
    listdir, read = fake_sysfs(tree)
    return scan_ports(ROOT, listdir, read)  # type: ignore[arg-type]


def test_scan_reads_states_link_layers_and_nonzero_gids() -> None:
    ports = ports_of(sample())
    assert [(p.device, p.port, p.active) for p in ports] == [
        ("mlx5_0", 1, False), ("mlx5_1", 1, True), ("mlx5_2", 1, True), ("mlx5_2", 2, True)
    ]
    roce = ports[1]
    assert roce.link_layer == "Ethernet" and sorted(roce.gids) == [0, 1, 3]


def test_default_choice_skips_down_ports_and_prefers_roce_v2_ipv4_gids() -> None:
    choice = choose_port(ports_of(sample()), {})
    assert (choice.device, choice.port, choice.gid_index, choice.use_grh) == (
        "mlx5_1", 1, 3, True
    )


def test_infiniband_uses_gid_zero_and_lids_unless_a_gid_index_is_asked_for() -> None:
    ports = ports_of(sample())
    choice = choose_port(ports, {"REGENCY_RDMA_DEVICE": "mlx5_2", "REGENCY_RDMA_PORT": "2"})
    assert (choice.device, choice.port, choice.gid_index, choice.use_grh) == (
        "mlx5_2", 2, 0, False
    )
    routed = choose_port(ports, {"REGENCY_RDMA_DEVICE": "mlx5_2", "REGENCY_RDMA_GID_INDEX": "0"})
    assert routed.use_grh


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"REGENCY_RDMA_DEVICE": "mlx9"}, r"REGENCY_RDMA_DEVICE must name an RDMA device, one "
         r"of \('mlx5_0', 'mlx5_1', 'mlx5_2'\) \(got 'mlx9'\)"),
        ({"REGENCY_RDMA_DEVICE": "mlx5_2", "REGENCY_RDMA_PORT": "3"},
         r"REGENCY_RDMA_PORT must be a port of the chosen device, one of \(1, 2\) \(got 3\)"),
        ({"REGENCY_RDMA_DEVICE": "mlx5_0"}, r"no active RDMA port \(mlx5_0 port 1 are down\)"),
        ({"REGENCY_RDMA_DEVICE": "mlx5_1", "REGENCY_RDMA_GID_INDEX": "2"},
         r"REGENCY_RDMA_GID_INDEX must be the index of a GID of mlx5_1 port 1, one of "
         r"\(0, 1, 3\) \(got 2\)"),
        ({"REGENCY_RDMA_PORT": "one"}, r"REGENCY_RDMA_PORT must be a non-negative integer "
         r"\(got 'one'\)"),
    ],
)
def test_choice_errors_name_the_variable_and_the_choices(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises((LookupError, ValueError), match=message):
        choose_port(ports_of(sample()), env)


def test_no_device_and_a_roce_port_without_gids() -> None:
    with pytest.raises(LookupError, match=r"no RDMA device found"):
        choose_port([], {})
    bare = ports_of(port_files("rxe0", 1, "4: ACTIVE", "Ethernet", {0: (ZERO, "RoCE v2")}))
    with pytest.raises(LookupError, match=r"rxe0 port 1 is RoCE but has no GID"):
        choose_port(bare, {})


# -- chunks and completion errors --------------------------------------------------------


def test_chunks_cover_the_transfer_within_the_message_size() -> None:
    assert plan_chunks(10, 4) == [(0, 4), (4, 4), (8, 2)]
    assert plan_chunks(8, 4) == [(0, 4), (4, 4)]
    assert plan_chunks(1, 1 << 31) == [(0, 1)]
    assert plan_chunks(3 * MAX_CHUNK + 1, 1 << 31) == [
        (0, MAX_CHUNK), (MAX_CHUNK, MAX_CHUNK), (2 * MAX_CHUNK, MAX_CHUNK), (3 * MAX_CHUNK, 1)
    ]
    assert plan_chunks(0, 4) == []
    with pytest.raises(ValueError, match=r"max_msg and cap must be positive \(got 0, "):
        plan_chunks(10, 0)
    with pytest.raises(ValueError, match=r"nbytes must be >= 0 \(got -1\)"):
        plan_chunks(-1, 4)


def test_completion_errors_name_the_status() -> None:
    assert completion_error(10, 0x88) == (
        "work completion IBV_WC_REM_ACCESS_ERR (10, remote access error: the rkey or address "
        "range is not valid at the owner (was the buffer dropped?)), vendor error 0x88"
    )
    assert completion_error(12, 0, "transport retry counter exceeded").startswith(
        "work completion IBV_WC_RETRY_EXC_ERR (12, transport retries exceeded"
    )
    assert completion_error(99, 0) == "work completion status 99 (99, unknown status)"
    assert completion_error(5, 0, "WR flush error").endswith("[WR flush error]")
    assert sorted(WC_STATUS) == list(range(24))
