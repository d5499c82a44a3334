"""Topology loader and port map."""

import pytest

from hccl.sim.topology import Topology, load_topology


@pytest.mark.parametrize("name,ports_per_peer,rate", [("hls1", 1, 100.0), ("hls2", 3, 100.0), ("hls3", 3, 200.0)])
def test_builtin_ports(name, ports_per_peer, rate):
    """Built-ins: 8 cards per box, ports per peer and 3 scale-out ports per card, distinct NICs."""
    t = load_topology(name, world_size=16)
    assert t.cards_per_box == 8 and t.num_boxes == 2
    assert t.scale_up_line_rate_gbps == rate
    for a in range(8):
        used = set()
        for b in range(8):
            if a != b:
                p = t.ports(a, b)
                assert len(p) == ports_per_peer
                assert not used & set(p)
                used |= set(p)
        so = t.scale_out_ports(a)
        assert len(so) == 3 and not used & set(so)
        assert t.ports(a, a + 8) == so


def test_hls2_port_map_from_hcl():
    """hls2 uses HCL's map: card 0 reaches card 3 on NICs 0, 1, 3 and scales out on 8, 22, 23."""
    t = load_topology("hls2")
    assert t.ports(0, 3) == (0, 1, 3)
    assert t.scale_out_ports(0) == (8, 22, 23)


def test_placement_and_latency():
    """Rank r sits in box r // 8; latency grows with switch hops."""
    t = load_topology("hls2", world_size=64, boxes_per_leaf=2)
    assert t.box_of(17) == 2 and t.local_rank_of(17) == 1
    assert t.switch_hops(0, 1) == 0 and t.switch_hops(0, 8) == 1 and t.switch_hops(0, 16) == 3
    assert t.path_latency_ns(0, 1) < t.path_latency_ns(0, 8) < t.path_latency_ns(0, 16)
    with pytest.raises(ValueError, match="rank 64 out of range"):
        t.box_of(64)


def test_world_size_partial_box():
    """The number of boxes follows from the world size; the last box may be partial."""
    assert load_topology("hls2", world_size=9).num_boxes == 2
    assert load_topology("hls2", world_size=4096).num_boxes == 512


def test_unknown_name():
    """An unknown topology name is a ValueError naming it."""
    with pytest.raises(ValueError, match="unknown topology 'hls9'"):
        load_topology("hls9")


def test_malformed_file(tmp_path):
    """A file that is not TOML is a ValueError naming the file."""
    f = tmp_path / "bad.toml"
    f.write_text("cards_per_box = = 8\n")
    with pytest.raises(ValueError, match="malformed topology file"):
        load_topology(str(f))


def test_bad_field_values(tmp_path):
    """Unknown fields and bad values are named."""
    f = tmp_path / "t.toml"
    f.write_text("cards_per_box = 4\nwarp_drive = 1\n")
    with pytest.raises(ValueError, match="warp_drive"):
        load_topology(str(f))
    f.write_text("cards_per_box = 4\nscale_up_line_rate_gbps = -1.0\n")
    with pytest.raises(ValueError, match="scale_up_line_rate_gbps"):
        load_topology(str(f))
    with pytest.raises(ValueError, match="oversubscription"):
        load_topology("hls2", oversubscription=0.5)


def test_fixed_boxes_too_small(tmp_path):
    """A file fixing num_boxes refuses a world size it cannot hold."""
    f = tmp_path / "small.toml"
    f.write_text("name = 'small'\ncards_per_box = 4\nnum_boxes = 2\nports_per_card = 12\n")
    t = load_topology(str(f))
    assert t.world_size == 8 and t.fixed_boxes
    with pytest.raises(ValueError, match="world size 9 does not fit"):
        load_topology(str(f), world_size=9)
    with pytest.raises(ValueError, match="does not fit"):
        t.with_world_size(12)


def test_custom_file_roundtrip(tmp_path):
    """A user file with a small box and overrides loads."""
    f = tmp_path / "mini.toml"
    f.write_text("cards_per_box = 2\nscale_up_ports_per_peer = 2\nports_per_card = 6\n")
    t = load_topology(str(f), world_size=6, oversubscription=2.0)
    assert isinstance(t, Topology) and t.num_boxes == 3 and t.oversubscription == 2.0
    assert len(t.ports(0, 1)) == 2


@pytest.mark.parametrize("device, topology, want", [
    (None, None, ("gaudi2", "hls2")),
    ("gaudi3", None, ("gaudi3", "hls3")),
    ("HLS-1", None, ("gaudi", "hls1")),
    (None, "hls3", ("gaudi3", "hls3")),
    (None, "dl1", ("gaudi", "dl1")),
    (None, "hls1h", ("gaudi", "hls1h")),
    ("gaudi", "hls1h", ("gaudi", "hls1h")),
])
def test_device_and_topology_follow_each_other(device, topology, want):
    """A box holds cards of one generation: the setting not given follows the other (the
    built-in files' ``generation``), neither given is Gaudi 2 in an HLS-Gaudi2 box."""
    from hccl.sim.topology import device_and_topology

    assert device_and_topology(device, topology) == want


