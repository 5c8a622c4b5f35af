"""What both launchers share: printing or running commands, the user's command, presets."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from typing import Sequence, TextIO

from configs import presets
from mocheg_jax.data.report import MochegInputError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class LaunchError(MochegInputError):
  """Unusable launcher input, or a step that failed; scripts print it on one line."""


class Runner:
  """Runs commands one after another, or (dry_run) only prints them, one per line."""

  def __init__(self, dry_run: bool, out: TextIO | None = None):
    self.dry_run = dry_run
    self.out = out or sys.stdout

  def run(self, argv: Sequence[str]) -> None:
    line = shlex.join(argv)
    print(line if self.dry_run else f"+ {line}", file=self.out, flush=True)
    if self.dry_run:
      return
    try:
      code = subprocess.run(list(argv), check=False).returncode
    except FileNotFoundError:
      raise LaunchError(f"{argv[0]} is not installed (or not on PATH)") from None
    if code:
      raise LaunchError(f"{argv[0]} exited with status {code}: {line}")


def split_command(command: str, root: str = "workdir") -> list[str]:
  """The command's words (shell syntax); a LaunchError when it is empty or unbalanced.

  `root` names the placeholder of the shared workdir root in the error's example.
  """
  if not command or not command.strip():
    raise LaunchError("--command is empty: give the command every worker runs, e.g. "
                      "'python scripts/train.py --config=configs/explain.py:paper "
                      f"--workdir={{{root}}}/explain'")
  try:
    return shlex.split(command)
  except ValueError as e:
    raise LaunchError(f"--command is not valid shell syntax ({e}): {command}") from None


def substitute(command: str, values: dict[str, str]) -> str:
  """Replaces each {name} of `values` in the command (other braces are left alone)."""
  for name, value in values.items():
    command = command.replace("{" + name + "}", value)
  return command


def workdirs(command: str) -> list[str]:
  """The values of every --workdir flag of the command (`--workdir=X` or `--workdir X`)."""
  words = split_command(command)
  found = []
  for i, word in enumerate(words):
    if word.startswith("--workdir="):
      found.append(word.split("=", 1)[1])
    elif word == "--workdir" and i + 1 < len(words):
      found.append(words[i + 1])
  return found


def with_preset(command: str, preset: str, devices: int) -> str:
  """The command with the flags of a sharding preset appended.

  Args:
    command: a `scripts/train.py --config=configs/STAGE.py:VARIANT ...` command.
    preset: a name of configs/presets.py.
    devices: the job's devices, which the preset must have.

  Raises:
    LaunchError: an unknown preset, one for another device count, or a command that is not
      a scripts/train.py run of a known stage.
  """
  try:
    hardware = presets.hardware(preset)
  except presets.PresetError as e:
    raise LaunchError(str(e)) from None
  if hardware.devices != devices:
    raise LaunchError(f"--preset {preset} is for {hardware.devices} devices, but this job "
                      f"has {devices}")
  stage = presets.stage_of_command(command)
  if "scripts/train.py" not in command or stage is None:
    raise LaunchError(f"--preset needs a scripts/train.py command with "
                      f"--config=configs/STAGE.py (STAGE one of {', '.join(presets.STAGES)})")
  return " ".join([command] + presets.preset_flags(preset, stage))
