"""The torch-facing adapter: maps each c10d ProcessGroup method onto a collective algorithm.

Each method validates its arguments (the same check on every rank, before any communication,
so a bad call fails everywhere alike), takes the next sequence number in the calling thread,
and queues the operation on the group's FIFO worker. There its tensors are staged (CUDA and
non-contiguous ones through contiguous host copies), the operation enters the channel its
algorithm runs on (placement.Collectives: flat or in two tiers) and runs there; results are
copied back.

One class with one method per c10d ProcessGroup entry point reads as a single table from
torch's call to fsdist's algorithm. What is not that table lives beside it: call forms, checks,
descriptions and staging in arguments.py, where each collective runs in placement.py, Work
objects and threads in work.py, sends and receives in point_to_point.py, the group's
generation in store_rendezvous.py.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..defaults import BACKEND_NAME, DEFAULT_TIMEOUT, DEVICES
from ..errors import FsdistError
from . import arguments as args
from . import compat
from .arguments import Staging, bytes_moved, describe, reduction_of
from .debug import OpLog
from .placement import group_collectives
from .point_to_point import PointToPoint
from .sparse import sparse_work
from .store_rendezvous import GroupSite, group_site
from .work import FsdistWork, OpQueue

log = logging.getLogger(__name__)

__all__ = ["ProcessGroupFsdist", "create_process_group"]

Tensors = Sequence[torch.Tensor]
#: an operation's arguments to its algorithm (beside the transport), from its staged tensors
Arguments = Callable[[Staging], tuple[Any, ...]]
_UNTIMED = contextlib.nullcontext()  # an operation's timing when debug records are off (debug.py)


@compat.answer_older_method_names  # c10d's older names for the same calls (torch <= 2.12, C++ callers)
class ProcessGroupFsdist(dist.ProcessGroup):
    """A torch process group whose ranks communicate only through files in a shared directory."""

    def __init__(self, site: GroupSite, rank: int, size: int, timeout: timedelta, group_id: str) -> None:
        """``site``: where the group lives (store_rendezvous.py): its generation, the generation's
        own DirectoryStore (whatever store c10d handed the creator), and whether this group owns
        the generation: beats the heartbeat and leaves it at shutdown (the world group, or an
        fsdist group under another backend's world)."""
        super().__init__(rank, size)  # type: ignore[call-arg]  # the (rank, size) form exists; the stub lacks it
        generation = site.generation
        self._store = site.store  # c10d keeps only the C++ half of a Python store alive
        self._generation = generation
        self._owns_generation = owns_generation = site.owns_generation
        self._timeout = timeout
        self._group_name = group_id
        self._group_desc = ""
        self._collectives = group_collectives(site, rank, timeout.total_seconds())
        self._ops = OpLog(generation.rank, group_id)
        self._p2p = PointToPoint(  # point-to-point messages always go flat
            self._collectives.flat.pairs, f"g{group_id}-r{rank}", timeout.total_seconds(), self._ops, self._broke
        )
        self._heartbeat = generation.heartbeat() if owns_generation else None
        if owns_generation:
            generation.use()  # (released at shutdown)
        self._seq = 0
        self._seq_lock = threading.Lock()
        self._queue = OpQueue(f"g{group_id}-r{rank}", on_error=self._broke)
        self._closed = False

    # ---- identity c10d asks for -----------------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 - c10d's name
        return BACKEND_NAME

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = self._ops.group = name

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    # ---- the backend c10d asks for per device ---------------------------------------------

    # What torch reads of a device's backend (``_get_backend(device).supports_splitting`` in
    # ``init_process_group(device_id=)`` and ``new_group``): fsdist has no communicator to split,
    # shrink or allocate from, no coalescing and no time estimate, so torch takes its general path.
    supports_splitting = supports_shrinking = supports_coalescing = False
    supports_tensor_alloc = supports_time_estimate = False

    @property
    def _device_types(self) -> list[torch.device]:  # c10d's name
        """The devices this group serves (c10d lists a group's devices here, e.g. to pick the one
        for object collectives): cpu, and cuda through host staging, as Gloo's do."""
        return [torch.device(device) for device in DEVICES]

    def _get_backend(self, device: torch.device | str) -> ProcessGroupFsdist:
        """This group's backend for ``device``: the group itself, for cpu and cuda alike (one
        ProcessGroupGloo serves both likewise). c10d holds a C++ backend per device; an fsdist
        group is its own, so it answers here what c10d's table would."""
        kind = torch.device(device).type
        if kind not in DEVICES:
            raise RuntimeError(f"No backend type associated with device type {kind}")  # c10d's words
        return self

    get_backend = _get_backend  # torch >= 2.14's public name (``dist.get_backend_impl``)

    # ---- running operations ---------------------------------------------------------------

    def _submit(
        self, description: str, outputs: list[torch.Tensor], name: str, arguments: Arguments, inputs: Tensors = ()
    ) -> FsdistWork:
        """Queue collective ``name`` (placement.FORMS) as the next operation, with ``arguments``
        made from its staged tensors. ``inputs`` (beside ``outputs``) count in debug records."""
        if self._closed:
            raise FsdistError(f"rank {self.rank()}: '{description}' called on a process group that was shut down")
        args.check_travel(inputs, outputs)
        with self._seq_lock:
            self._seq += 1
            seq = self._seq
        nbytes = bytes_moved(inputs, outputs)

        def execute() -> None:
            with self._ops.timed(seq, description, nbytes) if self._ops.on else _UNTIMED:
                try:
                    staging = Staging()
                    grad = torch.is_grad_enabled()
                    compat.set_grad_enabled(False)  # as torch.no_grad(): in-place writes into leaves
                    try:
                        channel, algorithm = self._collectives.forms[name]
                        channel.enter(seq, description)
                        algorithm(channel, *arguments(staging))
                        staging.finish()
                    finally:
                        compat.set_grad_enabled(grad)
                except OSError as exc:
                    if isinstance(exc, FsdistError):  # FsdistTimeoutError is one
                        raise
                    # the filesystem failed (EIO, ENOSPC, ...): say where it happened
                    raise FsdistError(f"rank {self.rank()}, operation #{seq} '{description}': {exc}") from exc

        work = FsdistWork(outputs, description)
        work.profile(inputs or outputs)  # (what it sends, else what it receives)
        return self._queue.submit(work, execute, nbytes)

    def _broke(self, error: BaseException) -> None:
        # (debug only: the same error reaches the caller's wait, and every later call, as an exception)
        log.debug("rank %d: process group %s broke: %s", self.rank(), self._group_name, error)
        text = str(error)  # (fsdist's own errors name the rank first already: "rank 0, operation #5 ...")
        self._collectives.abort(text if text.startswith(f"rank {self.rank()}") else f"rank {self.rank()}: {text}")

    # ---- collectives ----------------------------------------------------------------------

    def broadcast(self, tensors: Tensors, opts: Any = None) -> FsdistWork:
        tensors, opts = args.rooted(tensors, opts, dist.BroadcastOptions)
        root = args.root(opts.rootRank, self.size())
        desc = describe("broadcast", tensors, root=root)
        return self._submit(desc, list(tensors), "broadcast", lambda s: ([s.inout(x) for x in tensors], root))

    def allreduce(self, tensors: Tensors, opts: Any = None) -> FsdistWork:
        tensors, opts = args.allreduce(tensors, opts)
        if any(x.is_sparse for x in tensors):  # three dense all_gathers, waited for here (sparse.py)
            gather = lambda outs, x: self.allgather([outs], [x]).wait()  # noqa: E731
            return sparse_work(tensors, opts.reduceOp.op, self.size(), gather)
        return self._allreduce(tensors, opts, "all_reduce")

    def allreduce_coalesced(self, tensors: Tensors, opts: Any = None) -> FsdistWork:
        tensors, opts = args.allreduce(tensors, opts, dist.AllreduceCoalescedOptions)
        return self._allreduce(tensors, opts, "all_reduce_coalesced")

    def _allreduce(self, tensors: list[torch.Tensor], opts: Any, name: str) -> FsdistWork:
        """Both all_reduce forms, their arguments in c10d's one form already."""
        reduction = reduction_of(opts.reduceOp, tensors)
        desc = describe(name, tensors, reduction=reduction)
        return self._submit(desc, list(tensors), "all_reduce", lambda s: ([s.inout(x) for x in tensors], reduction))

    def reduce(self, tensors: Tensors, opts: Any = None, op: Any = None) -> FsdistWork:
        tensors, opts = args.reduce(tensors, opts, op)
        root = args.root(opts.rootRank, self.size())
        reduction = reduction_of(opts.reduceOp, tensors)
        (tensor,) = args.exactly_one(tensors, "reduce")
        desc = describe("reduce", tensors, root=root, reduction=reduction)
        return self._submit(desc, [tensor], "reduce", lambda s: (s.inout(tensor), root, reduction))

    def allgather(self, output_lists: Sequence[Tensors], inputs: Tensors, opts: Any = None) -> FsdistWork:
        output_lists, inputs = args.allgather(output_lists, inputs)
        (tensor,) = args.exactly_one(inputs, "all_gather")
        (outputs,) = args.exactly_one(output_lists, "all_gather outputs")
        args.same_list(outputs, tensor, self.size(), "all_gather")
        return self._all_gather("all_gather", [[out] for out in outputs], [tensor], list(outputs))

    def allgather_coalesced(self, output_lists: Sequence[Tensors], inputs: Tensors, opts: Any = None) -> FsdistWork:
        args.one_per_rank(output_lists, self.size(), "all_gather_coalesced", "output lists")
        for outputs in output_lists:
            for out, tensor in zip(outputs, inputs, strict=True):
                args.same(out, tensor, "all_gather_coalesced")
        flat = [out for outputs in output_lists for out in outputs]
        return self._all_gather("all_gather_coalesced", output_lists, inputs, flat)

    def _all_gather(
        self, name: str, by_rank: Sequence[Tensors], inputs: Tensors, flat: list[torch.Tensor]
    ) -> FsdistWork:
        def arguments(s: Staging) -> tuple[Any, ...]:
            return [[s.output(o) for o in outs] for outs in by_rank], [s.input(x) for x in inputs]

        return self._submit(describe(name, inputs), flat, "all_gather", arguments, inputs)

    def all_gather_single(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> FsdistWork:
        return self.all_gather_single_coalesced([output], [tensor], opts, name="all_gather_into_tensor")

    def all_gather_single_coalesced(
        self, outputs: Tensors, inputs: Tensors, opts: Any = None, name: str = "all_gather_into_tensor_coalesced"
    ) -> FsdistWork:
        args.scaled(inputs, outputs, self.size(), name)

        def arguments(s: Staging) -> tuple[Any, ...]:
            chunks = [s.output(out).view(-1).chunk(self.size()) if out.numel() else None for out in outputs]
            pairs = list(zip(chunks, inputs, strict=True))
            by_rank = [
                [c[r].view(x.shape) if c is not None else x.new_empty(x.shape) for c, x in pairs]
                for r in range(self.size())
            ]
            return by_rank, [s.input(x) for x in inputs]

        return self._submit(describe(name, inputs), list(outputs), "all_gather", arguments, inputs)

    def gather(self, output_lists: Sequence[Tensors], inputs: Tensors, opts: Any = None) -> FsdistWork:
        output_lists, inputs, opts = args.gather(output_lists, inputs, opts)
        root = args.root(opts.rootRank, self.size())
        (tensor,) = args.exactly_one(inputs, "gather")
        outputs: Tensors = []
        args.no_list_off_root(output_lists, self.rank() == root, "gather", "output")
        if self.rank() == root:
            (outputs,) = args.exactly_one(output_lists, "gather outputs")
            args.same_list(outputs, tensor, self.size(), "gather")
        desc = describe("gather", inputs, root=root)
        return self._submit(
            desc, list(outputs), "gather", lambda s: ([s.output(o) for o in outputs], s.input(tensor), root), [tensor]
        )

    def gather_single(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> FsdistWork:
        """``dist.gather_single``/``gather_into_tensor`` (torch >= 2.14): the root's ``output``
        holds every rank's ``tensor`` in rank order; elsewhere torch passes an empty placeholder."""
        opts = args.options(opts, dist.GatherOptions)
        root = args.root(opts.rootRank, self.size())
        is_root = self.rank() == root
        args.gather_single(output, tensor, self.size(), is_root)

        def arguments(s: Staging) -> tuple[Any, ...]:
            outputs: list[torch.Tensor] = []
            if is_root and tensor.numel():
                outputs = [piece.view(tensor.shape) for piece in s.output(output).view(-1).chunk(self.size())]
            elif is_root:
                outputs = [tensor.new_empty(tensor.shape) for _ in range(self.size())]
            return outputs, s.input(tensor), root

        desc = describe("gather", [tensor], root=root)  # the list form's
        return self._submit(desc, [output] if is_root else [], "gather", arguments, [tensor])

    def scatter(self, outputs: Tensors, input_lists: Sequence[Tensors], opts: Any = None) -> FsdistWork:
        outputs, input_lists, opts = args.scatter(outputs, input_lists, opts)
        root = args.root(opts.rootRank, self.size())
        (output,) = args.exactly_one(outputs, "scatter")
        inputs: Tensors = []
        args.no_list_off_root(input_lists, self.rank() == root, "scatter", "input")
        if self.rank() == root:
            (inputs,) = args.exactly_one(input_lists, "scatter inputs")
            args.same_list(inputs, output, self.size(), "scatter")
        desc = describe("scatter", outputs, root=root)
        return self._submit(
            desc, [output], "scatter", lambda s: (s.output(output), [s.input(x) for x in inputs], root), inputs
        )

    def reduce_scatter(self, outputs: Tensors, input_lists: Sequence[Tensors], opts: Any = None) -> FsdistWork:
        outputs, input_lists, opts = args.reduce_scatter(outputs, input_lists, opts)
        reduction = reduction_of(opts.reduceOp, outputs)
        (output,) = args.exactly_one(outputs, "reduce_scatter")
        (inputs,) = args.exactly_one(input_lists, "reduce_scatter inputs")
        args.same_list(inputs, output, self.size(), "reduce_scatter")
        desc = describe("reduce_scatter", outputs, reduction=reduction)
        return self._submit(
            desc, [output], "reduce_scatter",
            lambda s: ([s.output(output)], [[s.input(x) for x in inputs]], reduction), inputs,
        )  # fmt: skip

    def reduce_scatter_single(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> FsdistWork:
        return self.reduce_scatter_single_coalesced([output], [tensor], opts, name="reduce_scatter_tensor")

    def reduce_scatter_single_coalesced(
        self, outputs: Tensors, inputs: Tensors, opts: Any = None, name: str = "reduce_scatter_tensor_coalesced"
    ) -> FsdistWork:
        opts = args.options(opts, dist.ReduceScatterOptions)
        reduction = reduction_of(opts.reduceOp, outputs)
        args.scaled(outputs, inputs, self.size(), name)

        def arguments(s: Staging) -> tuple[Any, ...]:
            pieces = [
                [p.view(o.shape) for p in args.split_even(s.input(x), self.size())]
                for x, o in zip(inputs, outputs, strict=True)
            ]
            return [s.output(o) for o in outputs], pieces, reduction

        desc = describe(name, outputs, reduction=reduction)
        return self._submit(desc, list(outputs), "reduce_scatter", arguments, inputs)

    def alltoall(self, outputs: Tensors, inputs: Tensors, opts: Any = None) -> FsdistWork:
        args.one_per_rank(inputs, self.size(), "all_to_all", "input tensors")
        args.one_per_rank(outputs, self.size(), "all_to_all", "output tensors")
        args.one_dtype([*inputs, *outputs], "all_to_all")
        args.same(outputs[self.rank()], inputs[self.rank()], "all_to_all's own piece")
        desc = describe("all_to_all", [], dtype=inputs[0].dtype)
        return self._submit(
            desc, list(outputs), "all_to_all", lambda s: ([s.output(o) for o in outputs], [s.input(x) for x in inputs]),
            inputs,
        )  # fmt: skip

    def all_to_all_single(
        self, output: torch.Tensor, tensor: torch.Tensor, output_splits: list[int], input_splits: list[int],
        opts: Any = None,
    ) -> FsdistWork:  # fmt: skip
        args.one_dtype([output, tensor], "all_to_all_single")
        out_splits = args.splits(output, output_splits, self.size(), "output")
        in_splits = args.splits(tensor, input_splits, self.size(), "input")
        args.own_piece(output, out_splits, tensor, in_splits, self.rank())

        def arguments(s: Staging) -> tuple[Any, ...]:
            outs = list(s.output(output).split(out_splits)) if output.dim() else [s.output(output)]
            ins = list(s.input(tensor).split(in_splits)) if tensor.dim() else [s.input(tensor)]
            return outs, ins

        desc = describe("all_to_all_single", [], dtype=tensor.dtype)
        return self._submit(desc, [output], "all_to_all", arguments, [tensor])

    def barrier(self, opts: Any = None) -> FsdistWork:
        return self._submit("barrier", [], "barrier", lambda s: ())

    # ---- point to point (point_to_point.py) ---------------------------------------------

    def send(self, tensors: Tensors, dst: int, tag: int) -> FsdistWork:
        return self._p2p.send(tensors, dst, tag)

    def recv(self, tensors: Tensors, src: int, tag: int) -> FsdistWork:
        return self._p2p.receive(tensors, src, tag)

    def recv_anysource(self, tensors: Tensors, tag: int) -> FsdistWork:
        return self._p2p.receive(tensors, None, tag)

    def monitored_barrier(self, timeout: timedelta | float | None = None, wait_all_ranks: bool = False) -> None:
        """Gloo's monitored barrier (``fsdist.monitored_barrier`` calls this)."""
        self._p2p.monitored_barrier(timeout, wait_all_ranks)

    # ---- lifecycle ------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Finish queued work, then leave; the last rank out removes the group's files."""
        if self._closed:
            return
        with self._seq_lock:
            self._closed = True
        self._queue.close()
        self._p2p.close()
        self._collectives.close()
        if self._heartbeat is not None:
            self._heartbeat.stop()
        self._store.release_files()  # before leaving: the last rank out deletes the directory
        if self._owns_generation:
            self._generation.release()
            self._generation.leave()

    def abort(self) -> None:
        self._collectives.abort(f"rank {self.rank()} aborted the process group")
        self.shutdown()


def create_process_group(opts: Any, pg_options: Any = None) -> ProcessGroupFsdist:
    """The creator c10d calls (``extended_api=True``) for the world group and every subgroup;
    where each lives is store_rendezvous.group_site's to say."""
    timeout = opts.timeout if opts.timeout.total_seconds() > 0 else DEFAULT_TIMEOUT
    compat.prepare_records()  # for torch.profiler (profiling.py)
    return ProcessGroupFsdist(group_site(opts, timeout), opts.group_rank, opts.group_size, timeout, str(opts.group_id))
