"""Weight sync from a trainer to an inference engine over classic CUDA
IPC (docs/rl-weight-sync.md), in two modes.

**Buckets.**  A trainer (:class:`Sender`) keeps a few reusable buffers of
classic memory, allocated once inside :func:`allocconf.ipc_safe`, packs
named tensors into them a bucket at a time and puts a small picklable
:class:`Bucket` per bucket on the application's channel (a
multiprocessing queue, Ray, ZMQ; :class:`Channel` wraps two queues).  An
engine (:class:`Receiver`) opens each buffer's IPC handle once, on its
own device (matched by GPU UUID), waits on the bucket's interprocess CUDA
event, copies into its own tensors (``load``), hands them to its
``load_weights`` (``named_tensors``) or reads zero-copy views, and
returns an :class:`Ack`; a buffer is packed again only after the
receiver acknowledged it, and the sender waits, on the GPU, for the
receiver's reads to finish.  The layout of a sync is a *plan*, made once
per layout (names, dtypes, shapes, casts) and kept while it holds: while
the receiver knows the plan, a bucket carries no per-tensor data, and
tensors that share their memory (tied weights) are sent once.

**One copy.**  The engine exports its weights once (:class:`Targets`, a
:class:`TargetMap`); each sync it offers them and the trainer's
:class:`Writer` writes straight into them, no buffer.

Only classic CUDA IPC is used (``cudaIpcGetMemHandle``, no
``pidfd_getfd``), so it works where sharing memory in expandable segments
does not: containers without ptrace permission over the sender.
:mod:`allocconf.transfer.testing` runs both modes on the CPU.

``import allocconf.transfer`` imports torch; ``import allocconf`` does
not import this package.  Reloading it (``importlib.reload``) is not
supported: its modules hold no state worth reloading, and objects made
before a reload would not be the new classes'.

The package, each module using only those listed before it:
``_errors`` (the error type and argument checks), ``_messages`` (what
goes over a channel), ``_tensors`` (dtypes, bytes, the check of what is
given), ``_layout`` (buckets and plans), ``_copies`` (the copy programs),
``_device`` (the device interface and CUDA), ``_replay`` (the replay
check), ``_channel`` (channels and pipes), then ``_sender``,
``_receiver``, ``_targets``, ``_writer`` and ``testing``.
"""
from allocconf.transfer._channel import Channel
from allocconf.transfer._errors import TransferError
from allocconf.transfer._layout import ALIGN, plan
from allocconf.transfer._messages import (Abort, Ack, Bucket, Close, Entry,
                                          MapClosed, Message, Offer,
                                          SyncResult, Target, TargetMap,
                                          Written)
from allocconf.transfer._receiver import Receiver
from allocconf.transfer._sender import Sender
from allocconf.transfer._targets import Targets
from allocconf.transfer._writer import Writer

__all__ = [
    # the bucketed mode
    "Sender", "Receiver", "Channel", "SyncResult", "TransferError",
    "Message", "Bucket", "Abort", "Close", "Ack", "Entry", "plan", "ALIGN",
    # the one-copy mode
    "Targets", "Writer", "TargetMap", "Target", "Offer", "MapClosed",
    "Written",
]
