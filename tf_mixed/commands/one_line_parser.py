"""An `argparse` parser for the bench's standalone commands whose bad input is one line."""

from __future__ import annotations

import argparse
import re
import sys

from tf_mixed._internal import cli_errors


class OneLineParser(argparse.ArgumentParser):
    """An `argparse.ArgumentParser` whose bad input is one line, as in every command.

    ``prog`` is the command as typed (``"python -m tf_mixed rollback-cost"``); an
    error prints ``tf_mixed rollback-cost: error: MESSAGE; see ... --help`` (no
    usage block) and exits with status 2.
    """

    def one_line(self, message: str) -> str:
        """argparse's ``message`` in the words of every command.

        Args:
            message: What argparse passes to `error`.

        Returns:
            A wrong type as ``--name='x': not a number. Accepted: ...``; anything
            else as argparse says it, with where to read the flags.
        """
        wrong_type = re.fullmatch(r"argument --(\w+): invalid (int|float) value: '(.*)'",
                                  message, re.DOTALL)
        if wrong_type:  # the wording of the absl commands (tf_mixed.cli.model_command)
            name, kind, value = wrong_type.groups()
            return str(cli_errors.wrong_type(name, value, kind, self.get_default(name)))
        return f"{message}; see {self.prog} --help"

    def error(self, message: str):
        command = self.prog.removeprefix("python -m ")
        print(f"{command}: error: {self.one_line(message)}", file=sys.stderr)
        raise SystemExit(2)
