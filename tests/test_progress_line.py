"""The progress line's time left: hours, minutes and seconds, the hours
counted past a day (strftime's %H wrapped at 24 hours)."""

import pytest

from bertjax import progress


@pytest.mark.parametrize("seconds, shown", [
    (5 * 3600 + 35 * 60 + 35, "05:35:35"),
    (59, "00:00:59"),
    (19 * 86400 + 5 * 3600 + 35 * 60 + 35, f"{19 * 24 + 5}:35:35"),
    (86400, "24:00:00"),
    (float("nan"), "?"),
])
def test_time_left_counts_hours_past_a_day(seconds, shown):
  assert progress._time_left(seconds) == shown  # noqa: SLF001
