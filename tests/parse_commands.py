"""Run each command's argument parsing and stop there: tests/test_docs.py checks the documented commands with it.

Reads a JSON list of ``{"module" | "script": ..., "argv": [...]}`` on stdin and prints, as JSON, one result per
command: ``{"ok": bool, "error": str, "description": str}``. Each command runs as ``python -m MODULE ARGV`` or
``python SCRIPT ARGV`` would, in this process, until its first ``ArgumentParser.parse_args`` returns: then it is
stopped, so nothing it would do after parsing (load a model, run a stage) happens. ``argv == ["--help"]`` passes
when argparse prints the help. One process for all of them, so torch and vLLM are imported once.
"""

import argparse
import contextlib
import io
import json
import runpy
import sys


class Parsed(BaseException):
    """Raised once a parser accepted the arguments; a BaseException, so no ``except Exception`` in a stage eats it."""


def parse_only(command: dict) -> dict:
    descriptions = []
    original = argparse.ArgumentParser.parse_args

    def parse_args(parser, args=None, namespace=None):
        descriptions.append(parser.description or "")
        original(parser, args, namespace)
        raise Parsed

    target = command.get("module") or command["script"]
    sys.argv = [target, *command["argv"]]
    output = io.StringIO()
    argparse.ArgumentParser.parse_args = parse_args
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            if "module" in command:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(target, run_name="__main__")
        result = (False, "ended without parsing its arguments")
    except Parsed:
        result = (True, "")
    except SystemExit as exit_:  # argparse exits 0 after --help, 2 on arguments it refuses
        result = (exit_.code == 0 and command["argv"] == ["--help"], f"exit {exit_.code}: {output.getvalue()[-800:]}")
    except Exception as error:  # noqa: BLE001 - reported to the test, which names the command
        result = (False, f"{type(error).__name__}: {error}")
    finally:
        argparse.ArgumentParser.parse_args = original
    description = descriptions[0] if descriptions else ""
    return {"ok": result[0], "error": result[1], "description": description}


if __name__ == "__main__":
    results = [parse_only(command) for command in json.load(sys.stdin)]
    sys.stdout = sys.__stdout__
    print(json.dumps(results))
