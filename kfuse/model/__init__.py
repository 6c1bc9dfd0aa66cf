"""Device profiles and cost models."""

from kfuse.model.device import (
    DeviceProfile,
    current_profile,
    default_profile,
    devices_dir,
    profile_filename,
)


def register_graph_models() -> None:
    """Make ``wahib``, ``wahib-norm``, ``qiao`` and ``measured`` plannable for IR graphs.

    They join ``kfuse.search.problem.GRAPH_MODELS`` (where ``roofline`` lives); done here,
    on first import of ``kfuse.model``, so no search module has to import a model module.
    """
    from kfuse.model import measured, qiao, wahib
    from kfuse.search.problem import GRAPH_MODELS

    GRAPH_MODELS.setdefault("wahib", wahib.graph_group_time)
    GRAPH_MODELS.setdefault("wahib-norm", wahib.graph_group_time_normalized)
    GRAPH_MODELS.setdefault("qiao", qiao.graph_group_time)
    GRAPH_MODELS.setdefault("measured", measured.graph_group_time)


register_graph_models()

__all__ = ["DeviceProfile", "current_profile", "default_profile", "devices_dir",
           "profile_filename", "register_graph_models"]
