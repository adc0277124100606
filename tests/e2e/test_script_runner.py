"""Scripts in the styles people write load unmodified, leave nothing behind, and break clearly."""

from __future__ import annotations

import gc
import os
import textwrap
import time

import pytest
from pipeline_runs import GOOD_SCRIPT, failures, outcomes, run_script, write

from pytest_trainer.script_runner import script_modules

ARGPARSE_MAIN = """
    import argparse
    import tiny
    from transformers import Trainer, TrainingArguments

    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--lr", type=float, default=5e-4)
        parser.add_argument("--output", default="checkpoints")
        options = parser.parse_args()
        tok = tiny.tokenizer()
        args = TrainingArguments(output_dir=options.output, learning_rate=options.lr, per_device_train_batch_size=8)
        trainer = Trainer(model=tiny.classifier(), args=args, processing_class=tok,
                          train_dataset=tiny.tokenized(tiny.text_dataset(), tok))
        trainer.train()
        trainer.save_model()

    if __name__ == "__main__":
        main()
"""


def test_main_with_argparse_defaults_under_main_guard(project: pytest.Pytester) -> None:
    write(project, "train.py", ARGPARSE_MAIN)
    assert failures(run_script(project)) == []


def test_script_arguments_come_from_trainer_args(project: pytest.Pytester) -> None:
    write(project, "train.py", ARGPARSE_MAIN.replace("default=5e-4", "required=True"))
    result = run_script(project, "--trainer-args=--lr 0")
    assert failures(result) == ["step[cpu]"]
    result.stdout.fnmatch_lines(["step[[]cpu[]] failed: the learning rate is 0*"])


def test_argparse_rejecting_missing_arguments_suggests_trainer_args(project: pytest.Pytester) -> None:
    write(project, "train.py", ARGPARSE_MAIN.replace("default=5e-4", "required=True"))
    result = run_script(project)
    assert failures(result) == ["load[cpu]"]
    assert set(outcomes(result).values()) == {"SKIPPED"}
    result.stdout.fnmatch_lines(
        [
            "load[[]cpu[]] failed: train.py: the script exited (sys.exit with code 2) before building a Trainer*",
            "*| *error: the following arguments are required: --lr*",
            "*fix: *--trainer-args=*",
            "*SKIPPED*the Trainer did not load (see load[[]cpu[]])*",
        ]
    )


def test_trainer_subclass_with_its_own_compute_loss(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        """
        import torch
        import tiny
        from transformers import Trainer, TrainingArguments

        class WeightedTrainer(Trainer):
            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                labels = inputs.pop("labels")
                outputs = model(**inputs)
                weights = torch.tensor([1.0, 2.0, 3.0], device=outputs.logits.device)
                loss = torch.nn.functional.cross_entropy(outputs.logits, labels, weight=weights)
                return (loss, outputs) if return_outputs else loss

            def train(self, *args, **kwargs):  # overridden without calling super(): still never trains
                raise AssertionError("the real training loop ran")

        tok = tiny.tokenizer()
        args = TrainingArguments(output_dir="checkpoints", per_device_train_batch_size=8)
        trainer = WeightedTrainer(model=tiny.classifier(), args=args, processing_class=tok,
                                  train_dataset=tiny.tokenized(tiny.text_dataset(), tok))
        trainer.train()
    """,
    )
    assert failures(run_script(project)) == []


def test_factory_function_instead_of_main(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        """
        import tiny
        from transformers import Trainer, TrainingArguments

        def build_trainer():
            tok = tiny.tokenizer()
            args = TrainingArguments(output_dir="checkpoints", per_device_train_batch_size=8)
            return Trainer(model=tiny.classifier(), args=args, processing_class=tok,
                           train_dataset=tiny.tokenized(tiny.text_dataset(), tok))

        if __name__ == "__main__":
            raise SystemExit("a factory script must not run its main block")
    """,
    )
    result = run_script(project, "--trainer-factory=build_trainer")
    assert failures(result) == []
    assert outcomes(result)["step[cpu]"] == "PASSED"


