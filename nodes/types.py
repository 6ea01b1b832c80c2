"""The pack's socket types. The frontend only connects sockets whose type names match."""

from comfy_api.latest import io

ExpertsType = io.Custom("WAN22_EXPERTS")
ScheduleType = io.Custom("WAN22_SCHEDULE")

CATEGORY = "Wan2.2 Cache-DiT"
