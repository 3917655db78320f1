"""The library's torch paths on a CUDA GPU (marked ``gpu``: skipped where torch sees none; ``gpu/gpu_check.sh``
runs them). Each is checked against an independent truth computed on the CPU: FedAvg's accuracy and weights, the
Sinkhorn loss against POT (``ot.sinkhorn2``, ``ot.emd2``), one teacher and one student training run against the
same run on the CPU — and model parameters, batches and outputs stay on the GPU while they run. The hot loops
(FedAvg rounds, a teacher epoch, a KL distillation epoch) run under ``torch.cuda.set_sync_debug_mode("error")``:
an operation in them that makes the host wait for the GPU (``.item()``, a read-back, a blocking copy) raises.

Tolerances (float32 models; the GPU sums in another order than the CPU, nothing else differs):
- FedAvg in float64: weights within 1e-9, the same accuracy; in float32: weights within 1e-4, accuracy within
  2 of the evaluation samples (an argmax near a tie may flip);
- Sinkhorn loss (solved in float64 on either device): within 1e-6 of POT, 1e-9 of the CPU value, gradients 1e-8;
- teacher / student (dropout 0, so both devices run the same computation): epoch losses within 1e-3 relative,
  weights within 1e-3, predicted probabilities within 1e-3.
"""
from __future__ import annotations

import importlib
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import ot
import pytest
import torch

from otfed.device import resolve_device, stage_device, threads_for
from otfed.distill.bias import probability_bias, random_texts
from otfed.distill.ensemble import TeacherEnsemble
from otfed.distill.losses import ensemble_loss
from otfed.distill.student import distill_student, ensemble_weights
from otfed.fl import FedAvgConfig, fedavg, fedavg_accuracy, init_state
from otfed.label_space import LabelSpace
from otfed.models import ModelSpec, TrainingConfig, build_classifier, seeded_dropout, train_classifier
from otfed.models.training import EpochLoss
from otfed.models.tokenizer import vocabulary
from otfed.ot.entropic_histograms import sinkhorn_histogram_loss

pytestmark = pytest.mark.gpu

CUDA = "cuda"
F64 = torch.float64
fedavg_module = importlib.import_module("otfed.fl.fedavg")
student_module = importlib.import_module("otfed.distill.student")
training_module = importlib.import_module("otfed.models.training")