def test_script_that_builds_but_never_trains(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT.replace("trainer.train()", ""))
    result = run_script(project)
    assert failures(result) == []
    assert outcomes(result)["step[cpu]"] == "PASSED"


def test_suite_writes_nothing_into_the_project(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        """
        import os
        import tiny
        from transformers import Trainer, TrainerCallback, TrainingArguments

        class WritesAtStart(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                open("callback-was-here.txt", "w").close()

        os.environ["PIPELINE_SCRIPT_RAN"] = "1"
        tok = tiny.tokenizer()
        args = TrainingArguments(output_dir="checkpoints", save_strategy="steps", save_steps=1, report_to="all",
                                 per_device_train_batch_size=8)
        trainer = Trainer(model=tiny.classifier(), args=args, processing_class=tok, callbacks=[WritesAtStart()],
                          train_dataset=tiny.tokenized(tiny.text_dataset(), tok))
        trainer.train()
    """,
    )
    before = sorted(path.name for path in project.path.iterdir())
    result = run_script(project, "-p", "no:cacheprovider")
    assert failures(result) == []
    after = sorted(path.name for path in project.path.iterdir() if path.name != "__pycache__")
    assert after == before
    assert not (project.path / "checkpoints").exists()
    assert "PIPELINE_SCRIPT_RAN" not in __import__("os").environ


def test_process_state_is_restored_after_the_script(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        """
        import logging, os, random, signal, sys, warnings
        import tiny
        from transformers import Trainer, TrainingArguments
        signal.signal(signal.SIGINT, lambda number, frame: None)
        os.chdir("..")
        sys.argv.append("--extra")
        random.seed(1)
        logging.getLogger().setLevel(logging.ERROR)
        warnings.simplefilter("ignore")
        tok = tiny.tokenizer()
        trainer = Trainer(model=tiny.classifier(), args=TrainingArguments(output_dir="out"), processing_class=tok,
                          train_dataset=tiny.tokenized(tiny.text_dataset(), tok))
    """,
    )
    project.makeconftest("""
        import logging, os, signal, sys, warnings
        import pytest

        @pytest.fixture(autouse=True)
        def state_before(request):
            before = (os.getcwd(), list(sys.argv), logging.getLogger().level, list(warnings.filters),
                      signal.getsignal(signal.SIGINT))
            yield
            after = (os.getcwd(), list(sys.argv), logging.getLogger().level, list(warnings.filters),
                     signal.getsignal(signal.SIGINT))
            assert after == before
    """)
    result = run_script(project)
    assert failures(result) == []


@pytest.mark.parametrize("frozen_before", [False, True], ids=["collector-free", "frozen-by-the-process"])
def test_a_run_leaves_the_garbage_collector_as_it_found_it(project: pytest.Pytester, frozen_before: bool) -> None:
    """The session keeps the libraries and the Trainer out of the collector while it runs (`gc_freezer`); a run inside a
    process that goes on must leave them collectable, and leave a freeze the process made itself as it was."""
    write(project, "train.py", GOOD_SCRIPT)
    project.makeconftest("""
        import gc
        import pytest

        @pytest.fixture(autouse=True)
        def frozen_while_it_runs(request):
            yield
            if "load[" in request.node.name:
                assert gc.get_freeze_count() > 0
    """)
    gc.unfreeze()
    if frozen_before:
        gc.freeze()
    try:
        result = run_script(project, "--trainer-stages=load,forward")
        frozen_after = gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    assert failures(result) == []
    assert outcomes(result, load=True) == {"load[cpu]": "PASSED", "forward[cpu]": "PASSED"}
    assert frozen_after == frozen_before
    assert gc.isenabled()


