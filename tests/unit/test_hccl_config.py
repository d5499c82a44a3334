"""HcclConfig: every hccl variable read once, validated, errors naming the variable."""

import dataclasses
import re

import pytest

from hccl.config import HcclConfig


def test_defaults():
    """No variable set: hls2, selection rule, 16 MB slices, shared memory with 2 MiB staging
    regions, eager collectives."""
    c = HcclConfig.from_env({})
    assert (c.topology, c.algorithm, c.slice_bytes, c.transport) == ("hls2", None, 16 << 20, "shm")
    assert c.shm_buffer_bytes == 2 << 20 and c.lazy_collectives is False and c.comm_id is None


def test_reads_every_variable():
    """Each variable lands in its field."""
    c = HcclConfig.from_env({
        "HCCL_TOPOLOGY": "hls1", "HCCL_ALGO": "ring", "PT_HCCL_SLICE_SIZE_MB": "0.5", "HCCL_TRANSPORT": "MPI",
        "HCCL_SHM_BUFFER_MB": "1", "HCCL_SOCKET_ADDR": "10.0.0.1", "HCCL_SOCKET_IFNAME": "eth0",
        "HCCL_HOST_ID": "box3", "PT_HPU_ENABLE_LAZY_COLLECTIVES": "true", "HCCL_COMM_ID": "10.0.0.1:9999",
    })
    assert (c.topology, c.algorithm, c.slice_bytes, c.transport) == ("hls1", "ring", 1 << 19, "mpi")
    assert (c.shm_buffer_bytes, c.socket_addr, c.socket_ifname) == (1 << 20, "10.0.0.1", "eth0")
    assert (c.host_key(), c.lazy_collectives, c.comm_id) == ("box3", True, "10.0.0.1:9999")


def test_torchrun_node_makes_a_host():
    """Two torchrun nodes on one machine are two hosts; GROUP_RANK alone (no torchrun) is ignored."""
    node = HcclConfig.from_env({"TORCHELASTIC_RUN_ID": "x", "GROUP_RANK": "1"})
    assert node.host_key().endswith("/node1")
    assert "/node" not in HcclConfig.from_env({"GROUP_RANK": "1"}).host_key()


@pytest.mark.parametrize("name,value", [
    ("HCCL_ALGO", "tree"), ("PT_HCCL_SLICE_SIZE_MB", "-1"), ("PT_HCCL_SLICE_SIZE_MB", "zero"),
    ("HCCL_TRANSPORT", "infiniband"), ("HCCL_SHM_BUFFER_MB", "0"), ("HCCL_SHM_BUFFER_MB", "9000"),
    ("PT_HPU_ENABLE_LAZY_COLLECTIVES", "maybe"), ("HCCL_COMM_ID", "nohost"),
    ("PT_HCCL_SLICE_SIZE_MB", "inf"), ("PT_HCCL_SLICE_SIZE_MB", "nan"), ("PT_HCCL_SLICE_SIZE_MB", "0.001"),
    ("PT_HCCL_SLICE_SIZE_MB", "true"), ("HCCL_SHM_BUFFER_MB", "inf"), ("HCCL_SHM_BUFFER_MB", "nan"),
])
def test_bad_value_names_the_variable(name, value):
    """A bad value is a ValueError naming the variable and the value."""
    with pytest.raises(ValueError, match=f"{name}='?{re.escape(value)}"):
        HcclConfig.from_env({name: value})


@pytest.mark.parametrize("name,value,stated", [
    ("PT_HCCL_SLICE_SIZE_MB", "1e-6", "(4 KiB to 64 GiB)"), ("HCCL_SHM_BUFFER_MB", "1e9", "(4 KiB to 4 GiB)"),
])
def test_out_of_range_states_the_range(name, value, stated):
    """A slice of a few bytes (48 s for a 1 MB allreduce) or an absurd buffer: the range is in the message."""
    with pytest.raises(ValueError, match=re.escape(stated)):
        HcclConfig.from_env({name: value})


def test_frozen():
    """A group's configuration cannot be changed after creation."""
    c = HcclConfig.from_env({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.algorithm = "ring"


def test_agreement_names_each_setting_and_every_ranks_value():
    """NOTE [settings agreement]: ranks grouped by value, global ranks named, shown text kept
    apart from the compared value (two paths to one topology agree)."""
    from hccl.agreement import SettingsMismatchError, check_agreement

    row = {"HCCL_ALGO": ["ring", "ring"], "HCCL_TOPOLOGY": ["abc", "/a/t.toml (content abc)"]}
    other = {"HCCL_ALGO": ["(the selection rule)", "(the selection rule)"],
             "HCCL_TOPOLOGY": ["abc", "/b/t.toml (content abc)"]}
    check_agreement([row, other | {"HCCL_ALGO": row["HCCL_ALGO"]}], [0, 1])  # same content: agree
    with pytest.raises(SettingsMismatchError) as err:
        check_agreement([row, row, row, other, row], [10, 11, 12, 13, 14])
    assert "HCCL_ALGO: ring on rank(s) 10-12, 14; (the selection rule) on rank(s) 13" in str(err.value)
    assert "HCCL_TOPOLOGY" not in str(err.value)
