"""Wrote ``config_settings_flat.json``: every shipped config's resolved model settings (parsed by fit's parser, nothing
instantiated), at the commit before issue 60's option groups: ``python tests/data/make_config_settings_flat.py OUT.json``."""
import json, sys, os
from pathlib import Path
os.environ.setdefault("MLFLOW_TRACKING_URI", "sqlite:////tmp/snap_store/mlflow.db")
Path("/tmp/snap_store").mkdir(exist_ok=True)
from lightning_gpate.cli import run_lightning_cli
ROOT = Path(__file__).resolve().parents[1]
configs = sorted(p for p in (ROOT / "configs").rglob("*.yaml"))
os.chdir("/tmp/snap_store")
cli = run_lightning_cli(["--config", str(ROOT / "configs/quickstart.yaml"), "--trainer.accelerator", "cpu"], run=False)
out = {}
def plain(v):
    if isinstance(v, dict): return {k: plain(x) for k, x in v.items()}
    if hasattr(v, "__dict__") and type(v).__name__ == "Namespace": return plain(vars(v))
    if isinstance(v, (list, tuple)): return [plain(x) for x in v]
    return v
for p in configs:
    try:
        cfg = cli.parser.parse_args(["--config", str(p)])
    except SystemExit as e:
        print("FAIL", p, file=sys.stderr); continue
    model = cfg.model
    init = plain(model.init_args.as_dict() if hasattr(model.init_args, "as_dict") else model.init_args)
    init.pop("data_spec", None)
    out[str(p.relative_to(ROOT))] = {"class_path": model.class_path, "init_args": init}
json.dump(out, open(sys.argv[1], "w"), indent=1, sort_keys=True, default=str)
print(len(out), "configs")
