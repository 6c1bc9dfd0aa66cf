"""Device profiles and cost models."""

from kfuse.model.device import (
    DeviceProfile,
    current_profile,
    default_profile,
    devices_dir,
    profile_filename,
)

__all__ = ["DeviceProfile", "current_profile", "default_profile", "devices_dir",
           "profile_filename"]
