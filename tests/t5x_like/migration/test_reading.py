"""Reading upstream files as their tools do: a launch script's variables, conditions and `eval`, the launchers'
GPU counts, flags files, NeoX's merge of several YAML files, DeepSpeed's JSON, and the refusals (one line each,
naming the file and the fix)."""
import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from t5x_like.migration import shell, translate, upstream
from tests.support.migration import unset_gpu_count_script

UPSTREAM = Path(__file__).resolve().parents[2] / "data" / "upstream"

SCRIPT = textwrap.dedent('''\
    #! /bin/bash
    GPUS_PER_NODE=8   # per node
    NNODES=2
    WORLD_SIZE=$(($GPUS_PER_NODE*$NNODES))
    export DATA="${HOME}/corpus/my text_document"
    LR=6e-4
    NAME='it''s $LR'
    USE_FP16=true
    opts="--num-layers 12 \\
          --lr $LR --min-lr ${LR}"
    if [ "$USE_FP16" = "true" ]; then
        opts="$opts --fp16"
    elif [ "$USE_FP16" = "bf16" ]; then
        opts="$opts --bf16"
    else
        opts="$opts --fp32"
    fi
    if ["${UNSET}" = "true"]; then opts="$opts --never"; fi
    if [ -n "$UNSET" ]; then
        opts="$opts --never-either"
    fi
    echo python pretrain_gpt.py --ignored   # echo runs nothing
    cmd="torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_gpt.py $opts --data-path \\"$DATA\\""
    eval $cmd 2>&1 | tee log.txt
    ''')


def test_a_script_is_read_as_bash_runs_it():
    launch = shell.find_launch("run.sh", SCRIPT, {"HOME": "/home/me"})
    assert launch.program == "pretrain_gpt.py"
    assert launch.launcher[:1] == ["torchrun"] and shell.launcher_gpus(launch.launcher) == 16
    assert launch.arguments == ["--num-layers", "12", "--lr", "6e-4", "--min-lr", "6e-4", "--fp16", "--data-path",
                                "/home/me/corpus/my text_document"]
    notes = "\n".join(launch.notes)
    assert "run.sh:18: `[\"${UNSET}\" = \"true\"]` is not a valid test" in notes
    assert "$UNSET is not set by the script or the environment: empty, as in bash" in notes


@pytest.mark.parametrize("launcher, gpus", [
    ("python pretrain_gpt2.py", 1), ("python3 -u pretrain_gpt2.py", 1),
    ("deepspeed --num_gpus 8 --num_nodes 2 pretrain_gpt2.py", 16),
    ("deepspeed --master_port 8888 -i node1:4,5,6,7 --hostfile hostfile pretrain_gpt2.py", 4),
    ("python -m torch.distributed.launch --nproc_per_node=4 pretrain_gpt2.py", 4),
    ("srun python pretrain_gpt2.py", None)])
def test_launchers_say_how_many_gpus(launcher, gpus):
    launch = shell.find_launch("run.sh", launcher + " --lr 1\n", {})
    assert shell.launcher_gpus(launch.launcher) == gpus


def test_a_flags_file_and_a_deepspeed_config_read_as_one(tmp_path):
    flags = tmp_path / "args.txt"
    flags.write_text("# my run\n--num-layers 2 --hidden-size 64\n--data-path 0.3 a_text_document 0.7 b_text_document"
                     "\n--fp16\n--lr=3e-4\n--lr 2e-4\n")
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_batch_size": 64, "fp16": {"enabled": True, "initial_scale_power": 12}}))
    read = upstream.read([str(flags), str(config)])
    assert read.kind == upstream.MEGATRON and read.program is None
    values = {key: s.value for key, s in read.settings.items()}
    assert values["num_layers"] == "2" and values["fp16"] is True and values["lr"] == "2e-4"  # the last one wins
    assert values["data_path"] == ["0.3", "a_text_document", "0.7", "b_text_document"]
    assert values["fp16.initial_scale_power"] == 12 and values["train_batch_size"] == 64
    assert read.settings["hidden_size"].where == f"{flags}:2" and read.settings["fp16.enabled"].where == f"{config}:1"


