"""attnres_helpers.measure: the one window loop (mean_over_windows) and measure_windows on it."""

import pytest
import torch

from attnres_helpers.measure import attention_scores, mean_over_windows, measure_windows
from attnres_helpers.metric import ScoreAccumulator
from attnres_helpers.model import Transformer, preset


def test_the_loop_returns_each_total_over_n_and_continues_where_it_stopped():
    """Each statistic summed over every batch, divided by the number of windows (not of batches); started
    at ``done`` with the sums of the first ``done`` windows, it gives what one uninterrupted loop gives."""
    windows = torch.arange(14.0).reshape(7, 2)  # (n, T+1)
    seen = []

    def statistics(batch):
        return {"x": batch.sum(0).double()}

    def after(done, batch_sums, sums):
        seen.append((done, float(sums["x"][0])))

    whole = mean_over_windows(statistics, windows, batch_size=3, after=after)
    torch.testing.assert_close(whole["x"], windows.mean(0).double(), rtol=0, atol=1e-12)
    assert seen == [(3, 6.0), (6, 30.0), (7, 42.0)]  # after each batch: windows done, the running sum
    first = {"x": windows[:4].sum(0).double()}
    resumed = mean_over_windows(statistics, windows, batch_size=2, sums=first, done=4)
    torch.testing.assert_close(resumed["x"], whole["x"], rtol=0, atol=1e-12)


@pytest.mark.parametrize("encoding", ["rope", "alibi"])
def test_measure_windows_is_the_mean_of_each_windows_own_measurement_for_any_batch_size(encoding):
    """ŝ, key0 and NLL of 5 windows are the mean of each window measured alone, whatever the batch size
    (a batch of 2 leaves a last batch of 1). The scores are float32, and a batch's matrix products may be
    summed in another order than one window's (thread count, kernel choice): 1e-5 relative covers that;
    a batch's sum taken for its mean would be off by the batch size."""
    torch.manual_seed(0)
    model = Transformer(preset("tiny", encoding=encoding)).eval()
    windows = torch.randint(0, 256, (5, model.cfg.train_len + 1))
    alone = []
    for window in windows:
        accumulators = []
        for layer_scores in attention_scores(model, window[None, :-1]):  # (1, H, T, T)
            accumulators.append(ScoreAccumulator())
            accumulators[-1].update(layer_scores)
        alone.append(torch.stack([a.mean() for a in accumulators]))  # (layers, H, T)
    expected = torch.stack(alone).mean(0)
    for batch_size in (1, 2, 5):
        m = measure_windows(model, windows, batch_size=batch_size)
        torch.testing.assert_close(m["s_hat"], expected, rtol=1e-5, atol=1e-6)
        assert m["nll"].shape == (model.cfg.train_len,) and m["key0"].shape == expected.shape
    one, two = measure_windows(model, windows, batch_size=1), measure_windows(model, windows, batch_size=2)
    for name in ("key0", "nll"):
        torch.testing.assert_close(one[name], two[name], rtol=1e-5, atol=1e-6)
