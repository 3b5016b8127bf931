"""``spoke_read_seconds{front}``: the S3 front end's share of the reads, and the rest
(``/objects``), from the histogram of both and the S3 one timed a little earlier."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from service.metrics import Histogram
from spoke.serve.stats import READ_LATENCY_BUCKETS_S, by_front, read_latency_histograms

SECONDS = st.floats(min_value=0.0, max_value=5.0, allow_nan=False)


def _cumulative(h: Histogram) -> list[float]:
    return [n for _, n in h.cumulative()]


@given(st.lists(SECONDS, max_size=30), st.lists(st.tuples(SECONDS, SECONDS), max_size=30))
def test_the_rest_counts_exactly_the_other_reads_and_stays_a_histogram(
    http: list[float], s3: list[tuple[float, float]]
) -> None:
    both, share = Histogram(READ_LATENCY_BUCKETS_S), Histogram(READ_LATENCY_BUCKETS_S)
    for seconds in http:
        both.observe(seconds)
    for inner, extra in s3:  # the S3 timer starts first: it never reads less
        both.observe(inner)
        share.observe(inner + extra)
    rest = both.less(share)
    counts = _cumulative(rest)
    assert rest.count == len(http) == counts[-1]
    assert all(n >= 0 for n in rest.counts)
    assert counts == sorted(counts)
    # Where no read straddles a bound, each bucket is the other reads' own.
    alone = Histogram(READ_LATENCY_BUCKETS_S)
    for seconds in http:
        alone.observe(seconds)
    if all(extra == 0.0 for _, extra in s3):
        assert rest.counts == alone.counts


def test_each_outcome_is_split_by_front_end() -> None:
    reads, s3 = read_latency_histograms(), read_latency_histograms()
    reads["hit"].observe(0.001)
    reads["hit"].observe(0.002)
    s3["hit"].observe(0.002)
    reads["miss"].observe(0.1)
    split = by_front(reads, s3)
    assert (split["hit", "http"].count, split["hit", "s3"].count) == (1, 1)
    assert (split["miss", "http"].count, split["miss", "s3"].count) == (1, 0)
    assert split["hit", "http"].sum == 0.001
    # No S3 front end: every read is /objects', and the S3 series are there at 0.
    alone = by_front(reads, {})
    assert alone["hit", "http"] is reads["hit"] and alone["hit", "s3"].count == 0
