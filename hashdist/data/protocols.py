"""Evaluation protocols of the learning-to-hash literature, declared once (docs/metrics.md, section 5b).

A protocol fixes how a pooled dataset is split (strategy and set sizes, class-balanced),
which cut-offs K mAP@K uses, and the convention of the script that computed the published
numbers (section 3b). ``hashdist split --protocol NAME`` takes its sizes; ``hashdist evaluate
--protocol NAME`` its K and convention. Where sources disagree, each variant is its own preset
and the note says how they differ. ``k=None`` means the whole database (mAP over the full
ranking, reported as mAP@N_database).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hashdist.errors import InputError


@dataclass(frozen=True)
class Protocol:
    name: str
    summary: str
    pooled_items: int  # size of the pooled dataset the sizes were made for
    strategy: str  # "standard": the database holds the training set; "improved": it does not
    sizes: dict[str, int] = field(default_factory=dict)  # `hashdist split` set sizes
    k: tuple[int, ...] | None = None  # mAP@K cut-offs; None: the whole database
    convention: str = "deephash"
    source: str = ""
    note: str = ""


PROTOCOLS: tuple[Protocol, ...] = (
    Protocol("cifar10", "CIFAR-10: 1,000 queries (100 per class), 5,000 training images (500 per class), the "
             "other 54,000 as the database", 60_000, "improved",
             {"test_queries": 1_000, "training": 5_000, "test_database": 54_000}, None, "deephash",
             "DeepHash-pytorch, utils/tools.py cifar_dataset, dataset 'cifar10' (test 1000, train 5000, "
             "database 54000), topK -1",
             "DeepHash-pytorch's topK = -1 slices off the last database item (not reproduced)"),
    Protocol("cifar10-1", "CIFAR-10: 1,000 queries (100 per class), the other 59,000 as the database, 5,000 of "
             "them (500 per class) for training", 60_000, "standard", {"test_queries": 1_000, "training": 5_000},
             None, "deephash",
             "DeepHash-pytorch 'cifar10-1' (database 59000); DSDH's 'cifar10-59000'",
             "differs from 'cifar10' only in keeping the training images in the database"),
    Protocol("cifar10-2", "CIFAR-10: 10,000 queries (1,000 per class); the other 50,000 are both training set and "
             "database", 60_000, "standard", {"test_queries": 10_000, "training": 50_000}, None, "deephash",
             "DeepHash-pytorch 'cifar10-2' (test 10000, train 50000, database = train)"),
    Protocol("nuswide21", "NUS-WIDE restricted to its 21 most frequent concepts: 2,100 queries (100 per concept), "
             "10,500 training images (500 per concept), every non-query image in the database; mAP@5000",
             195_834, "standard", {"test_queries": 2_100, "training": 10_500}, (5_000,), "deephash",
             "DeepHash-pytorch config_dataset 'nuswide_21' (topK 5000; lists of 2,100 test, 10,500 train, 193,734 "
             "database images); DPSH and DSDH use the same sizes",
             "balanced on each image's first concept; other papers use 81 concepts ('nuswide_81_m') or 5,000 "
             "queries (HashNet)"),
    Protocol("coco", "MS-COCO (images with at least one category): 5,000 queries, 10,000 training images, the "
             "rest as the database; mAP@5000", 122_218, "standard", {"test_queries": 5_000, "training": 10_000},
             (5_000,), "hashnet",
             "HashNet (Cao et al., ICCV 2017; mean_average_precision with R = 5000); DeepHash-pytorch 'coco' "
             "(topK 5000, database 117,218)",
             "HashNet reports HashNet's query set (queries with a relevant item in the top K); DeepHash-pytorch "
             "counts those queries as 0 (use --convention deephash to compare)"),
    Protocol("imagenet100", "ImageNet, 100 classes: 5,000 queries (50 per class), 10,000 training images (100 per "
             "class), the rest as the database; mAP@1000", 133_495, "standard",
             {"test_queries": 5_000, "training": 10_000}, (1_000,), "hashnet",
             "HashNet (ICCV 2017): queries are the 5,000 validation images of the 100 classes, the database their "
             "128,495 training images; DeepHash-pytorch 'imagenet' (topK 1000)",
             "HashNet's queries are the official validation images, not a random draw; a seeded split only "
             "matches its sizes"),
    Protocol("mirflickr25k", "MIRFlickr-25K (20,015 images with a label): 2,000 queries, 10,000 training images, "
             "the rest as the database; mAP over the whole ranking", 20_015, "standard",
             {"test_queries": 2_000, "training": 10_000}, None, "deephash",
             "DCMH (Jiang and Li, CVPR 2017): 2,000 queries, 10,000 training images, 24 labels; DeepHash-pytorch "
             "'mirflickr' (topK -1, 38 labels)",
             "sources disagree on the label set (24 vs 38) and on the training size (5,000 in some papers)"),
)

BY_NAME = {p.name: p for p in PROTOCOLS}


def get_protocol(name: str) -> Protocol:
    if name not in BY_NAME:
        raise InputError(f"--protocol {name}: unknown protocol (choose from {', '.join(BY_NAME)})")
    return BY_NAME[name]


def protocol_k(protocol: Protocol, n_database: int) -> list[int]:
    """The cut-offs K of a protocol for a database of ``n_database`` items (the whole database when None)."""
    return list(protocol.k) if protocol.k is not None else [n_database]