@contextmanager
def no_host_sync() -> Iterator[None]:
    """Inside the block, an operation that synchronises the host with the GPU raises RuntimeError."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


# ------------------------------------------------------------------------------------------- device
def test_auto_resolves_to_cuda() -> None:
    assert torch.cuda.is_available()
    assert resolve_device("auto") == CUDA
    threads = torch.get_num_threads()
    assert stage_device("auto") == CUDA and torch.get_num_threads() == threads  # no CPU pinning on a GPU
    assert threads_for(CUDA) is None


# ------------------------------------------------------------------------------------------- FedAvg
def _blobs(n: int, seed: int, classes: int = 4, d: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    return rng.standard_normal((n, d)) + 1.5 * np.eye(classes, d)[y], y


def _clients(x: np.ndarray, y: np.ndarray, k: int = 3) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(x[i::k], y[i::k]) for i in range(k)]


def test_fedavg_float64_on_cuda_is_the_cpu_run() -> None:
    x, y = _blobs(300, 0)
    ex, ey = _blobs(200, 1)
    state = init_state(8, 4, hidden=(16,), seed=2, dtype=F64)
    kwargs = dict(rounds=3, epochs=2, lr=0.2, batch_size=32, seed=5, eval_data=(ex, ey))
    on_cpu = fedavg(_clients(x, y), state, device="cpu", **kwargs)
    on_gpu = fedavg(_clients(x, y), state, device=CUDA, num_threads=None, **kwargs)
    assert on_gpu.accuracy == on_cpu.accuracy
    for key, value in on_cpu.state.items():
        assert on_gpu.state[key].device.type == "cpu"  # the result comes back to the host
        torch.testing.assert_close(on_gpu.state[key], value, rtol=0, atol=1e-9)


def test_fedavg_accuracy_float32_on_cuda_matches_the_cpu() -> None:
    x, y = _blobs(400, 3)
    ex, ey = _blobs(300, 4)
    config = FedAvgConfig(rounds=5, epochs=3, lr=0.1, batch_size=16, hidden=[32])
    on_cpu = fedavg_accuracy(_clients(x, y, 4), (ex, ey), 4, config, seed=7)
    on_gpu = fedavg_accuracy(_clients(x, y, 4), (ex, ey), 4, config, seed=7, device=CUDA, num_threads=None)
    assert abs(on_gpu - on_cpu) <= 2 / len(ey)
    assert on_cpu > 0.5  # the problem is learnable: the comparison is not between two chance levels
    state = init_state(8, 4, hidden=(32,), seed=7)
    a = fedavg(_clients(x, y, 4), state, rounds=2, epochs=3, lr=0.1, batch_size=16, seed=7).state
    b = fedavg(_clients(x, y, 4), state, rounds=2, epochs=3, lr=0.1, batch_size=16, seed=7, device=CUDA).state
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-4)


def test_fedavg_keeps_data_and_states_on_cuda_between_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    real_update, real_aggregate = fedavg_module._client_update, fedavg_module.server_aggregate
    updates, aggregates = [], []

    def update(state, data, *args, **kwargs):
        out = real_update(state, data, *args, **kwargs)
        updates.append({t.device.type for t in (*state.values(), *data, *out.values())})
        return out

    def aggregate(states, weights):
        out = real_aggregate(states, weights)
        aggregates.append({t.device.type for s in (*states, out) for t in s.values()})
        return out

    monkeypatch.setattr(fedavg_module, "_client_update", update)
    monkeypatch.setattr(fedavg_module, "server_aggregate", aggregate)
    x, y = _blobs(120, 5)
    fedavg(_clients(x, y), init_state(8, 4, seed=0), rounds=2, epochs=2, lr=0.1, batch_size=10, device=CUDA)
    assert len(updates) == 6 and len(aggregates) == 2
    assert all(kinds == {"cuda"} for kinds in updates + aggregates)


def test_fedavg_rounds_never_wait_for_the_gpu() -> None:
    """Local updates (mini-batch SGD) and the aggregation of two rounds with data and state on the GPU, with no
    host sync; the result is the one fedavg computes (same seeds)."""
    x, y = _blobs(200, 6)
    clients = _clients(x, y)
    data = [fedavg_module._tensors(cx, cy, torch.float32, CUDA) for cx, cy in clients]
    start = init_state(8, 4, hidden=(16,), seed=0)
    state = {k: v.to(CUDA) for k, v in start.items()}
    fedavg_module._client_update(state, data[0], 1, 0.1, seed=0, batch_size=16, device=CUDA)  # warm-up
    with no_host_sync():
        for r in range(2):
            local = [fedavg_module._client_update(state, d, 2, 0.1,
                                                  seed=int(np.random.SeedSequence([3, r, k]).generate_state(1)[0]),
                                                  batch_size=16, device=CUDA)
                     for k, d in enumerate(data)]
            state = fedavg_module.server_aggregate(local, [len(c[1]) for c in clients])
    expected = fedavg(clients, start, rounds=2, epochs=2, lr=0.1, batch_size=16, seed=3, device=CUDA).state
    for key, value in expected.items():
        torch.testing.assert_close(state[key].cpu(), value, rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------------------ Sinkhorn
def _histograms(n_labels: int, batch: int, teachers: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    draws = -torch.log(torch.rand(batch * (teachers + 1), n_labels, generator=g, dtype=F64))
    draws = draws / draws.sum(-1, keepdim=True)
    return draws[:batch], draws[batch:].reshape(batch, teachers, n_labels)


@pytest.mark.parametrize("task", ["sa", "erc", "nli"])
@pytest.mark.parametrize("eps", [0.1, 0.05])
def test_sinkhorn_loss_on_cuda_matches_pot_and_the_cpu(task: str, eps: float) -> None:
    cost = LabelSpace.for_task(task).cost_matrix(dtype=F64)
    p, q = _histograms(cost.shape[0], 6, 3, seed=1)
    p_gpu = p.to(CUDA, copy=True).requires_grad_(True)
    value = sinkhorn_histogram_loss(p_gpu, q.to(CUDA), cost.to(CUDA), eps, tol=1e-12, threads=None)
    assert value.device.type == "cuda" and value.shape == (6, 3)
    values = value.detach().cpu()
    for b in range(6):
        for k in range(3):
            pot = ot.sinkhorn2(p[b].numpy(), q[b, k].numpy(), cost.numpy(), eps, method="sinkhorn_log",
                               numItermax=200_000, stopThr=1e-13)
            assert abs(float(values[b, k]) - float(pot)) < 1e-6
    p_cpu = p.clone().requires_grad_(True)
    reference = sinkhorn_histogram_loss(p_cpu, q, cost, eps, tol=1e-12)
    torch.testing.assert_close(values, reference.detach(), rtol=0, atol=1e-9)
    value.sum().backward()
    reference.sum().backward()
    assert p_gpu.grad.device.type == "cuda"
    torch.testing.assert_close(p_gpu.grad.cpu(), p_cpu.grad, rtol=0, atol=1e-8)


def test_sinkhorn_loss_on_cuda_is_within_the_entropic_bound_of_exact_w1() -> None:
    """⟨P_ε, C⟩ − W₁ ∈ [0, ε·log C] (module docstring of otfed.ot.entropic_histograms), W₁ by POT's ot.emd2."""
    cost = LabelSpace.for_task("sa").cost_matrix(dtype=F64)
    p, q = _histograms(5, 8, 2, seed=2)
    eps = 1e-3
    value = sinkhorn_histogram_loss(p.to(CUDA), q.to(CUDA), cost.to(CUDA), eps, threads=None).cpu()
    exact = torch.tensor([[ot.emd2(p[b].numpy(), q[b, k].numpy(), cost.numpy(), numItermax=10**7) for k in range(2)]
                          for b in range(8)], dtype=F64)
    gap = value - exact
    assert bool((gap >= -1e-9).all()) and bool((gap <= eps * np.log(5) + 1e-9).all())


