"""Which float kernel differs between two CPUs? ``python -m tests.kernel_fingerprint`` prints one md5 per torch /
numpy op, computed under otfed's portable CPU kernels (:mod:`otfed.cpu_kernels`) on one thread. Run it on two
machines and compare: an op whose md5 differs is computed with different float bits there.

The first block is the ops of the project's first fingerprint (same inputs, same names: its table from an AMD EPYC is
quoted in ``docs/running.md``); ``mlp 5 adam steps`` — a small MLP trained five steps — is the one that differed
between an Intel Xeon and an AMD EPYC while every op above it agreed. The second block takes that training step
apart (forward, loss, each gradient, one optimiser step) and adds the ops the bag-of-words teachers train with
(embedding lookups and their gradient, ReLU, seeded dropout, class-weighted cross-entropy, AdamW), so that the first
line that differs names the kernel. Not part of the suite: a tool, like ``tests.planted_bugs``.
"""
from __future__ import annotations

import hashlib
import os
import platform
from typing import Any, Callable

from otfed import cpu_kernels

cpu_kernels.use_portable_kernels()
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

cpu_kernels.hold_torch_kernels()
torch.set_num_threads(1)


def md5(value: Any) -> str:
    """The first 12 hex digits of the md5 of ``value``'s bytes (a tensor, an array or a list of them)."""
    if isinstance(value, (list, tuple)):
        return hashlib.md5(b"".join(bytes.fromhex(md5(v)) for v in value)).hexdigest()[:12]
    a = value.detach().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    return hashlib.md5(np.ascontiguousarray(a).tobytes()).hexdigest()[:12]


_g = torch.Generator().manual_seed(0)
X = torch.randn(128, 256, generator=_g)
W = torch.randn(256, 512, generator=_g)
Y = torch.arange(128) % 5


def first_block() -> dict[str, Callable[[], Any]]:
    """The first fingerprint's ops, inputs and names."""
    view = X.view(2, 4, 16, 256)
    return {
        "matmul 128x256x512": lambda: X @ W,
        "matmul 64x64 f64": lambda: X[:64, :64].double() @ X[:64, :64].double().T,
        "linear": lambda: F.linear(X, W.T[:64]),
        "exp": lambda: torch.exp(X),
        "log_softmax": lambda: torch.log_softmax(X, -1),
        "tanh": lambda: torch.tanh(X),
        "gelu": lambda: F.gelu(X),
        "layer_norm": lambda: F.layer_norm(X, (256,)),
        "sum": lambda: X.sum(0),
        "embedding_bag": lambda: F.embedding_bag(torch.arange(100).view(10, 10), W[:100], mode="mean"),
        "sdpa": lambda: F.scaled_dot_product_attention(view[..., :32], view[..., 32:64], view[..., 64:96]),
        "numpy matmul": lambda: np.random.default_rng(0).normal(size=(200, 300))
        @ np.random.default_rng(1).normal(size=(300, 100)),
        "numpy exp": lambda: np.exp(np.random.default_rng(0).normal(size=10000)),
        "mlp 5 adam steps": lambda: _train(torch.optim.Adam, steps=5)[-1],
    }


def _mlp() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 64), torch.nn.GELU(), torch.nn.Linear(64, 5))


def _train(optimizer: type, steps: int) -> list[torch.Tensor]:
    """The flattened parameters of the first fingerprint's MLP after each of ``steps`` steps of ``optimizer``."""
    m = _mlp()
    opt = optimizer(m.parameters(), lr=1e-3)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(m(X), Y).backward()
        opt.step()
        out.append(torch.cat([p.detach().flatten() for p in m.parameters()]))
    return out


def _grads() -> dict[str, torch.Tensor]:
    m = _mlp()
    F.cross_entropy(m(X), Y).backward()
    return {name: p.grad for name, p in m.named_parameters()}


def training_step_block() -> dict[str, Callable[[], Any]]:
    """The MLP's training step taken apart, then the bag-of-words teachers' own ops."""
    hidden = F.linear(X, _mlp()[0].weight.detach(), _mlp()[0].bias.detach())
    g = torch.randn(128, 64, generator=torch.Generator().manual_seed(1))
    ids = torch.randint(0, 1000, (32, 40), generator=torch.Generator().manual_seed(2))
    table = torch.randn(1000, 128, generator=torch.Generator().manual_seed(3))
    ops: dict[str, Callable[[], Any]] = {
        "mlp init": lambda: torch.cat([p.detach().flatten() for p in _mlp().parameters()]),
        "linear + bias (addmm)": lambda: hidden,
        "mlp logits": lambda: _mlp()(X),
        "cross_entropy": lambda: F.cross_entropy(_mlp()(X), Y),
        "gelu backward": lambda: torch.ops.aten.gelu_backward(g, hidden),
        "mm grad_input (g @ W)": lambda: g @ _mlp()[0].weight.detach(),
        "mm grad_weight (g^T @ X)": lambda: g.T @ X,
        "bias grad (sum over rows)": lambda: g.sum(0),
        "log_softmax backward": lambda: torch.ops.aten._log_softmax_backward_data(
            g[:, :5], torch.log_softmax(hidden[:, :5], -1), 1, torch.float32),
    }
    for name, grad in _grads().items():
        ops[f"grad {name}"] = (lambda grad=grad: grad)
    ops |= {
        "adam 1 step": lambda: _train(torch.optim.Adam, steps=1)[0],
        "adam 5 steps": lambda: _train(torch.optim.Adam, steps=5),
        "adamw 5 steps": lambda: _train(torch.optim.AdamW, steps=5),
        "sgd 5 steps": lambda: _train(torch.optim.SGD, steps=5),
        "embedding mean": lambda: F.embedding(ids, table).mean(1),
        "embedding backward": lambda: torch.ops.aten.embedding_dense_backward(
            torch.ones(32, 40, 128), ids, 1000, 0, False),
        "relu": lambda: torch.relu(X),
        "dropout (seeded)": lambda: _dropout(),
        "cross_entropy class-weighted": lambda: F.cross_entropy(X[:, :5], Y, weight=torch.tensor(
            [0.5, 1.0, 1.5, 2.0, 3.0])),
        "sqrt": lambda: torch.sqrt(X.abs()),
        "addcdiv": lambda: X.addcdiv(X, X.abs() + 1e-3, value=-1e-3),
        "lerp": lambda: X.lerp(W[:128, :256], 0.1),
    }
    return ops


def _dropout() -> torch.Tensor:
    mask = torch.rand(X.shape, generator=torch.Generator().manual_seed(4)) >= 0.3
    return X * mask / 0.7


def main() -> None:
    print("cpu:", platform.processor() or platform.machine(), "| torch", torch.__version__, "| numpy", np.__version__,
          "|", " ".join(f"{k}={v}" for k, v in cpu_kernels.kernels_in_use().items()),
          "| MKL_CBWR", os.environ.get("MKL_CBWR"), "| ATEN", os.environ.get("ATEN_CPU_CAPABILITY"),
          "| OPENBLAS", os.environ.get("OPENBLAS_CORETYPE"))
    for title, block in (("the first fingerprint", first_block()), ("its training step, apart", training_step_block())):
        print(f"# {title}")
        for name, op in block.items():
            with torch.no_grad() if name.startswith(("matmul", "linear ", "mm ", "gelu b", "log_softmax b")) \
                    else torch.enable_grad():
                print(f"{name:30s} {md5(op())}")


if __name__ == "__main__":
    main()
