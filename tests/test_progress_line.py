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


def test_tokens_per_second_is_the_rate_since_the_last_line():
  # It was the average since the process started: the compile, the data
  # preparation and a restore kept it (and MFU) several times too low for
  # the whole run, and time_left too long.
  from bertjax import config_files
  config = config_files.shipped("bert").get_config("tiny")
  config.num_train_steps, config.batch_size, config.seq_len = 1000, 8, 64
  p = progress.Progress(config, 100)  # resumed at step 100
  t0 = p._last[0]  # noqa: SLF001
  first, second, third = {}, {}, {}
  p.line(110, first, now=t0 + 100.0)  # 10 steps behind a 99 s compile
  p.line(130, second, now=t0 + 102.0)  # then 10 steps a second
  line = p.line(150, third, now=t0 + 106.0)  # and 5
  assert first["tokens_per_sec"] == pytest.approx(0.1 * 8 * 64)
  assert second["tokens_per_sec"] == pytest.approx(10 * 8 * 64)
  assert third["tokens_per_sec"] == pytest.approx(5 * 8 * 64)
  assert third["mfu"] == pytest.approx(second["mfu"] / 2)
  # Time left at the rate since the first line: 40 steps in 6 s.
  assert line.endswith(f"time_left={progress._time_left(850 / (40 / 6))}")  # noqa: SLF001