@pytest.mark.parametrize("kind", ["sinkhorn", "kl"])
def test_ensemble_loss_on_cuda_is_the_cpu_value(kind: str) -> None:
    cost = LabelSpace.for_task("erc").cost_matrix(dtype=F64)
    p, q = _histograms(cost.shape[0], 16, 4, seed=3)
    w = torch.rand(16, 4, generator=torch.Generator().manual_seed(4), dtype=F64)
    options = dict(cost=cost, eps=0.05) if kind == "sinkhorn" else {}
    reference = ensemble_loss(p, q, w, kind=kind, **options)
    if kind == "sinkhorn":
        options = dict(cost=cost.to(CUDA), eps=0.05, threads=None)
    value = ensemble_loss(p.to(CUDA), q.to(CUDA), w.to(CUDA), kind=kind, check_weights=False, **options)
    assert value.device.type == "cuda"
    assert float(value) == pytest.approx(float(reference), abs=1e-10)


# ------------------------------------------------------------------------------- teachers, students
WORDS = "good bad great awful fine poor nice terrible ok superb the a film plot was".split()
SPEC = ModelSpec(kind="bert", layers=1, hidden=32, heads=2, intermediate=64, dropout=0.0, max_length=16,
                 vocab_size=150)


def _texts(n: int, seed: int) -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, n)
    texts = [" ".join([*rng.choice(WORDS[6:], rng.integers(2, 9)), WORDS[int(y)]]) for y in labels]
    return texts, labels


