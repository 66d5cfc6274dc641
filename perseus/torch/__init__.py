"""PyTorch front ends of Perseus.

perseus.torch.horovod is the Horovod-compatible API (``import perseus.torch.horovod
as hvd``). Nothing is imported here so that each front end loads only what it uses.
"""
