"""The train CLI's arguments that the multi-process tests share (tests/t5x_like/test_multihost_*.py)."""

# A constant learning rate after one warmup step: a run's first steps do not depend on TRAIN_STEPS,
# so one long reference run serves every shorter one. The quickstart's model 64 wide: a step's time is its
# optimizer update, so the steps of a narrow model cost a fraction.
ARGS = ["--gin_file=quickstart.gin", "--gin.WARMUP_STEPS=1", "--gin.BATCH_SIZE=8", "--gin.SEQ_LEN=32",
        "--gin.EVAL_EVERY=0", "--gin.CHECKPOINT_EVERY=1000", "--gin.train.log_every=1",
        "--gin.optim.make_optimizer.decay='constant'",
        "--gin.model_config.overrides={'num_layers': 2, 'embed_dim': 64, 'mlp_dim': 256, 'dropout_rate': 0.0, "
        "'attention_dropout_rate': 0.0}"]