@pytest.mark.parametrize("kind", ["bert", "distilbert"])
def test_a_teacher_step_keeps_parameters_batches_and_outputs_on_cuda(kind: str) -> None:
    texts, labels = _texts(24, 0)
    clf = build_classifier(SPEC.model_copy(update={"kind": kind}), ["x", "y", "z"], texts, seed=1, device=CUDA)
    clf.model.train()
    batch = clf.encode(texts[:8])
    assert {v.device.type for v in batch.values()} == {"cuda"}
    logits = clf.logits(batch)
    assert logits.device.type == "cuda"
    torch.nn.functional.cross_entropy(logits, torch.as_tensor(labels[:8], device=CUDA)).backward()
    assert {p.device.type for p in clf.model.parameters()} == {"cuda"}
    assert {p.grad.device.type for p in clf.model.parameters() if p.grad is not None} == {"cuda"}
    assert clf.predict_proba_tensor(texts, batch_size=5).device.type == "cuda"


@pytest.mark.parametrize("kind", ["bert", "distilbert"])
def test_teacher_training_on_cuda_matches_the_cpu(kind: str) -> None:
    train, y_train = _texts(48, 1)
    val, y_val = _texts(16, 2)
    spec = SPEC.model_copy(update={"kind": kind})
    config = TrainingConfig(epochs=3, batch_size=8, lr=3e-3, patience=None)
    runs = {}
    for device in ("cpu", CUDA):
        clf = build_classifier(spec, ["x", "y", "z"], train, seed=3, device=device)
        result = train_classifier(clf, train, y_train, val, y_val, config, seed=4, progress=False)
        assert {p.device.type for p in clf.model.parameters()} == {torch.device(device).type}
        runs[device] = (clf, result)
    (cpu, cpu_result), (gpu, gpu_result) = runs["cpu"], runs[CUDA]
    assert gpu_result.best_epoch == cpu_result.best_epoch  # the same epoch's weights were restored
    for a, b in zip(cpu_result.history, gpu_result.history):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-3)
    for key, value in cpu.model.state_dict().items():
        torch.testing.assert_close(gpu.model.state_dict()[key].cpu(), value, rtol=0, atol=1e-3)
    np.testing.assert_allclose(gpu.predict_proba(val), cpu.predict_proba(val), atol=1e-3)


def test_probability_bias_on_cuda_counts_the_gpu_argmaxes() -> None:
    texts, labels = _texts(40, 5)
    clf = build_classifier(SPEC, ["x", "y", "z"], texts, seed=6, device=CUDA)
    train_classifier(clf, texts, labels, texts[:8], labels[:8], TrainingConfig(epochs=2, batch_size=8, lr=3e-3,
                                                                               patience=None),
                     seed=1, progress=False)
    noise = random_texts(vocabulary(clf.tokenizer), 64, 12, rng=0)
    seen = []

    def predict(batch):
        out = clf.predict_proba_tensor(batch, batch_size=len(batch))
        seen.append(out.device.type)
        return out

    bias = probability_bias(predict, noise, batch_size=16, n_labels=3, progress=False)
    assert seen == ["cuda"] * 4 and bias.device.type == "cpu"
    # recount on the host: the same batches' probabilities read back to NumPy, argmax by np.bincount
    labels = np.concatenate([clf.predict_proba(noise[i:i + 16], batch_size=16).argmax(1) for i in range(0, 64, 16)])
    np.testing.assert_array_equal(bias.numpy(), np.bincount(labels, minlength=3) / len(noise))


def _ensemble(n: int, seed: int) -> TeacherEnsemble:
    rng = np.random.default_rng(seed)
    return TeacherEnsemble(("t0", "t1", "t2"), rng.dirichlet(np.ones(5), size=(n, 3)), np.array([10, 20, 30]),
                           rng.dirichlet(np.ones(5), size=3))


