"""A fake of the narrow DCGM bindings surface gpuscope uses (``pydcgm`` + ``dcgm_structs``).

Modelled on the bindings in NVIDIA/DCGM ``testing/python3``: ``DcgmHandle(ipAddress=,
opMode=)``, ``GetSystem().discovery.GetAllSupportedGpuIds()`` / ``GetGpuAttributes``,
``GetGroupWithGpuIds``, ``DcgmFieldGroup(handle, name, fieldIds)``,
``group.samples.WatchFields`` / ``GetLatest(fieldGroup).values[gpuId][fieldId][-1]``
with ``.value``, ``.ts`` and ``.isBlank``. Not verified against a real host engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from gpuscope.exporter.gpu.dcgm import DcgmBindings

DCGM_ST_CONNECTION_NOT_VALID = -6


class DCGMError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"DCGM error {value}")
        self.value = value


@dataclass
class FakeValue:
    value: float
    ts: int = 1
    isBlank: bool = False


@dataclass
class FakeDcgmHost:
    """What the host engine knows: gpuId -> fieldId -> latest value."""

    gpus: dict[int, dict[int, FakeValue]] = field(default_factory=dict)
    reachable: bool = True
    watched: list[int] = field(default_factory=list)

    def bindings(self) -> DcgmBindings:
        host = self

        class Samples:
            def WatchFields(
                self, fieldGroup: Any, updateFreq: int, maxKeepAge: float, maxKeepSamples: int
            ) -> None:
                host.watched = list(fieldGroup.fieldIds)

            def GetLatest(self, fieldGroup: Any) -> Any:
                return SimpleNamespace(
                    values={g: {f: [v] for f, v in fs.items()} for g, fs in host.gpus.items()}
                )

        class Group:
            samples = Samples()

        class Discovery:
            def GetAllSupportedGpuIds(self) -> list[int]:
                return sorted(host.gpus)

            def GetGpuAttributes(self, gpuId: int) -> Any:
                return SimpleNamespace(
                    identifiers=SimpleNamespace(
                        uuid=f"GPU-dcgm-{gpuId}",
                        deviceName="NVIDIA H100 80GB HBM3",
                        pciBusId=f"00000000:{0x18 + gpuId:02X}:00.0",
                        driverVersion="550.54.15",
                    )
                )

        class System:
            discovery = Discovery()

            def GetGroupWithGpuIds(self, groupName: str, gpuIds: list[int]) -> Group:
                return Group()

        class DcgmHandle:
            def __init__(
                self, handle: Any = None, ipAddress: str | None = None, opMode: int = 1
            ) -> None:
                if not host.reachable:
                    raise DCGMError(DCGM_ST_CONNECTION_NOT_VALID)

            def GetSystem(self) -> System:
                return System()

        class DcgmFieldGroup:
            def __init__(self, dcgmHandle: Any, name: str, fieldIds: list[int]) -> None:
                self.fieldIds = fieldIds

        pydcgm = SimpleNamespace(DcgmHandle=DcgmHandle, DcgmFieldGroup=DcgmFieldGroup)
        structs = SimpleNamespace(DCGMError=DCGMError, DCGM_OPERATION_MODE_AUTO=1)
        return DcgmBindings(pydcgm=pydcgm, dcgm_structs=structs)