def test_a_transformers_that_does_not_import_fails_the_load_item(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The libraries are imported before the first item runs (`gc_freezer`); an install where that import breaks (a
    package transformers needs, built for another Python) still fails the load item with the error, not every item at
    its setup."""
    write(project, "train.py", GOOD_SCRIPT)
    broken = project.mkdir("broken_install") / "safetensors"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise RuntimeError('safetensors built for another Python')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(broken.parent), os.environ.get("PYTHONPATH", "")]))
    result = project.runpytest_subprocess("--trainer-module=train.py", "--trainer-devices=cpu", "-v")
    assert outcomes(result, load=True)["load[cpu]"] == "FAILED"
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.no_fnmatch_line("*ERROR*")


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import tiny\ndef broken(:\n", ["*train.py: syntax error: *", "*at *train.py:2*"]),
        (
            "import tiny\nimport package_that_is_not_installed\n",
            [
                "*train.py: import failed: No module named 'package_that_is_not_installed'*",
                "*fix: install the missing package*package_that_is_not_installed*",
            ],
        ),
        (  # transformers' own error for a class whose library is missing: it begins with a line break
            "import tiny\nfrom transformers.utils.import_utils import requires_backends\n"
            "class VideoProcessor: ...\nrequires_backends(VideoProcessor, ['essentia'])\n",
            [
                "*train.py: import failed: VideoProcessor requires essentia library.",
                "*fix: install the missing package in the test environment (essentia) or fix the import*",
            ],
        ),
        (
            "import tiny\nimport sys\nprint('loading data')\nsys.exit(3)\n",
            ["*the script exited (sys.exit with code 3) before building a Trainer*", "*| loading data*"],
        ),
        (
            "import tiny\ndata = tiny.text_dataset()\nrows = data['missing_column']\n",
            [
                "load[[]cpu[]] failed: train.py: ValueError: Column 'missing_column' doesn't exist.",
                "*at *train.py:3: rows = data*missing_column*",
                "*fix: the message comes from datasets, called by the script's line above*",
            ],
        ),
        (
            "import tiny\nraise RuntimeError('no GPU quota left')\n",
            [
                "load[[]cpu[]] failed: train.py: RuntimeError: no GPU quota left",
                "*at *train.py:2*",
                "*fix: fix the script at the line above*",
            ],
        ),
        (
            "import tiny\nprint('no trainer here')\n",
            ["*the script finished without building a transformers.Trainer*", "*fix: *--trainer-factory=NAME*"],
        ),
    ],
    ids=["syntax-error", "import-error", "missing-library", "sys-exit", "library-error", "own-error", "no-trainer"],
)
def test_broken_script_fails_once_with_cause_and_fix(
    project: pytest.Pytester, source: str, expected: list[str]
) -> None:
    write(project, "train.py", source)
    result = run_script(project)
    assert failures(result) == ["load[cpu]"]
    assert set(outcomes(result).values()) == {"SKIPPED"}
    result.stdout.fnmatch_lines(expected)
    result.stdout.no_fnmatch_line("*INTERNALERROR*")


def test_a_script_path_that_does_not_exist_is_a_usage_error(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT)
    result = project.runpytest("--trainer-module=nowhere.py", "--trainer-module=train.py", "--trainer-devices=cpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--trainer-module on the command line: *nowhere.py does not exist; give the path of the training script*"]
    )
    result.stdout.no_fnmatch_line("*INTERNALERROR*")
    project.makeini("[pytest]\ntrainer_module = scripts\n")
    (project.path / "scripts").mkdir()
    result = project.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*trainer_module in *: *scripts is a folder, not a script*"])


def test_the_trainer_loads_in_an_item_of_its_own(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT)
    result = run_script(project, "--trainer-stages=forward")
    assert outcomes(result, load=True) == {"load[cpu]": "PASSED", "forward[cpu]": "PASSED"}


#: A script as people write them with HfArgumentParser: its own arguments class, collator and callback, all pickled
#: by the checkpoint (training_args.bin) or by the test below.
OWN_CLASSES = """
    import dataclasses
    import tiny
    from transformers import DataCollatorWithPadding, HfArgumentParser, Trainer, TrainerCallback, TrainingArguments

    @dataclasses.dataclass
    class BriefsTrainingArguments(TrainingArguments):
        brief_length: int = dataclasses.field(default=12, metadata={"help": "words per brief"})

    @dataclasses.dataclass
    class Collator(DataCollatorWithPadding):
        class Options:
            pad_to = None

    class Progress(TrainerCallback):
        pass

    def main():
        (args,) = HfArgumentParser(BriefsTrainingArguments).parse_args_into_dataclasses(
            args=["--output_dir", "out", "--per_device_train_batch_size", "8", "--report_to", "none"])
        tok = tiny.tokenizer()
        data = tiny.tokenized(tiny.text_dataset(), tok)
        trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=data, eval_dataset=data,
                          processing_class=tok, data_collator=Collator(tok), callbacks=[Progress()])
        trainer.train()

    if __name__ == "__main__":
        main()