def test_device_and_topology_of_a_custom_file(tmp_path):
    """A file naming no generation holds any card (Gaudi 2 when none is given); one naming a
    generation holds only that one's."""
    from hccl.sim.topology import device_and_topology, topology_generation

    any_card = tmp_path / "mine.toml"
    any_card.write_text("cards_per_box = 8\n")
    assert topology_generation(str(any_card)) == "custom"
    assert device_and_topology(None, str(any_card)) == ("gaudi2", str(any_card))
    assert device_and_topology("gaudi3", str(any_card)) == ("gaudi3", str(any_card))
    first_gen = tmp_path / "first.toml"
    first_gen.write_text('cards_per_box = 4\ngeneration = "gaudi"\n')
    assert device_and_topology(None, str(first_gen))[0] == "gaudi"
    with pytest.raises(ValueError, match="box of gaudi cards"):
        device_and_topology("gaudi2", str(first_gen))
    bad = tmp_path / "bad.toml"
    bad.write_text("generation = 2\n")
    with pytest.raises(ValueError, match="generation must be a string"):
        topology_generation(str(bad))


def test_device_and_topology_of_two_generations_is_refused_naming_both():
    from hccl.sim.topology import device_and_topology

    with pytest.raises(ValueError) as err:
        device_and_topology("gaudi2", "hls3", device_from="--device-spec", topology_from="--topology")
    msg = str(err.value)
    assert "--device-spec='gaudi2' is a gaudi2 card" in msg and "--topology='hls3' is a box of gaudi3 cards" in msg
    with pytest.raises(ValueError, match="unknown Gaudi device 'gaudi9'"):
        device_and_topology("gaudi9", None)
    with pytest.raises(ValueError, match="unknown topology 'hls9'"):
        device_and_topology(None, "hls9")


def test_the_environment_pairs_card_and_box():
    """``HPU_DEVICE_SPEC`` unset: the card of ``HCCL_TOPOLOGY``'s boxes; ``HCCL_TOPOLOGY``
    unset: the box of ``HPU_DEVICE_SPEC``'s card; both given, both kept (a group refuses them
    if they disagree); a value either side cannot read leaves the other at its default."""
    from hccl.config import HcclConfig
    from hpu_runtime.bridge.config import RuntimeConfig

    assert RuntimeConfig.from_env({"HCCL_TOPOLOGY": "hls3"}).device_spec == "gaudi3"
    assert RuntimeConfig.from_env({"HCCL_TOPOLOGY": "dl1"}).device_spec == "gaudi"
    assert RuntimeConfig.from_env({}).device_spec == "gaudi2"
    assert RuntimeConfig.from_env({"HCCL_TOPOLOGY": "nosuch"}).device_spec == "gaudi2"
    assert RuntimeConfig.from_env({"HCCL_TOPOLOGY": "/some/file.toml"}).device_spec == "gaudi2"  # a group checks it
    assert RuntimeConfig.from_env({"HCCL_TOPOLOGY": "hls3", "HPU_DEVICE_SPEC": "gaudi"}).device_spec == "gaudi"
    assert HcclConfig.from_env({"HPU_DEVICE_SPEC": "gaudi"}).topology == "hls1"
    assert HcclConfig.from_env({"HPU_DEVICE_SPEC": "hls3"}).topology == "hls3"
    assert HcclConfig.from_env({}).topology == "hls2"
    assert HcclConfig.from_env({"HPU_DEVICE_SPEC": "gaudi9"}).topology == "hls2"
    assert HcclConfig.from_env({"HPU_DEVICE_SPEC": "gaudi", "HCCL_TOPOLOGY": "hls3"}).topology == "hls3"


@pytest.mark.parametrize("name", ["hls1", "hls2", "hls3", "hls1h", "dl1"])
def test_the_device_names_of_the_builtin_servers_are_their_files_generation(name):
    """The bridge picks the card of a built-in ``HCCL_TOPOLOGY`` by name (it does not import
    hccl); that name's device is the generation its topology file declares."""
    from hccl.sim.topology import topology_generation
    from hpu_runtime.device.spec import get_device_spec

    assert get_device_spec(name).name == topology_generation(name)


def test_a_commands_flags_come_before_the_environment():
    """``models.train``'s pair: each flag, else its variable, else it follows the other; a
    mismatch names where each value came from."""
    from hccl.config import card_and_box

    assert card_and_box(None, None, {}) == ("gaudi2", "hls2")
    assert card_and_box(None, None, {"HCCL_TOPOLOGY": "hls3"}) == ("gaudi3", "hls3")
    assert card_and_box(None, "hls1", {"HPU_DEVICE_SPEC": "gaudi"}) == ("gaudi", "hls1")
    assert card_and_box("gaudi3", None, {"HCCL_TOPOLOGY": "hls3"}) == ("gaudi3", "hls3")
    with pytest.raises(ValueError, match="HPU_DEVICE_SPEC='gaudi2' is a gaudi2 card, but --topology='hls3'"):
        card_and_box(None, "hls3", {"HPU_DEVICE_SPEC": "gaudi2"})
    with pytest.raises(ValueError, match="--device-spec='gaudi' is a gaudi card, but HCCL_TOPOLOGY='hls2'"):
        card_and_box("gaudi", None, {"HCCL_TOPOLOGY": "hls2"})
