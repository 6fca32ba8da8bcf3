"""A torchrun rendezvous backend that needs no port: ``--rdzv-backend=fsdist``.

    torchrun --rdzv-backend=fsdist --rdzv-endpoint=/shared/run --rdzv-id=job42 \\
             --nnodes=2 --nproc-per-node=4 train.py

The agents (one per node) form a generation under ``ENDPOINT/RUN_ID/agents`` with fsdist's own
rendezvous, taking node ranks in arrival order, and share its DirectoryStore; torch's
TCPStore is never started (``use_agent_store`` is False). The agents export
``FSDIST_DIR=ENDPOINT/RUN_ID/workers``, so a script's plain ``init_process_group("fsdist")``
(torch's env://) meets there (init_methods.py), as does ``init_method="fsdist://"``. The workers
also get torch's ``MASTER_PORT=0``: no store is served, and torch's own env:// handler, if forced
(FSDIST_ENV_INIT=torch), fails at once on it.

Elastic ranges (``--nnodes=MIN:MAX``): the agents' generation forms with MAX agents, or with MIN
or more once none joined for ``last_call_timeout`` seconds (``--rdzv-conf``, default 30, as
torch's own handler). An agent that finds the job running with room waits in the rendezvous
record's ``waiting`` list; the running agents see it as ``num_nodes_waiting``, and torch's agent
then restarts its workers and re-forms with it. An agent that leaves for good (its node
stopped) counts the same way: the others re-form without it.

Restarts (``--max-restarts``): an agent whose workers failed stops them, then asks for a new
round here. It records its stopped workers as gone in the workers' rendezvous record (agents on
other machines cannot see those processes die, and would take them for a live job) and leaves
the agents' generation. Every other agent counts the members that left as ``num_nodes_waiting``,
as torch's own handler reports agents waiting to join, so torch's agent restarts its healthy
workers at once instead of waiting for them to fail.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable
from datetime import timedelta

from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousInfo, RendezvousParameters
from torch.distributed.elastic.rendezvous.api import RendezvousStoreInfo

from ..defaults import ENV_DIR
from ..files.places import adopt_run_directory
from ..job.clean import retire_stopped
from ..job.generation import Generation
from ..job.rendezvous import membership_changes, rendezvous
from ..protocol import rendezvous_record
from .init_methods import open_store


class FsdistRendezvousHandler(RendezvousHandler):
    """torchrun's agents meet through the shared directory."""

    def __init__(self, params: RendezvousParameters) -> None:
        if not params.endpoint:
            raise ValueError("fsdist rendezvous needs --rdzv-endpoint=/shared/directory")
        self._params = params
        # the run's own folder (agents/ and workers/ inside), adopted as a run directory is: the
        # endpoint may be a folder of many users', the run's folder must be this user's alone
        self._root = adopt_run_directory(os.path.join(params.endpoint, params.run_id))
        self._timeout = timedelta(seconds=float(params.get("join_timeout", 600)))
        self._last_call = float(params.get("last_call_timeout", 30))
        self._generation: Generation | None = None
        self._closed = False

    def get_backend(self) -> str:
        return "fsdist"

    @property
    def use_agent_store(self) -> bool:
        return False  # the workers must not connect to a TCPStore: they use fsdist:// themselves

    def next_rendezvous(self) -> RendezvousInfo:
        workers = os.path.join(self._root, "workers")
        if self._generation is not None:  # a restart round: torch's agent stopped our workers
            retire_stopped(workers)
            self._leave()
        agents = os.path.join(self._root, "agents")
        self._generation = rendezvous(
            agents,
            None,
            self._params.max_nodes,
            self._timeout,
            min_size=self._params.min_nodes,
            last_call=self._last_call,
            unit=rendezvous_record.NODES,  # (torch's agents: one per node)
        )
        # torch's agent stopped by a signal stops its workers but never calls shutdown(): leave
        # at exit, the workers recorded as gone first (registered after the generation's own
        # exit hook, so it runs before it)
        atexit.unregister(self.shutdown)
        atexit.register(self.shutdown)
        os.environ[ENV_DIR] = workers  # inherited by the workers
        store = open_store(self._generation, self._timeout)
        self._store = store  # c10d keeps only the C++ half of a Python store alive
        info = RendezvousStoreInfo("localhost", 0)  # never used: no agent store is served
        return RendezvousInfo(store, self._generation.rank, self._generation.world_size, info)

    def is_closed(self) -> bool:
        return self._closed

    def set_closed(self) -> None:
        self._closed = True

    def num_nodes_waiting(self) -> int:
        """Agents that left this generation (their workers failed, or their node stopped), and
        agents waiting to join it (elastic)."""
        return 0 if self._generation is None else membership_changes(self._generation)

    def get_run_id(self) -> str:
        return self._params.run_id

    def shutdown(self) -> bool:
        if self._generation is not None:  # torch's agent stopped the workers: record them gone
            retire_stopped(os.path.join(self._root, "workers"))
        self._leave()
        return True

    def _leave(self) -> None:
        if self._generation is not None:
            self._generation.leave()
            self._generation = None


def handler_creator() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """What the ``torchrun.handlers`` entry point returns: torch calls it with no arguments."""
    return FsdistRendezvousHandler
