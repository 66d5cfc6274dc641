"""What a torch request keeps until synchronize(): its tensors, their storages, and
for CPU storages the memory itself, pinned against reallocation.

The core reads a request's input memory (and writes an in-place result into it)
at some time after the call returned, on its own threads. So that memory must
outlive the request whatever the caller does to the tensor meanwhile:
- set_() / `.data =` give the tensor another storage: keeping the old storage
  object keeps the old memory alive;
- a resize_() (or an out= op) that grows the tensor reallocates inside the SAME
  storage and frees the old memory at once: keeping the storage does not help.
  While an asynchronous request is in flight (the *_async calls; a synchronous
  call needs no pin, see pin()) its CPU storages are made non-resizable:
  the storage's memory is handed (StorageImpl swap_data_ptr, torch's
  UntypedStorage._swap_data_ptr_) to a private owner, and the caller's storage
  gets a non-owning, non-resizable view of the same address. A growing resize_()
  then raises torch's own "Trying to resize storage that is not resizable" on the
  caller's thread, and the request completes normally. synchronize() (or the
  handle being dropped) swaps the memory back, and grows the storage of a tensor
  whose refused resize_() left it larger than its memory (torch sets the new
  shape before it finds the storage cannot grow). Shrinking, reading and writing
  the tensor in flight are unaffected; its address never changes.
Storages that are not resizable to begin with (from numpy, frombuffer) are only
kept. CUDA storages are only kept: torch frees a grown CUDA tensor's old block
stream-ordered, and the swap is untested there (no GPU in CI).

("Keep", not "hold": the engine's hold, PERSEUS_HOLD_BYTES, delays a negotiation
round, csrc/src/engine/schedule.h.)

Several requests in flight may share a storage (e.g. views of one flat gradient
buffer): the pin is counted, and the last release swaps back.
"""

import threading

import torch

# Private torch functions (a torch without them only keeps, as for CUDA storages):
# a non-owning, non-resizable storage over an address, and StorageImpl's swap.
_view_of = getattr(torch._C, "_construct_storage_from_data_pointer", None)
_CAN_PIN = _view_of is not None and hasattr(torch.UntypedStorage, "_swap_data_ptr_")
_CPU = torch.device("cpu")

# StorageImpl address -> [count, the caller's storage, the memory's owner meanwhile,
# then each pinning request's tensor and its element count at submission, flat].
# Re-entrant: a Pins may be collected (and release) while this thread is in pin().
_lock = threading.RLock()
_pinned = {}


def keep(kept, tensor):
    """Keeps `tensor` and its storage referenced (in `kept`, which the caller keeps
    until synchronize()): what set_() / `.data =` would otherwise free."""
    kept.append(tensor)
    kept.append(tensor.untyped_storage())


def pin(kept, drive):
    """Pins the storages in `kept` (filled by keep()) of CPU tensors until the
    returned Pins is dropped (kept with the call's state). None if nothing to pin.

    drive: the caller waits for the request at once (a synchronous call). Then no
    code of the caller's thread runs while it is in flight, and a resize_() from
    another thread would race with it as with any torch op on the tensor: nothing
    to pin against, and a small allreduce_ does not pay for pinning."""
    if drive or not _CAN_PIN:
        return None
    pins = Pins()
    keys = pins.keys
    with _lock:
        for i in range(0, len(kept), 2):
            tensor, storage = kept[i], kept[i + 1]
            if not tensor.is_cpu:
                continue
            key = storage._cdata
            entry = _pinned.get(key)
            if entry is not None:
                entry[0] += 1
            elif storage.resizable() and storage.nbytes():
                owner = _view_of(storage.data_ptr(), _CPU, storage.nbytes())
                storage._swap_data_ptr_(owner)  # owner: the memory; storage: the view
                entry = _pinned[key] = [1, storage, owner]
            else:
                continue
            keys.append(key)  # at once: released even if a later one raises
            entry.append(tensor)
            entry.append(tensor.numel())
    return pins


def _release(keys):
    with _lock:
        for key in keys:
            entry = _pinned[key]
            entry[0] -= 1
            if entry[0] == 0:
                del _pinned[key]
                storage, owner = entry[1], entry[2]
                # Unless the caller moved the storage elsewhere meanwhile (e.g.
                # share_memory_()), it gets its memory back; else the owner frees it.
                if storage.data_ptr() == owner.data_ptr():
                    storage._swap_data_ptr_(owner)
                for i in range(3, len(entry), 2):
                    if entry[i].numel() > entry[i + 1]:
                        _grow(entry[i])


def _grow(tensor):
    """Completes a growing resize_() that the pin refused: torch had already given
    the tensor its new shape over the old memory (as for any non-resizable storage),
    which would read past the end. The storage grows now, keeping its contents."""
    needed = (tensor.storage_offset() + tensor.numel()) * tensor.element_size()
    storage = tensor.untyped_storage()
    if storage.resizable() and storage.nbytes() < needed:
        storage.resize_(needed)


class Pins:
    """One call's pins: released when dropped, whatever ends the call."""

    __slots__ = ("keys",)

    def __init__(self):
        self.keys = []

    def __del__(self, _release=_release):  # bound now: may run at interpreter exit
        if self.keys:
            _release(self.keys)


def pinned_count():
    """How many storages are pinned now (for tests)."""
    return len(_pinned)
