"""torch.distributed's point-to-point calls, with torch's signatures: send, recv, isend,
irecv, batch_isend_irecv of P2POp, and send_object_list / recv_object_list.

A message goes to one rank and is matched there by its sender and `tag` (MPI for a CPU
tensor, the pair's matching before NCCL for a CUDA one): no other rank takes part and
nothing is negotiated. `dst` and `src` are global ranks, as in torch, or group_dst and
group_src ranks within `group`. The group's timeout bounds each message that no peer
matches. A process outside `group` skips the call with a warning, as torch does (recv
then returns -1).
"""

import torch
import torch.distributed as _torch_dist

from perseus.common import basics as _basics
from perseus.common import objects as _objects
from perseus.common.ops import integer
from perseus.torch.distributed.arguments import DESTINATION, SOURCE, member_set, root
from perseus.torch.distributed.process_group import bound_of, process_set_of
from perseus.torch.ops import timeouts as _timeouts
from perseus.torch.ops import torch_api as _torch_api


def _peer(process_set, rank, group_rank, what, names):
    """The peer's rank within the set."""
    return process_set.ranks.index(root(process_set, rank, group_rank, what, names))


def _tag(tag, what):
    tag = integer(tag, "%s tag" % what)
    if tag < 0:
        raise ValueError("%s: tag must be 0 or more, got %d" % (what, tag))
    return tag


def isend(tensor, dst=None, group=None, tag=0, group_dst=None):
    """Starts sending `tensor` to rank dst; returns its Work (None outside the group).
    Do not change the tensor before the Work completes."""
    _torch_api.tensors_only("isend", tensor=tensor)
    process_set = member_set(group, "isend")
    if process_set is None:
        return None
    peer = _peer(process_set, dst, group_dst, "isend", DESTINATION)
    return _timeouts.bounded(_torch_api.send(tensor, peer, _tag(tag, "isend"), process_set),
                             bound_of(group))


def irecv(tensor, src=None, group=None, tag=0, group_src=None):
    """Starts receiving into `tensor` from rank src (neither src nor group_src: from any
    rank); returns its Work (None outside the group)."""
    _torch_api.tensors_only("irecv", tensor=tensor)
    process_set = member_set(group, "irecv")
    if process_set is None:
        return None
    peer = -1 if src is None and group_src is None else _peer(process_set, src, group_src,
                                                                "irecv", SOURCE)
    return _timeouts.bounded(_torch_api.recv(tensor, peer, _tag(tag, "irecv"), process_set),
                             bound_of(group))


def send(tensor, dst=None, group=None, tag=0, group_dst=None):
    """Sends `tensor` to rank dst (not this rank: nothing could receive it) and waits
    until it has gone."""
    process_set = member_set(group, "send")
    if process_set is None:
        return None
    peer = _peer(process_set, dst, group_dst, "send", DESTINATION)
    if peer == process_set.rank():
        raise ValueError("send: the destination is this rank (%d); a blocking send to itself "
                         "would never end (isend and irecv may)" % _basics.rank())
    isend(tensor, group=group, tag=tag, group_dst=peer).wait()
    return None


def recv(tensor, src=None, group=None, tag=0, group_src=None):
    """Receives into `tensor` from rank src (neither src nor group_src: from any rank);
    returns the sender's global rank (-1 outside the group)."""
    work = irecv(tensor, src, group, tag, group_src)
    if work is None:
        return -1
    return process_set_of(group).ranks[work._source_rank()]


def send_object_list(object_list, dst=None, group=None, device=None, group_dst=None):
    """Sends the picklable objects of `object_list` to rank dst, which receives them with
    recv_object_list into a list of as many entries. `device` is accepted and not
    needed: the pickled bytes travel as CPU tensors."""
    process_set = member_set(group, "send_object_list")
    if process_set is None:
        return None
    peer = _peer(process_set, dst, group_dst, "send_object_list", DESTINATION)
    pieces = [_objects.pickled(obj) for obj in object_list]
    sizes = torch.tensor([len(piece) for piece in pieces], dtype=torch.int64)
    data = torch.frombuffer(bytearray(b"".join(pieces)) or bytearray(1), dtype=torch.uint8)
    send(sizes, group=group, group_dst=peer)
    send(data, group=group, group_dst=peer)
    return None


def recv_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """Fills `object_list` with the objects rank src (neither src nor group_src: any
    rank) sent with send_object_list; returns the sender's global rank (-1 outside
    the group). The sender must send as many objects as the list has entries."""
    sizes = torch.empty(len(object_list), dtype=torch.int64)
    sender = recv(sizes, src, group, group_src=group_src)
    if sender < 0:
        return sender
    data = torch.empty(max(1, int(sizes.sum())), dtype=torch.uint8)
    recv(data, sender, group)
    object_list[:] = _objects.unpickled(bytes(data.numpy()), sizes.tolist())
    return sender


class P2POp:
    """One call for batch_isend_irecv: `op` is isend or irecv (this module's or
    torch.distributed's), with its tensor, peer (a global rank; or group_peer, the
    rank within `group`) and tag."""

    def __init__(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):
        if op in (isend, _torch_dist.isend):
            op = isend
        elif op in (irecv, _torch_dist.irecv):
            op = irecv
        else:
            raise ValueError("P2POp: op must be isend or irecv (perseus.torch.distributed's "
                             "or torch.distributed's), got %r" % (op,))
        if (peer is None) == (group_peer is None):
            raise ValueError("P2POp: pass exactly one of peer (a global rank) and group_peer")
        self.op, self.tensor, self.group, self.tag = op, tensor, group, tag
        self.peer, self.group_peer = peer, group_peer

    def __repr__(self):
        return "P2POp(%s, peer=%s, group_peer=%s, tag=%s)" % (
            self.op.__name__, self.peer, self.group_peer, self.tag)


def batch_isend_irecv(p2p_op_list):
    """Starts every P2POp of the list, in order, and returns their Works. Each is queued
    without waiting, so the pairs' sends and receives complete in any order."""
    if not isinstance(p2p_op_list, list) or not p2p_op_list or \
            not all(isinstance(op, P2POp) for op in p2p_op_list):
        raise ValueError("batch_isend_irecv: pass a non-empty list of P2POp, got %r"
                         % (p2p_op_list,))
    group = p2p_op_list[0].group
    if any(op.group is not group for op in p2p_op_list):
        raise ValueError("batch_isend_irecv: every P2POp must use the same group")
    works = []
    for op in p2p_op_list:
        if op.op is isend:
            works.append(isend(op.tensor, op.peer, op.group, op.tag, op.group_peer))
        else:
            works.append(irecv(op.tensor, op.peer, op.group, op.tag, op.group_peer))
    return works