@pytest.mark.parametrize("loss", ["kl", "sinkhorn"])
def test_student_distillation_on_cuda_stays_there_and_matches_the_cpu(loss: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    texts, _ = _texts(40, 7)
    ensemble = _ensemble(40, 8)
    space = LabelSpace.for_task("sa")
    weights = ensemble_weights(ensemble, "E")
    steps = []
    real = student_module.ensemble_loss

    def spy(student_probs, teacher_probs, w, **kwargs):
        tensors = [student_probs, teacher_probs, w] + ([kwargs["cost"]] if loss == "sinkhorn" else [])
        steps.append({t.device.type for t in tensors})
        out = real(student_probs, teacher_probs, w, **kwargs)
        steps[-1].add(out.device.type)
        return out

    def run(device: str):
        student = build_classifier(SPEC, list(space.labels), texts, seed=9, device=device)
        history = distill_student(student, texts, ensemble, weights, kind=loss,
                                  cost=space.cost_matrix(dtype=F64) if loss == "sinkhorn" else None,
                                  eps=0.05 if loss == "sinkhorn" else None, epochs=2, batch_size=8, seed=2,
                                  progress=False)
        assert {p.device.type for p in student.model.parameters()} == {torch.device(device).type}
        return student, history

    cpu, cpu_history = run("cpu")
    monkeypatch.setattr(student_module, "ensemble_loss", spy)
    gpu, gpu_history = run(CUDA)
    assert len(steps) == 10 and all(kinds == {"cuda"} for kinds in steps)
    for a, b in zip(cpu_history, gpu_history):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-3)
    np.testing.assert_allclose(gpu.predict_proba(texts), cpu.predict_proba(texts), atol=1e-3)


def test_a_teacher_epoch_never_waits_for_the_gpu() -> None:
    """One epoch of the teacher's training loop (dropout and attention dropout from the private generator) with no
    host sync; its summed loss stays on the GPU."""
    texts, labels = _texts(40, 9)
    clf = build_classifier(SPEC.model_copy(update={"dropout": 0.1}), ["x", "y", "z"], texts, seed=1, device=CUDA)
    features = clf.pretokenize(texts)
    targets = torch.as_tensor(labels, device=CUDA)
    optimizer = training_module._adamw(clf.model, 1e-3, 0.01)
    order_rng = torch.Generator().manual_seed(0)
    with seeded_dropout(clf.model, torch.Generator(device=CUDA).manual_seed(1)):
        training_module._train_epoch(clf, features, targets, order_rng, optimizer, 8, "warm-up", False)
        with no_host_sync():
            loss = training_module._train_epoch(clf, features, targets, order_rng, optimizer, 8, "epoch", False)
    assert loss.seen == 40 and np.isfinite(loss.mean())


def test_a_kl_distillation_epoch_never_waits_for_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """One epoch of the student loop with the KL loss (the Sinkhorn solver's convergence checks read back by
    design: otfed.ot.entropic_histograms) with no host sync but the epoch's one loss read-back, left out here."""
    texts, _ = _texts(40, 10)
    ensemble = _ensemble(40, 11)
    student = build_classifier(SPEC.model_copy(update={"dropout": 0.1}), list(LabelSpace.for_task("sa").labels),
                               texts, seed=2, device=CUDA)
    probs = torch.as_tensor(ensemble.probabilities, dtype=torch.float32, device=CUDA)
    w = torch.as_tensor(ensemble_weights(ensemble, "E"), dtype=torch.float32, device=CUDA)
    optimizer = torch.optim.AdamW(student.model.parameters(), lr=1e-3)
    features, generator = student.pretokenize(texts), torch.Generator().manual_seed(0)
    monkeypatch.setattr(EpochLoss, "mean", lambda self: 0.0)  # the epoch's one read-back, by design
    args = (student, features, probs, w, "kl", {}, optimizer, generator, 8)
    with seeded_dropout(student.model, torch.Generator(device=CUDA).manual_seed(1)):
        student_module._epoch(*args, "warm-up", False)
        with no_host_sync():
            student_module._epoch(*args, "epoch", False)