def test_neox_files_merge_as_neox_merges_them(tmp_path):
    (tmp_path / "model.yml").write_text('{\n  "num_layers": 2,\n  # a comment\n  "tokenizer_type": "HFTokenizer",\n'
                                        '  "optimizer": {"type": "Adam", "params": {"lr": 1.0e-4}},\n}\n')
    (tmp_path / "paths.yml").write_text('{"tokenizer-type": "GPT2BPETokenizer", "data_path": "data/x"}\n')
    read = upstream.read([str(tmp_path / "model.yml"), str(tmp_path / "paths.yml")])
    assert read.kind == upstream.NEOX
    assert read.settings["tokenizer_type"].value == "GPT2BPETokenizer"  # a '-' spelling replaces, as in NeoX
    assert read.settings["optimizer.params.lr"].value == 1e-4
    assert read.settings["num_layers"].where == f"{tmp_path / 'model.yml'}:2"
    (tmp_path / "again.yml").write_text('{"num_layers": 4}\n')
    with pytest.raises(ValueError, match=r"again.yml: 'num_layers' is set again \(already in .*model.yml\); NeoX "
                                         "refuses a key two files set: keep one."):
        upstream.read([str(tmp_path / "model.yml"), str(tmp_path / "again.yml")])


@pytest.mark.parametrize("files, message", [
    ({"a.yml": '{"num_layers": 2}', "b.sh": "python pretrain_gpt.py --lr 1\n"},
     "give one Megatron-LM argument list .* or GPT-NeoX YAML configs, and at most DeepSpeed configs besides"),
    ({"run.sh": "echo hello\n"}, r"run.sh: neither a script that starts a pretrain_\*.py program nor a file of --flag"),
    ({"run.sh": "python pretrain_gpt.py --lr 1 --deepspeed_config /nowhere/ds.json\n"},
     r"run.sh:1: --deepspeed_config /nowhere/ds.json does not exist here; pass your copy of it with "
     r"--deepspeed_config=FILE."),
    ({"bad.yml": '{"a": [1, 2}'}, r"bad.yml:1: not valid YAML / JSON"),
    ({"run.sh": 'X="never closed\npython pretrain_gpt.py\n'}, "line 1: a \" quote is never closed")])
def test_unreadable_inputs_are_refused_in_one_line(tmp_path, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=message):
        upstream.read([str(tmp_path / name) for name in files])


def test_numbers_are_checked_where_they_are_written():
    setting = upstream.Setting("num_layers", "2.5", "--num-layers", "run.sh:7")
    with pytest.raises(ValueError, match=r"^run.sh:7: --num-layers '2.5' is not a whole number; fix the value.$"):
        setting.number(int)
    assert upstream.Setting("lr", "1.0e-5", "--lr", "run.sh:8").number() == 1e-5


ARRAYS = textwrap.dedent('''\
    #!/bin/bash
    EMPTY=()
    NAME=${NAME:-"my run"}
    LR=${LR-3e-4}
    FALLBACK=${NOT_SET:-fallback}
    BLANK=""
    KEPT=${BLANK-kept}   # set, though empty: `-` keeps it
    ARGS=(
        --lr $LR   # a comment inside the array
        "--name $NAME"
    )
    ARGS+=(--tag "$NAME")
    MORE=("two words" three)
    ARGS+=("${MORE[@]}" "${EMPTY[@]}")
    opts="--a"
    opts+=" --b"
    if [[ "$LR" == "1" ]] || [ -n "$NAME" ]; then ARGS+=(--either); fi
    if [ -n "$NAME" ] && [ -z "$NAME" ]; then
        ARGS+=(--both)
    else ARGS+=(--not-both)
    fi
    CHECKPOINT=${1:-"checkpoints/run"}
    torchrun --nproc_per_node 2 pretrain_gpt.py ${ARGS[@]} "${ARGS[@]}" $opts --x "$FALLBACK" --y "$KEPT" \\
        --save $CHECKPOINT ${EMPTY[@]}
    ''')


