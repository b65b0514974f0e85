r"""The config of a model imported by ``python -m bertjax.convert --from_hf``.

  python -m bertjax.convert --from_hf=path/to/hf-model --workdir=/tmp/imported
  python -m bertjax.main --config=configs/hf.py:/tmp/imported --workdir=/tmp/imported

``get_config(workdir)`` reads ``<workdir>/config.json`` as the import wrote it
(parsed as JSON, never executed). Override fields as usual, e.g.
``--config.dataset=bertjax_local_text --config.text_files=my/*.txt``.
"""

import json

from etils import epath
import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  # epath, so that a gs:// workdir reads the same way as a local one.
  path = epath.Path(arg) / "config.json" if arg else None
  if path is None or not path.is_file():
    raise ValueError(
        f"No config.json in {arg!r}; pass the workdir of an import, "
        "--config=configs/hf.py:/path/to/workdir.")
  fields = json.loads(path.read_text(encoding="utf-8"))
  if "objective" not in fields and ("model_type" in fields
                                    or "architectures" in fields):
    raise ValueError(
        f"{arg!r} holds a Hugging Face model, not an import of one; import it "
        f"first with python -m bertjax.convert --from_hf={arg} "
        "--workdir=NEW_WORKDIR, then pass --config=configs/hf.py:NEW_WORKDIR.")
  return ml_collections.ConfigDict(fields)
