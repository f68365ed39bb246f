"""Tolerances derived from the computation, for tests that compare two floating-point paths.

Two code paths that compute the same value in a different order (another batch shape and so
another blocking of a matrix product, fused against unfused kernels, an incremental decode
against a whole-sequence forward, one process against a DDP split) agree only up to rounding, and
how much depends on the CPU's kernels (``ATEN_CPU_CAPABILITY``: default, avx2, avx512). A
tolerance tuned on one CPU until it passed asserts that CPU, not the property. So:

**A sum of n terms** (a dot product, a reduction): Higham, *Accuracy and Stability of Numerical
Algorithms* (2nd ed., 2002), Lemma 3.1 and eq. (3.5) (inner products; §4.2 for sums): in any
order, with unit roundoff ``u`` (2^-24 in float32, 2^-53 in float64),

    |fl(x_1 y_1 + ... + x_n y_n) - (x_1 y_1 + ... + x_n y_n)| <= gamma_n sum |x_i y_i|,
    gamma_n = n u / (1 - n u)   (a plain sum: y_i = 1, and gamma_{n-1} suffices).

Two orders of the same sum are each within that of the exact sum, so they differ by at most
``2 gamma_n sum|x_i| <= 2 gamma_n n max|x_i|``: :func:`summation_atol`, asserted by
:func:`assert_summation_close`. This is a worst case (errors of one sign); it holds on every CPU.

**A whole model** (many layers of such sums): the bound above, carried through the layers, is
multiplied by how much each layer amplifies an error, which a test does not know in float32. So
the two paths are run in float64 (:func:`to_float64`: the model and its inputs), where the same
bound is 2^29 times smaller: the test models' widest sums (a weight's gradient over <= 256
rows x steps, dot products over <= 32 features) of terms <= 1 give ``summation_atol(256, 1,
float64)`` = 1.5e-11, and ``FLOAT64_TOL`` allows 8 such errors in sequence (a 2-layer model's
forward and backward): 1.2e-10, used as both the absolute and the relative tolerance
(:func:`assert_float64_close`). A
broken property (a wrong row, a wrong mask, another dropout draw) moves the results by orders of
magnitude more, so the comparison can still fail; in float32 the same order change is ~1e-6.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


def unit_roundoff(dtype: torch.dtype = torch.float32) -> float:
    """``u``: half the gap between 1 and the next float (2^-24 for float32, 2^-53 for float64)."""
    return torch.finfo(dtype).eps / 2


def gamma(n: int, dtype: torch.dtype = torch.float32) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: the relative error bound of an n-term sum."""
    nu = n * unit_roundoff(dtype)
    assert nu < 1, f"gamma_{n} is undefined in {dtype} (n u >= 1)"
    return nu / (1 - nu)


def summation_atol(n: int, magnitude: float, dtype: torch.dtype = torch.float32) -> float:
    """How far two evaluations of the same ``n``-term sum, in any two orders, can be apart when
    every term is at most ``magnitude`` in absolute value: ``2 gamma_n n magnitude``."""
    return 2 * gamma(n, dtype) * n * magnitude


def mean_atol(n: int, magnitude: float, dtype: torch.dtype = torch.float32) -> float:
    """How far two evaluations of the mean of the same ``n`` terms (each at most ``magnitude``) can
    be apart, in any summation order, or as a mean of means: ``2 gamma_{n+1} magnitude`` (the sum's
    ``2 gamma_n n magnitude`` over n, and a rounding of the division on each side)."""
    return summation_atol(n + 1, magnitude / (n + 1), dtype)


def assert_summation_close(actual: torch.Tensor, expected: torch.Tensor, *, n: int, magnitude: float,
                           msg: str | None = None) -> None:
    """``actual`` and ``expected`` are the same ``n``-term sums (terms at most ``magnitude``) in
    two orders: equal within :func:`summation_atol` in their dtype (no relative slack)."""
    atol = summation_atol(n, magnitude, expected.dtype)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0.0, msg=msg)


#: summation order in float64 on the tiny test models (module docstring): ~1.2e-10
FLOAT64_TOL = 8 * summation_atol(256, 1.0, torch.float64)


def assert_float64_close(actual: torch.Tensor | float, expected: torch.Tensor | float, *,
                         msg: str | None = None) -> None:
    """Two float64 paths that differ only in summation order: equal within ``FLOAT64_TOL`` (a Python
    float, a metric the code logged, is a float64)."""
    actual, expected = (torch.tensor(x, dtype=torch.float64) if isinstance(x, float) else x
                        for x in (actual, expected))
    assert actual.dtype == expected.dtype == torch.float64, (actual.dtype, expected.dtype)
    torch.testing.assert_close(actual, expected, atol=FLOAT64_TOL, rtol=FLOAT64_TOL, msg=msg)


def to_float64(*objects: Any) -> Any:
    """The test's float32 modules (``.double()``, in place), floating tensors and dataclasses of
    them (a :class:`caprl.data.batch.Batch`: a copy with float64 fields) in float64; anything else
    as it is. One object gives it back, several a tuple. The values are the float32 ones (exact in
    float64): the test's data, drawn as before; only the arithmetic changes precision. Noise the
    code draws in the default dtype (a decode's Gumbel noise) stays a float32 draw, promoted where
    it meets float64 values, and both paths of a comparison draw the same."""
    out = tuple(_float64(o) for o in objects)
    return out[0] if len(out) == 1 else out


def _float64(o: Any) -> Any:
    if isinstance(o, torch.nn.Module):
        return o.double()
    if isinstance(o, torch.Tensor):
        return o.double() if o.is_floating_point() else o
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.replace(o, **{f.name: _float64(getattr(o, f.name)) for f in dataclasses.fields(o)
                                         if f.init and isinstance(getattr(o, f.name), torch.Tensor)})
    return o
