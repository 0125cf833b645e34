"""One rank of the 2-process DDP run in tests/test_torchmetrics.py (gloo on 127.0.0.1; not a test module).

argv: data.npz, output prefix, port, rank. Two metrics, fed as a DistributedSampler(shuffle=False,
drop_last=False) feeds a training loop: shards padded with repeated indices, sample ids with every batch.
  uneven: the database sharded, in batches of 16 rows on rank 0 and 37 on rank 1 (so the ranks call update
          different numbers of times); every query on rank 1 (rank 0 adds none).
  empty:  every database batch on rank 0 (rank 1 adds no database batch); the queries sharded, multi-hot labels.
Each rank writes its metrics as JSON to ``<prefix>.<rank>.json``.
"""

import json
import sys

import numpy as np
import torch
import torch.distributed as dist

from hashdist.integrations.torchmetrics import HashingMetrics

WORLD = 2


def shard(n: int, rank: int) -> np.ndarray:
    """DistributedSampler's indices for ``rank`` (no shuffle, no drop_last): padded with the first indices."""
    total = -(-n // WORLD) * WORLD
    indices = np.concatenate([np.arange(n), np.arange(total - n)])
    return indices[rank:total:WORLD]


def feed(update, codes, labels, indices, step: int) -> None:
    for start in range(0, len(indices), step):
        batch = indices[start : start + step]
        update(torch.from_numpy(codes[batch]), torch.from_numpy(labels[batch]), torch.from_numpy(batch))


def main() -> None:
    data, prefix, port, rank = np.load(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    db, q = data["db_codes"], data["query_codes"]
    uneven, empty = HashingMetrics(k=[5, 50]), HashingMetrics(k=[5, 50])
    feed(uneven.update_database, db, data["db_classes"], shard(len(db), rank), (16, 37)[rank])
    if rank == 1:
        feed(uneven.update_queries, q, data["query_classes"], np.arange(len(q)), 7)
    if rank == 0:
        feed(empty.update_database, db, data["db_multihot"], np.arange(len(db)), 64)
    feed(empty.update_queries, q, data["query_multihot"], shard(len(q), rank), 5)
    result = {}
    for name, metric in (("uneven", uneven), ("empty", empty)):
        result[name] = {"metrics": metric.report()["metrics"],
                        "flat": {k: v.item() for k, v in metric.compute().items()},
                        "database_batches": len(metric.db_codes)}  # after compute: this rank's own batches again
    with open(f"{prefix}.{rank}.json", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
