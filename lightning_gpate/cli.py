"""``lightning-gpate`` command line.

* ``lightning-gpate fit|validate|test --config configs/NAME.yaml [--model.* --data.* --trainer.* --seed_everything N]``
  through LightningCLI (models and DataModules in subclass mode); ``fit`` ends with a summary
  (:class:`callbacks.FitSummary`);
* ``lightning-gpate sample --ckpt_path RELEASE --num_samples N --output PATH`` writes synthetic data in
  the original schema (CSV for tables, ``.npz`` + PNG grid for images) from a run's release artifact;
* ``lightning-gpate evaluate --ckpt_path RELEASE [--data DATA]`` evaluates a finished run and attaches the
  report to its MLflow run;
* ``lightning-gpate compare --experiment NAME`` prints the experiment's runs side by side;
* ``lightning-gpate audit --config CONFIG --dataset worst_case|FILE --runs N`` measures the privacy a
  model really gives (:mod:`lightning_gpate.audit`).
* ``lightning-gpate plan --config configs/NAME.yaml (--data_is_public | --vote_shares 0.9,0.05)``
  estimates how many steps fit the target ε under each privacy analysis (:mod:`lightning_gpate.planning`).

Every command ends a user error (:func:`user_error_of`) with one line
``lightning-gpate <command>: error: <message>`` and exit code 2; ``--debug`` anywhere on the command
line prints the traceback first. Errors of the command line's own syntax (an unknown option, config key
or command, a wrong type, a missing config file) are one line too, naming the closest valid keys
(:mod:`lightning_gpate.option_errors`). OpenMP threads wait passively unless the user chose (see the
CPU defaults below the imports). A command added to :data:`EXTRA_COMMANDS` gets the same
handling: it takes its arguments (without ``--debug``) and returns an exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import inspect
import os
import re
import sys
import traceback
from dataclasses import is_dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

# The CPU defaults. Set before torch loads OpenMP, which reads it once: an OpenMP thread that waits for
# the others sleeps instead of spinning (unless the user set OMP_WAIT_POLICY). Spinning threads take the
# cores the working ones need on a busy machine: a quickstart step with torch's 2 threads on 2 shared
# cores took 146 s (11.6 CPU s) spinning, 4.9 s (1.5 CPU s) passive, 4.1 s (1.3 CPU s) on one thread;
# beside one more busy process 73 s, 6.3 s and 8.4 s (benchmarks/results/quickstart_threads.md). So the
# threads stay torch's (the physical cores; OMP_NUM_THREADS or torch.set_num_threads choose others) and
# DataModules load in the main process (num_workers 0: the data sits in memory). The command's
# processes (DDP ranks, DataLoader workers) inherit the policy.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pytorch_lightning.cli import LightningArgumentParser, LightningCLI  # noqa: E402

from datamodules.base import GenerativeDataModule  # noqa: E402
from lightning_gpate.errors import ConfigError, OptionError, UserError  # noqa: E402
from lightning_gpate.helptext import PlainHelpFormatter, first_paragraph  # noqa: E402
from lightning_gpate.models.base import CHECKPOINT_KEY, CheckpointError, GenerativeModel, refuse_changed_on_resume  # noqa: E402
from lightning_gpate.models.options import OptionGroup  # noqa: E402

PROG = "lightning-gpate"
#: Commands beside LightningCLI's: name → function(argv) returning an exit code.
EXTRA_COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {}
DEBUG_FLAG = "--debug"
#: LightningCLI's commands (the Trainer's methods).
LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")
#: ``--ckpt_path`` values that Lightning resolves itself (not file names).
_LIGHTNING_CKPT_ALIASES = ("last", "best", "hpc", "registry")

_PROJECT_PACKAGES = ("lightning_gpate", "datamodules", "callbacks")
_PROJECT_DIRS = tuple(str(Path(__file__).resolve().parents[1] / d) for d in _PROJECT_PACKAGES)
#: Exceptions that are the user's input when this project raises them (a ValueError from torch's
#: internals is a bug and keeps its traceback); a :class:`UserError` is one wherever it comes from.
_INPUT_ERRORS = (ValueError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


#: The models by what ``--help`` calls them, in the order it lists them (every model of :mod:`lightning_gpate.models`
#: must have a name here: a test checks it).
MODEL_TITLES = {"GPATE": "G-PATE", "PATEGAN": "PATE-GAN", "DPGAN": "DP-GAN", "GSWGAN": "GS-WGAN", "DPMERF": "DP-MERF",
                "MarginalTree": "MarginalTree (tables)", "GAN": "a non-private GAN"}
#: What ``lightning-gpate --help`` says first.
DESCRIPTION = (f"Train differentially private data generators ({', '.join(MODEL_TITLES.values())}) from a config, with a "
               "privacy guarantee, MLflow tracking and a release artifact to sample synthetic data from.\n\n"
               "Start: lightning-gpate fit --config configs/quickstart.yaml")
#: ``fit`` in the list of commands, and what ``fit --help`` says first.
FIT_HELP = "Train a model on data from a config and options."
FIT_DESCRIPTION = ("Train a model (--model) on data (--data) from a config (-c) and options, until the privacy budget "
                   "or --trainer.max_steps stops it; then evaluate it, write its release and print a summary. A model's "
                   "options: lightning-gpate fit --model.help GPATE; the data's: lightning-gpate fit --data.help "
                   "TabularDataModule.")
#: The help's groups whose docstring titles name a base class: their titles for a user.
GROUP_TITLES = {"trainer": "Lightning's Trainer", "model": "the model", "data": "the data", "fit": "resuming"}


class GPATEHelpFormatter(PlainHelpFormatter):
    """The plain help (:class:`~lightning_gpate.helptext.PlainHelpFormatter`) with this command line's words for the
    options whose docstrings are generic: the model and data choices, the checkpoint to resume."""

    hidden = (*PlainHelpFormatter.hidden, "data.frame", "data.images", "data.labels")  # the Python API's
    help_overrides = {
        "ckpt_path": "a private training checkpoint of this run's model to resume from (private/<experiment>/<run>/; "
                     "the fit summary prints its path).",
        "weights_only": "how --ckpt_path is read (torch.load's weights_only; default: Lightning's choice).",
        "seed_everything": "seed of every public random draw (an int; true: a random one; false: none). The mechanisms' "
                           "noise never comes from it.",
        "data": "the data: ImageDataModule (images: digits, MNIST, a folder, an .npz) or TabularDataModule (a CSV or a "
                "built-in table), by name or class path; --data.help NAME lists its options.",
    }

    def _get_help_string(self, action):
        if action.dest == "model":
            return (f"the model: {', '.join(MODEL_TITLES)}, by name or class path; --model.help NAME lists its "
                    f"options and what the model is.")
        return super()._get_help_string(action)


#: The help of one class's options (``--model.help GPATE``), as jsonargparse describes it.
_CLASS_HELP = re.compile(r"^Help for (--[\w.]+)\.help=([\w.]+)$")


class GPATEArgumentParser(LightningArgumentParser):
    """LightningCLI's parser whose syntax errors (an unknown option or config key, a wrong type, a missing
    config file) end in one line naming the bad key and the closest valid ones instead of the usage
    (:mod:`lightning_gpate.option_errors`), and whose help is plain text (:class:`GPATEHelpFormatter`): a class's
    help (``--model.help GPATE``) starts with the class's description, its first paragraph.

    Attributes:
        command: what the user ran (``lightning-gpate fit``), for the message's pointer to ``--help``
            (``None``: the parser's own ``prog``).
    """

    command: str | None = None

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", GPATEHelpFormatter)
        super().__init__(*args, **kwargs)

    def format_help(self) -> str:
        match = _CLASS_HELP.match(self.description or "")
        if match:
            from jsonargparse._actions import _ActionHelpClassPath
            from jsonargparse._util import import_object

            option, path = match.groups()
            cls, key = import_object(path), option[2:]
            chosen = "" if is_dataclass(cls) else f" --{key} {cls.__name__}"
            self.usage = f"{PROG} fit{chosen} [--{key}.OPTION VALUE ...]"
            self.description = first_paragraph(cls.__doc__)
            group = (self.groups or {}).get(key)
            if group is not None:
                group.title = f"{cls.__name__}'s options"
            nested = [f"{a.option_strings[0]}{' NAME' if a.nargs == '?' else ''}" for a in self._actions
                      if isinstance(a, _ActionHelpClassPath) and all(
                          t.__module__.partition(".")[0] in _PROJECT_PACKAGES for t in a._help_types)]
            if nested:  # the formatter leaves a group's own help out of the list: say here how to ask for it
                self.epilog = f"A group's own options: add {' or '.join(nested)} to this command."
        return super().format_help()

    def parse_args(self, args: Sequence[str] | None = None, *more, **kwargs):
        """jsonargparse's ``parse_args``, with ``null`` for an option of a group written as a mapping
        (:func:`null_group_options_as_mappings`)."""
        given = sys.argv[1:] if args is None else args
        return super().parse_args(null_group_options_as_mappings(given) if isinstance(given, (list, tuple)) else args, *more, **kwargs)

    def error(self, message: str, ex: Exception | None = None):
        if not self.exit_on_error:  # jsonargparse's inner parsers: it catches this and tries the next type
            super().error(message, ex)
        from lightning_gpate.option_errors import option_error_line

        parser = getattr(ex, "subcommand_parser", None) or self
        command = self.command or self.prog.replace(" [options]", "")
        raise OptionError(option_error_line(message, parser, command)) from ex


class GPATECLI(LightningCLI):
    """LightningCLI with the data spec linked into the model, MLflow as the default logger, checks
    before a fit starts, the DP metadata drawn once for a fit's processes and stages, and the end-of-fit summary."""

    def __init__(self, *args, **kwargs) -> None:
        # what a fit shares with its DataModules and its other processes (shared_released_spec), until the command ends
        self._shared_spec = contextlib.ExitStack()
        with self._shared_spec:
            super().__init__(*args, **kwargs)

    def _add_subcommands(self, parser, **kwargs) -> None:
        """LightningCLI's subcommands, with ``fit`` described as this tool's and the groups of its help titled for a
        user (the model, the data, resuming) instead of by their base classes' docstrings."""
        super()._add_subcommands(parser, **kwargs)
        for choice in parser._subcommands_action._choices_actions:
            if choice.dest == "fit":
                choice.help = FIT_HELP
        fit = self._subcommand_parsers.get("fit")
        if fit is not None:
            fit.description = FIT_DESCRIPTION
        for subparser in self._subcommand_parsers.values():
            for name, title in GROUP_TITLES.items():
                group = (subparser.groups or {}).get(name)
                if group is not None:
                    group.title = title

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list) -> Any:
        """LightningCLI's Trainer, with the fit's progress in steps (:class:`callbacks.StepProgress`) in place of
        Lightning's bar of epochs, unless the config turns the bar off or brings its own."""
        from pytorch_lightning.callbacks import ProgressBar

        from callbacks import StepProgress

        given = config.get("callbacks") or []
        given = given if isinstance(given, list) else [given]
        if config.get("enable_progress_bar") is not False and not any(isinstance(c, ProgressBar) for c in [*given, *callbacks]):
            callbacks = [*callbacks, StepProgress()]
        return super()._instantiate_trainer(config, callbacks)

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.spec", "model.init_args.data_spec", apply_on="instantiate")
        parser.set_defaults({"trainer.logger": {"class_path": "lightning_gpate.tracking.GPATEMLFlowLogger"}})
        from callbacks import DownstreamUtility, ImageQuality

        # Evaluation at the end of every fit, configurable per run: `utility: {every_n_steps: 500}`,
        # `image_quality: {enabled: false}` in a config or `--utility.enabled false` on the command line.
        parser.add_lightning_class_args(DownstreamUtility, "utility")
        parser.add_lightning_class_args(ImageQuality, "image_quality")

    def _command_config(self):
        """The parsed config of the command being run (``fit``, ``sample`` …), or the whole config without one."""
        subcommand = self.config.get("subcommand")
        return self.config[subcommand] if subcommand else self.config

    def parse_arguments(self, parser, args) -> None:
        """Parse, then check that a ``--ckpt_path`` file is a lightning-gpate checkpoint: LightningCLI
        reads its hyperparameters next, and would fail with a traceback on anything else."""
        given = sys.argv[1:] if args is None else args
        if isinstance(given, (list, tuple)):  # the main parser's errors may be about the command's options
            parser.command = " ".join([PROG, *[a for a in given if a in self.subcommands()][:1]])
        super().parse_arguments(parser, args)
        ckpt_path = self._command_config().get("ckpt_path") if self.config.get("subcommand") else None
        self._resume_from = self._requested = None
        if ckpt_path and str(ckpt_path) not in _LIGHTNING_CKPT_ALIASES:
            from lightning_gpate.release import read_file

            self._resume_from = (str(ckpt_path), read_file(str(ckpt_path)))  # tensors stay on disk
            # what the user asked for, before LightningCLI replaces the model's arguments by the checkpoint's
            self._requested = copy.deepcopy(self._command_config())

    def _default_quantile_epsilon(self) -> None:
        """A private model's table gets private quantile bins by default: an unset ``data.quantile_epsilon`` becomes
        a share of the model's budget (:func:`~lightning_gpate.privacy.quantiles.default_quantile_epsilon`), in the
        config and in what a resume asked for alike (a function of the budget, which a resume pins)."""
        from lightning_gpate.release import _import as import_class

        for config in (self._command_config(), self._requested):
            data, model = (config or {}).get("data"), (config or {}).get("model")
            if data is None or model is None or not hasattr(data, "init_args") or not hasattr(model, "init_args"):
                continue
            from datamodules import TabularDataModule

            try:
                tabular = issubclass(import_class(data.class_path), TabularDataModule)
            except Exception:  # noqa: BLE001 - an unknown class fails where LightningCLI builds it, with its own message
                continue
            epsilon, delta = model.init_args.get("epsilon"), model.init_args.get("delta")
            valid = _is_number(epsilon) and _is_number(delta) and float(epsilon) > 0 and 0 < float(delta) < 1
            # an invalid budget is left for the model to refuse, in its own words
            if tabular and data.init_args.get("quantile_epsilon", 0) is None and valid:
                from lightning_gpate.privacy.quantiles import default_quantile_epsilon

                data.init_args.quantile_epsilon = default_quantile_epsilon(float(epsilon), float(delta))

    def _share_the_continued_data_spec(self) -> None:
        """A fit that continues a run on the same data (a resume; GS-WGAN's private stage after its pretraining:
        :meth:`~lightning_gpate.models.base.GenerativeModel.data_checkpoint`) builds its DataModule, here and in its
        other processes (on every node), with that run's released data spec
        (:func:`~datamodules.base.shared_released_spec`): its DP metadata was drawn and charged once."""
        from datamodules.base import shared_released_spec
        from lightning_gpate.release import _import as import_class
        from lightning_gpate.release import read_file

        if self._resume_from is not None:
            checkpoint = self._resume_from[1]
        else:
            model = self._command_config().get("model")
            if model is None or not hasattr(model, "init_args"):
                return
            try:
                cls = import_class(model.class_path)
            except Exception:  # noqa: BLE001 - an unknown class fails where LightningCLI builds it, with its own message
                return
            path = cls.data_checkpoint(vars(model.init_args)) if hasattr(cls, "data_checkpoint") else None
            if not path:
                return
            checkpoint = read_file(path)
        released = (checkpoint.get("hyper_parameters") or {}).get("data_spec")
        if isinstance(released, dict):
            self._shared_spec.enter_context(shared_released_spec(released))

    def _run_subcommand(self, subcommand: str) -> None:
        """LightningCLI's, with a fit on several processes started from this one sharing its DP metadata: the other
        processes build their DataModules with the spec this one's model was built from, drawn once."""
        if subcommand == "fit" and self.trainer.world_size > 1 and isinstance(self.datamodule, GenerativeDataModule):
            from datamodules.base import shared_released_spec
            from lightning_gpate.models.private import release_spec

            self._shared_spec.enter_context(shared_released_spec(release_spec(self.model.data_spec, warn=False), self.datamodule))
        super()._run_subcommand(subcommand)

    def before_instantiate_classes(self) -> None:
        """Fill the default quantile budget of a table (:meth:`_default_quantile_epsilon`); refuse, before anything is
        built or run, a resume that asks for other values than its training checkpoint pins: the model's class and
        arguments (LightningCLI has just replaced them by the checkpoint's) and the data's teacher count and
        DP-metadata budgets."""
        if self.config.get("subcommand") in (None, "fit"):
            self._default_quantile_epsilon()
            self._share_the_continued_data_spec()
        if self._resume_from is None or self._requested is None:
            return
        path, checkpoint = self._resume_from
        if CHECKPOINT_KEY not in checkpoint or not checkpoint.get("hyper_parameters"):
            return  # not a training checkpoint: before_fit's check_resume says so
        from datamodules.base import PRIVACY_PARAMETERS
        from lightning_gpate.release import _import as import_class

        pinned, requested = self._command_config(), self._requested
        ours, theirs = requested.model.class_path, pinned.model.class_path
        if import_class(ours) is not import_class(theirs):
            raise CheckpointError(f"{path} holds a {theirs}, but the config trains a {ours}: resume with the config it was trained with")
        cls = import_class(theirs)

        def model_args(model) -> dict:
            """The model's arguments (not the data spec: linked from the data) as plain values, a checkpoint's of before
            the option groups (LightningCLI passes its flat names as ``dict_kwargs``) moved into them."""
            given = {**vars(model.init_args), **dict(model.get("dict_kwargs") or {})}
            given.pop("data_spec", None)
            defaults = {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()}
            return {k: _plain_option(type(defaults[k]).of(v, defaults[k], name=k) if isinstance(defaults.get(k), OptionGroup)
                                     and v is not None else v) for k, v in cls.migrate_options(given).items()}

        # None asks the model to resolve a value (a public seed, a length scale, a default by data kind): the
        # checkpoint's resolved one answers it
        theirs = model_args(pinned.model)
        asked = cls.answer_on_resume(model_args(requested.model), theirs, checkpoint["hyper_parameters"].get("data_spec") or {})
        refuse_changed_on_resume(path, theirs, asked)
        refuse_changed_on_resume(path, checkpoint.get("datamodule_hyper_parameters") or {}, vars(requested.data.init_args),
                                 PRIVACY_PARAMETERS)

    def before_fit(self) -> None:
        """Refuse, before any process or MLflow run starts, what cannot run: a single-process model on
        several processes, and a ``--ckpt_path`` that is not a resumable checkpoint of this model
        (missing, not a checkpoint, another model, a spent privacy budget)."""
        reason = getattr(self.model, "single_process_only", None)
        if reason and self.trainer.world_size > 1:
            raise ConfigError(
                f"{type(self.model).__name__} trains on one process only ({reason}); this run asks for "
                f"{self.trainer.world_size}: set --trainer.devices 1 (and --trainer.num_nodes 1)"
            )
        if self.trainer.world_size > 1 and getattr(self.model, "ddp_needs_find_unused_parameters", False):
            from pytorch_lightning.strategies import DDPStrategy

            strategy = self.trainer.strategy
            if isinstance(strategy, DDPStrategy) and not getattr(strategy, "_ddp_kwargs", {}).get("find_unused_parameters"):
                raise ConfigError(
                    f"{type(self.model).__name__} has parameters that some of its steps do not use: under DDP, "
                    f"set --trainer.strategy ddp_find_unused_parameters_true"
                )
        if self._resume_from is not None:
            path, checkpoint = self._resume_from
            self._resume_from = None
            self.model.check_resume(checkpoint, path)
        from lightning_gpate.tracking import GPATEMLFlowLogger, run_title

        for logger in self.trainer.loggers:  # a run without a configured name is named for its model, data and ε
            if isinstance(logger, GPATEMLFlowLogger):
                logger.name_run(run_title(self.model, self.datamodule))

    def after_fit(self) -> None:
        """Print the summary (global rank 0, after the progress bar and the evaluations; every fact in
        it is also in the MLflow run)."""
        from callbacks import FitSummary

        trainer = self.trainer
        summary = next((cb for cb in trainer.callbacks if isinstance(cb, FitSummary)), None)
        if summary is not None and trainer.is_global_zero:
            print(summary.text(trainer, self.model, command=PROG), flush=True)


