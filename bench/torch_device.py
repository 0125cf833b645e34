"""HashingMetrics in a training loop: update() and compute() times, state memory, the torch engine against the numba
one, and a DeepHash-style CalcTopMap (a numpy argsort per query) on the same codes.

    .venv/bin/python bench/torch_device.py                  # CPU
    .venv/bin/python bench/torch_device.py --device cuda    # the same on a GPU, as it is

Cases: CIFAR-10 sizes (1,000 queries x 59,000 items, 64 bits, 10 classes) and NUS-WIDE sizes (2,100 x 193,734,
64 bits, 21 concepts, multi-hot). Codes are real-valued network outputs on the device (clustered, so many ties).
Per case: the median update() of 256 codes, the state's bytes, compute() with the default engine (numba on the
CPU, torch on CUDA) and with engine="torch" (best of --repeat, warm), whether the two reports' metrics are equal
(==), and CalcTopMap on --topmap-queries queries against hashdist's [worst, expected, best] for those queries.
Prints a markdown table and the CPU model.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

import hashdist
from hashdist.integrations.torchmetrics import HashingMetrics

BATCH = 256


def calc_hamming_dist(B1, B2):
    """DeepHash-pytorch utils/tools.py, transcribed: Hamming distances of +-1 codes by an inner product."""
    q = B2.shape[1]
    distH = 0.5 * (q - np.dot(B1, B2.transpose()))
    return distH


def calc_top_map(rB, qB, retrievalL, queryL, topk):
    """DeepHash-pytorch utils/tools.py CalcTopMap, transcribed: per query a numpy argsort (quicksort: ties in
    whatever order it leaves them), AP over the top ``topk``; a query without relevant items adds 0."""
    num_query = queryL.shape[0]
    topkmap = 0
    for iter in range(num_query):
        gnd = (np.dot(queryL[iter, :], retrievalL.transpose()) > 0).astype(np.float32)
        hamm = calc_hamming_dist(qB[iter, :], rB)
        ind = np.argsort(hamm)
        gnd = gnd[ind]
        tgnd = gnd[0:topk]
        tsum = np.sum(tgnd).astype(int)
        if tsum == 0:
            continue
        count = np.linspace(1, tsum, tsum)
        tindex = np.asarray(np.where(tgnd == 1)) + 1.0
        topkmap_ = np.mean(count / (tindex))
        topkmap = topkmap + topkmap_
    topkmap = topkmap / num_query
    return topkmap


def _cpu() -> str:
    try:
        lines = open("/proc/cpuinfo").read().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


def cases(rng, device, scale: float):
    """(name, query outputs, database outputs, query labels, database labels, topk), tensors on ``device``."""
    def outputs(groups, centres):
        signs = centres[groups] * np.where(rng.random((len(groups), centres.shape[1])) < 0.12, -1, 1)
        return torch.from_numpy((signs * rng.random(signs.shape)).astype(np.float32)).to(device)

    n_q, n_db = int(1000 * scale), int(59000 * scale)
    centres = rng.choice([-1.0, 1.0], (10, 64))
    ql, dl = rng.integers(0, 10, n_q), rng.integers(0, 10, n_db)
    yield ("CIFAR-10 sizes, class", outputs(ql, centres), outputs(dl, centres), torch.from_numpy(ql).to(device),
           torch.from_numpy(dl).to(device), n_db)
    n_q, n_db = int(2100 * scale), int(193734 * scale)
    concepts = rng.choice([-1.0, 1.0], (21, 64))
    qm, dm = rng.random((n_q, 21)) < 0.08, rng.random((n_db, 21)) < 0.08
    first_q, first_d = rng.integers(0, 21, n_q), rng.integers(0, 21, n_db)
    qm[np.arange(n_q), first_q], dm[np.arange(n_db), first_d] = True, True
    yield ("NUS-WIDE sizes, 21 labels", outputs(first_q, concepts), outputs(first_d, concepts),
           torch.from_numpy(qm.astype(np.uint8)).to(device), torch.from_numpy(dm.astype(np.uint8)).to(device), 5000)


def fed(q, d, ql, dl, **options):
    metric = HashingMetrics(**options).to(q.device)
    times = []
    for start in range(0, len(d), BATCH):
        t = time.perf_counter()
        metric.update_database(d[start : start + BATCH], dl[start : start + BATCH])
        if q.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    for start in range(0, len(q), BATCH):
        metric.update_queries(q[start : start + BATCH], ql[start : start + BATCH])
    return metric, statistics.median(times[1:] or times)


def compute_time(metric, repeat: int) -> tuple[float, dict]:
    best = None
    for _ in range(repeat):
        metric._computed = None  # torchmetrics keeps compute()'s value until the next update: time a fresh one
        t = time.perf_counter()
        metric.compute()
        best = min(best or 1e9, time.perf_counter() - t)
    return best, metric._last_report


def topmap_row(q, d, ql, dl, topk, n_queries):
    """CalcTopMap on the first n_queries queries, and hashdist's AP@topk (over retrieved) on the same ones."""
    qb, db = (np.where(x.cpu().numpy() > 0, 1.0, -1.0) for x in (q[:n_queries], d))
    qlab, dlab = ql[:n_queries].cpu().numpy(), dl.cpu().numpy()
    onehot = (lambda y: np.eye(10)[y]) if qlab.ndim == 1 else (lambda y: y.astype(np.float32))
    t = time.perf_counter()
    value = calc_top_map(db, qb, onehot(dlab), onehot(qlab), topk)
    seconds = time.perf_counter() - t
    report = hashdist.evaluate_codes(qb > 0, db > 0, qlab, dlab, k=[topk], empty_queries="zero")
    exact = report["metrics"]["map_at_k"][str(topk)]["retrieved"]
    return value, seconds, exact


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="torch device of the codes (default cpu)")
    parser.add_argument("--repeat", type=int, default=3, help="compute() calls per engine, best kept (default 3)")
    parser.add_argument("--topmap-queries", type=int, default=100, help="queries CalcTopMap runs on (default 100)")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the sizes (default 1)")
    a = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"machine: {_cpu()}; device {a.device}; torch {torch.__version__}\n")
    print("| case | update() of 256 ms | state MB | compute() default engine s | compute() torch engine s | "
          "engines equal | CalcTopMap (queries, s) | hashdist AP@K [worst, expected, best] |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, q, d, ql, dl, topk in cases(rng, torch.device(a.device), a.scale):
        metric, update_s = fed(q, d, ql, dl, k=[100, topk])
        state = sum(t.numel() * t.element_size() for n in ("db_codes", "db_labels", "query_codes", "query_labels")
                    for t in getattr(metric, n))
        default_s, default_report = compute_time(metric, a.repeat)
        by_torch, _ = fed(q, d, ql, dl, k=[100, topk], engine="torch")
        torch_s, torch_report = compute_time(by_torch, a.repeat)
        equal = default_report["metrics"] == torch_report["metrics"]
        value, topmap_s, exact = topmap_row(q, d, ql, dl, topk, a.topmap_queries)
        print(f"| {name} | {update_s * 1e3:.3f} | {state / 1e6:.2f} | {default_s:.3f} | {torch_s:.3f} | {equal} | "
              f"{value:.5f} ({a.topmap_queries}, {topmap_s:.2f}) | [{exact['worst']:.5f}, {exact['expected']:.5f}, "
              f"{exact['best']:.5f}]; CalcTopMap - expected = {value - exact['expected']:+.2e} |")


if __name__ == "__main__":
    main()
