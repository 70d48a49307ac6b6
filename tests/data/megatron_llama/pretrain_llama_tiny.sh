#!/bin/bash

# A tiny Llama (2 layers, 64 wide, 4 query / 2 key-value heads) for a smoke test on 2 GPUs, with Llama 2's
# sentencepiece tokenizer and a corpus tokenized by Megatron's tools/preprocess_data.py.

CHECKPOINT_PATH=checkpoints/llama_tiny
DATA_PATH=data/tiny_text_document
TOKENIZER_MODEL=tokenizer.model

GPT_ARGS="
    --num-layers 2 --hidden-size 64 --ffn-hidden-size 128 --num-attention-heads 4
    --group-query-attention --num-query-groups 2
    --seq-length 32 --max-position-embeddings 32
    --position-embedding-type rope --rotary-base 500000
    --normalization RMSNorm --swiglu
    --untie-embeddings-and-output-weights --disable-bias-linear
    --attention-dropout 0.0 --hidden-dropout 0.0
    --micro-batch-size 2 --global-batch-size 4
    --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 1
    --train-iters 2 --weight-decay 0.1 --adam-beta2 0.95 --clip-grad 1.0
"

DATA_ARGS="
    --data-path $DATA_PATH --split 90,10,0
    --tokenizer-type Llama2Tokenizer --tokenizer-model $TOKENIZER_MODEL
"

OUTPUT_ARGS="
    --log-interval 1 --save-interval 2 --eval-interval 1000 --eval-iters 1
    --save $CHECKPOINT_PATH --load $CHECKPOINT_PATH
"

torchrun --nproc_per_node 2 pretrain_gpt.py $GPT_ARGS $DATA_ARGS $OUTPUT_ARGS
