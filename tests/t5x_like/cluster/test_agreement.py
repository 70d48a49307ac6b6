"""t5x_like.cluster.agreement and distributed's start-up messages, in-process (the real processes are in
test_multihost_faults.py and test_processes.py)."""
import gin
import pytest

from t5x_like.cluster import agreement, peers, processes
from t5x_like.config import bindings


def test_differences_name_the_setting_both_values_and_the_process():
    mine = {"TRAIN_STEPS": "30", "BATCH_SIZE": "8", "file corpus.bin": "1,000 bytes, sha256 aa"}
    reference = {"TRAIN_STEPS": "20", "BATCH_SIZE": "8", "file corpus.bin": "2,000 bytes, sha256 bb"}
    assert agreement.describe_differences(mine, reference, 3) == (
        "TRAIN_STEPS is 30 on process 3 but 20 on process 0; "
        "file corpus.bin is 1,000 bytes, sha256 aa on process 3 but 2,000 bytes, sha256 bb on process 0")
    assert agreement.describe_differences(mine, dict(mine), 1) == ""


def test_many_differences_are_counted_and_a_missing_setting_is_absent():
    mine = {f"S{i}": "1" for i in range(10)}
    text = agreement.describe_differences(mine, {}, 1)
    assert text.count(" on process 1 but absent on process 0") == 3
    assert text.endswith("and 7 more (S3, S4, S5, S6, S7, ...)")


@pytest.fixture
def gin_bindings():
    gin.clear_config()
    gin.parse_config("TRAIN_STEPS = 20\nDATA_PATH = 'data/corpus'")
    yield
    gin.clear_config()


def test_run_facts_hold_the_gin_macros_the_data_files_and_the_checkpoint(tmp_path, monkeypatch, gin_bindings):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "corpus.bin").write_bytes(b"x" * 3_000_000)  # longer than the two MiB read
    (tmp_path / "data" / "corpus.idx").write_bytes(b"index")
    (tmp_path / "tok.json").write_text("{}")
    facts = agreement.run_facts(7, ["data/corpus", "tok.json", None], bindings.every_binding())
    assert facts["TRAIN_STEPS"] == "20" and facts["DATA_PATH"] == "'data/corpus'"
    assert facts["the checkpoint to resume"] == "step 7" and "jax" in facts["versions"]
    assert facts["file data/corpus.bin"].startswith("3,000,000 bytes, sha256 ")
    assert facts["file data/corpus.idx"].startswith("5 bytes, sha256 ") and "file tok.json" in facts
    before = facts["file data/corpus.bin"]
    with open(tmp_path / "data" / "corpus.bin", "r+b") as f:  # the same size, another last MiB
        f.seek(2_900_000)
        f.write(b"y")
    assert agreement.run_facts(7, ["data/corpus"], {})["file data/corpus.bin"] != before


def test_one_process_agrees_with_itself():
    assert not peers.active()
    agreement.agree({"TRAIN_STEPS": "20"})  # returns at once


@pytest.mark.parametrize("count, me, says", [
    (2, 0, "process 0: process 1 did not connect within 9 s"),
    (4, 0, "process 0: not all of processes 1-3 connected within 9 s"),
    (2, 1, "process 1: process 0 (the coordinator at 10.0.0.1:8476) did not answer within 9 s"),
    (4, 2, "process 2: process 0 (the coordinator at 10.0.0.1:8476) or another of the 4 processes did not connect"),
])
def test_a_missing_process_is_named_as_far_as_this_process_can_tell(count, me, says):
    message = processes.not_connected_message(processes.ClusterSpec("flags", "10.0.0.1:8476", count, me), 9)
    assert message.startswith(says) and message.endswith("raise --initialization_timeout_seconds (now 9) if some "
                                                         "start later.")


@pytest.mark.parametrize("flag", ["initialization_timeout", "heartbeat_timeout_seconds"])
def test_timeouts_must_be_positive(flag):
    with pytest.raises(ValueError, match=r"timeout_seconds=0: must be >= 1"):
        processes.initialize(**{flag: 0})