"""


def test_classes_the_script_defines_pickle_as_in_a_direct_run(project: pytest.Pytester) -> None:
    write(project, "train.py", OWN_CLASSES)
    project.makepyfile(
        test_pickles="""
        import pickle
        import sys

        import pytest

        @pytest.mark.trainer_pipeline(module="train.py", stages=["save"], devices=["cpu"])
        def test_pickles(trainer, trainer_stage):
            trainer_stage.run()
            for value in (trainer.args, trainer.data_collator, trainer.data_collator.Options,
                          trainer.callback_handler.callbacks[-1]):
                assert type(pickle.loads(pickle.dumps(value))) is type(value)
            assert sys.modules["__main__"] is not sys.modules[type(trainer.args).__module__]
    """
    )
    result = project.runpytest(
        "--trainer-module=train.py", "--trainer-devices=cpu", "--trainer-stages=save", "test_pickles.py", "-v"
    )
    assert outcomes(result) == {"save[cpu]": "PASSED"}
    result.assert_outcomes(passed=3)
    assert not script_modules()  # the session ended: the script's module is no longer kept


def test_classes_of_a_factory_script_pickle_too(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        OWN_CLASSES.replace("def main():", "def build():")
        .replace("trainer.train()", "return trainer")
        .replace('if __name__ == "__main__":\n        main()', ""),
    )
    result = run_script(project, "--trainer-factory=build", "--trainer-stages=save")
    assert outcomes(result) == {"save[cpu]": "PASSED"}


def test_library_frames_under_a_script_error_are_folded(project: pytest.Pytester) -> None:
    write(project, "train.py", "import tiny\ndata = tiny.text_dataset()\nrows = data['missing_column']\n")
    result = run_script(project, "--trainer-stages=dataset")
    result.stdout.fnmatch_lines(
        [
            "original error:",
            "train.py:3: in <module>",
            "*rows = data*",
            "*: in __init__*",
            "E   ValueError: Column 'missing_column' doesn't exist.",
            "(* library frames folded; --fulltrace shows them)",
        ]
    )


def test_a_hung_stage_fails_with_its_name(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        textwrap.dedent(GOOD_SCRIPT).replace(
            "trainer = Trainer(",
            "import time\nfrom transformers import DataCollatorWithPadding\n"
            "class Stuck(DataCollatorWithPadding):\n"
            "    def __call__(self, features):\n"
            "        time.sleep(3600)\n"
            "trainer = Trainer(data_collator=Stuck(tok), ",
        ),
    )
    result = run_script(project, "--trainer-timeout=2", "--trainer-stages=dataset,collate")
    assert outcomes(result) == {"dataset[cpu]": "PASSED", "collate[cpu]": "FAILED"}
    result.stdout.fnmatch_lines(
        [
            "collate[[]cpu[]] failed: collate[[]cpu[]] of train.py did not finish within 2 s*",
            "*fix: *raise --trainer-timeout if it is only slow*",
        ]
    )


def test_a_hung_script_fails_with_the_remedy(project: pytest.Pytester) -> None:
    write(project, "train.py", "import time\ntime.sleep(3600)\n")
    result = run_script(project, "--trainer-timeout=1", "--trainer-stages=dataset")
    assert failures(result) == ["load[cpu]"]
    result.stdout.fnmatch_lines(
        ["*train.py: the script did not build its Trainer within 1 s*", "*fix: *--trainer-sample*--trainer-timeout*"]
    )


def test_two_scripts_on_two_workers_each_stay_on_one(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT)
    write(project, "other.py", GOOD_SCRIPT.replace("tiny.classifier()", "tiny.classifier(num_labels=2)"))
    args = (
        "--trainer-module=train.py",
        "--trainer-module=other.py",
        "--trainer-devices=cpu",
        "--trainer-stages=dataset,collate,forward,eval",
    )
    alone = project.runpytest(*args, "-v")
    spread = project.runpytest(*args, "-v", "-n", "2")
    assert outcomes(spread, "train.py") == outcomes(alone, "train.py")
    assert outcomes(spread, "other.py") == outcomes(alone, "other.py")
    assert failures(spread, "other.py") == ["dataset[cpu]"]
    workers = {}
    for line in spread.outlines:
        if line.startswith("[gw"):
            workers.setdefault(line.split()[-1].split("::")[0], set()).add(line.split()[0])
    assert all(len(used) == 1 for used in workers.values()), workers


def test_unknown_factory_names_the_functions_there_are(project: pytest.Pytester) -> None:
    write(project, "train.py", "import tiny\ndef build():\n    pass\n")
    result = run_script(project, "--trainer-factory=make_trainer", "--trainer-stages=dataset")
    result.stdout.fnmatch_lines(
        [
            "load[[]cpu[]] failed: train.py: no function 'make_trainer' in the script",
            "  fix: --trainer-factory names one of its functions: build",
        ]
    )
    result.stdout.no_fnmatch_line("*the script raised ScriptError*")


def test_arguments_the_script_rejects_are_named(project: pytest.Pytester) -> None:
    write(project, "train.py", ARGPARSE_MAIN)
    result = run_script(project, "--trainer-args=--bogus 1", "--trainer-stages=dataset")
    result.stdout.fnmatch_lines(
        ["*error: unrecognized arguments: --bogus 1*", "*fix: the script's argument parser rejected *'--bogus', '1'*"]
    )


def test_a_framework_reading_the_trainer_signature_sees_the_original(project: pytest.Pytester) -> None:
    """Frameworks choose processing_class= or tokenizer= from the signature of Trainer.__init__ (ms-swift does)."""
    write(
        project,
        "train.py",
        """
        import inspect
        import tiny
        from transformers import Trainer, TrainingArguments

        parameters = inspect.signature(Trainer.__init__).parameters
        assert "args" in inspect.signature(Trainer.train).parameters or \\
            "resume_from_checkpoint" in inspect.signature(Trainer.train).parameters
        assert Trainer.__init__.__name__ == "__init__" and Trainer.train.__name__ == "train"
        tok = tiny.tokenizer()
        given = {"processing_class": tok} if "processing_class" in parameters else {"tokenizer": tok}
        data = tiny.tokenized(tiny.text_dataset(), tok)
        args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
        trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=data, **given)
        assert "resume_from_checkpoint" in inspect.signature(trainer.train).parameters
        trainer.train()
    """,
    )
    result = run_script(project, "--trainer-stages=load,forward")
    assert failures(result) == [], result.stdout.str()[-3000:]
    assert outcomes(result)["forward[cpu]"] == "PASSED"


def test_worker_settings_stay_consistent_without_workers(project: pytest.Pytester) -> None:
    """The plugin loads data in the main process: a prefetch factor, which only workers take, goes with them."""
    write(
        project,
        "train.py",
        GOOD_SCRIPT.replace(
            "per_device_train_batch_size=8,",
            "per_device_train_batch_size=8, dataloader_num_workers=2, dataloader_prefetch_factor=2, "
            "dataloader_persistent_workers=True,",
        ),
    )
    result = run_script(project, "--trainer-stages=load,collate,eval")
    assert failures(result) == [], result.stdout.str()[-3000:]
    assert outcomes(result) == {"collate[cpu]": "PASSED", "eval[cpu]": "PASSED"}


#: A script that writes into the folder its own settings name after building the Trainer, as axolotl does with its
#: config, tokenizer and log.
WRITES_BEFORE_TRAIN = """
    import os
    import tiny
    from transformers import Trainer, TrainingArguments

    OUT = "outputs/run"
    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(), tok)
    args = TrainingArguments(output_dir=OUT, per_device_train_batch_size=8, report_to="none")
    trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=data, processing_class=tok)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "config.yaml"), "w") as file:
        file.write("written by the run")
    tok.save_pretrained(OUT)
    trainer.train()
