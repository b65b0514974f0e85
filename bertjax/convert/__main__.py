r"""Converts between Hugging Face model directories and bertjax workdirs.

Import (HF -> bertjax), then continue pretraining or evaluate:

  python -m bertjax.convert --from_hf=path/to/bert-base-uncased --workdir=/tmp/bb
  python -m bertjax.main --config=configs/hf.py:/tmp/bb --workdir=/tmp/bb

HF model types bert, roberta, albert, deberta-v2 (DeBERTa-v2/v3), electra
and xlnet import. ``--config`` (default: the shipped config of that system,
e.g. configs/roberta.py:base, after the HF model_type) supplies the training
and data fields; the model fields come from the HF config.json.

Export (bertjax -> HF), loadable by transformers' classes of the same
systems (BertForPreTraining, RobertaForMaskedLM, AlbertForPreTraining,
DebertaV2ForMaskedLM, ElectraForPreTraining with the generator beside it,
XLNetLMHeadModel; SpanBERT exports as a BERT):

  python -m bertjax.convert --to_hf=/tmp/bb-hf --workdir=/tmp/bb [--step=N] \
      [--model_type=roberta] [--overwrite]

--to_hf must be a new or empty directory, or one holding an earlier export
(then --overwrite replaces it: only the files that export wrote are removed);
a bertjax workdir or a directory of other files is refused
(bertjax/convert/export_target.py).

SIGTERM (a scheduler, a preempted VM) stops either at once, with one line and
exit status 75 (EX_TEMPFAIL, as the other binaries: run the same command
again); Ctrl-C alike, status 130. An import stopped so leaves the workdir as
it was (it is staged, then moved into place), an export removes what it wrote.
"""

from bertjax import guards

if __name__ == "__main__":
  guards.catch_sigterm()  # remembered until main's sigterm_raises takes it

import json  # noqa: E402
import sys  # noqa: E402

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from bertjax import cli  # noqa: E402
from bertjax import config_files  # noqa: E402
from bertjax import paths  # noqa: E402

_FROM_HF = flags.DEFINE_string("from_hf", None, "HF model directory to import.")
_TO_HF = flags.DEFINE_string("to_hf", None, "Directory to write the HF model into.")
_WORKDIR = flags.DEFINE_string("workdir", None, "The bertjax workdir.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step to export; default the latest.")
_MODEL_TYPE = flags.DEFINE_string(
    "model_type", None, "HF model_type to export as; default the imported one, else "
    "the model's own (bert, albert, deberta-v2, electra, xlnet). 'roberta' writes a "
    "bertjax BERT as RobertaForMaskedLM (a pooler and NSP head are left out).")
_OVERWRITE = flags.DEFINE_bool(
    "overwrite", False, "Let --to_hf replace an earlier export in its directory "
    "(only the files that export wrote are removed).")
_CONFIG = config_files.define_config_flag(
    "Base config for an import, e.g. configs/bert.py:base.", lock_config=False)
flags.mark_flags_as_required(["workdir"])


def _default_config(model: str):
  return config_files.shipped(model).get_config("base")


def main(argv):
  try:
    with guards.sigterm_raises():
      return _main(argv)
  except guards.Terminated:
    what = (f"the export (nothing of it is left in --to_hf={_TO_HF.value})"
            if _TO_HF.value else "the import (the workdir is as it was)")
    print(f"error: stopped by SIGTERM before the end of {what}; run the same "
          "command again.", file=sys.stderr, flush=True)
    return guards.EXIT_PREEMPTED


def _main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if bool(_FROM_HF.value) == bool(_TO_HF.value):
    raise ValueError("Pass exactly one of --from_hf=DIR (import) or --to_hf=DIR (export).")
  paths.require_directory(_WORKDIR.value, "--workdir")
  if _FROM_HF.value:  # an export reads the workdir: a missing one is said below
    paths.require_bucket(_WORKDIR.value, "--workdir")
  from bertjax import convert
  from bertjax.convert import hf_files
  from bertjax.convert import workdir as workdir_lib
  if _TO_HF.value:
    result = workdir_lib.export_hf(_WORKDIR.value, _TO_HF.value, _STEP.value,
                                   _MODEL_TYPE.value, overwrite=_OVERWRITE.value)
    if result.get("left_out"):
      print(f"note: left out {', '.join(result['left_out'])}, which the HF class has "
            "no place for (a BERT written as model_type bert keeps a pooler and "
            "NSP head).")
    print(json.dumps({"exported_step": result["step"], "to": _TO_HF.value,
                      "tokenizer_files": result["tokenizer_files"],
                      **({"architecture": result["architecture"]}
                         if "architecture" in result else {})}), flush=True)
    return
  model_type = hf_files.read_config(_FROM_HF.value).get("model_type", "")
  mapping = convert.mapping_for_hf(model_type)
  base = _CONFIG.value or _default_config(workdir_lib.base_config_name(mapping))
  report = workdir_lib.import_hf(_FROM_HF.value, _WORKDIR.value, base)
  for head in report.initialised:
    print(f"note: the checkpoint has no {head} head; it was freshly initialised.")
  kept = [n for n in report.unused if n in getattr(mapping, "KEPT_WHOLE", ())]
  ignored = [n for n in report.unused if n not in kept]
  if kept:
    print(f"note: kept {len(kept)} tensors bertjax does not use beside the checkpoint "
          f"({workdir_lib.KEPT_FILE}), for the export to write back: {', '.join(kept)}")
  if ignored:
    print(f"note: ignored {len(ignored)} tensors with no place in bertjax: "
          f"{', '.join(ignored[:8])}")
  print(json.dumps({"imported": _FROM_HF.value, "workdir": paths.absolute(_WORKDIR.value),
                    "model_size": report.config.model_size,
                    "initialised_heads": report.initialised,
                    "continue_with": f"--config=configs/hf.py:{paths.absolute(_WORKDIR.value)}"}),
        flush=True)


if __name__ == "__main__":
  cli.run(main)
