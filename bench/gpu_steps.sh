#!/usr/bin/env bash
# BERT-base / BERT-large bf16 train steps on one GPU: bertjax (cuDNN attention
# and the XLA reference), HF Flax and PyTorch (SDPA, torch.compile, fused
# AdamW) in one process per size, interleaved. One JSON line per run on
# stdout (bench/step_bench.py's and bench/ab_step.py's records).
#
#   bash bench/gpu_steps.sh base 32 512     # size, batch, seq_len
#   bash bench/gpu_steps.sh large 16 512
#   PARTS="ab" bash bench/gpu_steps.sh base 32 512
#
# PARTS (default "compare xla") picks the runs, in the order given:
#   compare  bertjax (cuDNN attention) beside HF Flax and compiled PyTorch
#   xla      bertjax alone with the XLA attention
#   alone    bertjax alone (cuDNN attention)
# IN_FLIGHT (default 1) for compare, xla and alone: steps queued per timed
#            sample (bench/step_bench.py --in_flight; 1 waits for each step)
#   ab       bench/ab_step.py, interleaved: VARIANTS (default this tree
#            against the embedding lookups it replaced: bf16 word-table
#            scatter; scatter-add gradients of the position and segment
#            tables); e.g. VARIANTS=baseline,pointwise_remat,dpa_lengths;
#            COMPILE_BUDGET=300 stops compiling further variants after 300 s
#   profile  bench/profile_step.py: bertjax's step traced, its costliest GPU
#            kernels listed (where the time beyond the matmuls goes)
# Each run compiles its steps first: on an H200 (2026-11-26) bertjax's base
# step took 102-124 s (large 118-127 s), HF Flax's 46 s (large 68 s),
# torch.compile 23 s (large 40 s). STEPS (default 20) timed steps per
# system; ROUNDS (default 5) for ab. JAX's compilation cache (and with it
# XLA's per-fusion autotuning results) is kept in JAX_COMPILATION_CACHE_DIR
# (default /tmp/bertjax-jax-cache), so later runs and A/B variants that
# share fusions skip their autotuning.
set -euo pipefail
size=${1:-base}; batch=${2:-32}; seq=${3:-512}
preds=$(( (seq * 15 + 99) / 100 ))   # 15% of the row, rounded up
here=$(cd "$(dirname "$0")" && pwd)
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/bertjax-jax-cache}
common=(--config="$here/../configs/bert.py:$size" --config.dtype=bfloat16
        --config.batch_size="$batch" --config.seq_len="$seq"
        --config.max_position_embeddings="$(( seq > 512 ? seq : 512 ))"
        --config.max_predictions_per_seq="$preds"
        --config.dropout_rate=0 --config.attention_dropout_rate=0
        --config.mesh_shape=1,1,1)
for part in ${PARTS:-compare xla}; do
  case "$part" in
    compare) python3 "$here/step_bench.py" "${common[@]}" --steps="${STEPS:-20}" \
               --warmup=3 --config.attention_impl=dot_product --compare --torch_compile \
               --in_flight="${IN_FLIGHT:-1}" ;;
    xla) python3 "$here/step_bench.py" "${common[@]}" --steps="${STEPS:-20}" \
           --warmup=3 --config.attention_impl=xla --in_flight="${IN_FLIGHT:-1}" ;;
    alone) python3 "$here/step_bench.py" "${common[@]}" --steps="${STEPS:-20}" \
             --warmup=3 --config.attention_impl=dot_product --in_flight="${IN_FLIGHT:-1}" ;;
    ab) python3 "$here/ab_step.py" "${common[@]}" --config.attention_impl=dot_product \
          --variants="${VARIANTS:-baseline,embed_gather+word_bf16,word_bf16}" \
          --rounds="${ROUNDS:-5}" --compile_budget_s="${COMPILE_BUDGET:-0}" ;;
    profile) python3 "$here/profile_step.py" "${common[@]}" --config.attention_impl=dot_product \
               --systems=bertjax --raw_top=40 ;;
    *) echo "Unknown part '$part' in PARTS; pick from: compare xla alone ab profile." >&2; exit 2 ;;
  esac
done
