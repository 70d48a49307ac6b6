#!/bin/bash

# Llama 3 8B pre-training on one node of 8 H100s with Megatron-Core, written after Megatron-LM's
# examples/llama/train_llama3_8b_h100_fp8.sh and the Llama 3 arguments of its docs/llama_mistral.md.
# Usage: bash train_llama3_8b.sh [CHECKPOINT_PATH] [TENSORBOARD_LOGS_PATH] [TOKENIZER_MODEL] [DATA_PATH]

export CUDA_DEVICE_MAX_CONNECTIONS=1

CHECKPOINT_PATH=${1:-"checkpoints/llama3_8b"}
TENSORBOARD_LOGS_PATH=${2:-"tensorboard_logs/llama3_8b"}
TOKENIZER_MODEL=${3:-"Meta-Llama-3-8B"}  # the Hugging Face folder: tokenizer.json, tokenizer_config.json
DATA_PATH=${4:-"data/fineweb_llama3_text_document"}

GPUS_PER_NODE=8
NUM_NODES=1
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}
NODE_RANK=${NODE_RANK:-0}

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --node_rank $NODE_RANK
    --master_addr $MASTER_ADDR
    --master_port $MASTER_PORT
)

MODEL_ARGS=(
    --use-mcore-models
    --transformer-impl transformer_engine
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --kv-channels 128
    --seq-length 8192
    --max-position-embeddings 8192
    --position-embedding-type rope
    --rotary-base 500000
    --rotary-percent 1.0
    --normalization RMSNorm
    --norm-epsilon 1e-5
    --swiglu
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --init-method-std 0.02
    --attention-backend fused
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 512
    --train-iters 100000
    --lr 3e-4
    --min-lr 3e-5
    --lr-decay-style cosine
    --lr-decay-iters 100000
    --lr-warmup-iters 2000
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.95
    --adam-eps 1e-5
    --clip-grad 1.0
    --bf16
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 2
    --pipeline-model-parallel-size 1
)

DATA_ARGS=(
    --data-path $DATA_PATH
    --tokenizer-type HuggingFaceTokenizer
    --tokenizer-model $TOKENIZER_MODEL
    --split 99,1,0
    --num-workers 2
)

EVAL_AND_LOGGING_ARGS=(
    --log-interval 10
    --save-interval 1000
    --eval-interval 1000
    --eval-iters 10
    --save $CHECKPOINT_PATH
    --load $CHECKPOINT_PATH
    --tensorboard-dir $TENSORBOARD_LOGS_PATH
)

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${MODEL_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    ${DATA_ARGS[@]} \
    ${EVAL_AND_LOGGING_ARGS[@]}
