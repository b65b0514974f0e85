"""bertjax installed with `pip install .` (not -e) works from any directory.

The checkout's files are copied (what git would commit: tracked and untracked
but not ignored files, so uncommitted changes are tested too and build
outputs are not), installed non-editable into a fresh venv whose dependencies
come from this environment (--system-site-packages, --no-deps), and every
binary then runs from an empty directory: the demo for a few steps, evaluate,
and HF RoBERTa and ALBERT imports with their default (shipped) configs.

Building the wheel needs setuptools and wheel from a package index (pip's
build isolation, as a user's `pip install .` does); the test is skipped only
when no index can provide them.
"""

import json
import os
import re
import shutil
import site
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The demo, kept to seconds: 3 steps of 8 x 32 tokens, one eval batch.
SMALL = ["--config.num_train_steps=3", "--config.batch_size=8",
         "--config.seq_len=32", "--config.max_predictions_per_seq=5",
         "--config.warmup_steps=1", "--config.log_every_steps=1",
         "--config.checkpoint_every_steps=3", "--config.eval_max_batches=1",
         "--config.shuffle_window=16"]


def _copy_checkout(dest):
  """Copies the files git would commit (present on disk) to ``dest``."""
  try:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
  except (OSError, subprocess.CalledProcessError):  # not a git checkout
    def ignore(directory, names):
      top = os.path.samefile(directory, ROOT)
      return [n for n in names if n in ("__pycache__", ".pytest_cache")
              or n.endswith(".egg-info") or (top and (
                  n in (".git", "build", "dist", ".venv") or n.startswith("workdir")))]
    shutil.copytree(ROOT, dest, ignore=ignore)
    return
  for rel in filter(None, listed):
    src = os.path.join(ROOT, rel)
    if os.path.isfile(src):  # tracked files deleted in the work tree are gone
      os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
      shutil.copy2(src, os.path.join(dest, rel))


def _run(cmd, cwd, env, timeout=300):
  proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                        timeout=timeout)
  assert proc.returncode == 0, (
      f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n"
      f"{proc.stderr[-3000:]}")
  return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
  """(venv python, env, an empty directory to run in, venv site-packages)."""
  tmp = tmp_path_factory.mktemp("install")
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  probe = subprocess.run(
      [sys.executable, "-m", "pip", "download", "--no-deps", "--timeout=10",
       "--dest", str(tmp / "probe"), "setuptools>=68", "wheel"],
      env=env, capture_output=True, text=True, timeout=180)
  if probe.returncode:
    pytest.skip("no package index reachable for the build requirements "
                f"(setuptools, wheel): {probe.stderr.strip()[-300:]}")
  source = tmp / "clone"
  _copy_checkout(str(source))
  venv = tmp / "venv"
  _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
       str(tmp), env)
  python = str(venv / "bin" / "python")
  _run([python, "-m", "pip", "install", "--no-deps", "--quiet", str(source)],
       str(tmp), env)
  purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                 str(tmp), env).stdout.strip()
  if sys.prefix != sys.base_prefix:
    # The tests run in a venv themselves: --system-site-packages reaches only
    # the base interpreter's packages, so add this environment's after the
    # new venv's own (its .pth files too, as Python's site module does).
    with open(os.path.join(purelib, "_test_parent_env.pth"), "w") as f:
      f.writelines(f"import site; site.addsitedir({d!r})\n"
                   for d in site.getsitepackages())
  elsewhere = tmp / "elsewhere"
  elsewhere.mkdir()
  return python, env, str(elsewhere), purelib


def test_wheel_ships_the_configs_and_shadows_any_checkout(installed):
  python, env, elsewhere, purelib = installed
  proc = _run([python, "-c", "import bertjax; print(bertjax.__file__)"], elsewhere, env)
  package = os.path.dirname(proc.stdout.strip())
  # The venv's copy, not the global editable install pointing at a checkout.
  assert package == os.path.join(purelib, "bertjax")
  shipped = sorted(os.listdir(os.path.join(package, "configs")))
  assert {"albert.py", "bert.py", "ernie.py", "hf.py", "roberta.py",
          "spanbert.py"} <= set(shipped)
  assert "__init__.py" not in shipped  # data loaded by path, not a package
  assert not os.path.exists(os.path.join(purelib, "configs"))


