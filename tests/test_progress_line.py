"""The progress line's time left: hours, minutes and seconds, with days
beyond a day (strftime's %H wrapped at 24 hours)."""

import pytest

from bertjax import progress


@pytest.mark.parametrize("seconds, shown", [
    (5 * 3600 + 35 * 60 + 35.9, "05:35:35"),
    (59, "00:00:59"),
    (19 * 86400 + 5 * 3600 + 35 * 60 + 35, "19d 05:35:35"),
    (86400, "1d 00:00:00"),
    (float("nan"), "?"),
    (float("inf"), "?"),
])
def test_time_left_counts_days(seconds, shown):
  assert progress._duration(seconds) == shown  # noqa: SLF001
