"""The GPU staging scripts: valid bash, and the vLLM pins of ``tools/gpu/stage_vllm.sh`` exactly the wheels whose
sha256 ``tools/gpu/vllm-manifest.txt`` records (a pin changed without ``stage_vllm.sh manifest`` fails here)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

GPU = Path(__file__).resolve().parents[2] / "tools" / "gpu"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


@pytest.mark.parametrize("script", sorted(p.name for p in GPU.glob("*.sh")))
def test_scripts_parse(script: str) -> None:
    subprocess.run(["bash", "-n", str(GPU / script)], check=True)


def test_vllm_pins_match_the_manifest() -> None:
    text = (GPU / "stage_vllm.sh").read_text()
    block = re.search(r"^PINS=\((.*?)^\)", text, re.DOTALL | re.MULTILINE)
    assert block is not None
    pins = {(_norm(n), v) for n, v in re.findall(r"([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.+\-]+)", block.group(1))}
    wheels = {}
    for line in (GPU / "vllm-manifest.txt").read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        digest, name = line.split()
        assert re.fullmatch(r"[0-9a-f]{64}", digest) and name.endswith(".whl"), line
        dist, version = name.split("-")[:2]
        wheels[(_norm(dist), version)] = digest
    assert pins == set(wheels)
    assert ("vllm", "0.26.0") in pins and ("openai", "2.54.0") in pins  # openai 2.x: 3.x imports httpx2
