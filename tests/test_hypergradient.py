"""The IFT hypergradient with a Neumann series, on a quadratic problem whose hypergradient has a closed form.

Inner loss: L_T(w, lam) = 0.5 w^T H w - b^T w + 0.5 sum_i (w_i - w0_i)^2 / eta_g(i),  eta = exp(lam) per group:
per-group learning rates enter as a proximal term (a larger rate lets w move further from its start w0).
Its minimizer is w*(lam) = (H + D)^{-1} (b + D w0), D = diag(1 / eta_g(i)). Outer loss: L_V(w) = 0.5 ||w - t||^2.
"""

from __future__ import annotations

import torch

from fedpeft.hypergradient import ift_hypergradient, neumann_inverse_hvp

F64 = torch.float64
H = torch.tensor([[2.0, 0.3, 0.0, 0.1], [0.3, 1.5, 0.2, 0.0], [0.0, 0.2, 1.0, 0.1], [0.1, 0.0, 0.1, 0.8]], dtype=F64)
B = torch.tensor([1.0, -0.5, 0.3, 0.7], dtype=F64)
W0 = torch.tensor([0.2, 0.1, -0.3, 0.0], dtype=F64)
TARGET = torch.tensor([0.5, 0.4, -0.2, 0.3], dtype=F64)
GROUPS = torch.tensor([0, 0, 1, 1])
LAM = torch.tensor([0.3, -0.2], dtype=F64)


def inner_loss(w: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    eta = lam.exp()[GROUPS]
    return 0.5 * w @ H @ w - B @ w + 0.5 * ((w - W0) ** 2 / eta).sum()


def solution(lam: torch.Tensor) -> torch.Tensor:
    d = torch.diag(1.0 / lam.exp()[GROUPS])
    return torch.linalg.solve(H + d, B + d @ W0)


def closed_form_hypergradient() -> torch.Tensor:
    lam = LAM.clone().requires_grad_(True)
    w = solution(lam)
    (0.5 * ((w - TARGET) ** 2).sum()).backward()
    return lam.grad


def hypergradient(steps: int, psi: float, clamp: float | None = None) -> torch.Tensor:
    lam = LAM.clone().requires_grad_(True)
    w = solution(LAM).clone().requires_grad_(True)
    val_grads = [w.detach() - TARGET]
    train_grads = torch.autograd.grad(inner_loss(w, lam), [w], create_graph=True)
    return ift_hypergradient(val_grads, train_grads, [w], [lam], steps=steps, psi=psi, clamp=clamp)[0]


def test_hypergradient_converges_to_the_closed_form():
    exact = closed_form_hypergradient()
    # Total Hessian H + D has eigenvalues below 4, so psi = 0.3 converges.
    torch.testing.assert_close(hypergradient(steps=400, psi=0.3), exact, rtol=1e-9, atol=1e-12)
    errors = [float((hypergradient(steps=q, psi=0.3) - exact).norm()) for q in (1, 3, 10, 30)]
    assert errors == sorted(errors, reverse=True) and errors[-1] < 1e-3 * errors[0]


def test_three_neumann_steps_are_the_truncated_series():
    lam = LAM
    w = solution(lam)
    eta = lam.exp()[GROUPS]
    total_hessian = H + torch.diag(1.0 / eta)
    psi, v = 0.1, w - TARGET
    identity = torch.eye(4, dtype=F64)
    series = psi * sum(torch.linalg.matrix_power(identity - psi * total_hessian, j) for j in range(4)) @ v
    # d^2 L_T / dw_i dlam_g = -(w_i - w0_i) / eta_g for i in group g.
    mixed = torch.zeros(4, 2, dtype=F64)
    mixed[torch.arange(4), GROUPS] = -(w - W0) / eta
    torch.testing.assert_close(hypergradient(steps=3, psi=psi), -(mixed.T @ series), rtol=1e-12, atol=1e-14)


def test_neumann_series_approaches_the_inverse_hessian_vector_product():
    hessian = torch.tensor([[1.5, 0.4], [0.4, 0.8]], dtype=F64)
    v = [torch.tensor([1.0, -2.0], dtype=F64)]
    exact = torch.linalg.solve(hessian, v[0])
    errors = []
    for q in (0, 3, 20, 200):
        approx = neumann_inverse_hvp(lambda x: [hessian @ x[0]], v, steps=q, psi=0.5)[0]
        errors.append(float((approx - exact).norm()))
    assert errors == sorted(errors, reverse=True) and errors[-1] < 1e-10
    # One step by hand: psi * (v + (I - psi H) v).
    one = neumann_inverse_hvp(lambda x: [hessian @ x[0]], v, steps=1, psi=0.5)[0]
    torch.testing.assert_close(one, 0.5 * (v[0] + v[0] - 0.5 * hessian @ v[0]))


def test_hypergradient_is_clamped_elementwise():
    free = hypergradient(steps=3, psi=0.1)
    bound = 0.5 * float(free.abs().min())
    clamped = hypergradient(steps=3, psi=0.1, clamp=bound)
    torch.testing.assert_close(clamped, free.sign() * bound)