def option_group_names() -> set[str]:
    """The names under which some model takes an option group (``generator``, ``training``, ``warm_start``, …)."""
    import lightning_gpate.models as models

    names = set()
    for cls in vars(models).values():
        if isinstance(cls, type) and issubclass(cls, GenerativeModel):
            names.update(k for k, p in inspect.signature(cls.__init__).parameters.items()
                         if isinstance(p.default, OptionGroup) or k == "warm_start")
    return names


def null_group_options_as_mappings(args: Sequence[str]) -> list[str]:
    """``args`` with each ``--model[.init_args].<group>.<option> null`` written ``--model.init_args.<group> '{<option>:
    null}'``: jsonargparse (4.53) refuses ``null`` for an optional field of a dataclass group inside a subclass's
    ``init_args`` ("expected a float"), but takes the same value in a mapping, merged over the config's group."""
    pattern = re.compile(r"^--model\.(?:init_args\.)?(\w+)\.(\w+)(?:=(.*))?$")
    groups, out, i = None, [], 0
    args = list(args)
    while i < len(args):
        match = pattern.match(args[i])
        value = match and (match.group(3) if match.group(3) is not None else (args[i + 1] if i + 1 < len(args) else None))
        if match and value in ("null", "None") and match.group(1) in (groups := groups or option_group_names()):
            out += [f"--model.init_args.{match.group(1)}", f"{{{match.group(2)}: null}}"]
            i += 1 if match.group(3) is not None else 2
            continue
        out.append(args[i])
        i += 1
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _plain_option(value: Any) -> Any:
    """A model argument as plain values, whichever form it came in (jsonargparse's namespace, an option group or an
    aggregator object, a mapping of its options): what a resume compares with its checkpoint's."""
    if hasattr(value, "as_hparams"):
        value = value.as_hparams()
    if type(value).__name__ == "Namespace":
        value = vars(value)
    if isinstance(value, dict):
        return {k: _plain_option(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_option(v) for v in value]
    return value


def run_lightning_cli(args: Sequence[str] | None = None, *, run: bool = True) -> GPATECLI:
    import lightning_gpate.models  # noqa: F401  (registers every model class for subclass mode)
    from callbacks import FitSummary, MLflowSaveConfig, ReleaseArtifact, SampleLogger

    return GPATECLI(
        GenerativeModel,
        GenerativeDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_callback=MLflowSaveConfig,
        save_config_kwargs={"save_to_log_dir": False},
        # Training checkpoints (private) go to ./private/<experiment>/<run>/ (ReleaseArtifact), outside
        # the MLflow store; only the release artifact is logged.
        trainer_defaults={"callbacks": [SampleLogger(), ReleaseArtifact(), FitSummary()]},
        parser_class=GPATEArgumentParser,
        parser_kwargs={"prog": PROG, "description": DESCRIPTION,
                       "epilog": f"Other commands: {', '.join(sorted(EXTRA_COMMANDS))} ({PROG} <command> --help). "
                                 f"Add {DEBUG_FLAG} to any command to see the traceback of an error."},
        args=args,
        auto_configure_optimizers=False,
        run=run,
    )


def sample_command(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="lightning-gpate sample",
        description="Write synthetic data from a trained generator, in the original data's schema, and a picture of it "
                    "(images: a grid with one labelled class per row; tables: a few columns' marginals) beside it.",
    )
    parser.add_argument("--ckpt_path", required=True, help="release artifact of a run (release/release.pt, printed by fit; "
                        "its MLflow tag release_artifact), or a private training checkpoint (its release is extracted)")
    parser.add_argument("--num_samples", type=int, required=True, help="rows or images to generate (>= 1)")
    parser.add_argument("--output", required=True, help="output .csv (tables), .npz (images) or a new folder (images: "
                        "PNGs in class folders, OUTPUT/<class>/<n>.png); a .png picture is written beside it")
    parser.add_argument("--seed", type=int, default=None, help="seed of the latent draws")
    parser.add_argument("--reference", default=None, help="a reference set YOU declare public, drawn beside the samples in the "
                        "picture: .npz with images and labels (as this command writes) or a .csv table. Without it the picture "
                        "of a non-private model shows its real test split, that of a private model synthetic data only")
    args = parser.parse_args(argv)
    if args.num_samples < 1:
        parser.error(f"--num_samples must be >= 1, got {args.num_samples}")
    from lightning_gpate.release import load_release, model_from_release
    from lightning_gpate.evaluation.store import real_test_split
    from lightning_gpate.sampling import load_reference, write_samples

    release = load_release(args.ckpt_path)
    model = model_from_release(release, source=str(args.ckpt_path))
    if args.reference is not None:
        reference, title = load_reference(args.reference, model.data_spec), f"reference ({Path(args.reference).name})"
    else:
        reference, title = real_test_split(model, release), "real (test split)"
    for path in write_samples(model, args.num_samples, args.output, seed=args.seed, reference=reference, reference_title=title):
        print(f"wrote {path}")
    if reference is None:
        from lightning_gpate.privacy.disclosure import is_private

        print("the picture shows synthetic data only" + (" (a private model's pictures never show its real data; "
              "--reference adds a public set)" if is_private(model) else " (the real test split could not be read)"))
    return 0


EXTRA_COMMANDS["sample"] = sample_command


def evaluate_command(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="lightning-gpate evaluate",
        description="Evaluate a trained generator (downstream utility; IS/FID for images) against its data's real "
                    "splits and attach the report to the checkpoint's MLflow run (metrics utility/*, quality/*; "
                    "artifacts under evaluation/).",
    )
    parser.add_argument("--ckpt_path", required=True, help="release artifact of a run (or a private training checkpoint)")
    parser.add_argument("--data", default=None, help="YAML data config (or the fit config) or a CSV replacing the stored data path "
                        "(default: the DataModule stored in the checkpoint)")
    parser.add_argument("--run_id", default=None, help="MLflow run to attach the report to (default: the checkpoint's run)")
    parser.add_argument("--tracking_uri", default=None, help="MLflow store (default: MLFLOW_TRACKING_URI, else the checkpoint's store)")
    parser.add_argument("--new_run", default=None, metavar="EXPERIMENT", help="if the checkpoint's run is not in the store, record the report in a new run of this experiment")
    parser.add_argument("--num_samples", type=int, default=None, help="generated rows/images (default: as many as the real "
                        "test split for a private model, whose training split's size is private; as the training split for a "
                        "non-private one; IS/FID: as the split they compare with)")
    parser.add_argument("--seed", type=int, default=0, help="seed of generation and of the evaluation models")
    parser.add_argument("--classifiers", default=None, help="comma-separated tabular classifiers (default: all 12)")
    parser.add_argument("--settings", default="ABC", help="tabular settings, e.g. ABC or B")
    parser.add_argument("--no_utility", action="store_true", help="skip the downstream classifiers")
    parser.add_argument("--no_quality", action="store_true", help="skip IS/FID")
    parser.add_argument("--no_figures", action="store_true", help="skip the tabular figures")
    parser.add_argument("--real_baselines", default=None, choices=["true", "false"],
                        help="compute what needs the real training split (Setting A, ranking agreements with A); default: "
                             "yes for non-private models, for private ones only if they log private diagnostics (then "
                             "named private/utility/*)")
    parser.add_argument("--feature_split", default=None, choices=["train", "val", "test"],
                        help="real split the IS/FID feature classifier trains on (default: train for non-private models, "
                             "a held-out split for private ones; train makes a private model's figures private/quality/*)")
    parser.add_argument("--val_source", default="synthetic", choices=["synthetic", "real_val"], help="epoch selection of the image CNN")
    parser.add_argument("--inception_weights", default=None, help="torchvision Inception-v3 weights file (RGB IS/FID)")
    parser.add_argument("--output", default=None, help="also write the report as JSON here")
    args = parser.parse_args(argv)
    if args.num_samples is not None and args.num_samples < 1:
        parser.error(f"--num_samples must be >= 1, got {args.num_samples}")
    from lightning_gpate.evaluation.report import write_report
    from lightning_gpate.evaluation.store import evaluate_checkpoint

    metrics, run_id, notes, spec = evaluate_checkpoint(
        args.ckpt_path, data=args.data, run_id=args.run_id, tracking_uri=args.tracking_uri, new_run_experiment=args.new_run,
        utility=not args.no_utility, quality=not args.no_quality, figures=not args.no_figures, num_samples=args.num_samples,
        seed=args.seed, classifiers=args.classifiers.split(",") if args.classifiers else None, settings=list(args.settings),
        val_source=args.val_source, inception_weights=args.inception_weights,
        real_baselines=None if args.real_baselines is None else args.real_baselines == "true", feature_split=args.feature_split,
    )
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    width = max((len(k) for k in metrics), default=0)
    for key, value in metrics.items():
        print(f"{key:<{width}}  {value:.4f}")
    from lightning_gpate.evaluation.fidelity import value_advice

    for line in value_advice(metrics, spec, "utility/fidelity/") if spec.get("kind") == "tabular" else []:
        print(f"advice: {line}")
    if args.output:
        print(f"wrote {write_report(metrics, args.output, run_id=run_id, checkpoint=args.ckpt_path, notes=notes)}")
    print(f"logged to MLflow run {run_id}")
    return 0


def compare_command(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="lightning-gpate compare",
        description="Print the runs of an MLflow experiment side by side: model, epsilon, delta, utility, IS/FID, steps, wall time.",
    )
    parser.add_argument("--experiment", required=True, help="MLflow experiment name")
    parser.add_argument("--tracking_uri", default=None, help="MLflow store (default: MLFLOW_TRACKING_URI or sqlite:///mlruns/mlflow.db)")
    parser.add_argument("--sort", default=None, help="column to sort by (descending), e.g. auroc_B or FID")
    parser.add_argument("--output", default=None, help="also write the table as CSV here")
    args = parser.parse_args(argv)
    from lightning_gpate.evaluation.store import runs_table

    table = runs_table(args.experiment, tracking_uri=args.tracking_uri)
    if table.empty:
        print(f"experiment {args.experiment!r} has no runs")
        return 0
    if args.sort:
        if args.sort not in table.columns:
            raise ValueError(f"--sort {args.sort!r} is not a column; columns: {list(table.columns)}")
        table = table.sort_values(args.sort, ascending=args.sort == "FID", na_position="last")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}", na_rep="-"))
    if args.output:
        table.to_csv(args.output, index=False)
        print(f"wrote {args.output}")
    return 0


