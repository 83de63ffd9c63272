import numpy as np
import pytest

from tokenops.bench.arrivals import ArrivalSpec


def test_poisson_mean_and_variance():
    g = ArrivalSpec(rate=4.0, kind="poisson", seed=7).gaps(20000)[1:]
    assert g.mean() == pytest.approx(0.25, rel=0.03)
    assert g.var() == pytest.approx(0.25**2, rel=0.06)  # exponential: var = mean^2


def test_constant_is_exact():
    off = ArrivalSpec(rate=2.0, kind="constant").offsets(5)
    assert np.allclose(off, [0, 0.5, 1.0, 1.5, 2.0])


def test_gamma_burstiness_sets_cv_and_keeps_mean():
    bursty = ArrivalSpec(rate=10.0, kind="gamma", burstiness=0.25, seed=1).gaps(20000)[1:]
    smooth = ArrivalSpec(rate=10.0, kind="gamma", burstiness=4.0, seed=1).gaps(20000)[1:]
    for g in (bursty, smooth):
        assert g.mean() == pytest.approx(0.1, rel=0.05)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.08)  # CV = 1/sqrt(shape)
    assert smooth.std() / smooth.mean() == pytest.approx(0.5, rel=0.08)


def test_seeded_and_validated():
    a = ArrivalSpec(rate=3, seed=5).offsets(10)
    assert np.array_equal(a, ArrivalSpec(rate=3, seed=5).offsets(10))
    assert not np.array_equal(a, ArrivalSpec(rate=3, seed=6).offsets(10))
    assert np.all(ArrivalSpec(rate=float("inf")).offsets(3) == 0)
    with pytest.raises(ValueError, match="arrival process"):
        ArrivalSpec(rate=1, kind="weird")
    with pytest.raises(ValueError, match="positive"):
        ArrivalSpec(rate=0)
