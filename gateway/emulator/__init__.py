"""Upstream emulators: real HTTP servers speaking the vLLM, llama.cpp and paid-API dialects, paced by
performance profiles built from published figures, with fault knobs for tests and demos.
"""

from gateway.emulator.app import create_emulator_app, run_emulator
from gateway.emulator.listener import GatedServer
from gateway.emulator.profiles import PROFILES, Profile

__all__ = ["PROFILES", "GatedServer", "Profile", "create_emulator_app", "run_emulator"]