EXTRA_COMMANDS["evaluate"] = evaluate_command
EXTRA_COMMANDS["compare"] = compare_command


def audit_command(argv: Sequence[str]) -> int:
    from lightning_gpate.audit.runner import audit_command as run

    return run(argv)


EXTRA_COMMANDS["audit"] = audit_command


def plan_command(argv: Sequence[str]) -> int:
    from lightning_gpate.planning import plan_command as plan

    return plan(argv, build_cli=run_lightning_cli)


EXTRA_COMMANDS["plan"] = plan_command


def _raised_by_project(err: BaseException) -> bool:
    """Whether ``err`` was raised in this project's code (the innermost frame of its traceback)."""
    tb = err.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename.startswith(_PROJECT_DIRS)


def user_error_of(err: BaseException) -> BaseException | None:
    """The user error behind ``err``, or ``None`` when ``err`` is a bug.

    Looks through the chain of causes, because jsonargparse wraps an error raised in a class's
    constructor during instantiation into its own (with a dump of the whole config): the outermost
    :class:`UserError` wins, else the outermost ValueError (or file error) raised by this project's code.
    """
    chain: list[BaseException] = []
    e: BaseException | None = err
    while e is not None and not any(e is c for c in chain):
        chain.append(e)
        e = e.__cause__ if e.__cause__ is not None else (None if e.__suppress_context__ else e.__context__)
    for e in chain:
        if isinstance(e, UserError):
            return e
    for e in chain:
        if isinstance(e, _INPUT_ERRORS) and _raised_by_project(e):
            return e
    return None


