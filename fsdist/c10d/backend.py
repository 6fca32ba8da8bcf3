"""The torch-facing adapter: maps each c10d ProcessGroup method onto a collective algorithm.

Each method validates its arguments (the same check on every rank, before any communication,
so a bad call fails everywhere alike), takes the next sequence number in the calling thread,
and queues a closure on the group's FIFO worker. The closure stages tensors (CUDA and
non-contiguous ones through contiguous host copies), announces the operation to its peers,
runs the algorithm and copies results back.

Longer than most modules (~440 lines) on purpose: one class with one method per c10d
ProcessGroup entry point (about 25, ten lines each) reads as a single table from torch's call to
fsdist's algorithm. What is not that table lives beside it: argument checks in checks.py, Work
objects and threads in work.py, staging in staging.py, pybind's call forms in call_forms.py.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .. import collectives as coll
from ..collectives import hierarchical as hier
from ..defaults import DEFAULT_TIMEOUT, REDUCE_THREADS
from ..errors import FsdistError
from ..files.waiting import Deadline
from ..job.generation import Generation
from ..job.liveness import Heartbeat, PeerWatch
from ..protocol import layout
from ..transport.group import GroupTransport
from ..transport.p2p import Mailbox, PendingReceive
from ..transport.tiers import NodeTiers
from . import call_forms as forms
from . import checks, compat
from .compat import unwrap_store
from .debug import enabled as debug_enabled
from .debug import log_op, tensor_bytes
from .describe import describe, reduction_of
from .intraop import limited
from .placement import two_tiers
from .receives import ReceiveLoop
from .sparse import all_reduce_sparse, is_sparse
from .staging import Staging
from .store import DirectoryStore
from .store_rendezvous import join_through_store, joined
from .work import FsdistWork, OpQueue, StagedWork

log = logging.getLogger(__name__)

__all__ = ["ProcessGroupFsdist", "create_process_group"]

Tensors = Sequence[torch.Tensor]


class ProcessGroupFsdist(dist.ProcessGroup):
    """A torch process group whose ranks communicate only through files in a shared directory."""

    def __init__(
        self, store: DirectoryStore, generation: Generation, rank: int, size: int, timeout: timedelta, group_id: str,
        global_ranks: Sequence[int], owns_generation: bool,
    ) -> None:  # fmt: skip
        """``store``: the generation's own DirectoryStore (whatever store c10d handed the creator);
        ``owns_generation``: this group beats the heartbeat and leaves the generation at shutdown
        (the world group, or an fsdist group under another backend's world)."""
        super().__init__(rank, size)  # type: ignore[call-arg]  # the (rank, size) form exists; the stub lacks it
        self._store = store  # c10d keeps only the C++ half of a Python store alive
        self._generation = generation
        self._owns_generation = owns_generation
        self._timeout = timeout
        self._group_name = group_id
        self._group_desc = ""
        # torch may give a re-created group the name of a destroyed one; the incarnation count
        # (the same on every member, which create groups in the same order) keeps them apart
        incarnation = generation.incarnations.get(group_id, 0)
        generation.incarnations[group_id] = incarnation + 1
        directory = layout.group_dir(generation.directory, group_id, incarnation)
        watch = PeerWatch(
            [generation.members[g] for g in global_ranks], [generation.heartbeat_path(g) for g in global_ranks]
        )
        one_client = len({generation.members[g].client for g in global_ranks}) == 1
        self._t = GroupTransport(directory, rank, size, watch, timeout.total_seconds(), one_client=one_client)
        #: the node and leaders' tiers, where collectives run in two (None: every one flat)
        self._tiers = two_tiers(store, generation, global_ranks, rank, directory, timeout.total_seconds())
        if not owns_generation and rank == 0:  # `fsdist status` maps the group's ranks to the job's
            store.set(layout.GROUP_RANKS_KEY + os.path.basename(directory), json.dumps(list(global_ranks)))
        #: per-operation debug records (FSDIST_DEBUG=1): decided once, so they cost nothing when off
        self._debug = debug_enabled()
        self._heartbeat = Heartbeat(generation.heartbeat_path(generation.rank)) if owns_generation else None
        self._seq = 0
        self._seq_lock = threading.Lock()
        self._queue = OpQueue(f"g{group_id}-r{rank}", on_error=self._broke)
        self._receives: ReceiveLoop | None = None
        self._closed = False

    # ---- identity c10d asks for -----------------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 - c10d's name
        return "fsdist"

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    # ---- running operations ---------------------------------------------------------------

    def _submit(
        self, description: str, outputs: list[torch.Tensor], run: Callable[[Staging], None], inputs: Tensors = (),
        tiered: Callable[[NodeTiers, Staging], None] | None = None,
    ) -> FsdistWork:  # fmt: skip
        """Queue ``run`` as the next collective; it gets a Staging for its tensors.

        ``inputs`` (beside ``outputs``) only count towards the bytes in debug records.
        ``tiered``: the operation's two-tier form, run instead where the group has tiers.
        """
        if self._closed:
            raise FsdistError(f"rank {self.rank()}: '{description}' called on a process group that was shut down")
        with self._seq_lock:
            self._seq += 1
            seq = self._seq
        work = FsdistWork(outputs, description)
        nbytes = tensor_bytes(inputs, outputs)

        def execute() -> None:
            start = time.perf_counter() if self._debug else 0.0
            error = ""
            try:
                staging = Staging()
                grad = torch.is_grad_enabled()
                compat.set_grad_enabled(False)  # as torch.no_grad(): in-place writes into leaves
                try:
                    if tiered is not None and self._tiers is not None:
                        self._t.flush_acknowledgements()  # (the flat transport's enter does it otherwise)
                        self._tiers.enter(seq, description)
                        tiered(self._tiers, staging)
                    else:
                        self._t.enter(seq, description)
                        run(staging)
                    staging.finish()
                finally:
                    compat.set_grad_enabled(grad)
            except BaseException as exc:
                error = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, OSError) and not isinstance(exc, FsdistError):  # FsdistTimeoutError is one
                    # the filesystem failed (EIO, ENOSPC, ...): say where it happened
                    raise FsdistError(f"rank {self.rank()}, operation #{seq} '{description}': {exc}") from exc
                raise
            finally:
                if self._debug:
                    self._log_op(seq, description, nbytes, time.perf_counter() - start, error)

        return self._queue.submit(work, execute, nbytes)

    def _log_op(self, seq: int | None, description: str, nbytes: int, seconds: float, error: str = "") -> None:
        log_op(self._generation.rank, self._group_name, seq, description, nbytes, seconds, error)

    def _broke(self, error: BaseException) -> None:
        log.error("rank %d: process group %s broke: %s", self.rank(), self._group_name, error)
        self._abort_all(f"rank {self.rank()}: {error}")

    def _abort_all(self, reason: str) -> None:
        """Fail the group in every tier: each tier's waiters, on every node, end with ``reason``."""
        if self._tiers is not None:
            self._tiers.abort(reason)
        self._t.abort(reason)

    # ---- collectives ----------------------------------------------------------------------

    def broadcast(self, tensors: Tensors, opts: Any = None) -> FsdistWork:
        tensors, opts = forms.rooted(tensors, opts, dist.BroadcastOptions)
        root = checks.root(opts.rootRank, self.size())
        desc = describe("broadcast", tensors, root=root)
        return self._submit(
            desc,
            list(tensors),
            lambda s: coll.broadcast(self._t, [s.inout(x) for x in tensors], root),
            tiered=lambda h, s: hier.broadcast(h, [s.inout(x) for x in tensors], root),
        )

    def allreduce(self, tensors: Tensors, opts: Any = None) -> FsdistWork:
        tensors, opts = forms.allreduce(tensors, opts)
        if is_sparse(tensors):  # three dense all_gathers, waited for here (sparse.py)
            all_reduce_sparse(
                tensors, opts.reduceOp.op, self.size(), lambda outs, x: self.allgather([outs], [x]).wait()
            )
            work = FsdistWork(list(tensors), "all_reduce sparse")
            work.complete()
            return work
        return self._allreduce(tensors, opts, "all_reduce")

    def allreduce_coalesced(self, tensors: Tensors, opts: Any = None) -> FsdistWork:
        tensors, opts = forms.allreduce(tensors, opts, dist.AllreduceCoalescedOptions)
        return self._allreduce(tensors, opts, "all_reduce_coalesced")

    def _allreduce(self, tensors: list[torch.Tensor], opts: Any, name: str) -> FsdistWork:
        """Both all_reduce forms, their arguments in c10d's one form already."""
        reduction = reduction_of(opts.reduceOp, tensors)
        desc = describe(name, tensors, reduction=reduction)

        def run(s: Staging) -> None:
            coll.all_reduce_coalesced(self._t, [s.inout(x) for x in tensors], reduction)

        def tiered(h: NodeTiers, s: Staging) -> None:
            hier.all_reduce(h, [s.inout(x) for x in tensors], reduction)

        return self._submit(desc, list(tensors), run, tiered=tiered)

    def reduce(self, tensors: Tensors, opts: Any = None, op: Any = None) -> FsdistWork:
        tensors, opts = forms.reduce(tensors, opts, op)
        root = checks.root(opts.rootRank, self.size())
        reduction = reduction_of(opts.reduceOp, tensors)
        (tensor,) = checks.exactly_one(tensors, "reduce")
        desc = describe("reduce", tensors, root=root, reduction=reduction)
        return self._submit(
            desc,
            [tensor],
            lambda s: coll.reduce(self._t, s.inout(tensor), root, reduction),
            tiered=lambda h, s: hier.reduce(h, s.inout(tensor), root, reduction),
        )

    def allgather(self, output_lists: Sequence[Tensors], inputs: Tensors, opts: Any = None) -> FsdistWork:
        output_lists, inputs = forms.allgather(output_lists, inputs)
        (tensor,) = checks.exactly_one(inputs, "all_gather")
        (outputs,) = checks.exactly_one(output_lists, "all_gather outputs")
        checks.same_list(outputs, tensor, self.size(), "all_gather")
        return self._all_gather("all_gather", [[out] for out in outputs], [tensor], list(outputs))

    def allgather_coalesced(self, output_lists: Sequence[Tensors], inputs: Tensors, opts: Any = None) -> FsdistWork:
        if len(output_lists) != self.size():
            raise ValueError(f"all_gather_coalesced needs {self.size()} output lists, got {len(output_lists)}")
        for outputs in output_lists:
            for out, tensor in zip(outputs, inputs, strict=True):
                checks.same(out, tensor, "all_gather_coalesced")
        flat = [out for outputs in output_lists for out in outputs]
        return self._all_gather("all_gather_coalesced", output_lists, inputs, flat)

    def all_gather_single(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> FsdistWork:
        return self.all_gather_single_coalesced([output], [tensor], opts, name="all_gather_into_tensor")

    def all_gather_single_coalesced(
        self, outputs: Tensors, inputs: Tensors, opts: Any = None, name: str = "all_gather_into_tensor_coalesced"
    ) -> FsdistWork:
        for out, tensor in zip(outputs, inputs, strict=True):
            if out.numel() != tensor.numel() * self.size() or out.dtype != tensor.dtype:
                raise ValueError(f"{name}: output must hold {self.size()} × input ({tensor.numel()} {tensor.dtype})")
        desc = describe(name, inputs)

        def by_rank(s: Staging) -> list[list[torch.Tensor]]:
            chunks = [s.output(out).view(-1).chunk(self.size()) if out.numel() else None for out in outputs]
            return [
                [
                    c[r].view(x.shape) if c is not None else x.new_empty(x.shape)
                    for c, x in zip(chunks, inputs, strict=True)
                ]
                for r in range(self.size())
            ]

        return self._submit(
            desc,
            list(outputs),
            lambda s: coll.all_gather(self._t, by_rank(s), [s.input(x) for x in inputs]),
            inputs,
            lambda h, s: hier.all_gather(h, by_rank(s), [s.input(x) for x in inputs]),
        )

    def _all_gather(
        self, name: str, by_rank: Sequence[Tensors], inputs: Tensors, flat: list[torch.Tensor]
    ) -> FsdistWork:
        desc = describe(name, inputs)
        return self._submit(
            desc,
            flat,
            lambda s: coll.all_gather(
                self._t, [[s.output(o) for o in outs] for outs in by_rank], [s.input(x) for x in inputs]
            ),
            inputs,
            lambda h, s: hier.all_gather(
                h, [[s.output(o) for o in outs] for outs in by_rank], [s.input(x) for x in inputs]
            ),
        )

    def gather(self, output_lists: Sequence[Tensors], inputs: Tensors, opts: Any = None) -> FsdistWork:
        output_lists, inputs, opts = forms.gather(output_lists, inputs, opts)
        root = checks.root(opts.rootRank, self.size())
        (tensor,) = checks.exactly_one(inputs, "gather")
        outputs: Tensors = []
        if self.rank() == root:
            (outputs,) = checks.exactly_one(output_lists, "gather outputs")
            checks.same_list(outputs, tensor, self.size(), "gather")
        elif output_lists and any(output_lists):
            raise ValueError("gather: only the root may pass output tensors")
        desc = describe("gather", inputs, root=root)
        return self._submit(
            desc,
            list(outputs),
            lambda s: coll.gather(self._t, [s.output(o) for o in outputs], s.input(tensor), root),
            [tensor],
        )

    def scatter(self, outputs: Tensors, input_lists: Sequence[Tensors], opts: Any = None) -> FsdistWork:
        outputs, input_lists, opts = forms.scatter(outputs, input_lists, opts)
        root = checks.root(opts.rootRank, self.size())
        (output,) = checks.exactly_one(outputs, "scatter")
        inputs: Tensors = []
        if self.rank() == root:
            (inputs,) = checks.exactly_one(input_lists, "scatter inputs")
            checks.same_list(inputs, output, self.size(), "scatter")
        elif input_lists and any(input_lists):
            raise ValueError("scatter: only the root may pass input tensors")
        desc = describe("scatter", outputs, root=root)
        return self._submit(
            desc,
            [output],
            lambda s: coll.scatter(self._t, s.output(output), [s.input(x) for x in inputs], root),
            inputs,
        )

    def reduce_scatter(self, outputs: Tensors, input_lists: Sequence[Tensors], opts: Any = None) -> FsdistWork:
        outputs, input_lists, opts = forms.reduce_scatter(outputs, input_lists, opts)
        reduction = reduction_of(opts.reduceOp, outputs)
        (output,) = checks.exactly_one(outputs, "reduce_scatter")
        (inputs,) = checks.exactly_one(input_lists, "reduce_scatter inputs")
        checks.same_list(inputs, output, self.size(), "reduce_scatter")
        desc = describe("reduce_scatter", outputs, reduction=reduction)
        return self._submit(
            desc,
            [output],
            lambda s: coll.reduce_scatter(self._t, [s.output(output)], [[s.input(x) for x in inputs]], reduction),
            inputs,
            lambda h, s: hier.reduce_scatter(h, [s.output(output)], [[s.input(x) for x in inputs]], reduction),
        )

    def reduce_scatter_single(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> FsdistWork:
        return self.reduce_scatter_single_coalesced([output], [tensor], opts, name="reduce_scatter_tensor")

    def reduce_scatter_single_coalesced(
        self, outputs: Tensors, inputs: Tensors, opts: Any = None, name: str = "reduce_scatter_tensor_coalesced"
    ) -> FsdistWork:
        opts = forms.options(opts, dist.ReduceScatterOptions)
        reduction = reduction_of(opts.reduceOp, outputs)
        for out, tensor in zip(outputs, inputs, strict=True):
            if tensor.numel() != out.numel() * self.size() or out.dtype != tensor.dtype:
                raise ValueError(f"{name}: input must hold {self.size()} × output ({out.numel()} {out.dtype})")
        desc = describe(name, outputs, reduction=reduction)

        def pieces(s: Staging) -> list[list[torch.Tensor]]:
            return [
                [p.view(o.shape) for p in checks.split_even(s.input(x), self.size())]
                for x, o in zip(inputs, outputs, strict=True)
            ]

        return self._submit(
            desc,
            list(outputs),
            lambda s: coll.reduce_scatter(self._t, [s.output(o) for o in outputs], pieces(s), reduction),
            inputs,
            lambda h, s: hier.reduce_scatter(h, [s.output(o) for o in outputs], pieces(s), reduction),
        )

    def alltoall(self, outputs: Tensors, inputs: Tensors, opts: Any = None) -> FsdistWork:
        if len(outputs) != self.size() or len(inputs) != self.size():
            raise ValueError(f"all_to_all needs {self.size()} input and output tensors")
        desc = describe("all_to_all", inputs[:0], dtype=inputs[0].dtype)
        return self._submit(
            desc,
            list(outputs),
            lambda s: coll.all_to_all(self._t, [s.output(o) for o in outputs], [s.input(x) for x in inputs]),
            inputs,
        )

    def all_to_all_single(
        self, output: torch.Tensor, tensor: torch.Tensor, output_splits: list[int], input_splits: list[int],
        opts: Any = None,
    ) -> FsdistWork:  # fmt: skip
        out_splits = checks.splits(output, output_splits, self.size(), "output")
        in_splits = checks.splits(tensor, input_splits, self.size(), "input")
        desc = describe("all_to_all_single", [], dtype=tensor.dtype)

        def run(s: Staging) -> None:
            outs = list(s.output(output).split(out_splits)) if output.dim() else [s.output(output)]
            ins = list(s.input(tensor).split(in_splits)) if tensor.dim() else [s.input(tensor)]
            coll.all_to_all(self._t, outs, ins)

        return self._submit(desc, [output], run, [tensor])

    def barrier(self, opts: Any = None) -> FsdistWork:
        return self._submit("barrier", [], lambda s: coll.barrier(self._t), tiered=lambda h, s: hier.barrier(h))

    # c10d's C++ callers (functional collectives) use these older names.
    allgather_into_tensor_coalesced = all_gather_single_coalesced
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced
    alltoall_base = all_to_all_single

    # ---- point to point -------------------------------------------------------------------

    def send(self, tensors: Tensors, dst: int, tag: int) -> FsdistWork:
        """Buffered: publish the message now (in the caller's thread) and return a finished Work."""
        checks.peer(dst, "send to", self.rank(), self.size())
        desc = describe("send", tensors, tag=tag)
        staging = Staging()
        hosts = [staging.input(x) for x in tensors]
        work = FsdistWork(list(tensors), desc)
        start = time.perf_counter() if self._debug else 0.0
        try:
            with limited(REDUCE_THREADS):  # its copy into a file, as the worker's (intraop.py)
                self._t.send(dst, hosts, tag, desc)
        except BaseException as error:  # noqa: BLE001
            work.complete(error)
        else:
            work.complete()
        if self._debug:
            failed = work.exception()
            seconds = time.perf_counter() - start
            self._log_op(None, f"{desc} to {dst}", tensor_bytes(tensors), seconds, repr(failed) if failed else "")
        return work

    def recv(self, tensors: Tensors, src: int, tag: int) -> FsdistWork:
        checks.peer(src, "receive from", self.rank(), self.size())
        return self._post_receive(tensors, src, tag)

    def recv_anysource(self, tensors: Tensors, tag: int) -> FsdistWork:
        return self._post_receive(tensors, None, tag)

    def _post_receive(self, tensors: Tensors, src: int | None, tag: int) -> FsdistWork:
        with self._seq_lock:
            if self._closed:
                raise FsdistError(f"rank {self.rank()}: recv called on a process group that was shut down")
            if self._receives is None:
                name = f"g{self._group_name}-r{self.rank()}"
                self._receives = ReceiveLoop(name, Mailbox(self._t), self._t.check_health, self._broke)
        staging = Staging()
        hosts = [staging.output(x) for x in tensors]
        work = StagedWork(list(tensors), describe("recv", tensors, tag=tag), staging)
        if self._debug:
            start, nbytes = time.perf_counter(), tensor_bytes(tensors)

            def report(error: BaseException | None, source: int | None) -> None:
                what = f"{work.description} from {source if source is not None else src}"
                self._log_op(None, what, nbytes, time.perf_counter() - start, repr(error) if error else "")

            work.on_complete = report
        receive = PendingReceive(src, tag, hosts, Deadline(self._timeout.total_seconds()))
        return self._receives.post(work, receive)

    # ---- lifecycle ------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Finish queued work, then leave; the last rank out removes the group's files."""
        if self._closed:
            return
        with self._seq_lock:
            self._closed = True
        self._queue.close()
        if self._receives is not None:
            self._receives.close()
        if self._tiers is not None:
            self._tiers.close()
        self._t.close()
        if self._heartbeat is not None:
            self._heartbeat.stop()
        self._store.release_files()  # before leaving: the last rank out deletes the directory
        if self._owns_generation:
            self._generation.leave()

    def abort(self) -> None:
        self._abort_all(f"rank {self.rank()} aborted the process group")
        self.shutdown()


def create_process_group(opts: Any, pg_options: Any = None) -> ProcessGroupFsdist:
    """The creator c10d calls (``extended_api=True``) for the world group and every subgroup.

    c10d hands it whatever store the init method made. fsdist's own (``fsdist://``, and
    ``env://`` where FSDIST_DIR is set) carries the generation formed in the directory; any
    other (FileStore, TCPStore, HashStore, a user's) is where the ranks agree on a fresh
    generation first (store_rendezvous.py). Subgroups reuse the world group's generation.
    """
    timeout = opts.timeout if opts.timeout.total_seconds() > 0 else DEFAULT_TIMEOUT
    store = unwrap_store(opts.store)
    global_ranks = list(opts.global_ranks_in_group)
    if isinstance(store, DirectoryStore) and store.generation is not None:
        generation, owner = store.generation, not global_ranks
    elif global_ranks and joined() is not None:
        generation, owner = joined(), False
    else:  # the world group, or an fsdist group under another backend's world: its own generation
        subdir = f"group.{layout.key_to_filename(str(opts.group_id))}" if global_ranks else None
        generation = join_through_store(opts.store, opts.group_rank, opts.group_size, timeout, subdir)
        owner, global_ranks = True, []
    if not isinstance(store, DirectoryStore) or store.generation is not generation:
        store = DirectoryStore(layout.store_dir(generation.directory), timeout)  # fsdist's own records
    global_ranks = global_ranks or list(range(generation.world_size))
    return ProcessGroupFsdist(
        store, generation, opts.group_rank, opts.group_size, timeout, str(opts.group_id), global_ranks, owner
    )
