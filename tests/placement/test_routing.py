"""The vendored OLMoE routing and the batching and traffic-mix models built on it."""

import numpy as np
import pytest

from moe_placement.regimes import REAL, real_counts
from moe_placement.routing import SCHEDULES, decode_counts, load_routes, prefill_counts


def test_the_vendored_data_is_what_its_readme_says() -> None:
    routes = load_routes()
    assert routes.domains == ("arxiv", "github", "wikipedia") and routes.layers == (0, 7, 15)
    assert routes.sets.shape == (3, 3, 208896, 8) and routes.sets.dtype == np.uint8
    sample = routes.sets[:, :, ::997]
    assert sample.max() < 64
    assert (np.diff(sample.astype(int), axis=-1) > 0).all()  # 8 distinct experts per token, ascending
    # the hottest expert gets 2.5-7.8x its fair share, depending on layer and domain
    for d in range(3):
        for layer in range(3):
            share = np.bincount(routes.sets[d, layer].ravel(), minlength=64) / (8 * routes.num_tokens)
            assert 2.3 <= share.max() * 64 <= 8.0


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("domains", [1, 3, 4])
def test_schedules_are_mixes(name: str, domains: int) -> None:
    mix = SCHEDULES[name](400, domains, 32, np.random.default_rng(5))
    assert mix.shape == (400, domains)
    assert (mix >= 0).all()
    np.testing.assert_allclose(mix.sum(axis=1), 1.0)


def test_decode_and_prefill_count_every_token_once_per_layer() -> None:
    routes = load_routes()
    mix = SCHEDULES["walk"](50, 3, 16, np.random.default_rng(1))
    dec = decode_counts(routes, mix, batch=32, mean_length=20.0, rng=np.random.default_rng(2))
    pre = prefill_counts(routes, mix, chunk=512, mean_prompt=200.0, rng=np.random.default_rng(3))
    assert dec.shape == pre.shape == (50, 3, 64)
    np.testing.assert_array_equal(dec.sum(axis=2), 32 * 8)
    np.testing.assert_array_equal(pre.sum(axis=2), 512 * 8)


def test_one_domain_routes_like_that_domain_and_seeds_repeat() -> None:
    routes = load_routes()
    only_code = np.zeros((40, 3))
    only_code[:, 1] = 1.0
    counts = decode_counts(routes, only_code, batch=64, mean_length=30.0, rng=np.random.default_rng(4))
    code = np.bincount(routes.sets[1, 0].ravel(), minlength=64)
    assert np.corrcoef(counts[:, 0].sum(axis=0), code)[0, 1] > 0.8
    a = real_counts("prefill", "phases", windows=3, seed=7)
    np.testing.assert_array_equal(a, real_counts("prefill", "phases", windows=3, seed=7))
    assert a.shape == (3 * REAL["prefill"].window, 3, 64)
    other = real_counts("prefill", "phases", windows=3, seed=7, replica=1)
    assert not np.array_equal(a, other)  # another replica: the same mix, its own prompts
