"""lm-eval called as t5x_like.eval.harness.tasks calls it, from a user's folder outside any git repository."""
import pytest


@pytest.mark.system  # git runs as a process
def test_lm_evals_git_describe_says_nothing_outside_a_repository(tmp_path, monkeypatch, capfd):
    """simple_evaluate records `git describe` of the working directory (evaluator.get_git_commit_hash); git's
    `fatal: not a git repository` reaches the user's stderr unless tasks.quiet_git_describe is around the call."""
    evaluator = pytest.importorskip("lm_eval.evaluator")
    from t5x_like.eval.harness import tasks

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # git looks in tmp_path only
    original = evaluator.get_git_commit_hash
    assert original() is None
    assert "fatal: not a git repository" in capfd.readouterr().err  # what users saw
    with tasks.quiet_git_describe(evaluator):
        assert evaluator.get_git_commit_hash() is None
    assert capfd.readouterr().err == ""
    assert evaluator.get_git_commit_hash is original


# ---------------------------------------------------------------- issue 46: mistakes in a local task's files

GOOD_YAML = """task: my_qa
dataset_path: json
dataset_kwargs:
  data_files:
    test: my_tasks/qa.jsonl
output_type: multiple_choice
test_split: test
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
metric_list:
  - metric: acc
metadata:
  version: 1.0
"""
DOCS = ['{"question": "What do bees make?", "choices": ["honey", "milk", "silk"], "answer": 0}',
        '{"question": "Sky color?", "choices": ["green", "blue", "red"], "answer": 1}']
TASK_FILE = "my_tasks/my_qa.yaml"
MISTAKES = [  # the YAML, the data lines, what the one line says (before issue 46: a traceback, or 'not a task')
    (GOOD_YAML.replace("output_type: multiple_choice", "output_type: [multiple_choice"), DOCS,
     f"lm-eval skips the folder's files it cannot read: {TASK_FILE}:7: not valid YAML (expected ',' or ']'"),
    (GOOD_YAML.replace("task: my_qa\n", ""), DOCS, f"{TASK_FILE}: no `task:` name"),
    (GOOD_YAML.replace("multiple_choice", "multiple_choise"), DOCS,
     f"task 'my_qa' ({TASK_FILE}): lm-eval could not use it: ValueError: Got invalid output_type 'multiple_choise'"),
    (GOOD_YAML.replace("{{question}}", "{{questio}}"), DOCS, "UndefinedError: 'questio' is undefined"),
    (GOOD_YAML.replace('doc_to_choice: "{{choices}}"\n', ""), DOCS, "TypeError: (no message) in lm-eval's doc_to_choice"),
    (GOOD_YAML.replace("test_split: test", "test_split: validation"), DOCS, "KeyError: 'validation'"),
    (GOOD_YAML.replace("metric: acc", "metric: accuracy"), DOCS, "check the task's YAML"),
    (GOOD_YAML, [DOCS[0].replace('"answer": 0', '"answer": 5'), DOCS[1]], "IndexError: list index out of range"),
    (GOOD_YAML, [DOCS[0], '{"question": "x", "choices": ['], "DatasetGenerationError"),
    (GOOD_YAML, [], "StopIteration: (the data has no documents)"),
]


def flat_lm():
    """An lm-eval LM that gives every request the same score: the mistakes below are lm-eval's to find."""
    from lm_eval.api.model import LM

    class Flat(LM):
        def loglikelihood(self, requests):
            return [(0.0, False) for _ in requests]

        def loglikelihood_rolling(self, requests):
            return [0.0 for _ in requests]

        def generate_until(self, requests):
            return ["" for _ in requests]
    return Flat()


def write_task(folder, yaml_text: str, docs: list[str]) -> None:
    (folder / "my_tasks").mkdir()
    (folder / TASK_FILE).write_text(yaml_text)
    (folder / "my_tasks" / "qa.jsonl").write_text("".join(line + "\n" for line in docs))


@pytest.mark.parametrize("yaml_text, docs, says", MISTAKES, ids=[says[:40] for _, _, says in MISTAKES])
def test_a_mistake_in_a_task_file_is_one_line_naming_the_file(tmp_path, monkeypatch, yaml_text, docs, says):
    pytest.importorskip("lm_eval")
    from t5x_like.errors import UserError
    from t5x_like.eval.harness import tasks

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    write_task(tmp_path, yaml_text, docs)
    with pytest.raises(UserError) as error:
        manager, built = tasks.load_tasks(["my_qa"], "my_tasks")
        tasks.evaluate(flat_lm(), manager, built, bootstrap_iters=0)
    assert "\n" not in str(error.value) and says in str(error.value), str(error.value)
    assert TASK_FILE in str(error.value), str(error.value)


@pytest.mark.system  # simple_evaluate runs git describe
def test_the_tasks_own_file_runs_and_an_error_in_our_model_is_not_called_the_tasks(tmp_path, monkeypatch):
    """The good task file evaluates; an exception raised in t5x_like's code under lm-eval (the model it calls)
    is ours, and goes on as it is."""
    pytest.importorskip("lm_eval")
    from t5x_like.eval.harness import tasks

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    write_task(tmp_path, GOOD_YAML, DOCS)
    manager, built = tasks.load_tasks(["my_qa"], "my_tasks")
    scored = tasks.evaluate(flat_lm(), manager, built, bootstrap_iters=0)
    assert scored["results"]["my_qa"]["acc,none"] == 0.5  # equal scores: the first choice, right for one of two
    lm = flat_lm()
    lm.loglikelihood = lambda requests: tasks.summary_table(None)  # fails inside t5x_like
    manager, built = tasks.load_tasks(["my_qa"], "my_tasks")
    with pytest.raises((TypeError, AttributeError)):
        tasks.evaluate(lm, manager, built, bootstrap_iters=0)
