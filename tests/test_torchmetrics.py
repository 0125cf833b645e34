"""hashdist.integrations.torchmetrics.HashingMetrics: the same report as evaluate_codes on the same data (class and
multi-label, heavy ties), every code kind, ids that drop DistributedSampler's padding, refused input, the
Metric protocol, a 2-process DDP run (gloo) that must neither hang nor double-count, and `import hashdist`
without torch."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchmetrics")

import hashdist  # noqa: E402
from hashdist.integrations.torchmetrics import HashingMetrics, flat_metrics, pack_rows  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DDP_TIMEOUT_S = 180
VARYING = ("timing", "throughput", "provenance")  # wall-clock times, and the report's creation time


def tie_data(seed=0, n_db=400, n_q=30, nbits=10, n_classes=4, n_concepts=5):
    """Few bits and few labels: many items share each distance, many share a code."""
    rng = np.random.default_rng(seed)
    return {
        "db_codes": rng.integers(0, 2, (n_db, nbits)).astype(np.int8),
        "query_codes": rng.integers(0, 2, (n_q, nbits)).astype(np.int8),
        "db_classes": rng.integers(0, n_classes, n_db),
        "query_classes": rng.integers(0, n_classes, n_q),
        "db_multihot": (rng.random((n_db, n_concepts)) < 0.3).astype(np.uint8),
        "query_multihot": (rng.random((n_q, n_concepts)) < 0.3).astype(np.uint8),
    }


def stable(report: dict) -> dict:
    return {key: value for key, value in report.items() if key not in VARYING}


def fed(data, labels: str, step=64, **options) -> HashingMetrics:
    metric = HashingMetrics(**options)
    for start in range(0, len(data["db_codes"]), step):
        rows = slice(start, start + step)
        metric.update_database(torch.from_numpy(data["db_codes"][rows]), torch.from_numpy(data[f"db_{labels}"][rows]))
    metric.update_queries(torch.from_numpy(data["query_codes"]), torch.from_numpy(data[f"query_{labels}"]))
    return metric


@pytest.mark.parametrize("labels", ["classes", "multihot"])
def test_report_is_evaluate_codes(labels):
    data = tie_data(seed=1)
    metric = fed(data, labels, k=[5, 100], radius=[0, 2])
    expected = hashdist.evaluate_codes(data["query_codes"], data["db_codes"], data[f"query_{labels}"],
                                       data[f"db_{labels}"], k=[5, 100], radius=[0, 2])
    report = metric.report()
    assert stable(report) == stable(expected)
    assert report["provenance"]["parameters"] == expected["provenance"]["parameters"]
    flat = metric.compute()
    assert set(flat) == {"map", "auc", *(f"{m}@{k}" for m in ("map", "precision", "recall", "ndcg") for k in (5, 100)),
                         *(f"{m}@r{r}" for m in ("precision", "recall", "map", "mlgap") for r in (0, 2))}
    assert all(v.dtype == torch.float64 and v.ndim == 0 for v in flat.values())
    assert flat["map"].item() == expected["metrics"]["map"]["expected"]
    assert flat["map@100"].item() == expected["metrics"]["map_at_k"]["100"]["retrieved"]["expected"]
    assert flat["ndcg@5"].item() == expected["metrics"]["ndcg_at_k"]["5"]["expected"]
    assert flat["mlgap@r2"].item() == expected["metrics"]["mlgap_at_radius"]["2"]


def test_code_kinds_binarised_by_sign():
    """{0,1}, {-1,+1}, bool and real outputs (an exact 0 counts as -1) give the report of their bits."""
    data = tie_data(seed=2, n_db=200, n_q=12, nbits=9)
    bits_db, bits_q = data["db_codes"], data["query_codes"]
    expected = hashdist.evaluate_codes(bits_q, bits_db, data["query_classes"], data["db_classes"], k=[10])
    rng = np.random.default_rng(0)
    real_db = np.where(bits_db == 1, rng.random(bits_db.shape) + 1e-3, -rng.random(bits_db.shape))
    real_db[bits_db == 0] *= rng.random(bits_db[bits_db == 0].shape) < 0.5  # half the cleared bits exactly 0.0
    assert (real_db == 0).any()
    kinds = {
        "01 int": (bits_db, bits_q),
        "+-1 float": (bits_db * 2.0 - 1, bits_q * 2.0 - 1),
        "bool": (bits_db.astype(bool), bits_q.astype(bool)),
        "real": (real_db.astype(np.float32), (bits_q * 2.0 - 1) * 0.25),
    }
    for name, (db, q) in kinds.items():
        metric = HashingMetrics(k=[10])
        metric.update_database(torch.from_numpy(db), torch.from_numpy(data["db_classes"]))
        metric.update_queries(torch.from_numpy(q), torch.from_numpy(data["query_classes"]))
        assert stable(metric.report()) == stable(expected), name


def test_pack_rows_is_numpy_packbits():
    rng = np.random.default_rng(3)
    for width in (1, 7, 8, 9, 64, 65):
        bits = rng.random((5, width)) < 0.5
        assert np.array_equal(pack_rows(torch.from_numpy(bits)).numpy(), np.packbits(bits, axis=1))


def test_ids_drop_padding_and_order_rows():
    """Rows fed in any order, with DistributedSampler-style repeats, give the report of the rows in id order."""
    data = tie_data(seed=4, n_db=150, n_q=20)
    order = np.random.default_rng(5).permutation(150)
    order = np.concatenate([order, order[:7]])  # seven items repeated (padding)
    metric = HashingMetrics(k=[5])
    for start in range(0, len(order), 40):
        rows = order[start : start + 40]
        metric.update_database(torch.from_numpy(data["db_codes"][rows]), torch.from_numpy(data["db_multihot"][rows]),
                               ids=torch.from_numpy(rows))
    q_order = np.r_[19:-1:-1, 0, 1]
    metric.update_queries(torch.from_numpy(data["query_codes"][q_order]),
                          torch.from_numpy(data["query_multihot"][q_order]), ids=torch.from_numpy(q_order))
    expected = hashdist.evaluate_codes(data["query_codes"], data["db_codes"], data["query_multihot"],
                                       data["db_multihot"], k=[5])
    assert stable(metric.report()) == stable(expected)


@pytest.mark.parametrize("call, message", [
    (lambda m: m.update_database(torch.zeros(3), torch.zeros(3, dtype=torch.long)), "2-D"),
    (lambda m: m.update_database(torch.full((2, 4), float("nan")), torch.zeros(2, dtype=torch.long)), "NaN"),
    (lambda m: m.update_database(torch.ones(2, 4), torch.zeros(3, dtype=torch.long)), "3 labels but 2 codes"),
    (lambda m: m.update_database(torch.ones(2, 4), torch.zeros(2)), "class labels must be integers"),
    (lambda m: m.update_database(torch.ones(2, 4), torch.full((2, 3), 2)), "only 0 and 1"),
    (lambda m: m.update_database(torch.ones(2, 8), torch.zeros(2, dtype=torch.long)), "8 bits but earlier"),
    (lambda m: m.update_database(torch.ones(2, 4), torch.zeros(2, 3, dtype=torch.long)), "earlier batches"),
    (lambda m: m.update_database(torch.ones(2, 4), torch.zeros(2, dtype=torch.long), torch.arange(2)), "every"),
    (lambda m: m.update_queries(torch.ones(2, 4), torch.zeros(2, dtype=torch.long), torch.zeros(2)), "integers"),
])
def test_refused_batches_leave_the_state(call, message):
    metric = HashingMetrics()
    metric.update_database(torch.ones(2, 4), torch.zeros(2, dtype=torch.long))
    with pytest.raises(hashdist.InputError, match=message):
        call(metric)
    assert len(metric.db_codes) == 1 and metric.nbits == 4


def test_metric_protocol():
    metric = HashingMetrics(k=[5], sync_on_compute=False)
    assert (metric.full_state_update, metric.higher_is_better, metric.is_differentiable) == (False, True, False)
    assert metric.options.k == (5,)
    with pytest.raises(TypeError, match="'topk'"):
        HashingMetrics(topk=3)
    with pytest.raises(hashdist.InputError, match="update_database: no database batch"):
        metric.compute()
    data = tie_data(seed=6, n_db=100, n_q=10)
    first = fed(data, "classes", k=[5]).compute()
    metric = fed(data, "classes", k=[5])
    metric.compute()
    metric.reset()
    assert metric.nbits is None and all(len(getattr(metric, name)) == 0 for name in ("db_codes", "query_ids"))
    metric.update_database(torch.from_numpy(data["db_codes"]), torch.from_numpy(data["db_classes"]))
    metric.update_queries(torch.from_numpy(data["query_codes"]), torch.from_numpy(data["query_classes"]))
    again = metric.compute()
    assert {k: v.item() for k, v in again.items()} == {k: v.item() for k, v in first.items()}
    with pytest.raises(TypeError, match="update_database"):
        metric(torch.ones(2, 4), torch.zeros(2, dtype=torch.long))


def test_state_is_packed():
    """Codes take B/8 bytes, class labels 8, multi-hot rows L/8: no per-pair state."""
    metric = HashingMetrics()
    metric.update_database(torch.randn(1000, 64), torch.randint(0, 2, (1000, 21)))
    metric.update_queries(torch.randn(100, 64), torch.randint(0, 2, (100, 21)))
    state = sum(t.numel() * t.element_size() for name in ("db_codes", "db_labels", "query_codes", "query_labels")
                for t in getattr(metric, name))
    assert state == 1100 * (8 + 3)


def test_import_hashdist_never_imports_torch():
    code = ("import sys, numpy as np, hashdist; hashdist.Evaluator; hashdist.evaluate_codes(np.eye(4, dtype=int), "
            "np.eye(4, dtype=int), np.arange(4), np.arange(4), k=[2]); assert 'torch' not in sys.modules, 'torch'")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_two_processes_uneven_empty_padded(tmp_path):
    """Two gloo ranks: uneven update counts, a rank without database (or query) batches, padded repeats; both
    ranks' results are bit-identical to one process on the data in id order."""
    data = tie_data(seed=7, n_db=301, n_q=23)  # odd sizes: DistributedSampler pads one repeat per side
    np.savez(tmp_path / "data.npz", **data)
    port, env = _free_port(), {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    worker = str(ROOT / "tests" / "torch_ddp_worker.py")
    ranks = [subprocess.Popen([sys.executable, worker, str(tmp_path / "data.npz"), str(tmp_path / "out"), str(port),
                               str(rank)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(2)]
    try:
        outputs = [p.communicate(timeout=DDP_TIMEOUT_S)[0] for p in ranks]
    finally:
        for p in ranks:
            p.kill()
            p.wait()
    assert [p.returncode for p in ranks] == [0, 0], outputs
    single = {
        "uneven": hashdist.evaluate_codes(data["query_codes"], data["db_codes"], data["query_classes"],
                                          data["db_classes"], k=[5, 50]),
        "empty": hashdist.evaluate_codes(data["query_codes"], data["db_codes"], data["query_multihot"],
                                         data["db_multihot"], k=[5, 50]),
    }
    for rank in range(2):
        got = json.loads((tmp_path / f"out.{rank}.json").read_text())
        for name, report in single.items():
            assert json.dumps(got[name]["metrics"], sort_keys=True) == json.dumps(report["metrics"], sort_keys=True)
            assert got[name]["flat"] == pytest.approx(flat_metrics(report), rel=0, abs=0, nan_ok=True)
    own = [json.loads((tmp_path / f"out.{rank}.json").read_text()) for rank in range(2)]
    assert [o["uneven"]["database_batches"] for o in own] == [10, 5]  # ceil(151/16), ceil(151/37): unsynced again
    assert [o["empty"]["database_batches"] for o in own] == [5, 0]


def test_lightning_fit_validate_logs_the_metrics(tmp_path):
    """A LightningModule that logs self.log_dict(metric.compute()) at the end of each validation epoch."""
    pl = pytest.importorskip("lightning.pytorch")
    from torch.utils.data import DataLoader, TensorDataset

    data = tie_data(seed=8, n_db=256, n_q=32, nbits=16)
    features = torch.randn(288, 16, generator=torch.Generator().manual_seed(0))
    labels = torch.from_numpy(np.concatenate([data["db_classes"], data["query_classes"]]))
    is_query = torch.arange(288) >= 256

    class Hasher(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(16, 12)
            self.metric = HashingMetrics(k=[10, 50])

        def training_step(self, batch, _):
            x, _, _ = batch
            return torch.tanh(self.net(x)).pow(2).mean()

        def validation_step(self, batch, _):
            x, y, query = batch
            codes = self.net(x)
            self.metric.update_queries(codes[query], y[query])
            self.metric.update_database(codes[~query], y[~query])

        def on_validation_epoch_end(self):
            self.log_dict(self.metric.compute())
            self.metric.reset()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    loader = DataLoader(TensorDataset(features, labels, is_query), batch_size=96)
    model = Hasher()
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                         num_sanity_val_steps=0)  # its two batches hold no query: compute() would refuse
    trainer.fit(model, loader, loader)
    logged = trainer.validate(model, loader, verbose=False)[0]
    with torch.no_grad():
        codes = (model.net(features) > 0).numpy()
    expected = flat_metrics(hashdist.evaluate_codes(codes[256:], codes[:256], labels[256:].numpy(),
                                                    labels[:256].numpy(), k=[10, 50]))
    assert set(logged) == set(expected)
    assert logged == pytest.approx(expected, rel=1e-6, nan_ok=True)
