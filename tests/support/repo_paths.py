"""Paths of the repository and of the test tree, the same from a test at any depth."""

import pathlib

TESTS = pathlib.Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
DATA = TESTS / "data"
INTEGRATION = TESTS / "integration"
