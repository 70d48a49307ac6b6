#!/bin/bash

# Qwen2 0.5B pre-training on 4 GPUs with Megatron-Core, the model arguments as Megatron-LM's
# examples/post_training/modelopt/conf/Qwen/ gives them (query/key/value biases, a tied output layer).

TOKENIZER_MODEL=Qwen2-0.5B   # the Hugging Face folder
DATA_PATH=data/qwen2_text_document

MODEL_ARGS=" \
    --bf16 \
    --no-masked-softmax-fusion \
    --disable-bias-linear \
    --add-qkv-bias \
    --position-embedding-type rope \
    --no-rope-fusion \
    --normalization RMSNorm \
    --norm-epsilon 1e-6 \
    --swiglu \
    --num-layers 24 \
    --hidden-size 896 \
    --ffn-hidden-size 4864 \
    --num-attention-heads 14 \
    --group-query-attention \
    --num-query-groups 2 \
    --kv-channels 64 \
    --seq-length 4096 \
    --max-position-embeddings 131072 \
    --tokenizer-type HuggingFaceTokenizer \
    --tokenizer-model ${TOKENIZER_MODEL} \
    --padded-vocab-size 151936 \
    --make-vocab-size-divisible-by 1 \
    --use-mcore-models \
    --rotary-percent 1.0 \
    --rotary-base 1000000 \
    --no-bias-swiglu-fusion \
"

TRAINING_ARGS=" \
    --micro-batch-size 4 \
    --global-batch-size 256 \
    --train-samples 25600000 \
    --lr-decay-samples 25600000 \
    --lr-warmup-samples 256000 \
    --lr 1e-3 \
    --min-lr 1e-5 \
    --lr-decay-style cosine \
    --weight-decay 0.1 \
    --adam-beta2 0.95 \
    --clip-grad 1.0 \
    --data-path ${DATA_PATH} \
    --split 98,2,0 \
    --save checkpoints/qwen2_0_5b \
    --save-interval 2000 \
    --eval-interval 2000 \
    --eval-iters 20 \
    --log-interval 10 \
"

torchrun --nproc_per_node 4 pretrain_gpt.py ${MODEL_ARGS} ${TRAINING_ARGS}
