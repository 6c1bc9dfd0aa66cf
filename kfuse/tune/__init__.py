"""What measures the GPU: timing with CUDA events, calibration of device profiles, the
measured cost model and autotuning. Planning below this package reads stored profiles and
never runs a kernel; everything that does lives here.

Importing it makes the visible GPU's profile the one planning reads
(:func:`kfuse.model.device.current_profile`) and the ``measured`` model plannable.
"""

from kfuse.model.device import use_visible_gpu
from kfuse.tune import measured
from kfuse.tune.calibrate import calibrate, visible_gpu_profile

use_visible_gpu(visible_gpu_profile)
measured.register()

__all__ = ["calibrate", "measured", "visible_gpu_profile"]
