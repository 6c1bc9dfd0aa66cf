"""Device profiles and cost models (they read a stored profile; they never run kernels)."""

from kfuse.model.device import (
    DeviceProfile,
    current_profile,
    default_profile,
    devices_dir,
    profile_filename,
)

__all__ = ["DeviceProfile", "current_profile", "default_profile", "devices_dir",
           "profile_filename"]
