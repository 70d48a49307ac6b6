#!/bin/bash

# A tiny GPT (2 layers, 64 wide, learned positions, LayerNorm, GELU) in float16 with Megatron's dynamic loss scale
# (its defaults: 2**32 at the start, hysteresis 2, a window of 1000), with GPT-2's BPE and a corpus tokenized by
# Megatron's tools/preprocess_data.py, for a smoke test on 2 GPUs.

CHECKPOINT_PATH=checkpoints/gpt_tiny_fp16
DATA_PATH=data/tiny_text_document

GPT_ARGS="
    --num-layers 2 --hidden-size 64 --num-attention-heads 4
    --seq-length 32 --max-position-embeddings 32
    --attention-dropout 0.0 --hidden-dropout 0.0
    --micro-batch-size 4 --global-batch-size 8
    --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 2
    --train-iters 40 --weight-decay 0.01 --clip-grad 1.0
    --fp16
"

DATA_ARGS="
    --data-path $DATA_PATH --split 98,2,0
    --tokenizer-type GPT2BPETokenizer --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt
"

OUTPUT_ARGS="
    --log-interval 1 --save-interval 40 --eval-interval 1000 --eval-iters 1
    --save $CHECKPOINT_PATH --load $CHECKPOINT_PATH
"

torchrun --nproc_per_node 2 pretrain_gpt.py $GPT_ARGS $DATA_ARGS $OUTPUT_ARGS
