"""``lightning-gpate`` command line.

* ``lightning-gpate fit|validate|test --config configs/NAME.yaml [--model.* --data.* --trainer.* --seed_everything N]``
  through LightningCLI (models and DataModules in subclass mode);
* ``lightning-gpate sample --ckpt_path CKPT --num_samples N --output PATH`` writes synthetic data in
  the original schema (CSV for tables, ``.npz`` + PNG grid for images).
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


def run_lightning_cli(args: Sequence[str] | None = None) -> GPATECLI:
    import lightning_gpate.models  # noqa: F401  (registers every model class for subclass mode)
    from callbacks import FinalCheckpoint, MLflowSaveConfig, SampleLogger

    return GPATECLI(
        GenerativeModel,
        GenerativeDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_callback=MLflowSaveConfig,
        save_config_kwargs={"save_to_log_dir": False},
        trainer_defaults={
            "default_root_dir": "mlruns/lightning",
            "callbacks": [SampleLogger(), FinalCheckpoint()],
        },
        args=args,
        auto_configure_optimizers=False,
    )


def sample_command(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="lightning-gpate sample",
        description="Write synthetic data from a trained generator, in the original data's schema.",
    )
    parser.add_argument("--ckpt_path", required=True, help="checkpoint of a lightning-gpate model")
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
