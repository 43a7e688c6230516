"""The root pass on a stream of its own: GPU work that runs beside drafting, ordered by events.

A GPU runs the work of one stream in the order it was queued, so a root pass queued on the
device's default stream holds up every kernel queued after it there: the draft's passes when
the draft shares the card, and an EAGLE-3 head's reads of the target's features and embeddings
when it does not. On a stream of its own, the root pass is ordered against the rest by events
instead:
- on entry, the side stream waits for the work already queued on the caller's stream (the
  root pass must see the cache as the last commit left it);
- on exit, an event marks the end of the root pass;
- `join` makes the caller's stream wait for that event (on the GPU: the host does not block)
  before anything there uses the root pass's cache entries or rows.

Memory: torch's caching allocator hands a freed block back to the stream it was allocated on
at once. A tensor read on another stream must say so (`record_use`, torch's `record_stream`),
or the block could be reused while that read is still queued. Outputs the root pass hands over
(its rows) are recorded on the caller's stream by `join`, each sequence's by its own join.

The same code runs on the CPU, whose streams are torch's no-op ones: the decode loop is the
same on every device, and only a GPU orders anything.
"""

from __future__ import annotations

import torch


def device_module(device: torch.device):
    """torch's stream functions for `device`'s kind (`torch.cuda`, `torch.cpu`): the one place
    they are looked up, so that a test can watch the calls."""
    return torch.get_device_module(torch.device(device).type)


def record_use(tensor: torch.Tensor | None) -> None:
    """Tell the caching allocator that the current stream reads `tensor`: its block is not
    reused until the work queued there so far is done. Nothing to record off the GPU."""
    if tensor is not None and tensor.is_cuda:
        tensor.record_stream(torch.cuda.current_stream(tensor.device))


class SideStream:
    """A stream of its own on `device` (a CUDA card, or the CPU's no-op streams) for the work
    queued inside ``with side:``, joined back into the caller's stream by `join`. Enter, leave
    and join from the same thread."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        if self.device.type not in ("cuda", "cpu"):
            raise ValueError(f"no side stream on a {self.device.type} device (cuda or cpu)")
        self._module = device_module(self.device)
        self.stream = (self._module.Stream(self.device) if self.device.type == "cuda"
                       else self._module.Stream())
        self._caller = self._context = self._done = None

    def __enter__(self) -> SideStream:
        self._caller = self._module.current_stream(self.device)
        self.stream.wait_stream(self._caller)
        self._context = self._module.stream(self.stream)
        self._context.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        self._context.__exit__(*exc)
        self._context = None
        self._done = self.stream.record_event()
        return False

    def join(self, *handed_over: torch.Tensor) -> None:
        """The caller's stream waits for the side stream's work queued so far (on the device:
        the host does not wait); `handed_over` tensors, made on the side stream, are recorded
        as read by the caller's stream. The sequences of a batch share the stream and each
        joins with its own rows: a second join waits again for the same work, at no cost."""
        if self._done is None:
            return
        self._caller.wait_event(self._done)
        with self._module.stream(self._caller):
            for tensor in handed_over:
                record_use(tensor)
