"""Evaluation protocols of the learning-to-hash literature, declared once (docs/metrics.md, sections 5b and 5c).

A protocol fixes how a pooled dataset is split (strategy and set sizes, class-balanced),
which cut-offs K mAP@K uses, and the convention of the script that computed the published
numbers (section 3b). ``hashdist split --protocol NAME`` takes its sizes; ``hashdist evaluate
--protocol NAME`` its K and convention; ``hashdist split --check --protocol NAME`` its rules (set
sizes, and whether the training set lies inside the database, is the database, or is held out).
Where sources disagree, each variant is its own preset and the note says how they differ.
``k=None`` means the whole database (mAP over the full ranking, reported as mAP@N_database).

Cross-modal presets (``cross_modal=True``) pool image-text pairs: one index names a pair, so one
split serves every task (I->T, T->I). ``unverified`` names the fields no readable source confirmed;
the split check does not hold a split to them.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from hashdist.errors import InputError

TRAINING_RULES = ("subset", "database", "held_out")  # training inside the database, equal to it, or apart from it


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
    cross_modal: bool = False  # items are image-text pairs
    labels: int | None = None  # number of classes (label_kind "class") or label columns ("multilabel")
    label_kind: str | None = None  # "class" (one label per item) or "multilabel"; None: not stated
    training_set: str | None = None  # a TRAINING_RULES value; None: from the strategy and sizes
    unverified: tuple[str, ...] = ()  # fields no readable source confirmed (e.g. "pooled_items", "labels")


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
    # Cross-modal presets (docs/metrics.md section 5c): pools of image-text pairs; `dcmh` is DCMH's calc_map.
    Protocol("mirflickr25k", "MIRFlickr-25K image-text pairs (20,015 with a tag and a label; 24 labels, "
             "multi-label): 2,000 queries, the other 18,015 as the database, 10,000 training pairs drawn from the "
             "database; mAP over the whole ranking", 20_015, "standard", {"test_queries": 2_000, "training": 10_000},
             None, "dcmh",
             "DCMH (Jiang and Li, CVPR 2017), jiangqy/DCMH-CVPR2017 DCMH_tensorflow/DCMH_tensorflow/DCMH_demo.py: "
             "QUERY_SIZE 2000, DATABASE_SIZE 18015, TRAINING_SIZE 10000 (2,000 + 18,015 = 20,015; the training "
             "rows lie inside the database); the same numbers with num_label 24 in Zjut-MultimediaPlus/DADH "
             "config.py; 20,015 items with a tag and a label, and 24 labels without the *_r1 files, in "
             "iTomxy/data flickr25k/README.md",
             "sources differ in which rows are the queries: the first 2,000 of FLICKR-25K.mat (DCMH TensorFlow), the "
             "last 2,000 (DADH), an unseeded permutation (SSAH, GCH, DCMH MATLAB) or seed 6 (torchcmh); DJSRH and "
             "JDSH draw 2,000 queries and 5,000 training pairs per label; UCCH trains on the whole database; DCHMT "
             "uses 5,120 queries and 10,240 training pairs, DSPH 5,000 and 10,000 (their pool sizes not verified); "
             "DeepHash-pytorch's image-only 'mirflickr' has 38 labels (the *_r1 files kept) and is not this "
             "protocol. UCCH's raw-image loader puts about 1,800 of its 2,000 queries into the database "
             "(hashdist split --check reports such a leak)",
             cross_modal=True, labels=24, label_kind="multilabel", training_set="subset"),
    Protocol("nuswide21-cm", "NUS-WIDE image-text pairs of the 21 most frequent concepts (195,834 pairs, "
             "multi-label): 2,100 queries, the other 193,734 as the database, 10,000 training pairs drawn from the "
             "database; mAP over the whole ranking", 195_834, "standard",
             {"test_queries": 2_100, "training": 10_000}, None, "dcmh",
             "Zjut-MultimediaPlus/DADH config.py (NUS-WIDE-TC21.mat: query_size 2100, db_size 193734, "
             "training_size 10000, num_label 21; 2,100 + 193,734 = 195,834); the DCMH paper, section 4.1 (195,834 "
             "pairs of the 21 most frequent concepts, 2,100 queries); iTomxy/data nuswide/make.clean.py (keeping "
             "the items with one of the 21 labels leaves 195,834, 'which matches the one DCMH provided')",
             "torchcmh (WangGodder/deep-cross-modal-hashing torchcmh/dataset/nus_wide.py) trains on 10,500 pairs "
             "(seed 7), like the image-only 'nuswide21' preset; DCHMT and DSPH keep the same 195,834 pairs with "
             "5,120 / 5,000 queries; dropping the items without tags too leaves 190,421 (iTomxy/data). The DCMH "
             "paper's own training size was not verified",
             cross_modal=True, labels=21, label_kind="multilabel", training_set="subset"),
    Protocol("nuswide10-djsrh", "NUS-WIDE image-text pairs of the 10 most frequent concepts (186,577 pairs, "
             "multi-label), DJSRH's split: 2,000 queries (200 per label), every other pair in the database, 5,000 "
             "training pairs (500 per label) from the database; mAP@50", 186_577, "standard",
             {"test_queries": 2_000, "training": 5_000}, (50,), "deephash",
             "DJSRH (Su, Zhong and Zhang, ICCV 2019), zs-zhong/DJSRH datasets.py (NUSWIDE): 200 queries and 500 "
             "training pairs per label from the pairs not yet taken, the database all but the queries; train.py "
             "reports calculate_top_map(topk=50), the deephash convention at K = 50; the total 186,577 from "
             "iTomxy/data nuswide/make.clean.py (items with one of the 10 labels, matching DCMH's file), a "
             "third-party count",
             "DJSRH draws per label in label order with no numpy seed, so a multi-label pair counts for several "
             "labels and every run differs; hashdist split balances on each pair's first label. DADH's commented "
             "TC-10 db_size 184,457 is 20 short of 186,577 - 2,100. Add --convention dcmh for mAP over the whole "
             "ranking",
             cross_modal=True, labels=10, label_kind="multilabel", training_set="subset"),
    Protocol("nuswide10-ucch", "NUS-WIDE-10 image-text pairs (186,577, multi-label), UCCH's split: 2,100 queries, "
             "the other 184,477 both database and training set; mAP over the whole ranking without the queries "
             "that have no relevant pair", 186_577, "standard", {"test_queries": 2_100, "training": 184_477},
             None, "trec",
             "UCCH (Hu et al., TPAMI 2022), penghu-cs/UCCH src/cmdataset.py NUSWIDE_fea: test_size 2100, the last "
             "2,100 rows of the nus-wide-tc10 files are the queries and the other rows both the 'train' and the "
             "'retrieval' partition; its fx_calc_map_multilabel_k leaves queries without a relevant item out of the "
             "mean (the trec convention at the whole database); the total as in nuswide10-djsrh",
             "training = database is UCCH's unsupervised setting (the author's answer in UCCH#5); its raw-image "
             "loader (NUSWIDE) shuffles each partition separately, so its queries overlap its database. dcmh "
             "differs only when a query has no relevant pair",
             cross_modal=True, labels=10, label_kind="multilabel", training_set="database"),
    Protocol("iaprtc12", "IAPR TC-12 image-text pairs (multi-label): 2,000 queries, every other pair in the "
             "database, 10,000 training pairs drawn from it; mAP over the whole ranking", 20_000, "standard",
             {"test_queries": 2_000, "training": 10_000}, None, "dcmh",
             "the DCMH paper, section 4.1 (2,000 random queries, the rest as the database); torchcmh "
             "(WangGodder/deep-cross-modal-hashing torchcmh/dataset/tc12.py: query_num 2000, train_num 10000, "
             "the training pairs the first 10,000 of the database, seed 8); UCCH src/cmdataset.py IAPR_fea "
             "(test_size 2000, training = database)",
             "not verified: the pool size (20,000 is the number of images in the IAPR TC-12 collection; the pairs "
             "in the cross-modal .mat files could not be counted) and the 255 labels, so split --check does not "
             "hold a split to the database size. UCCH trains on the whole database",
             cross_modal=True, labels=255, label_kind="multilabel", training_set="subset",
             unverified=("pooled_items", "labels")),
    Protocol("mscoco-cm", "MS-COCO image-caption pairs with at least one of the 80 categories: 5,000 queries, "
             "every other pair in the database, 10,000 training pairs drawn from it; mAP over the whole ranking",
             122_218, "standard", {"test_queries": 5_000, "training": 10_000}, None, "dcmh",
             "torchcmh (WangGodder/deep-cross-modal-hashing torchcmh/dataset/coco2014.py: query_num 5000, "
             "train_num 10000, seed 8, COCO 2014 train and val merged); UCCH src/cmdataset.py MSCOCO_fea "
             "(test_size 5000, training = database); COCO's 80 categories (iTomxy/data coco/README.md)",
             "not verified: the pool size (122,218 is the image-only 'coco' preset's count of images with a "
             "category; COCO 2017 has 123,287 images, iTomxy/data coco/README.md), so split --check does not hold a "
             "split to the database size. Sources use other images: COCO 2014 train+val (torchcmh), train2017 "
             "images with an instance (DCHMT: 5,120 queries, 10,240 training pairs), UCCH's doc2vec file",
             cross_modal=True, labels=80, label_kind="multilabel", training_set="subset",
             unverified=("pooled_items",)),
    Protocol("wiki", "Wikipedia image-text articles (2,866 pairs, 10 classes, single-label): the 693 of the test "
             "list as queries, the 2,173 of the training list as both database and training set; mAP over the "
             "whole ranking", 2_866, "standard", {"test_queries": 693, "training": 2_173}, None, "dcmh",
             "the dataset's list files (trainset_txt_img_cat.list, testset_txt_img_cat.list) as zs-zhong/DJSRH "
             "datasets.py and train.py use them (database_dataset = WIKI(train=True), 10 class names); 693 and 2,173 "
             "as the constants testnum = 693, trainnum = 2173 of a program that reads those lists (found by code "
             "search, its repository not identified)",
             "the split is the dataset's fixed lists: hashdist split --protocol wiki only draws sets of the same "
             "sizes. The list files themselves were not readable here. DGCPN (get_loader_wiki) moves the first "
             "231 test pairs to validation, leaving 462 queries; DJSRH reports mAP@50 (--convention deephash --k "
             "50)",
             cross_modal=True, labels=10, label_kind="class", training_set="database"),
)

BY_NAME = {p.name: p for p in PROTOCOLS}


def get_protocol(name: str) -> Protocol:
    """The preset called ``name``; InputError naming --protocol, the names it begins (else the closest name) and
    every name otherwise."""
    if name not in BY_NAME:
        word = str(name).lower()
        close = [known for known in BY_NAME if known.startswith(word)] or difflib.get_close_matches(
            word, list(BY_NAME), n=1, cutoff=0.6)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise InputError(f"--protocol {name}: unknown protocol{hint} (choose from {', '.join(BY_NAME)})")
    return BY_NAME[name]


def training_rule(protocol: Protocol) -> str:
    """Where the protocol's training set lies: "subset" (inside the database), "database" (the database itself)
    or "held_out" (apart from the queries and the database); from ``training_set``, else from the strategy
    (improved: held out) and the sizes (standard: the database when it takes every non-query item)."""
    if protocol.training_set is not None:
        return protocol.training_set
    if protocol.strategy == "improved":
        return "held_out"
    everything = protocol.pooled_items - protocol.sizes["test_queries"]
    return "database" if protocol.sizes.get("training") == everything else "subset"


def expected_sizes(protocol: Protocol) -> dict[str, int | None]:
    """{"queries", "database", "training": size} the protocol prescribes; the database size is None when the pool
    size is unverified (it follows from the pool: every non-query item for the standard strategy)."""
    sizes = protocol.sizes
    if protocol.strategy == "improved":
        database = sizes.get("test_database")
    elif "pooled_items" in protocol.unverified:
        database = None
    else:
        database = protocol.pooled_items - sizes["test_queries"]
    return {"queries": sizes["test_queries"], "database": database, "training": sizes.get("training")}


def protocol_k(protocol: Protocol, n_database: int) -> list[int]:
    """The cut-offs K of a protocol for a database of ``n_database`` items (the whole database when None)."""
    return list(protocol.k) if protocol.k is not None else [n_database]
