"""``python -m support.hung_nvml_exporter [exporter flags]``: a real ``gpuscope exporter``
process (its ``serve``, signals and shutdown) over the NVML source and the fake pynvml,
whose ``nvmlDeviceGetPowerUsage`` hangs for good after its first round (two GPUs): the
hung driver call that only a subprocess can show ending with SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import sys

from gpuscope import flags
from gpuscope.exporter.config import ExporterConfig
from gpuscope.exporter.gpu.nvml.source import NvmlSource
from gpuscope.exporter.service import serve
from support.gpu_fake_nvml import FakeNvml, fake_gpu


def main(argv: list[str]) -> None:
    config = flags.parse(ExporterConfig, argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    fake = FakeNvml([fake_gpu(0), fake_gpu(1)])
    fake.hang_in["nvmlDeviceGetPowerUsage"] = 2  # round 1 reads both GPUs, round 2 hangs
    asyncio.run(serve(config, gpu_source=NvmlSource(fake, xid_wait_ms=50)))


if __name__ == "__main__":
    main(sys.argv[1:])
