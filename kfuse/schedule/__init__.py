"""How each group of a fusion plan is implemented: typed, frozen forms (:mod:`.forms`) and
the register tiles and thread blocks of tiled kernels (:mod:`.tiles`).

Below fusion and the models, above the IR: legality asks a form whether it can implement a
group, the models predict it, code generation lowers it.
"""

from kfuse.schedule.forms import (
    Form,
    GroupSchedule,
    MapReduceVariant,
    Recompute,
    Registers,
    Single,
    Staged,
    Tiled,
    WhereRead,
    as_form,
    default_form,
    group_schedule,
    parse_form,
)

__all__ = ["Form", "GroupSchedule", "MapReduceVariant", "Recompute", "Registers", "Single",
           "Staged", "Tiled", "WhereRead", "as_form", "default_form", "group_schedule", "parse_form"]
