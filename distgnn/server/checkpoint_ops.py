"""The servers' checkpoint ops: each main server writes and reads ITS OWN rows of a distributed tensor.

Paths come from the trainer as a root (absolute) plus a step directory and a
file name checked by :mod:`distgnn.store.checkpoint_files`: nothing can be written or
read outside the root, no file is overwritten, and a load is refused unless
the file's sha256 and shape match what the checkpoint's manifest recorded.

Requests (header fields; arrays) -> reply:

* ``checkpoint_dir`` (``root, dir, action`` "prepare"|"commit"|"remove") -> (); prepare makes an empty staging
  directory, commit renames a staging directory to its final name, remove deletes a checkpoint
* ``save_tensor`` (``policy, name, root, dir, file``) -> header ``bytes, sha256, rows``
* ``load_tensor`` (``policy, name, root, dir, file, bytes, sha256, rows, verify``) -> (); the rows replace the
  tensor's, or with ``verify`` true are only checked; ``rows`` is the ``[start, end)`` id range the file was
  saved from (``save_tensor``'s reply), which must be this partition's

All are main-server only (one writer per partition). A save reads the tensor
while no trainer pushes to it: the trainers meet at a barrier before and after.
"""

from __future__ import annotations

import numpy as np

from distgnn.errors import InputError, ProtocolError
from distgnn.server.handlers import Reply, ServerState, check_arrays, header_field, named_tensor, require_main
from distgnn.store import checkpoint_files as cio


def _paths(header: dict) -> tuple[str, str]:
    return header_field(header, "root", str), header_field(header, "dir", str)


def handle_checkpoint_dir(state: ServerState, header: dict, arrays: list[np.ndarray]) -> Reply:
    require_main(state, "checkpoint_dir")
    check_arrays(arrays, 0, "checkpoint_dir")
    root, name = _paths(header)
    action = header_field(header, "action", str)
    if action == "prepare":
        cio.prepare_staging(root, name)
    elif action == "commit":
        cio.commit_staging(root, name)
    elif action == "remove":
        cio.remove_checkpoint(root, name)
    else:
        raise ProtocolError(f"checkpoint_dir action must be prepare, commit or remove, got {action!r}")
    return {}, []


def handle_save_tensor(state: ServerState, header: dict, arrays: list[np.ndarray]) -> Reply:
    require_main(state, "save_tensor")
    check_arrays(arrays, 0, "save_tensor")
    policy, _, table = named_tensor(state, header)
    root, name = _paths(header)
    if not name.startswith(cio.STAGING_PREFIX):
        raise InputError(f"tensors are saved into a staging directory ({cio.STAGING_PREFIX}...), not {name!r}")
    path = cio.confined(root, name, header_field(header, "file", str))
    if not path.parent.is_dir():
        raise InputError(f"{path.parent} does not exist: send checkpoint_dir 'prepare' first")
    entry = cio.write_new_file(path, array=table)
    return {**entry, "rows": list(state.partition.owned_range(policy))}, []


def handle_load_tensor(state: ServerState, header: dict, arrays: list[np.ndarray]) -> Reply:
    require_main(state, "load_tensor")
    check_arrays(arrays, 0, "load_tensor")
    policy, tensor_name, table = named_tensor(state, header)
    root, name = _paths(header)
    path = cio.confined(root, name, header_field(header, "file", str))
    entry = {"bytes": header_field(header, "bytes", int), "sha256": header_field(header, "sha256", str)}
    owned = list(state.partition.owned_range(policy))
    saved_rows = header_field(header, "rows", list)
    if saved_rows != owned:
        raise InputError(
            f"{path.name} holds the {policy} ids {saved_rows} of another partition; partition "
            f"{state.partition.part_id} owns {owned}"
        )
    rows = cio.read_verified_npy(path, entry)
    if rows.dtype != table.dtype or rows.shape != table.shape:
        raise InputError(
            f"{path} holds {rows.dtype}{list(rows.shape)}, but {policy} tensor {tensor_name!r} is "
            f"{table.dtype}{list(table.shape)} on partition {state.partition.part_id}: another graph or partitioning"
        )
    if not header_field(header, "verify", bool, False):
        np.copyto(table, rows)
    return {}, []


CHECKPOINT_HANDLERS = {
    "checkpoint_dir": handle_checkpoint_dir,
    "save_tensor": handle_save_tensor,
    "load_tensor": handle_load_tensor,
}
