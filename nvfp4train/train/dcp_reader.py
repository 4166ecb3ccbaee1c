"""torch.distributed.checkpoint's reader and load planner, restricted to what our checkpoints hold (tensors).

A module of its own so that `train/checkpoint.py` imports DCP only where a checkpoint is read or written.
"""

from __future__ import annotations

from pathlib import Path

from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata

from nvfp4train.train.checkpoint import CheckpointError, _MetadataUnpickler


class SafeFileSystemReader(FileSystemReader):
    """DCP's reader with the restricted unpickler, and tensor entries only.

    DCP loads a `BytesStorageMetadata` entry with `torch.load(weights_only=False)`, whatever the
    state dict asks for, so a metadata file that declared one would reach the full unpickler through
    the data files. Our checkpoints hold tensors only; anything else is refused here.
    """

    def read_metadata(self, *args, **kwargs):
        path = Path(self._get_metadata_path(kwargs.get("rank")))
        try:
            with self.fs.create_stream(path, "rb") as f:
                metadata = _MetadataUnpickler(f).load()
        except FileNotFoundError:
            raise CheckpointError(f"{path} missing: the checkpoint is incomplete") from None
        except Exception as e:  # any damage to the file: truncated, garbage, foreign objects
            raise CheckpointError(f"{path}: refused ({e}); not loaded") from None
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"{path}: refused (holds a {type(metadata).__name__}, not DCP metadata); not loaded")
        for fqn, md in metadata.state_dict_metadata.items():
            if not isinstance(md, TensorStorageMetadata):
                raise CheckpointError(
                    f"{path}: refused ({fqn} is stored as {type(md).__name__}; a checkpoint "
                    "holds tensors only); not loaded"
                )
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _TensorsOnlyLoadPlanner(DefaultLoadPlanner):
    """Second line behind SafeFileSystemReader: never hand stored bytes to the full unpickler."""

    def load_bytes(self, read_item, value):
        raise CheckpointError(f"refused to unpickle the non-tensor entry {read_item.dest_index.fqn}")
