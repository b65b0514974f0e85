#!/usr/bin/env bash
# BERT-base / BERT-large bf16 train steps on one GPU: bertjax (cuDNN attention
# and the XLA reference), HF Flax and PyTorch (SDPA, torch.compile, fused
# AdamW) in one process per size, interleaved. One JSON line per run on
# stdout (bench/step_bench.py's record).
#
#   bash bench/gpu_steps.sh base 32 512     # size, batch, seq_len
#   bash bench/gpu_steps.sh large 16 512
set -euo pipefail
size=${1:-base}; batch=${2:-32}; seq=${3:-512}
preds=$(( (seq * 15 + 99) / 100 ))   # 15% of the row, rounded up
here=$(cd "$(dirname "$0")" && pwd)
common=(--config="$here/../configs/bert.py:$size" --config.dtype=bfloat16
        --config.batch_size="$batch" --config.seq_len="$seq"
        --config.max_position_embeddings="$(( seq > 512 ? seq : 512 ))"
        --config.max_predictions_per_seq="$preds"
        --config.dropout_rate=0 --config.attention_dropout_rate=0
        --config.mesh_shape=1,1,1 --steps="${STEPS:-20}" --warmup=3)
python3 "$here/step_bench.py" "${common[@]}" --config.attention_impl=dot_product \
    --compare --torch_compile
python3 "$here/step_bench.py" "${common[@]}" --config.attention_impl=xla
