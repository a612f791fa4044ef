"""PCIe link capacity per direction, in bytes/s, from link generation and width.

Per-lane signalling rates and line codes are those of the PCI Express Base
Specification revisions 1.0 to 6.0 (PCI-SIG): 2.5 and 5 GT/s with 8b/10b encoding
(generations 1 and 2), 8, 16 and 32 GT/s with 128b/130b (3 to 5), 64 GT/s with PAM4
in FLIT mode (6), where each 256-byte FLIT carries 242 bytes past its FEC and CRC.
The figure is what the link carries after that coding; transaction-layer overhead
(TLP/DLLP headers) is not subtracted, so real transfers top out some 10-20 % lower.
Generation 5 x16 comes to 63.0 GB/s per direction, generation 6 x16 to 121 GB/s.
"""

from __future__ import annotations

from gpuscope.contract import gpu as gpu_rows
from pack.contract import series

# generation -> (GT/s per lane, payload bits per line bit)
LINK_GENERATIONS: dict[int, tuple[float, float]] = {
    1: (2.5, 8 / 10),
    2: (5.0, 8 / 10),
    3: (8.0, 128 / 130),
    4: (16.0, 128 / 130),
    5: (32.0, 128 / 130),
    6: (64.0, 242 / 256),
}


def lane_bytes_per_second(generation: int) -> float:
    """One lane's capacity in one direction, in bytes/s."""
    transfers, efficiency = LINK_GENERATIONS[generation]
    return transfers * 1e9 * efficiency / 8


def capacity_expr(selector: str) -> str:
    """PromQL: bytes/s per direction of each GPU's current link, one series per GPU.

    ``generation == bool N`` is 1 for the matching generation and 0 otherwise, so the
    sum picks that generation's per-lane figure; a generation outside the table (or a
    width of 0) gives no series rather than a made-up capacity, or a 0 that a
    utilisation would divide by.
    """
    per_lane = " + ".join(
        f"({series(gpu_rows.PCIE_LINK_GENERATION)}{selector} == bool {generation})"
        f" * {lane_bytes_per_second(generation):.6g}"
        for generation in sorted(LINK_GENERATIONS)
    )
    # parenthesised: a query divides by it, and "/" binds as tightly as "*"
    return f"({series(gpu_rows.PCIE_LINK_WIDTH)}{selector} * ({per_lane}) > 0)"
