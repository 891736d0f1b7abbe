"""What saving G-PATE's teacher state costs inside a real ``fit`` (issue: saving must not dominate a run).

The teachers (and their Adam moments) are written only into the private training checkpoint, and only
when checkpoints are asked for. This measures, per case, on MNIST-shaped data (a CSV of 28×28 images,
e.g. ``../shared/data/mnist_5k.csv.gz``) with the paper's conv teachers:

* ``iter_s``: seconds per iteration of ``fit`` without checkpoints (median over the timed steps);
* ``save_s`` / ``ckpt_mb``: one private training checkpoint (teachers + Adam state) written by
  ``trainer.save_checkpoint``, and its size; ``release_kb`` the release artifact's size;
* ``fit_ckpt_s`` vs ``fit_s``: the same ``fit`` with a ``ModelCheckpoint(every_n_train_steps=every)``
  plus the final private checkpoint, against none;
* ``share_at_N``: the fraction of a run spent saving with a checkpoint every N steps
  (``save_s / (N·iter_s + save_s)``), for the paper configs' N;
* ``mb_per_teacher`` and ``save_mb_per_s``: to extrapolate to other teacher counts and disks.

Usage::

    python benchmarks/checkpoint_cost.py --teachers 50 100 --steps 12 --every 6              # CPU
    python benchmarks/checkpoint_cost.py --device cuda --teachers 1000 2000 --steps 60 --every 20

Prints a markdown table (and writes it with ``--output``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from callbacks import ReleaseArtifact  # noqa: E402
from datamodules import ImageDataModule  # noqa: E402
from lightning_gpate.models import GPATE  # noqa: E402
from lightning_gpate.models.gpate import PAPER_SETTINGS  # noqa: E402  (the aggregator measured)

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist_5k.csv.gz"


class StepTimer(pl.Callback):
    def __init__(self) -> None:
        self.times: list[float] = []
        self._start = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self._start)


def _model_and_data(args, teachers: int):
    dm = ImageDataModule("csv", path=str(args.data), classes=list(range(10)), num_teachers=teachers, teacher_batch_size=30,
                         val_fraction=0.0, test_fraction=0.2)
    model = GPATE(dm.spec, **PAPER_SETTINGS, epsilon=1e6, delta=1e-5, fake_batch_size=30, projection_dim=10, sigma_threshold=600.0,
                  sigma_gnmax=100.0, teacher_chunk_size=args.chunk, z_dim=100)
    return model, dm


def _fit(args, teachers: int, root: Path, *, every: int | None):
    model, dm = _model_and_data(args, teachers)
    timer = StepTimer()
    callbacks = [timer, ReleaseArtifact()]
    if every:
        callbacks.append(pl.callbacks.ModelCheckpoint(every_n_train_steps=every, save_last=True))
    trainer = pl.Trainer(max_steps=args.steps, accelerator=args.device, devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=bool(every), callbacks=callbacks,
                         default_root_dir=str(root))
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, dm)
    return time.perf_counter() - start, timer.times, trainer, callbacks[1]


def run_case(args, teachers: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        fit_s, times, trainer, _ = _fit(args, teachers, root / "plain", every=None)
        iter_s = statistics.median(times[2:] or times)
        start = time.perf_counter()
        trainer.save_checkpoint(root / "one.ckpt")
        save_s = time.perf_counter() - start
        ckpt_mb = (root / "one.ckpt").stat().st_size / 2**20
        release_kb = sum(p.stat().st_size for p in (root / "plain").rglob("release.pt")) / 2**10
        fit_ckpt_s, _, _, _ = _fit(args, teachers, root / "ckpt", every=args.every)
        saves = len(list((root / "ckpt").rglob("*.ckpt")))
    row = {"teachers": teachers, "iter_s": iter_s, "save_s": save_s, "ckpt_mb": ckpt_mb, "mb_per_teacher": ckpt_mb / teachers,
           "save_mb_per_s": ckpt_mb / save_s, "release_kb": release_kb, "fit_s": fit_s, "fit_ckpt_s": fit_ckpt_s,
           "ckpt_files": saves}
    for n in args.share_at:
        row[f"share_at_{n}"] = save_s / (n * iter_s + save_s)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--teachers", type=int, nargs="+", default=[50, 100])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=6, help="ModelCheckpoint every_n_train_steps of the checkpointed fit")
    parser.add_argument("--share-at", type=int, nargs="+", default=[500, 2000], help="checkpoint intervals to report the saving share for")
    parser.add_argument("--chunk", type=int, default=None, help="teacher_chunk_size (default: 50 on CPU, all on GPU)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    if args.chunk is None:
        args.chunk = 50 if args.device == "cpu" else None
    torch.set_num_threads(args.threads)
    rows = [run_case(args, t) for t in args.teachers]
    cols = list(rows[0])
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"cpu ({args.threads} threads)"
    lines = [f"G-PATE, MNIST-shaped conv teachers, {device}; {args.steps} steps, ModelCheckpoint every {args.every}", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    text = "\n".join(lines)
    print(text)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
