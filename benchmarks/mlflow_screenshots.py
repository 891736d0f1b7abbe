"""What a user sees in the MLflow UI: screenshots of a real store in headless Chromium.

Starts ``mlflow ui`` on a local port against an MLflow store holding real runs (the quickstart and a
DP-MERF run in the same experiment, both to their end), opens in headless Chromium the
experiment page, a run's overview and metric charts (ε over steps, utility, IS/FID), its sample grid
and release artifacts, the compare view of two runs and the experiment's chart view of both, and
writes one PNG per view
(``docs/img/mlflow_*.png``, referenced from ``docs/mlflow.md``).

Needs Chromium and its driver (Debian: ``apt-get install chromium chromium-driver``) and selenium
(``pip install -c constraints.txt -e ".[screenshots]"``). Usage::

    python benchmarks/mlflow_screenshots.py --store sqlite:///mlruns/mlflow.db --experiment quickstart \\
        [--runs RUN_ID RUN_ID] [--out docs/img] [--port 5077]

The runs of the figures in ``docs/img`` (both generate digits: CNN accuracy 0.879 and 0.784 on the real test split,
the epoch selected on synthetic digits)
were made with::

    lightning-gpate fit --config configs/quickstart.yaml --utility.every_n_steps 50 --image_quality.every_n_steps 50
    lightning-gpate fit --config configs/dpmerf_folder.yaml --data.init_args.dataset digits \\
        --trainer.logger.init_args.experiment_name quickstart --trainer.logger.init_args.run_name dpmerf-digits-eps1 \\
        --trainer.log_every_n_steps 10 --utility.every_n_steps 50 --image_quality.every_n_steps 50
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--hide-scrollbars")
MAX_PNG_BYTES = 300_000

from lightning_gpate.tracking import UI_TRAINING_VIEW  # noqa: E402  (after the path)


def _free_port(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def start_ui(store: str, port: int) -> subprocess.Popen:
    """``mlflow ui`` on 127.0.0.1:``port``, in its own process group; waits until it answers."""
    if not _free_port(port):
        raise SystemExit(f"port {port} is taken: pass --port")
    mlflow = Path(sys.executable).parent / "mlflow"
    proc = subprocess.Popen([str(mlflow), "ui", "--backend-store-uri", store, "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"mlflow ui exited with code {proc.returncode}")
            time.sleep(1)
    os.killpg(proc.pid, signal.SIGTERM)
    raise SystemExit("mlflow ui did not answer within 120 s")


def browser(width: int, height: int, profile: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={width},{height}")
    service = Service(executable_path=shutil.which("chromedriver") or "/usr/bin/chromedriver")
    return webdriver.Chrome(options=options, service=service)


def wait_for_text(driver, texts: list[str], timeout: float = 60) -> None:
    """Wait until every one of ``texts`` is on the page (the UI renders after its API calls)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        body = driver.execute_script("return document.body ? document.body.innerText : ''")
        if all(t in body for t in texts):
            return
        time.sleep(0.5)
    missing = [t for t in texts if t not in driver.execute_script("return document.body.innerText")]
    debug = Path(tempfile.gettempdir()) / "mlflow_screenshots_failed.png"
    driver.save_screenshot(str(debug))
    print(f"what the page showed: {debug}", file=sys.stderr)
    raise RuntimeError(f"{driver.current_url}: never showed {missing}")


def shoot(driver, url: str | None, path: Path, texts: list[str], *, settle: float = 3.0, height: int | None = None, act=None,
          after: list[str] = ()) -> Path:
    """Open ``url`` (``None``: stay), wait for ``texts``, optionally act (``act(driver)``) and wait for
    ``after``, let charts draw, save a PNG of the window (``height``: resize it first)."""
    if height is not None:
        driver.set_window_size(driver.get_window_size()["width"], height)
    if url is not None:
        driver.get(url)
    wait_for_text(driver, texts)
    close_assistant(driver)
    if act is not None:
        act(driver)
        wait_for_text(driver, list(after))
    time.sleep(settle)
    driver.save_screenshot(str(path))
    _shrink(path)
    print(f"wrote {path} ({path.stat().st_size // 1000} KB)")
    return path