"""


def test_files_written_into_a_new_output_folder_before_train_are_removed(project: pytest.Pytester) -> None:
    write(project, "train.py", WRITES_BEFORE_TRAIN)
    before = sorted(path.name for path in project.path.iterdir())
    result = run_script(project, "-p", "no:cacheprovider", "--trainer-stages=load,forward")
    assert failures(result) == [], result.stdout.str()[-3000:]
    assert sorted(path.name for path in project.path.iterdir() if path.name != "__pycache__") == before
    result.stdout.fnmatch_lines(
        ["put back: *outputs: created by the script before train(), with * files; removed when the session ends"]
    )


def test_an_existing_output_folder_is_put_back_as_it_was(project: pytest.Pytester) -> None:
    write(project, "train.py", WRITES_BEFORE_TRAIN)
    run = project.path / "outputs" / "run"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("the user's own")
    (run / "checkpoint-500").mkdir()
    (run / "checkpoint-500" / "trainer_state.json").write_text("{}")
    for path in [*run.rglob("*"), run, run.parent]:  # written by an earlier run, an hour ago
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    result = run_script(project, "-p", "no:cacheprovider", "--trainer-stages=load,forward")
    assert failures(result) == [], result.stdout.str()[-3000:]
    assert sorted(path.relative_to(run).as_posix() for path in run.rglob("*")) == [
        "checkpoint-500",
        "checkpoint-500/trainer_state.json",
        "config.yaml",
    ]
    assert (run / "config.yaml").read_text() == "the user's own"
    result.stdout.fnmatch_lines(
        [
            "put back: *outputs/run: written by the script before train(); * new files removed; "
            "1 changed files put back when the session ends"
        ]
    )


def test_a_log_opened_in_the_output_folder_before_the_arguments_is_removed(project: pytest.Pytester) -> None:
    """axolotl opens its debug.log in the output folder its config names before it builds the training arguments."""
    early_log = WRITES_BEFORE_TRAIN.replace(
        '    OUT = "outputs/run"\n',
        '    OUT = "outputs/run"\n    os.makedirs(OUT, exist_ok=True)\n'
        '    open(os.path.join(OUT, "debug.log"), "w").write("the run log")\n',
    )
    assert early_log.count("debug.log") == 1
    write(project, "train.py", early_log)
    before = sorted(path.name for path in project.path.iterdir())
    result = run_script(project, "-p", "no:cacheprovider", "--trainer-stages=load,forward")
    assert failures(result) == [], result.stdout.str()[-3000:]
    assert sorted(path.name for path in project.path.iterdir() if path.name != "__pycache__") == before


def test_a_cache_made_in_the_working_directory_before_train_is_removed(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """axolotl prepares its dataset into last_run_prepared/ in the working directory unless its config says where."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # the run below is no worker, whatever runs this test
    write(
        project,
        "train.py",
        WRITES_BEFORE_TRAIN.replace(
            '    OUT = "outputs/run"\n',
            '    OUT = "outputs/run"\n    os.makedirs("last_run_prepared/abc123", exist_ok=True)\n'
            '    open("last_run_prepared/abc123/data.arrow", "w").write("rows")\n',
        ),
    )
    before = sorted(path.name for path in project.path.iterdir())
    result = run_script(project, "-p", "no:cacheprovider", "--trainer-stages=load,forward")
    assert failures(result) == [], result.stdout.str()[-3000:]
    assert sorted(path.name for path in project.path.iterdir() if path.name != "__pycache__") == before
    result.stdout.fnmatch_lines(
        [
            "put back: *last_run_prepared: made by the script before train(), in the working "
            "directory; removed when the session ends"
        ]
    )


