"""Objectives compared at equal compute: ``python -m bertjax.study``.

``run(configs, flops, workdir)`` pretrains each config to the same budget of
useful FLOPs (bertjax/flops.py), evaluates it at budget points along the way
(held-out objective metrics, then the fine-tuning tasks) and writes
``study.json``, ``study.md`` and ``study.png`` (bertjax/study/report.py).
"""

from bertjax.study.core import run  # noqa: F401
