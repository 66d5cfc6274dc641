"""Framework-neutral Python side of the Perseus core.

Everything two framework adapters would both need lives here: loading the C ABI,
init/ranks, process sets, request submission and handles, errors, op constants.
Submodules are imported on demand so that ``perseus.common.ops`` and
``perseus.common.exceptions`` stay usable without a built libperseus.
"""
