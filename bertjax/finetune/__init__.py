"""Fine-tuning pretrained encoders on tasks: ``bertjax.finetune.run``."""

from bertjax.finetune.loop import run  # noqa: F401
