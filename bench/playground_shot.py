"""``python -m bench.playground_shot --model EXPORT_DIR --out docs/playground.png``: the README's picture
of the playground, taken in headless Chromium after asking the first shipped sample's first question."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.browser import headless_chromium
from harness.server_process import ServerProcess


def take(model: Path, out: Path, backend: str = "onnx", threshold: str = "") -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    log = Path(tempfile.mkdtemp(prefix="xlnetqa-shot-")) / "server.log"
    with (
        ServerProcess(model, backend=backend, log_path=log) as server,
        headless_chromium(1000, 1250) as driver,
    ):
        driver.get(server.url + "/")
        wait = WebDriverWait(driver, 30)
        wait.until(ec.text_to_be_present_in_element((By.ID, "model-line"), "threshold"))
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#sample option")) > 1)
        Select(driver.find_element(By.ID, "sample")).select_by_index(1)
        question = driver.find_element(By.ID, "question")
        first = question.get_attribute("value").splitlines()[0]
        question.clear()
        question.send_keys(first)
        if threshold:
            driver.find_element(By.ID, "threshold").send_keys(threshold)
        driver.find_element(By.ID, "ask").click()
        wait.until(lambda d: d.find_element(By.ID, "result").get_attribute("data-done"))
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.playground_shot", description=__doc__)
    p.add_argument("--model", type=Path, required=True, help="export directory to serve")
    p.add_argument("--backend", default="onnx")
    p.add_argument("--out", type=Path, default=Path("docs/playground.png"))
    p.add_argument(
        "--threshold", default="", help="no-answer threshold typed into the page (default: the model's)"
    )
    args = p.parse_args(argv)
    take(args.model, args.out, args.backend, args.threshold)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