def close_assistant(driver) -> None:
    """MLflow 3.17 opens its chat assistant beside every page on a first visit: close it."""
    driver.execute_script(
        "for (const b of document.querySelectorAll('button[aria-label=\"Close\"]')) {"
        "  let e = b; for (let i = 0; i < 8 && e; i++, e = e.parentElement) {"
        "    if (e.innerText && e.innerText.includes('MLflow Assistant')) { b.click(); return; } } }")


def is_training_view(driver) -> bool:
    """Whether the UI shows its model-training view (its sidebar lists Runs, not Evaluation runs)."""
    body = driver.execute_script("return document.body.innerText")
    return "Evaluation runs" not in body and "\nRuns\n" in body


def switch_to_training_view(driver, page: str) -> None:
    """On ``page`` (opened without the URL parameter), click the sidebar's "Model training" switch once,
    as a user does: the browser remembers the choice for every later page."""
    from selenium.webdriver.common.by import By

    if driver.execute_script("return localStorage.getItem('mlflow.workflowType_v1')") == '"machine_learning"':
        return
    driver.get(page)
    wait_for_text(driver, ["Model training"])
    time.sleep(2)
    switch = driver.find_elements(By.XPATH, "//*[normalize-space(text())='Model training']")
    driver.execute_script("arguments[0].click()", switch[-1])
    time.sleep(3)
    if driver.execute_script("return localStorage.getItem('mlflow.workflowType_v1')") != '"machine_learning"':
        raise RuntimeError("the 'Model training' switch did not stick: another MLflow version?")


def collapse_sections(*titles: str):
    """An action collapsing the compare page's sections with these titles (so its metrics table shows)."""
    def act(driver) -> None:
        from selenium.webdriver.common.by import By

        for title in titles:
            for header in driver.find_elements(By.XPATH, f"//*[normalize-space(text())='{title}']"):
                driver.execute_script("arguments[0].click()", header)
                break
        time.sleep(1)
    return act


def click_texts(*texts: str):
    """An action clicking, in turn, the first element showing each of ``texts`` (e.g. an artifact folder, then a file)."""
    def act(driver) -> None:
        from selenium.webdriver.common.by import By

        for text in texts:
            found = driver.find_elements(By.XPATH, f"//*[normalize-space(text())='{text}']")
            if not found:
                raise RuntimeError(f"nothing shows {text!r} on {driver.current_url}")
            driver.execute_script("arguments[0].click()", found[0])
            time.sleep(2)
    return act


#: The charts of the experiment's chart view (a regular expression in its chart search): ε, utility, IS/FID.
CHARTS = "^epsilon$|cnn_accuracy_final|cnn_accuracy_val_selected|quality/fid$|quality/inception_score$"


def search_charts(pattern: str):
    """An action typing ``pattern`` into the chart view's search box (it filters charts by regular expression)."""
    def act(driver) -> None:
        from selenium.webdriver.common.by import By

        box = driver.find_element(By.CSS_SELECTOR, "input[placeholder='Search metric charts']")
        box.send_keys(pattern)
        time.sleep(2)
    return act


def scroll_to(text: str):
    """An action scrolling the page so that the first element with ``text`` is at the top."""
    def act(driver) -> None:
        from selenium.webdriver.common.by import By

        found = driver.find_elements(By.XPATH, f"//*[normalize-space(text())='{text}']")
        if found:
            driver.execute_script("arguments[0].scrollIntoView({block: 'start'})", found[0])
    return act


