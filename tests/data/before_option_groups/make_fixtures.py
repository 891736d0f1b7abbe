"""Writes this folder's fixtures with the code from BEFORE the option groups (issue 60: written by the commit that added
this folder, on the flat options): for each model on a small table and on the 8x8 digits, a seeded 3-step fit (``seed_everything(0)``, the
mechanisms' ``noise_seed`` 1234) with the flat options of that time; its release artifact (``<name>.release.pt``) and
the sha256 of its released generator's weights (``expected.json``). ``tests/test_option_groups.py`` refits each with
the option groups and compares, and loads each old artifact. Run from the repository root:
``python tests/data/before_option_groups/make_fixtures.py`` (it only makes sense at that commit: later code takes the groups).
On a machine whose floating point gives other last bits (``test_a_seeded_fit_gives_the_release_it_gave_before_the_groups``
fails for every model): ``git worktree add /tmp/flat 54b4527``, run it there (``PYTHONPATH=/tmp/flat
OMP_NUM_THREADS=1``), and append each digest of that ``expected.json`` to this folder's list of the same name (keep
this folder's release artifacts: the first digest of each list is theirs)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # tests/

from small_models import build, fit  # noqa: E402

#: image models: (kind, flat options) on the 8x8 digits with a small DCGAN generator.
IMAGE_OPTIONS = {
    "gan": dict(z_dim=8, gf_dim=8, fc_dim=32, df_dim=8),
    "gpate": dict(z_dim=8, gf_dim=8, fc_dim=32, generator_upsample="nearest", ema_decay=0.9),
    "pategan": dict(z_dim=8, gf_dim=8, fc_dim=32, df_dim=8, generator_upsample="transposed", ema_decay=0.9),
    "dpgan": dict(z_dim=8, gf_dim=8, fc_dim=32, df_dim=8, architecture="dcgan", generator_upsample="nearest", ema_decay=0.9),
    "gswgan": dict(z_dim=8, gf_dim=8, fc_dim=32, df_dim=8, generator_upsample="nearest", ema_decay=0.9),
    "dpmerf": dict(z_dim=8, gf_dim=8, fc_dim=32, ema_decay=0.9),
}
#: table models: flat options beside small_models.build's own.
TABLE_OPTIONS = {
    "gan": dict(latent_prior="uniform"),
    "gpate": dict(ema_decay=0.5),
    "pategan": dict(latent_prior="uniform", ema_decay=0.5),
    "dpgan": dict(latent_prior="uniform", ema_decay=0.5),
    "gswgan": dict(latent_prior="uniform", ema_decay=0.5),
    "dpmerf": dict(latent_prior="uniform", ema_decay=0.5),
}


def digits_module(num_teachers: int):
    from datamodules import ImageDataModule

    return ImageDataModule(dataset="digits", num_teachers=num_teachers, teacher_batch_size=4, batch_size=16, classes=list(range(10)))


def image_model(kind: str, options: dict):
    """The image variant: build()'s table model's class and options, on the digits."""
    table_model, _ = build(kind)
    hparams = dict(table_model.hparams)
    hparams.pop("data_spec", None)
    for name in ("hidden", "generator_hidden", "discriminator_hidden", "teacher_hidden", "student_hidden"):
        hparams.pop(name, None)
    teachers = {"gpate": 12, "pategan": 6, "gswgan": 5}.get(kind, 0)
    dm = digits_module(teachers)
    dm.setup("fit")
    # a group given in ``options`` (today's form) overrides the table model's group option by option
    merged = {k: {**hparams[k], **v} if isinstance(v, dict) and isinstance(hparams.get(k), dict) else v for k, v in options.items()}
    return type(table_model)(dm.spec, **{**hparams, **merged}), dm


def generator_digest(model) -> str:
    digest = hashlib.sha256()
    for key, value in sorted(model.generator_module.state_dict().items()):
        digest.update(key.encode())
        digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    from lightning_gpate.release import build_release, save_release

    expected = {}
    for kind in IMAGE_OPTIONS:
        for data in ("table", "image"):
            pl.seed_everything(0, workers=True)
            if data == "table":
                model, dm = build(kind, **TABLE_OPTIONS[kind], **({} if kind == "gan" else {"noise_seed": 1234}))
            else:
                model, dm = image_model(kind, {**IMAGE_OPTIONS[kind], **({} if kind == "gan" else {"noise_seed": 1234})})
            pl.seed_everything(0, workers=True)
            fit(model, dm, steps=3)
            name = f"{kind}_{data}"
            expected[name] = generator_digest(model)
            save_release(build_release(model), HERE / f"{name}.release.pt")
            print(name, expected[name][:12], flush=True)
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
