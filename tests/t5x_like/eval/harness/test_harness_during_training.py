"""lm-eval during training (the evaluator train() calls): tasks loaded once, each call on the parameters it is
given (new parameters: new numbers; the same again: the same numbers), flat metrics for metrics.jsonl."""
import jax
import pytest

from partitioning import Partitioner, make_mesh
from t5x_like.errors import UserError


@pytest.fixture(scope="module")
def evaluator_and_params(causal_checkpoint):
    from t5x_like.eval.harness.during_training import LmEvalDuringTraining, TrainingEvaluator
    from t5x_like.inference import loading

    checkpoint = str(causal_checkpoint / "ours")
    config, _ = loading.read_config(checkpoint)
    partitioner = Partitioner(make_mesh(data=2, tensor=2, devices=jax.devices()[:4]), "fsdp_tensor")
    params = loading.restore_sharded(checkpoint, config, partitioner)
    settings = LmEvalDuringTraining(tasks="t5xl_choices, t5xl_answers", every=10, include_path="lm_eval_tasks",
                                    limit=4, batch_size=4)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(causal_checkpoint)
        patch.setenv("HF_DATASETS_OFFLINE", "1")
        evaluator = TrainingEvaluator(settings, config, partitioner, loading.checkpoint_tokenizer(checkpoint, config))
    return evaluator, params


@pytest.mark.system
def test_each_call_evaluates_the_parameters_it_is_given(evaluator_and_params):
    """Called from another working directory than the tasks' data_files are relative to: loaded once."""
    from lm_eval.api.instance import Instance

    evaluator, params = evaluator_and_params
    assert evaluator.due(20) and not evaluator.due(25)
    request = [Instance("loglikelihood", {}, ("Question: What do bees make?\nAnswer:", " honey"), 0)]
    first = evaluator(params, 10)
    assert set(first) == {"lm_eval/t5xl_choices/acc", "lm_eval/t5xl_choices/acc_norm",
                          "lm_eval/t5xl_answers/exact_match"}
    lm = evaluator._lm
    before = lm.loglikelihood(request)
    evaluator(jax.tree.map(lambda p: p * 1.5, params), 20)
    assert evaluator._lm is lm and lm.loglikelihood(request) != before
    assert all(generator.params is lm.params for generator in lm._generators.values())
    assert evaluator(params, 30) == first and lm.loglikelihood(request) == before


@pytest.mark.parametrize("settings, message", [
    (dict(tasks="", every=5), "but no tasks"),
    (dict(tasks="x", every=-1), "lm_eval_during_training.every"),
    (dict(tasks="x", every=5, limit=0), "lm_eval_during_training.limit"),
])
def test_bad_settings_are_one_line_in_gin_names(settings, message):
    from t5x_like.eval.harness.during_training import LmEvalDuringTraining

    with pytest.raises(UserError, match=message):
        LmEvalDuringTraining(**settings).check()


@pytest.mark.system
def test_train_runs_the_tasks_every_n_steps_and_logs_them(tmp_path):
    """`python -m t5x_like.train` with lm_eval_during_training bound on the command line, from the folder of the
    user's tasks: the tasks' metrics in metrics.jsonl at every `every` steps and at the last step."""
    import shutil
    import subprocess
    import sys

    from t5x_like import metrics
    from tests.support.cli import REPO
    from tests.support.environment import cpu_env
    from tests.support.harness import TASKS

    shutil.copytree(TASKS, tmp_path / "lm_eval_tasks")
    done = subprocess.run(
        [sys.executable, "-m", "t5x_like.train", "--gin_file=quickstart.gin", "--gin.MODEL_DIR='run'",
         "--gin.BATCH_SIZE=2", "--gin.SEQ_LEN=64", "--gin.TRAIN_STEPS=3", "--gin.WARMUP_STEPS=1",
         "--gin.EVAL_EVERY=0", "--gin.model_config.overrides={'num_layers': 1, 'embed_dim': 32, 'num_heads': 2, "
         "'mlp_dim': 64}", "--gin.lm_eval_during_training.tasks='t5xl_choices'",
         "--gin.lm_eval_during_training.every=2", "--gin.lm_eval_during_training.include_path='lm_eval_tasks'",
         "--gin.lm_eval_during_training.limit=3"],
        cwd=tmp_path, env=cpu_env(1, PYTHONPATH=REPO, HF_DATASETS_OFFLINE="1"), capture_output=True, text=True,
        timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [row for row in metrics.read_rows(str(tmp_path / "run")) if "lm_eval/t5xl_choices/acc" in row]
    assert [row["step"] for row in rows] == [2, 3]
    assert all(0 <= row["lm_eval/t5xl_choices/acc"] <= 1 for row in rows)
    assert "step 2: lm-eval t5xl_choices/acc" in done.stderr
    assert "fatal:" not in done.stderr  # lm-eval's `git describe` outside a repository (harness.tasks keeps it quiet)
