"""``hl-smi``: the Gaudi system-management CLI, answering for the simulated cards.

Installed as the ``hl-smi`` console script. Gaudi tooling shells out to it: lightning-habana
reads the SynapseAI version from ``hl-smi -v`` (it refuses ``accelerator="hpu"`` below
1.11 and reads 0.0.0 when the command is missing), optimum-habana reads the driver version
from line 3 of the plain table. Output formats follow Intel's ``hl-smi`` (Gaudi
documentation, "System Management Interface Tool (hl-smi)"); the values describe the
emulator: version :data:`SYNAPSE_VERSION`, ``HPU_DEVICE_SPEC``'s generation (default
``gaudi2``), :data:`CARDS_PER_BOX` cards, no utilisation. Imports no torch (it runs in a
subprocess of the user's job and must be quick).

A real ``hl-smi`` earlier on ``PATH`` wins, as it should on a Gaudi machine.
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["SYNAPSE_VERSION", "CARDS_PER_BOX", "main"]

SYNAPSE_VERSION = "1.24.0"
"""The SynapseAI release the emulated names follow (the release optimum-habana 1.21.2 validates, its ``CURRENTLY_VALIDATED_SYNAPSE_VERSION``; equal to the version of the ``habana-torch-plugin`` metadata distribution, ``hpu_runtime/_packaging/habana_torch_plugin``)."""

CARDS_PER_BOX = 8
"""Cards in one Gaudi server (HLS-Gaudi2: 8 OAM cards, Intel Gaudi2 HLS-2 product brief)."""

_PRODUCT = {"gaudi": ("HL-205", 32), "gaudi2": ("HL-225", 96), "gaudi3": ("HL-325L", 128)}


def _generation() -> str:
    name = os.environ.get("HPU_DEVICE_SPEC", "gaudi2").strip().lower() or "gaudi2"
    return name if name in _PRODUCT else "gaudi2"


def main(argv: list[str] | None = None) -> int:
    """Print ``-v`` (version), ``-L`` (card list) or, by default, the status table."""
    ap = argparse.ArgumentParser(prog="hl-smi", description=__doc__.splitlines()[0])
    ap.add_argument("-v", "--version", action="store_true", help="print the driver/firmware version")
    ap.add_argument("-L", "--list", action="store_true", help="list the cards")
    args, _unknown = ap.parse_known_args(argv)
    gen = _generation()
    product, hbm_gb = _PRODUCT[gen]
    if args.version:
        print(f"Habanalabs hl-smi/hlml version hl-{SYNAPSE_VERSION}-fw-0.0.0.0 (gaudi-hccl-emulator, simulated {gen})")
        return 0
    if args.list:
        for i in range(CARDS_PER_BOX):
            print(f"[{i}] AIP (accel{i}) 0000:{i:02x}:00.0\n    Product Name : {product}\n"
                  f"    Model Number : hl-{gen} (simulated)\n    Module ID    : {i}")
        return 0
    bar = "+" + "-" * 78 + "+"
    print(bar)
    print(f"| HL-SMI Version: hl-{SYNAPSE_VERSION}-emulated".ljust(79) + "|")
    print(f"| Driver Version: {SYNAPSE_VERSION}-emulated".ljust(79) + "|")
    print(bar)
    print("| AIP  Name        Bus-Id            Memory-Usage".ljust(79) + "|")
    for i in range(CARDS_PER_BOX):
        print(f"| {i:<4} {product:<11} 0000:{i:02x}:00.0      0MiB / {hbm_gb * 1024}MiB (simulated)".ljust(79) + "|")
    print(bar)
    return 0


if __name__ == "__main__":
    sys.exit(main())