def bash_arguments(script: Path, arguments: tuple[str, ...] = ()) -> tuple[list[str], dict[str, str]]:
    """What bash passes the launcher when it runs `script` with `arguments` (a stand-in torchrun that writes its
    arguments), and the environment it ran with."""
    bin_dir = script.parent / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$ARGUMENTS"\n')
    (bin_dir / "torchrun").chmod(0o755)
    (script.parent / "pretrain_gpt.py").touch()
    environ = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(script.parent), "PWD": str(script.parent),
               "ARGUMENTS": str(script.parent / "arguments.txt")}
    done = subprocess.run(["bash", script.name, *arguments], cwd=script.parent, env=environ, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return (script.parent / "arguments.txt").read_text().splitlines(), environ


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to compare with")
@pytest.mark.parametrize("name", ["arrays.sh", "train_llama3_8b_h100_fp8.sh"])
@pytest.mark.system
def test_arrays_and_defaults_are_read_as_bash_runs_them(tmp_path, name):
    """Bash arrays (`A=( ... )`, `A+=( ... )`, `${A[@]}` split, `"${A[@]}"` a word per element), `${X:-default}`,
    `${X-default}`, `+=`, `&&` / `||` between tests, and Megatron-LM's own Llama 3 example script."""
    script = tmp_path / name
    script.write_text(ARRAYS if name == "arrays.sh" else (UPSTREAM / "megatron" / name).read_text())
    expected, environ = bash_arguments(script)
    launch = shell.find_launch(name, script.read_text(), environ)
    assert launch.launcher[1:] + [launch.program] + launch.arguments == expected
    assert f"{name}:" in "\n".join(launch.notes) and "$1 (the script's own arguments) taken as empty" in \
        "\n".join(launch.notes)


OWN_ARGUMENTS = textwrap.dedent('''\
    #!/bin/bash
    CHECKPOINT_PATH=$1
    TENSORBOARD=${2}
    VOCAB=${3:-"default vocab.json"}
    echo "$# arguments"
    shift 3
    torchrun pretrain_gpt.py --save $CHECKPOINT_PATH --tensorboard-dir $TENSORBOARD --vocab-file "$VOCAB" \\
        --data-path "$@" --tags $* --count $# --script $0
    ''')
GIVEN = {
    "all": (("ckpts", "runs/tb two", "v.json", "a b", "c"),
            ["--save", "ckpts", "--tensorboard-dir", "runs/tb", "two", "--vocab-file", "v.json", "--data-path", "a b",
             "c", "--tags", "a", "b", "c", "--count", "2", "--script", "own.sh"], []),
    # `shift 3` with one argument shifts none, as in bash
    "one": (("ckpts",), ["--save", "ckpts", "--tensorboard-dir", "--vocab-file", "default vocab.json", "--data-path",
                         "ckpts", "--tags", "ckpts", "--count", "1", "--script", "own.sh"],
            ["own.sh:3: $2 (the script's own arguments) taken as empty",
             "own.sh:4: $3 (the script's own arguments) taken as empty: its default applies",
             "own.sh:6: `shift 3` fails: 1 of the script's own arguments are left, and bash leaves them as they are "
             "(give the arguments the script expects after `--`)"]),
    "none": ((), ["--save", "--tensorboard-dir", "--vocab-file", "default vocab.json", "--data-path", "--tags",
                  "--count", "0", "--script", "own.sh"],
             ["own.sh:2: $1 (the script's own arguments) taken as empty",
              "own.sh:3: $2 (the script's own arguments) taken as empty",
              "own.sh:4: $3 (the script's own arguments) taken as empty: its default applies",
              "own.sh:6: `shift 3` fails: 0 of the script's own arguments are left, and bash leaves them as they are "
              "(give the arguments the script expects after `--`)",
              "own.sh:7: $@ (the script's own arguments) taken as empty",
              "own.sh:7: $* (the script's own arguments) taken as empty"]),
}


@pytest.mark.parametrize("given", GIVEN)
def test_a_scripts_own_arguments_expand_as_bash_gives_them(given):
    """$1, ${2}, ${3:-default}, "$@" (a word each), $* (split), $#, $0 and `shift N`; an argument read but not
    given is empty and noted."""
    arguments, expected, notes = GIVEN[given]
    launch = shell.find_launch("own.sh", OWN_ARGUMENTS, {}, arguments)
    assert launch.arguments == expected
    assert launch.notes == notes


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to compare with")
@pytest.mark.parametrize("given", GIVEN)
@pytest.mark.system
def test_a_scripts_own_arguments_are_what_bash_passes(tmp_path, given):
    script = tmp_path / "own.sh"
    script.write_text(OWN_ARGUMENTS)
    expected, environ = bash_arguments(script, GIVEN[given][0])
    launch = shell.find_launch("own.sh", OWN_ARGUMENTS, environ, GIVEN[given][0])
    assert [launch.program] + launch.arguments == expected


def test_arguments_need_a_script_to_take_them(tmp_path):
    (tmp_path / "model.yml").write_text('{"num_layers": 2}\n')
    with pytest.raises(ValueError, match=r"^the arguments after -- \(ckpts\) are a launch script's own \(\$1, \$2, "
                                         r"...\), and no launch script is given; leave them out for GPT-NeoX "
                                         "configs.$"):
        upstream.read([str(tmp_path / "model.yml")], arguments=["ckpts"])
    with pytest.raises(ValueError, match=r"^run.sh:2: `shift two`: bash needs a number of arguments to shift; fix "
                                         "the script.$"):
        shell.find_launch("run.sh", "#!/bin/bash\nshift two\npython pretrain_gpt.py --save $1\n", {}, ["a", "b"])


NOT_EVALUATED = textwrap.dedent('''\
    #!/bin/bash
    LR=1e-4
    NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
    HOST=`hostname -s`
    STEM=${DATA%%.*}
    LAYERS=(2 4)
    while [[ $# -gt 0 ]]; do
      case "$1" in
        --lr) LR="$2"; shift 2 ;;
        -h|--help) echo usage; exit 0 ;;
      esac
    done
    setup() {
      LR=5
    }
    setup
    shift 3
    eval "export X=1; python pretrain_gpt.py --lr $LR --num-layers ${LAYERS[1]} --tags ${#LAYERS[@]} --lr 2e-4"
    ''')


def test_what_is_read_but_not_evaluated_is_noted_with_its_line(tmp_path):
    """Issue 52, item 9: an option-parsing loop, `case`, a function and its call, `$(...)`, backticks, another
    `${...}` form and a failing `shift` are each noted with their line; `eval` runs all its statements; arrays'
    elements and counts expand; a flag given twice is noted (the last applies, as argparse takes it)."""
    launch = shell.find_launch("run.sh", NOT_EVALUATED, {}, ["--lr", "3"])
    assert launch.arguments == ["--lr", "1e-4", "--num-layers", "4", "--tags", "2", "--lr", "2e-4"]
    assert launch.notes == [
        'run.sh:3: the command `$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)` is not run here: taken '
        "as empty (write its value into the script)",
        "run.sh:4: the command `hostname -s` is not run here: taken as empty (write its value into the script)",
        "run.sh:5: `${DATA%%.*}` is not evaluated here: taken as empty",
        "run.sh:7: `while [[ $# -gt 0 ]]` ... `done` is not evaluated here (option parsing over the script's own "
        "arguments: the variables it would set keep the values set before it; write your run's values there)",
        "run.sh:13: the function setup is not read: what it sets or starts when called is not followed",
        "run.sh:16: the call `setup` of a function is not followed",
        "run.sh:17: `shift 3` fails: 2 of the script's own arguments are left, and bash leaves them as they are "
        "(give the arguments the script expects after `--`)"]
    (tmp_path / "run.sh").write_text(NOT_EVALUATED)
    read = upstream.read([str(tmp_path / "run.sh")], environ={}, arguments=["--lr", "3"])
    assert read.settings["lr"].value == "2e-4"
    assert f"--lr is given twice ('1e-4', then '2e-4'; {tmp_path / 'run.sh'}:18): the last applies" in \
        "\n".join(read.notes)


UNSET = "#!/bin/bash\nGPUS=\nARGS=\"--num-layers $LAYERS --lr ${1}\"\n" \
        "deepspeed --num_nodes 2 --num_gpus $GPUS pretrain_gpt.py $ARGS --hidden-size $HIDDEN --heads $(nproc)\n"


@pytest.mark.parametrize("script, environ, arguments, message", [
    (UNSET, {}, ["1e-4"], r"^run.sh:4: the launcher's --num_gpus has no value \(\$GPUS is set at run.sh:2 \(`GPUS=`\): "
                          r"write the value into that line\); or give migrate --num_gpus=N"),
    (UNSET.replace("GPUS=\n", ""), {}, ["1e-4"], r"the launcher's --num_gpus has no value \(\$GPUS is not set by the "
                                                 r"script or the environment: set it in the environment \(GPUS=VALUE "),
    (UNSET.replace("GPUS=\n", ""), {"GPUS": "eight"}, ["1e-4"],
     r"--num_gpus 'eight' is not a whole number above 0 \(\$GPUS comes from the environment \(GPUS='eight'\)"),
])
def test_a_launcher_count_a_variable_leaves_empty_is_one_line(tmp_path, script, environ, arguments, message):
    """Issue 52, item 8: CPM-2-Finetune's sogou-log script passes `--num_gpus ${NUM_GPUS_PER_WORKER}`, never set."""
    (tmp_path / "run.sh").write_text(script)
    path = str(tmp_path / "run.sh")
    with pytest.raises(ValueError, match=message.replace("run.sh", f"{tmp_path}/run.sh")):
        upstream.read([path], environ=environ, arguments=arguments)
    assert upstream.read([path], environ=environ, arguments=arguments, gpus=16).gpus == 16  # --num_gpus given


@pytest.mark.parametrize("flag, environ, arguments, message", [
    ("num_layers", {}, ["1e-4"], r"run.sh:3: --num-layers has no value \(\$LAYERS is not set by the script or the "
                                 r"environment: set it in the environment \(LAYERS=VALUE python -m t5x_like.migrate "
                                 r"...\) or in the script\).$"),
    ("num_layers", {"LAYERS": "two"}, ["1e-4"], r"--num-layers 'two' is not a whole number \(\$LAYERS comes from the "
                                                r"environment \(LAYERS='two'\): set it there to the value the run used\)"),
    ("lr", {}, [], r"run.sh:3: --lr has no value \(\$1 is the script's own argument 1: give the script's arguments "
                   r"after `--` \(python -m t5x_like.migrate .*run.sh -- ARG1 ARG2 ...\)\).$"),
    ("hidden_size", {}, ["1e-4"], r"run.sh:4: --hidden-size has no value \(\$HIDDEN is not set"),
    ("heads", {}, ["1e-4"], r"run.sh:4: --heads has no value; fix the value.$"),
])
def test_a_number_a_variable_leaves_empty_names_the_variable_and_the_fix(tmp_path, flag, environ, arguments, message):
    (tmp_path / "run.sh").write_text(UNSET)
    read = upstream.read([str(tmp_path / "run.sh")], environ={"GPUS": "8", **environ}, arguments=arguments, gpus=8)
    with pytest.raises(ValueError, match=message):
        read.settings[flag].number(int if flag != "lr" else float)
    assert "run.sh:4: the command `$(nproc)` is not run here" in "\n".join(read.notes)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_a_value_that_is_not_finite_is_refused_where_it_is_written(value):
    setting = upstream.Setting("moe_aux_loss_coeff", value, "--moe-aux-loss-coeff", "run.sh:9")
    with pytest.raises(ValueError, match=rf"^run.sh:9: --moe-aux-loss-coeff '{value}' is not a finite number; fix "
                                         "the value.$"):
        setting.number()


def test_a_cpm2_finetune_script_without_its_gpu_count_migrates_once_it_is_given(tmp_path, monkeypatch):
    """CPM-2-Finetune's sogou-log script passes `--num_gpus ${NUM_GPUS_PER_WORKER}` and never sets it (a traceback
    before issue 52): one line naming the line and the variable; given in the environment, the script migrates as
    the LCQMC script that sets it does."""
    script = unset_gpu_count_script(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=rf"^{script.name}:65: the launcher's --num_gpus has no value "
                                         r"\(\$NUM_GPUS_PER_WORKER is not set by the script or the environment"):
        upstream.read([script.name], "ds_full_model.json", environ={})
    out = translate.translate(upstream.read([script.name], "ds_full_model.json", environ={"NUM_GPUS_PER_WORKER": "8"}))
    (tmp_path / "lcqmc.sh").write_text((UPSTREAM / "cpm2_finetune" / "finetune_cpm2_lcqmc.sh").read_text())
    want = translate.translate(upstream.read(["lcqmc.sh"], "ds_full_model.json", environ={}))
    for name in ("BATCH_SIZE", "MICRO_BATCH_SIZE", "TENSOR_PARALLEL", "FEATURE_LENGTHS"):
        assert out.value(name) == want.value(name), name