def test_under_xdist_a_cache_made_in_the_working_directory_is_only_named(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Other pytest processes share the working directory: what appeared there is named, never removed."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    write(
        project,
        "train.py",
        WRITES_BEFORE_TRAIN.replace(
            '    OUT = "outputs/run"\n', '    OUT = "outputs/run"\n    open("prepared.arrow", "w").write("rows")\n'
        ),
    )
    result = run_script(project, "-p", "no:cacheprovider", "--trainer-stages=load,forward")
    assert failures(result) == [], result.stdout.str()[-3000:]
    assert (project.path / "prepared.arrow").read_text() == "rows"
    result.stdout.fnmatch_lines(
        [
            "put back: *prepared.arrow: made by the script before train(); left, as other pytest "
            "processes work in this directory too"
        ]
    )


SFT_ON_TOKENIZED_ROWS = """
    import lm
    import tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tok = lm.tokenizer()
    data = Dataset.from_dict({{"text": tiny.sentences(16)}}).map(lambda batch: tok(batch["text"]), batched=True)
    args = SFTConfig(output_dir="out", use_cpu=True, bf16=False, report_to=[], max_length=32)
    trainer = SFTTrainer(model=lm.model(), args=args, train_dataset=data, processing_class=tok{formatting})
    trainer.train()
"""


