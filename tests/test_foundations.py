"""Regression tests for the foundations: ball volumes, recorded parameters, the registry and the one reduction."""

import functools
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from math import comb

import numpy as np
import pytest

from hashdist.api import evaluate_local, prepare
from hashdist.data.bits import ball_volumes
from hashdist.engine.cache import BlockCache
from hashdist.engine.compute import Partials, run_blocks
from hashdist.engine.plan import code_passes, for_threads, work_shares
from hashdist.engine.reduction import ThreadExecutor, reduce_partials, run_local
from hashdist.metrics.ranking import cutoff_grid
from hashdist.metrics.registry import MEASURES, lookup, per_query_key


def test_ball_volumes_are_the_binomial_sums():
    for nbits in (1, 7, 64, 300):
        assert ball_volumes(nbits, nbits) == [sum(comb(nbits, i) for i in range(k + 1)) for k in range(nbits + 1)]
    assert ball_volumes(4, 2) == [1, 5, 11]  # the spec's worked example 2


def test_lgap_at_full_radius_of_2048_bit_codes_is_quick():
    """LGAP@2048 of 2048-bit codes needs the 2049 ball volumes once (it took minutes with fresh binomial sums)."""
    code = ("import numpy as np\nfrom hashdist.metrics.radius import lgap_at_radius\n"
            "rng = np.random.default_rng(0)\nH = rng.integers(0, 3, (150, 2049, 2))\n"
            "M = np.maximum(1, rng.integers(0, 3, (150, 2049)))\n"
            "v = lgap_at_radius(H, M, 2048)\nassert v.shape == (150,) and np.isfinite(v).all()\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_recorded_block_rows_and_threads(class_dataset):
    """The report records the block sizes the plan used (not the first block's rows) and the threads."""
    _, _, plan, parameters, _ = prepare(class_dataset, query_block_rows=20, db_block_rows=700)
    assert parameters["query_block_rows"] == plan.query_block_rows == 32  # rounded up to 16-row chunks
    assert parameters["db_block_rows"] == plan.db_block_rows == 1000  # rounded up to 500-row chunks
    _, _, plan, parameters, _ = prepare(class_dataset)  # defaults larger than the data: 70 queries, 3000 items
    assert parameters["query_block_rows"] == 2048 and plan.query_blocks == ((0, 70),)
    report = evaluate_local(class_dataset, cache=False).report
    assert report["parameters"]["query_block_rows"] == 2048
    assert isinstance(report["engine"]["threads"], int) and report["engine"]["threads"] >= 1


def test_every_registered_measure_is_in_the_report_and_per_query(multilabel_dataset):
    ev = evaluate_local(multilabel_dataset, cache=False, k=[5, 50], radius=[0, 3], hashtable=["8x2"])
    m = ev.report["metrics"]
    assert set(m) == {x.key for x in MEASURES}
    for measure in MEASURES:
        values = [None] if measure.parameter is None else list(m[measure.key])
        grid = cutoff_grid([5, 50], 3000)  # the fixture's database size
        assert values == [None] or values == [str(v) for v in {"k": [5, 50], "radius": [0, 3], "hashtable": ["8x2"],
                                                               "cutoff": grid}[measure.parameter]]
        for value in values:
            for variant in measure.variants or (None,):
                v = lookup(m, measure, value, variant)
                if measure.policies:
                    assert set(v) == set(measure.policies)
                    assert v["worst"] <= v["expected"] + 1e-12 and v["expected"] <= v["best"] + 1e-12
                if measure.per_query is not None:
                    for policy in measure.policies or (None,):
                        assert ev.per_query[per_query_key(measure, value, variant, policy)].shape == (70,)


def test_every_registered_measure_has_a_place_in_the_report():
    """A measure the report has no table or figure for (a per-K value without tie policies, say) is refused
    when a report is rendered, not dropped from its tables."""
    from hashdist.metrics.registry import Measure
    from hashdist.report.evaluation import _unshown

    assert _unshown() == []
    hit_rate = Measure(key="hit_rate_at_k", label="hit@{}", description="a query with a relevant item in its top K",
                       parameter="k")
    assert _unshown([*MEASURES, hit_rate]) == ["hit_rate_at_k"]


@pytest.mark.parametrize(("parts", "code_parts", "threads"), [(1, 1, 1), (3, 2, 1), (7, 5, 1), (4, 9, 2)])
def test_partials_merge_in_any_order_gives_identical_results(class_dataset, parts, code_parts, threads):
    """The one reduction: any share of the blocks, merged in any order, with the distinct codes in any
    number of parts and passes, finishes to the same bits."""
    _, params, plan, *_ = prepare(class_dataset, query_block_rows=16, db_block_rows=500)
    cache = BlockCache(None)
    reference = run_local(plan, params, cache, threads=1)
    _, _, plan, *_ = prepare(class_dataset, query_block_rows=16, db_block_rows=500, code_parts=code_parts)
    plan = replace(for_threads(plan, threads), parts_per_pass=threads)  # a pass per `threads` parts
    assert len(code_passes(plan)) == -(-code_parts // threads)
    pieces = [run_blocks(plan, run, cache) for run in work_shares(plan, parts)]
    rng = np.random.default_rng(parts)
    merged = functools.reduce(Partials.merge, [pieces[i] for i in rng.permutation(len(pieces))], Partials())
    with ThreadPoolExecutor(1) as pool:
        result = reduce_partials(ThreadExecutor(pool), plan, params, merged)
    assert result.metrics == reference.metrics
    assert result.blocks == reference.blocks
    assert result.code_usage == reference.code_usage
    np.testing.assert_array_equal(result.bucket_sizes, reference.bucket_sizes)
    for key, values in reference.per_query.items():
        np.testing.assert_array_equal(result.per_query[key], values)