def _shrink(path: Path) -> None:
    """Keep a screenshot under MAX_PNG_BYTES: fewer colours first (UI screenshots have few), then smaller."""
    from PIL import Image

    image = Image.open(path).convert("RGB")
    for colours in (256, 128, 64):
        image.quantize(colors=colours, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
        if path.stat().st_size <= MAX_PNG_BYTES:
            return
    while path.stat().st_size > MAX_PNG_BYTES:
        image = image.resize((image.width * 4 // 5, image.height * 4 // 5), Image.Resampling.LANCZOS)
        image.quantize(colors=64).save(path, optimize=True)


def _api(port: int, endpoint: str, payload: dict | None = None, query: dict | None = None) -> dict:
    url = f"http://127.0.0.1:{port}/api/2.0/mlflow/{endpoint}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    data = json.dumps(payload).encode() if payload is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(request, timeout=30).read())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default="sqlite:///mlruns/mlflow.db", help="the MLflow tracking store (backend URI)")
    parser.add_argument("--experiment", default="quickstart")
    parser.add_argument("--runs", nargs="*", default=None, help="the run to show (first) and the one to compare it with "
                        "(default: the experiment's two newest finished runs, the G-PATE run first)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "img"))
    parser.add_argument("--port", type=int, default=5077)
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=900)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    ui = start_ui(args.store, args.port)
    base = f"http://127.0.0.1:{args.port}/#"
    try:
        experiment = _api(args.port, "experiments/get-by-name", query={"experiment_name": args.experiment})["experiment"]
        exp_id = experiment["experiment_id"]
        kind = {t["key"]: t["value"] for t in experiment.get("tags", [])}.get("mlflow.experimentKind")
        print(f"experiment {args.experiment!r} ({exp_id}), mlflow.experimentKind = {kind}")
        runs = _api(args.port, "runs/search", {"experiment_ids": [exp_id], "filter": "attributes.status = 'FINISHED'",
                                               "order_by": ["attributes.start_time DESC"], "max_results": 10})["runs"]
        by_id = {r["info"]["run_id"]: r for r in runs}
        if args.runs:
            chosen = [by_id[r] for r in args.runs]
        else:
            chosen = sorted(runs[:2], key=lambda r: {t["key"]: t["value"] for t in r["data"].get("tags", [])}.get("model_class") != "GPATE")
        if len(chosen) < 2:
            raise SystemExit(f"the experiment needs two finished runs to compare, it has {len(runs)}")
        run = chosen[0]["info"]
        run_id, run_name = run["run_id"], run["run_name"]
        names = [r["info"]["run_name"] for r in chosen]
        print(f"run {run_name} ({run_id}); compared with {names[1]}")

        with tempfile.TemporaryDirectory() as profile:
            driver = browser(args.width, args.height, Path(profile))
            try:
                run_url = f"{base}/experiments/{exp_id}/runs/{run_id}"
                # A fresh browser opens the link the fit summary prints: the training view by its URL parameter
                shoot(driver, f"{run_url}?{UI_TRAINING_VIEW}", out / "mlflow_run.png", [run_name, "epsilon"])
                if not is_training_view(driver):
                    raise RuntimeError(f"{run_url}?{UI_TRAINING_VIEW} did not open the model-training view")
                switch_to_training_view(driver, f"{base}/experiments")  # for the pages opened without the parameter
                shoot(driver, f"{base}/experiments/{exp_id}", out / "mlflow_experiment.png", [args.experiment, *names])
                shoot(driver, f"{run_url}/model-metrics", out / "mlflow_run_metrics.png",
                      ["epsilon", "quality", "utility", "cnn_accuracy_final"], settle=6, height=2300)
                shoot(driver, f"{run_url}/artifactPath/samples/samples_final.png", out / "mlflow_samples.png",
                      ["samples_final.png"], settle=5, height=args.height + 150)
                shoot(driver, None, out / "mlflow_release.png", ["release"], act=click_texts("release", "release.pt"),
                      after=["release/release.pt"])
                ids = json.dumps([r["info"]["run_id"] for r in chosen])
                compare = f"{base}/compare-runs?runs={urllib.parse.quote(ids)}&experiments={urllib.parse.quote(json.dumps([exp_id]))}"
                shoot(driver, compare, out / "mlflow_compare.png", [*names, "Metrics"], settle=3, height=1300,
                      act=collapse_sections("Visualizations", "Parameters"))
                # The experiment's chart view: every metric of the runs in one chart each (ε over steps, utility, IS/FID)
                shoot(driver, f"{base}/experiments/{exp_id}/runs?compareRunsMode=CHART", out / "mlflow_compare_charts.png",
                      [*names, "quality/fid"], settle=8, height=1600,
                      act=search_charts(CHARTS), after=["epsilon", "utility/cnn_accuracy_final", "quality/fid"])
                if not is_training_view(driver):
                    raise RuntimeError("the UI left the model-training view")
            finally:
                driver.quit()
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