@pytest.mark.parametrize("formatting", ["", ", formatting_func=lambda row: row['text']"], ids=["plain", "ignored"])
def test_what_the_libraries_warn_of_while_the_trainer_is_built_is_kept(
    project: pytest.Pytester, formatting: str
) -> None:
    """TRL logs that it ignores a formatting function on rows already tokenized; load passes, and pytest shows the
    logs of a passing item nowhere: the plugin says it once for the script."""
    from task_scripts import LM

    project.makepyfile(lm=LM)
    write(project, "train.py", SFT_ON_TOKENIZED_ROWS.format(formatting=formatting))
    result = run_script(project, "--trainer-stages=dataset")
    assert failures(result) == []
    said = (
        "the libraries said while the Trainer was built: trl: You passed a dataset that is already processed "
        "(contains an `input_ids` field) together with a formatting function. Therefore `formatting_func` will "
        "be ignored.*"
    )
    if formatting:
        result.stdout.fnmatch_lines([said])
    else:
        result.stdout.no_fnmatch_line(said)


@pytest.mark.parametrize(
    ("columns", "dropped", "kept"),
    [
        ({"text": ["a b"], "label": [0]}, {"text"}, False),  # tokenized text: let go
        ({"speech": [[0.1, 0.2]], "sampling_rate": [8000]}, {"speech"}, True),
        ({"audio": [{"array": [0.1], "sampling_rate": 8000}]}, {"audio"}, True),
        ({"tokens": [["a", "b"]], "tags": [[0, 1]]}, {"tokens", "tags"}, True),
        ({"question": ["q"], "context": ["c"]}, {"question", "context"}, True),
    ],
    ids=["text", "arrays-beside-a-rate", "audio-values", "word-lists", "questions"],
)
def test_a_mapped_dataset_is_kept_only_for_what_the_checks_read_back(
    columns: dict[str, list[object]], dropped: set[str], kept: bool
) -> None:
    from datasets import Dataset

    from pytest_trainer.script_runner import kept_as_stored

    assert kept_as_stored(Dataset.from_dict(columns), dropped) is kept
