"""RecordIO: GoTorch-compatible record files, and a sharded loader over them.

    from pybridge import recordio
    with recordio.Writer("train-00000.recordio", compressor="snappy") as w:
        w.write(b"...")
    with recordio.Loader("train-*.recordio", batch_size=64, shuffle=True) as loader:
        for epoch in range(3):
            loader.set_epoch(epoch)
            for batch in loader:          # batch.data: uint8, batch.offsets: int64
                arrays = batch.decode([("label", "u1", ()), ("image", "u1", (28, 28))])

Byte layout: format.py. Command line: python -m pybridge.recordio --help.
"""

from .batch import Batch, decode_fixed
from .format import COMPRESSORS, DEFAULT_MAX_CHUNK_BYTES, GZIP, NONE, SNAPPY, compressor_id
from .index import ChunkInfo, Index
from .loader import Loader, expand_files
from .partition import DynamicPartition, LocalStore, Task, chunk_tasks, epoch_order, make_tasks, num_batches, per_rank_records, permutation, static_shard
from .reader import Reader, read_file
from .writer import Writer, write_file

__all__ = [
    "Batch", "decode_fixed", "COMPRESSORS", "DEFAULT_MAX_CHUNK_BYTES", "NONE", "SNAPPY", "GZIP",
    "compressor_id", "ChunkInfo", "Index", "Loader", "expand_files", "DynamicPartition",
    "LocalStore", "Task", "chunk_tasks", "epoch_order", "make_tasks", "num_batches",
    "per_rank_records", "permutation", "static_shard", "Reader", "read_file", "Writer", "write_file",
]