def _is_global_rank_zero() -> bool:
    rank_zero = sys.modules.get("lightning_fabric.utilities.rank_zero")
    return rank_zero is None or getattr(rank_zero.rank_zero_only, "rank", 0) == 0


def run_command(name: str, command: Callable[[], int], *, debug: bool = False) -> int:
    """Run ``command``; a user error ends in one line on stderr (global rank 0 only) and exit code 2."""
    from callbacks.summary import one_line

    try:
        return command() or 0
    except Exception as err:  # noqa: BLE001 - sorted into user errors and bugs below
        user = user_error_of(err)
        if user is None:
            raise
        from lightning_gpate.progress import close_bars

        close_bars()  # a bar the error stopped would hold the start of the error's line
        if debug:
            traceback.print_exception(err)
        if _is_global_rank_zero():
            print(f"{' '.join([PROG, name]) if name else PROG}: error: {one_line(user)}", file=sys.stderr, flush=True)
        return 2


def _lightning_command(args: Sequence[str] | None) -> int:
    run_lightning_cli(args)
    return 0


def _no_such_command(name: str) -> int:
    from lightning_gpate.option_errors import closest

    commands = [*LIGHTNING_COMMANDS, *sorted(EXTRA_COMMANDS)]
    said = (f"unknown command {name}" + "".join(f"; did you mean {c}?" for c in closest(name, commands)[:1])) if name else "no command given"
    raise OptionError(f"{said} (commands: {', '.join(commands)}; see {PROG} --help)")


def main(argv: Sequence[str] | None = None) -> int:
    from lightning_gpate.progress import quiet_known_noise

    quiet_known_noise()
    args = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in args
    args = [a for a in args if a != DEBUG_FLAG]
    name = args[0] if args and not args[0].startswith("-") else ""
    if name in EXTRA_COMMANDS:
        return run_command(name, lambda: EXTRA_COMMANDS[name](args[1:]), debug=debug)
    if (name or not args) and name not in LIGHTNING_COMMANDS:
        return run_command(name, lambda: _no_such_command(name), debug=debug)
    if argv is None:
        # LightningCLI reads sys.argv itself (and DDP relaunches this command from it): drop --debug there.
        sys.argv[1:] = args
        return run_command(name, lambda: _lightning_command(None), debug=debug)
    return run_command(name, lambda: _lightning_command(args), debug=debug)


if __name__ == "__main__":
    sys.exit(main())
