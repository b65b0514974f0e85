"""Local task files name a bad row by its line: the header is line 1, so the
first row is line 2, and blank lines the reader skips still count. The label
column is no text column."""

import pytest

from bertjax.finetune import tasks as tasks_lib

from test_finetune import _finetune_config

_GOOD = "sentence,label\na cat,pos\na dog,neg\n"


@pytest.mark.parametrize("train,evals,message", [
    ('sentence,label\n"unclosed quote,pos\nok row,neg\n', _GOOD,
     r"train\.csv line 2 opens a quoted value that runs on to line 3,"),
    (_GOOD, "sentence,label\nThe film was good.,neutral\nThe film was bad.,neg\n",
     r"Label 'neutral' of .*dev\.csv line 2 is not among"),
    (_GOOD, "sentence,label\n\nfine,pos\n\r\nodd,maybe\n",
     r"Label 'maybe' of .*dev\.csv line 5 is not among"),
    (_GOOD, "sentence\tlabel\nfine\tpos\n\nshort\n",
     r"dev\.tsv line 4 has 1 fields where its header has 2"),
])
def test_a_bad_row_is_named_by_its_own_line(tmp_path, train, evals, message):
  name = "dev.tsv" if "\t" in evals else "dev.csv"
  (tmp_path / "train.csv").write_text(train)
  (tmp_path / name).write_bytes(evals.encode())
  config = _finetune_config("local", train_files=str(tmp_path / "train.csv"),
                            eval_files=str(tmp_path / name))
  with pytest.raises(ValueError, match=message):
    tasks_lib.load(config)


def test_the_label_column_is_refused_as_text(tmp_path):
  # Fed as text, the label would be read by the model that is to predict it.
  (tmp_path / "train.csv").write_text(_GOOD)
  config = _finetune_config("local", train_files=str(tmp_path / "train.csv"),
                            eval_files=str(tmp_path / "train.csv"),
                            text_fields="sentence,label")
  with pytest.raises(ValueError, match=r"names the label column 'label'; name only"):
    tasks_lib.load(config)
  config.text_fields = "sentence"
  assert [ex["text_a"] for ex in tasks_lib.load(config).train] == ["a cat", "a dog"]
