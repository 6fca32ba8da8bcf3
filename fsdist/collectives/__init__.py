"""Collective algorithms, one short module each, written over ``CollectiveChannel`` only.

Every algorithm uses the shared directory as a broadcast medium: a message published once is
readable by every rank. Step numbers order the messages within one operation. Tensors passed
in are contiguous CPU tensors; the backend adapter stages everything else.
"""

from .allgather import all_gather
from .allreduce import all_reduce, all_reduce_coalesced
from .alltoall import all_to_all
from .barrier import barrier
from .broadcast import broadcast
from .gather import gather
from .reduce import reduce
from .reduce_scatter import reduce_scatter
from .scatter import scatter

__all__ = [
    "all_gather",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "barrier",
    "broadcast",
    "gather",
    "reduce",
    "reduce_scatter",
    "scatter",
]