def test_demo_trains_and_evaluates_from_another_directory(installed):
  python, env, elsewhere, _ = installed
  workdir = os.path.join(elsewhere, "demo")
  _run([python, "-m", "bertjax.main", "--config=configs/bert.py:tiny",
        f"--workdir={workdir}", *SMALL], elsewhere, env)
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "3"))
  proc = _run([python, "-m", "bertjax.evaluate", "--config=configs/bert.py:tiny",
               f"--workdir={workdir}", *SMALL], elsewhere, env)
  record = json.loads(proc.stdout.strip().splitlines()[-1])
  assert record["step"] == 3
  assert 0.0 <= record["mlm_accuracy"] <= 1.0


def test_hf_roberta_and_albert_import_with_shipped_configs(installed, tmp_path):
  pytest.importorskip("torch", reason="the HF fixtures need torch (the hf extra)")
  pytest.importorskip("transformers", reason="the HF fixtures need transformers")
  import test_convert_variants as variants
  transformers = variants.transformers
  python, env, elsewhere, _ = installed
  workdirs = {}
  for kind in ("roberta", "albert"):
    hf_dir = str(tmp_path / f"hf_{kind}")
    os.makedirs(hf_dir)
    if kind == "roberta":
      config = transformers.RobertaConfig(
          vocab_size=variants._roberta_tokenizer(hf_dir), type_vocab_size=1,
          **variants.SIZES, **variants.NUMERICS[kind])
      model = transformers.RobertaForMaskedLM(config)
    else:
      config = transformers.AlbertConfig(
          vocab_size=variants._albert_tokenizer(hf_dir), embedding_size=16,
          **variants.SIZES, **variants.NUMERICS[kind])
      model = transformers.AlbertForPreTraining(config)
    model.save_pretrained(hf_dir)
    workdirs[kind] = os.path.join(elsewhere, f"imported_{kind}")
    proc = _run([python, "-m", "bertjax.convert", f"--from_hf={hf_dir}",
                 f"--workdir={workdirs[kind]}"], elsewhere, env)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["continue_with"] == f"--config=configs/hf.py:{workdirs[kind]}"
  # The installed package reads both workdirs; the training fields came from
  # the shipped configs/roberta.py and configs/albert.py.
  script = ("import json, sys, bertjax\n"
            "for wd in sys.argv[1:]:\n"
            "  m = bertjax.load(wd)\n"
            "  h = m.encode(['The cat sat.'])['hidden']\n"
            "  print(json.dumps([m.config['objective'], m.config['model'], list(h.shape)]))\n")
  proc = _run([python, "-c", script, workdirs["roberta"], workdirs["albert"]],
              elsewhere, env)
  rows = [json.loads(line) for line in proc.stdout.strip().splitlines()[-2:]]
  assert [r[:2] for r in rows] == [["mlm_only", "bert"], ["albert", "albert"]]
  assert all(r[2][0] == 1 and r[2][2] == 32 for r in rows)


def test_config_specs_resolve_to_the_shipped_configs_unless_a_local_file_exists(
    tmp_path, monkeypatch):
  from bertjax import config_files
  monkeypatch.chdir(tmp_path)  # no configs/ here
  shipped = config_files.configs_dir() / "bert.py"
  for spec in ("configs/bert.py:tiny", "bert.py:tiny", "bert:tiny"):
    assert config_files.resolve(spec) == f"{shipped}:tiny"
  assert config_files.load("bert:mini").model_size == "mini"
  names = sorted(p.stem for p in config_files.configs_dir().glob("*.py"))
  assert {"bert", "roberta", "albert"} <= set(names)
  with pytest.raises(ValueError, match="one of " + re.escape(", ".join(names))):
    config_files.resolve("configs/nope.py:tiny")
  # A local file always wins; a copied config builds on the bert.py beside it,
  # else on the shipped one.
  (tmp_path / "configs").mkdir()
  shutil.copy(config_files.configs_dir() / "roberta.py", tmp_path / "configs" / "roberta.py")
  assert config_files.load("configs/roberta.py:tiny").seed == 0  # shipped bert.py
  (tmp_path / "configs" / "bert.py").write_text(
      "from bertjax import config_files\n"
      "def get_config(arg):\n"
      "  c = config_files.shipped('bert').get_config(arg)\n"
      "  c.seed = 7\n"
      "  return c\n")
  assert config_files.resolve("configs/bert.py:tiny") == "configs/bert.py:tiny"
  assert config_files.load("configs/bert.py:tiny").seed == 7
  assert config_files.load("configs/roberta.py:tiny").seed == 7
  assert config_files.load("roberta:tiny").seed == 0  # the shipped roberta.py
