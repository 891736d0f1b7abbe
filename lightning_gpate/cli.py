"""``lightning-gpate`` command line.

* ``lightning-gpate fit|validate|test --config configs/NAME.yaml [--model.* --data.* --trainer.* --seed_everything N]``
  through LightningCLI (models and DataModules in subclass mode);
* ``lightning-gpate sample --ckpt_path RELEASE --num_samples N --output PATH`` writes synthetic data in
  the original schema (CSV for tables, ``.npz`` + PNG grid for images) from a run's release artifact;
* ``lightning-gpate evaluate --ckpt_path RELEASE [--data DATA]`` evaluates a finished run and attaches the
  report to its MLflow run;
* ``lightning-gpate compare --experiment NAME`` prints the experiment's runs side by side.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from pytorch_lightning.cli import LightningCLI

from datamodules.base import GenerativeDataModule
from lightning_gpate.models.base import GenerativeModel

EXTRA_COMMANDS = {}


class GPATECLI(LightningCLI):
    """LightningCLI with the data spec linked into the model and MLflow as the default logger."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.spec", "model.init_args.data_spec", apply_on="instantiate")
        parser.set_defaults({"trainer.logger": {"class_path": "lightning_gpate.tracking.GPATEMLFlowLogger"}})
        from callbacks import DownstreamUtility, ImageQuality

        # Evaluation at the end of every fit, configurable per run: `utility: {every_n_steps: 500}`,
        # `image_quality: {enabled: false}` in a config or `--utility.enabled false` on the command line.
        parser.add_lightning_class_args(DownstreamUtility, "utility")
        parser.add_lightning_class_args(ImageQuality, "image_quality")


def run_lightning_cli(args: Sequence[str] | None = None) -> GPATECLI:
    import lightning_gpate.models  # noqa: F401  (registers every model class for subclass mode)
    from callbacks import MLflowSaveConfig, ReleaseArtifact, SampleLogger

    return GPATECLI(
        GenerativeModel,
        GenerativeDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_callback=MLflowSaveConfig,
        save_config_kwargs={"save_to_log_dir": False},
        # Training checkpoints (private) go to ./private/<experiment>/<run>/ (ReleaseArtifact), outside
        # the MLflow store; only the release artifact is logged.
        trainer_defaults={"callbacks": [SampleLogger(), ReleaseArtifact()]},
        args=args,
        auto_configure_optimizers=False,
    )


def sample_command(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="lightning-gpate sample",
        description="Write synthetic data from a trained generator, in the original data's schema.",
    )
    parser.add_argument("--ckpt_path", required=True, help="release artifact of a run (release/release.pt, printed by fit; "
                        "its MLflow tag release_artifact), or a private training checkpoint (its release is extracted)")
    parser.add_argument("--num_samples", type=int, required=True, help="rows or images to generate (>= 1)")
    parser.add_argument("--output", required=True, help="output .csv (tables) or .npz (images; a .png grid is written beside it)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the latent draws")
    args = parser.parse_args(argv)
    if args.num_samples < 1:
        parser.error(f"--num_samples must be >= 1, got {args.num_samples}")
    from lightning_gpate.models.base import load_generator
    from lightning_gpate.sampling import write_samples

    model = load_generator(args.ckpt_path)
    for path in write_samples(model, args.num_samples, args.output, seed=args.seed):
        print(f"wrote {path}")
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
    parser.add_argument("--num_samples", type=int, default=None, help="generated rows/images (default: as many as the real training split)")
    parser.add_argument("--seed", type=int, default=0, help="seed of generation and of the evaluation models")
    parser.add_argument("--classifiers", default=None, help="comma-separated tabular classifiers (default: all 12)")
    parser.add_argument("--settings", default="ABC", help="tabular settings, e.g. ABC or B")
    parser.add_argument("--no_utility", action="store_true", help="skip the downstream classifiers")
    parser.add_argument("--no_quality", action="store_true", help="skip IS/FID")
    parser.add_argument("--no_figures", action="store_true", help="skip the tabular figures")
    parser.add_argument("--val_source", default="synthetic", choices=["synthetic", "real_val"], help="epoch selection of the image CNN")
    parser.add_argument("--inception_weights", default=None, help="torchvision Inception-v3 weights file (RGB IS/FID)")
    parser.add_argument("--output", default=None, help="also write the report as JSON here")
    args = parser.parse_args(argv)
    if args.num_samples is not None and args.num_samples < 1:
        parser.error(f"--num_samples must be >= 1, got {args.num_samples}")
    from lightning_gpate.evaluation.report import write_report
    from lightning_gpate.evaluation.store import evaluate_checkpoint

    metrics, run_id, notes = evaluate_checkpoint(
        args.ckpt_path, data=args.data, run_id=args.run_id, tracking_uri=args.tracking_uri, new_run_experiment=args.new_run,
        utility=not args.no_utility, quality=not args.no_quality, figures=not args.no_figures, num_samples=args.num_samples,
        seed=args.seed, classifiers=args.classifiers.split(",") if args.classifiers else None, settings=list(args.settings),
        val_source=args.val_source, inception_weights=args.inception_weights,
    )
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    width = max((len(k) for k in metrics), default=0)
    for key, value in metrics.items():
        print(f"{key:<{width}}  {value:.4f}")
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


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in EXTRA_COMMANDS:
        try:
            return EXTRA_COMMANDS[args[0]](args[1:]) or 0
        except (ValueError, FileNotFoundError) as err:  # user errors: one clear line, no traceback
            print(f"lightning-gpate {args[0]}: error: {err}", file=sys.stderr)
            return 2
    run_lightning_cli(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
