"""Install difftune as a package (pip install -e .); training itself runs from the repo."""

from pathlib import Path

from setuptools import find_packages, setup

requirements = [
    line.strip()
    for line in Path(__file__).with_name("requirements.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]

setup(
    name="difftune",
    version="0.1.0",
    description="Fine-tune Stable Diffusion models (LoRA or full UNet) from one TOML file",
    packages=find_packages(include=["library", "library.*"]),
    package_data={"library.models": ["configs/*/*.json"]},
    py_modules=["train_network"],
    python_requires=">=3.10",
    install_requires=requirements,
    entry_points={"console_scripts": ["difftune-train=library.cli:main_entry"]},
)
